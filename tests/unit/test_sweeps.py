"""Sweep files: the shipped comparison presets parse with valid arms; bad sweep files give clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubswap_flwr.compare import SweepError, load_sweep

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name, arms, nodes, seeds", [
    ("compare-pubswap.toml", ["fedavg", "fedprox", "pubswap-random", "pubswap-balanced"], 4, [0, 1, 2]),
    ("compare-sapo.toml", ["sapo-8-0", "sapo-6-2", "sapo-4-4", "sapo-2-6"], 8, [0, 1, 2]),
    ("compare-sapo-long.toml", ["sapo-8-0", "sapo-4-4"], 8, [0]),
    ("compare-control-sapo-strong-weak.toml", ["sapo-8-0", "sapo-4-4", "sapo-2-6"], 4, [0, 1, 2]),
    ("compare-control-sapo-skills.toml", ["sapo-8-0", "sapo-4-4"], 4, [0, 1, 2]),
    ("compare-control-pubswap-experts.toml",
     ["fedavg", "fedprox", "pubswap-none", "pubswap-random", "pubswap-balanced"], 4, [0, 1, 2]),
])
def test_shipped_sweeps_are_valid(name, arms, nodes, seeds):
    sweep = load_sweep(CONFIGS / name)
    assert [a.name for a in sweep.arms] == arms
    assert all(a.error is None for a in sweep.arms)
    assert sweep.nodes == nodes and sweep.seeds == seeds
    config = sweep.config_for(sweep.arms[0], 1, Path("/tmp/out"))
    assert config["seed"] == 1 and config["run-name"] == f"{arms[0]}-s1" and config["output.dir"] == "/tmp/out/runs"


@pytest.mark.parametrize("name", ["compare-sapo.toml", "compare-sapo-long.toml",
                                  "compare-control-sapo-strong-weak.toml", "compare-control-sapo-skills.toml"])
def test_sapo_sweep_ratios_sum_to_eight(name):
    sweep = load_sweep(CONFIGS / name)
    for arm in sweep.arms:
        local, external = arm.overrides["sapo.local"], arm.overrides["sapo.external"]
        assert local + external == 8 and arm.name == f"sapo-{local}-{external}"


@pytest.mark.parametrize("text, message", [
    ("name = 'x'\n", "no [arms.<name>] tables"),
    ("seeds = []\n[arms.a]\nseed = 1\n", "s.toml: seeds: expected `array` of length >= 1"),
    ("seeds = [0, -1]\n[arms.a]\nseed = 1\n", "s.toml: seeds[1]: expected `int` >= 0"),
    ("seeds = [0.5]\n[arms.a]\nseed = 1\n", "s.toml: seeds[0]: expected `int`, got `float`"),
    ("colour = 1\n[arms.a]\nseed = 1\n", "unknown sweep keys ['colour']"),
    ("[config]\ntrain.local-steps = 0\n[arms.a]\nseed = 1\n", "the base config is invalid: train.local-steps = 0"),
    ("[arms]\na = 3\n", "s.toml: arms[...]: expected `object`, got `int`"),
    ("nodes = 0\n[arms.a]\nseed = 1\n", "s.toml: nodes: expected `int` >= 1"),
    ("timeout-s = '1h'\n[arms.a]\nseed = 1\n", "s.toml: timeout-s: expected `float`, got `str`"),  # was float()'d
    ("cpus-per-client = 1.5\n[arms.a]\nseed = 1\n", "s.toml: cpus-per-client: expected `int`, got `float`"),  # cut
    ("gpus-per-client = -1\n[arms.a]\nseed = 1\n", "s.toml: gpus-per-client: expected `float` >= 0.0"),
    ("gpus-per-client = 'all'\n[arms.a]\nseed = 1\n", "s.toml: gpus-per-client: expected `float`, got `str`"),
])
def test_bad_sweep_files_are_refused_with_a_reason(tmp_path, text, message):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(SweepError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_sweep(path)


def test_an_arm_with_an_unknown_key_is_kept_with_its_error(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("[arms.good]\nstrategy.mode = 'fedprox'\n[arms.bad]\nstrategy.mdoe = 'fedprox'\n")
    sweep = load_sweep(path)
    assert sweep.arms[0].error is None
    assert sweep.arms[1].error == "arm 'bad': unknown config key 'strategy.mdoe' (did you mean 'strategy.mode'?)"


def test_gpus_per_client_is_read_from_the_sweep_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("gpus-per-client = 0.25\n[arms.a]\nseed = 1\n")
    assert load_sweep(path).gpus_per_client == 0.25
    assert load_sweep(CONFIGS / "compare-sapo.toml").gpus_per_client == 0.0


def test_outcomes_of_an_only_invocation_keep_the_other_runs_in_sweep_order(tmp_path, caplog):
    import json

    from pubswap_flwr.compare import merged_outcomes

    sweep = load_sweep(CONFIGS / "real-pubswap.toml")  # 5 arms, seeds 0-2
    path = tmp_path / "outcomes.json"
    earlier = [{"arm": arm, "seed": seed, "status": "completed"} for seed in (0, 1, 2)
               for arm in ("fedavg", "pubswap-balanced")]
    path.write_text(json.dumps(earlier))
    now = [{"arm": "pubswap-none", "seed": 1, "status": "failed"}, {"arm": "fedavg", "seed": 0, "status": "completed",
                                                                     "reused": True}]
    merged = merged_outcomes(path, sweep, now)
    assert [(o["arm"], o["seed"], o["status"], o.get("reused")) for o in merged] == [
        ("fedavg", 0, "completed", True), ("pubswap-balanced", 0, "completed", None),
        ("fedavg", 1, "completed", None), ("pubswap-none", 1, "failed", None),
        ("pubswap-balanced", 1, "completed", None),
        ("fedavg", 2, "completed", None), ("pubswap-balanced", 2, "completed", None)]
    path.write_text("{not json")
    assert merged_outcomes(path, sweep, now) == [now[1], now[0]]
    assert "is not JSON" in caplog.text
