"""Checkpoint/resume: a PubSwap run killed (SIGKILL, mid-round) after round k and resumed with `resume = true`
produces the same metrics for rounds k+1..n as an uninterrupted run with the same seed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pubswap_flwr.server.metrics import read_metrics

pytestmark = pytest.mark.slow

# 3 rounds, killed inside round 2: the resumed run repeats round 2 (undoing the node state it had saved) and round 3
BASE = {"strategy.mode": "pubswap", "num-server-rounds": 3, "train.local-steps": 3, "pubswap.tau-swap": 2,
        "pubswap.public-prompts": 2, "train.prompts-per-step": 2, "train.completions-per-prompt": 4,
        "eval.items-per-task": 6, "seed": 4}


def _simulate(config: dict, **popen) -> subprocess.Popen:
    # without Ray: checkpoints, node state and resume are the ServerApp's and ClientApp's, the same on either engine
    return subprocess.Popen([sys.executable, "-m", "pubswap_flwr.cli", "simulate", "--engine", "inprocess",
                             "--nodes", "3", "--json", json.dumps(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, **popen)


def _comparable(row: dict) -> dict:
    """What must repeat exactly: held-out metrics, rewards, swaps by node index (Flower node ids differ per run)."""
    index = {node: c["node_index"] for node, c in row.get("clients", {}).items()}
    out = {"round": row["round"], "eval": row.get("eval"), "train_reward": row.get("train_reward"),
           "cumulative_reward": row.get("cumulative_reward"),
           "client_rewards": sorted((c["node_index"], c.get("train_reward")) for c in row.get("clients", {}).values())}
    if "public_steps" in row:
        out["swaps"] = [(s["prompts"], sorted((index[n], v) for n, v in s["responses_swapped"].items()),
                         sorted((index[n], v) for n, v in s["public_reward_before_swap"].items()))
                        for s in row["public_steps"]]
    return out


def _mid_round(run_dir, round_number: int) -> bool:
    """A node has started `round_number` (its round-start snapshot names it) and saved state since: the kill lands
    inside that round, with node state the resumed round must undo, and a round before the run's last."""
    for node in run_dir.glob("nodes/partition-*"):
        started = node / "round-start" / "round"
        saved = node / "node.json"
        try:
            if started.read_text().strip() == str(round_number) and \
                    saved.stat().st_mtime_ns > started.stat().st_mtime_ns:
                return True
        except FileNotFoundError:  # written between the glob and the read
            continue
    return False


def test_killed_run_resumes_and_repeats_the_uninterrupted_metrics(tmp_path):
    full = _simulate({**BASE, "output.dir": str(tmp_path), "run-name": "full"})

    cut_config = {**BASE, "output.dir": str(tmp_path), "run-name": "cut"}
    cut = _simulate(cut_config, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and not _mid_round(tmp_path / "cut", 2):
        assert cut.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(cut.pid, signal.SIGKILL)
    cut.wait()
    assert json.loads((tmp_path / "cut" / "status.json").read_text())["status"] == "running"  # killed, not done

    resumed = _simulate({**cut_config, "resume": True})
    assert resumed.wait(timeout=600) == 0
    assert full.wait(timeout=600) == 0

    a, b = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["round"] for r in a] == [r["round"] for r in b] == [0, 1, 2, 3]
    assert [_comparable(r) for r in a] == [_comparable(r) for r in b]
    assert json.loads((tmp_path / "cut" / "status.json").read_text())["status"] == "completed"


def test_resume_refuses_a_changed_config(tmp_path):
    from pubswap_flwr.config import ConfigError, ExperimentConfig
    from pubswap_flwr.server.checkpoint import ServerCheckpoint, check_compatible

    saved = ServerCheckpoint(round=2, config=ExperimentConfig.from_flat({"seed": 1, "run-name": "x"}).to_flat())
    check_compatible(saved, ExperimentConfig.from_flat({"seed": 1, "num-server-rounds": 20, "resume": True,
                                                        "run-name": "x"}))
    with pytest.raises(ConfigError, match="changed keys: seed, train.learning-rate"):
        check_compatible(saved, ExperimentConfig.from_flat({"seed": 2, "train.learning-rate": 0.1, "run-name": "x"}))
    with pytest.raises(ConfigError, match="below the checkpointed round 2"):
        check_compatible(saved, ExperimentConfig.from_flat({"seed": 1, "num-server-rounds": 1, "run-name": "x"}))
