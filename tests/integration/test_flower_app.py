"""The Flower app end to end through `flwr run` (hermetic FLWR_HOME and ports): fedavg and fedprox runs, outputs,
a bad config failing the run with the key named, and the saved adapter loading with PEFT."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.server.metrics import read_metrics

from .flower_harness import LocalFlower

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flower-app")]  # one worker: they share `flower`

# 2 nodes: apply their rounds (#54 keeps them by default)
SMALL = ("num-server-rounds=2 train.local-steps=2 train.prompts-per-step=4 train.completions-per-prompt=4 "
         "eval.items-per-task=4 eval.samples=1 seed=3 strategy.apply-below-robust=true")
# The smallest run that completes a round: for tests that check how a run starts or ends, not what it learns
TINY = ("num-server-rounds=1 train.local-steps=1 train.prompts-per-step=2 train.completions-per-prompt=2 "
        "eval.items-per-task=4 eval.samples=1 seed=3")


@pytest.fixture(scope="module")
def flower(tmp_path_factory):
    harness = LocalFlower(tmp_path_factory.mktemp("flower"))
    yield harness
    harness.close()


def _overrides(tmp_path, name: str, extra: str = "") -> list[str]:
    """Base settings, then `extra` as a second -c (a key may appear once per -c string)."""
    return [f"{SMALL} output.dir='{tmp_path}' run-name='{name}'"] + ([extra] if extra else [])


@pytest.fixture(scope="module")
def fedavg_run(flower, tmp_path_factory):
    """One fedavg run of SMALL (2 nodes, 2 rounds): its `flwr ls` row and run dir, read by two tests."""
    out = tmp_path_factory.mktemp("fedavg")
    return flower.run(_overrides(out, "fedavg")), out / "fedavg"


def test_fedavg_run_writes_metrics_and_adapters_and_changes_the_global_adapter(fedavg_run):
    row, run_dir = fedavg_run
    assert row["status"] == "finished:completed", row
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all("greedy_accuracy" in r["eval"] and "sampled_reward" in r["eval"] for r in rows)
    for r in rows[1:]:
        assert len(r["clients"]) == 2 and not r["dropped"]
        assert all(c["bytes_sent"] > 0 and c["bytes_received"] > 0 for c in r["clients"].values())
        assert r["aggregated"] is True and r["parameter_drift"] > 0
        assert set(r["time"]) >= {"round_s", "sampling_s", "update_s", "evaluation_s", "comm_orchestration_s"}
        assert 0 <= r["train_reward"] <= 1
    assert rows[2]["cumulative_reward"] == pytest.approx(rows[1]["train_reward"] + rows[2]["train_reward"])
    for name in ("round-0001", "round-0002", "final"):
        assert (run_dir / "adapters" / name / "adapter_config.json").is_file()
        assert (run_dir / "adapters" / name / "adapter_model.safetensors").is_file()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    # The global adapter moved away from its seeded initialisation.
    from pubswap_flwr.server.app import GlobalEvaluator

    initial = GlobalEvaluator(ExperimentConfig.from_flat({"seed": 3})).initial_adapter()
    final = load_file(str(run_dir / "adapters" / "final" / "adapter_model.safetensors"))
    assert len(final) == len(initial)
    moved = max(float(np.abs(final[k] - initial[k]).max()) for k in final)
    assert moved > 1e-4


@pytest.fixture(scope="module")
def fedprox_reward_run(flower, tmp_path_factory):
    """One fedprox run of TINY whose gcd reward is a user's function (tasks.rewards names modules of the checkout;
    `flwr run` bundles them, and the server and the nodes import them from the installed bundle, the scoring worker
    by name): its `flwr ls` row and run dir, read by two tests."""
    out = tmp_path_factory.mktemp("fedprox")
    rewards = "gcd=tests.unit.reward_fixtures:half_for_any_answer,examples.my_reward:reward"
    # every key of a table in one -c: Flower merges -c strings table by table, so a later string's strategy keys
    # replaced the first's (strategy.apply-below-robust was lost and both rounds kept)
    row = flower.run([f"{TINY} eval.sampled=false output.dir='{out}' run-name='fedprox'",
                      f"tasks.per-node=0 tasks.partial-credit=true tasks.mix='gcd:1,chain_sum:1' "
                      f"tasks.rewards='{rewards}'",
                      "strategy.mode='fedprox' strategy.proximal-mu=0.01 strategy.apply-below-robust=true"])
    return row, out / "fedprox"


def test_fedprox_run_completes(fedprox_reward_run):
    row, run_dir = fedprox_reward_run
    assert row["status"] == "finished:completed", row
    rows = read_metrics(run_dir)
    assert rows[-1]["mode"] == "fedprox" and rows[-1]["aggregated"] is True


def test_a_user_reward_named_in_the_config_scores_from_the_app_bundle(fedprox_reward_run):
    """gcd's held-out reward is the fixture's 0.5 per tagged answer, which no built-in verifier pays."""
    row, run_dir = fedprox_reward_run
    assert row["status"] == "finished:completed", row
    evals = [r["eval"]["per_task"]["gcd"] for r in read_metrics(run_dir)]
    assert [(e["greedy_reward"], e["greedy_accuracy"]) for e in evals] == [(0.5, 0.0), (0.5, 0.0)]


# One case through `flwr run` (every key's validation is unit-tested in tests/unit/test_config.py)
@pytest.mark.parametrize("override, key", [("strategy.mode='fedsgd'", "strategy.mode")])
def test_invalid_config_fails_the_run_at_start_naming_the_key(flower, tmp_path, override, key):
    row = flower.run(_overrides(tmp_path, "bad", override))
    assert row["status"] == "finished:failed"
    assert key in row["status-details"]
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()  # stopped before any round


def test_saved_adapter_loads_with_peft_and_generates(fedavg_run):
    """The fedavg run's final adapter (a run of its own cost a minute and checked nothing more)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pubswap_flwr.policy.model import resolve_model

    row, run_dir = fedavg_run
    assert row["status"] == "finished:completed", row
    adapter_dir = run_dir / "adapters" / "final"
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "embedded:tiny"  # portable: data/models/tiny of any checkout
    base = AutoModelForCausalLM.from_pretrained(resolve_model(config["base_model_name_or_path"]))
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir))  # saved beside the adapter
    prompt = "<|im_start|>user\nCalculate 4 + 7.\nReply with only the final answer as <answer>X</answer>.<|im_end|>\n" \
             "<|im_start|>assistant\n"
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "<answer>" in text
    loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert loaded and any(float(p.abs().sum()) > 0 for n, p in loaded.items() if "lora_B" in n)
    assert torch.is_tensor(next(iter(loaded.values())))
