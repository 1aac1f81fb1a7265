"""Every server optimizer (strategy.server-optimizer) in whole in-process runs under FedAvg and PubSwap: its state
(step count, moments) is in the server's checkpoint, so a run resumed after round 2 repeats the uninterrupted one's
metrics exactly, and the metrics row says what it did."""

from __future__ import annotations

import json

import pytest

from pubswap_flwr.algorithms import server_optimizers as optimizers
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from tests.golden.runs import comparable
from tests.tiers import fast_only

# a round of 2 replies (2 nodes, or 3 with one dropped) is applied: a robust rule keeps it by default (#54)
TINY = {"seed": 5, "train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 3,
        "eval.samples": 1, "eval.sampled": False, "train.local-steps": 1, "strategy.apply-below-robust": True}
MODES = {"fedavg": {}, "pubswap": {"strategy.mode": "pubswap", "pubswap.tau-swap": 1, "pubswap.public-prompts": 2}}


def _run(tmp_path, name: str, **flat) -> list[dict]:
    simulate_in_process({**TINY, **flat, "output.dir": str(tmp_path), "run-name": name}, 2)
    return read_metrics(tmp_path / name)


@pytest.mark.parametrize("name,mode", fast_only([(n, m) for m in MODES for n in optimizers.names() if n != "none"],
                                                fast=[(n, "fedavg") for n in optimizers.names() if n != "none"]))
def test_a_resumed_run_repeats_the_uninterrupted_metrics(tmp_path, name, mode):
    # "full" and "half": names of one length, as the run name and dir travel in every message
    flat = {**MODES[mode], "strategy.server-optimizer": name, "num-server-rounds": 3}
    full = _run(tmp_path, "full", **flat)
    _run(tmp_path, "half", **{**flat, "num-server-rounds": 2})
    state = json.loads((tmp_path / "half" / "checkpoint" / "state.json").read_text())
    assert state["protocol"][optimizers.STATE_KEY] == {"name": name, "steps": 2}
    assert all(key.startswith(f"server-{name}-") for key in state.get("adapters", {}))
    cut = _run(tmp_path, "half", **{**flat, "resume": True})
    assert [r["round"] for r in cut] == [0, 1, 2, 3]
    assert comparable(full) == comparable(cut)
    steps = [r["server_optimizer"] for r in full[1:]]
    assert [s["steps"] for s in steps] == [1, 2, 3]
    assert all(s["aggregate_norm"] > 0 and s["update_norm"] > 0 for s in steps)
