"""The embedded-model builder runs end to end (a few steps) and its output loads through the real model path."""

from __future__ import annotations

import json

import pytest

from pubswap_flwr import tiny
from pubswap_flwr.policy import Policy, PolicySpec
from pubswap_flwr.tasks import TaskItem

pytestmark = pytest.mark.slow


def test_builder_writes_a_loadable_model_with_its_build_record(tmp_path):
    out = tmp_path / "model"
    assert tiny.main(["build", "--preset", "tiny", "--out", str(out), "--steps", "4", "--eval-every", "2",
                      "--eval-per-task", "4", "--pool-per-task", "200", "--seed", "5"]) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "build.json"):
        assert (out / name).is_file(), name
    info = json.loads((out / "build.json").read_text())
    assert info["seed"] == 5 and info["steps"] == 4 and info["preset"] == "tiny"
    assert info["command"] == "python -m pubswap_flwr.tiny build --preset tiny --seed 5 --steps 4"
    assert [c["step"] for c in info["curve"]] == [2, 4]
    assert set(info["held_out_greedy"]) == {"basic_arithmetic", "gcd", "count_bits", "fraction_simplification",
                                            "spell_backward", "mix"}
    assert all(0 <= v["accuracy"] <= 1 for v in info["held_out_greedy"].values())
    assert 800_000 < info["parameters"] < 900_000
    # A local model directory goes through the same loading code as any Hugging Face path.
    policy = Policy(PolicySpec(model_name=str(out)))
    assert policy.location == str(out.resolve())
    assert policy.tokenizer.eos_token == "<|im_end|>" and policy.formatter.chatml
    out_samples = policy.sample([TaskItem("u", "gcd", "Find the GCD of 4 and 6.", "2", "rg")], 2)
    assert len(out_samples[0]) == 2


def test_shipped_models_record_partial_accuracy():
    from pubswap_flwr.policy.data import data_dir

    for name, low in (("tiny", 0.2), ("tiny-b", 0.1)):
        info = json.loads((data_dir() / "models" / name / "build.json").read_text())
        assert low <= info["held_out_greedy"]["mix"]["accuracy"] <= 0.6, (name, info["held_out_greedy"]["mix"])
