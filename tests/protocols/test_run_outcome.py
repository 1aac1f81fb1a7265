"""A run's final status says whether its rounds trained anything: a run in which every round kept the global
adapter (all replies rejected, every client dropped) is `failed`, not `completed`, so a sweep re-runs it instead of
reporting the starting model as the experiment's result; rounds that trained nothing are named in the detail."""

from __future__ import annotations

import numpy as np
import pytest

from pubswap_flwr.server.metrics import read_metrics, read_status
from pubswap_flwr.server.runner import outcome, trained_nothing
from pubswap_flwr.simulation import simulate_in_process as simulate
from pubswap_flwr.wire.codecs import ADAPTER_KEY, adapter_from_record, adapter_record

# a round of 2 replies (2 nodes, or 3 with one dropped) is applied: a robust rule keeps it by default (#54)
TINY = {"train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 5, "eval.samples": 1,
        "train.local-steps": 1, "seed": 2, "strategy.apply-below-robust": True}


def _poison_rounds(rounds: set[int]):
    """A reply hook that puts a NaN in every client's adapter in `rounds` (each reply is then rejected)."""
    def hook(msg, context, reply):
        if reply.has_error() or ADAPTER_KEY not in reply.content:
            return reply
        if int(msg.content["config"]["server-round"]) not in rounds:
            return reply
        arrays = {k: np.array(v, dtype=np.float32) for k, v in adapter_from_record(reply.content[ADAPTER_KEY]).items()}
        first = sorted(arrays)[0]
        arrays[first].flat[0] = np.nan
        reply.content[ADAPTER_KEY] = adapter_record(arrays)
        return reply

    return hook


def test_a_run_in_which_no_round_aggregated_ends_failed_naming_why(tmp_path):
    simulate({**TINY, "num-server-rounds": 2, "output.dir": str(tmp_path), "run-name": "none"}, 2,
             reply_hook=_poison_rounds({1, 2}))
    rows = read_metrics(tmp_path / "none")
    assert [r.get("aggregated") for r in rows[1:]] == [False, False]
    status = read_status(tmp_path / "none")
    assert status["status"] == "failed"
    assert status["detail"].startswith("no round trained anything (2 rounds in ")


def test_a_run_with_some_rounds_that_trained_nothing_completes_and_names_them(tmp_path):
    simulate({**TINY, "num-server-rounds": 3, "output.dir": str(tmp_path), "run-name": "some"}, 2,
             reply_hook=_poison_rounds({2}))
    rows = read_metrics(tmp_path / "some")
    assert [r.get("aggregated") for r in rows[1:]] == [True, False, True]
    status = read_status(tmp_path / "some")
    assert status["status"] == "completed"
    assert "; 1 trained nothing (rounds 2;" in status["detail"]


def test_idle_clients_a_2_client_run_under_the_default_keeps_every_round_and_ends_failed_naming_why(tmp_path):
    simulate({**TINY, "strategy.apply-below-robust": False, "num-server-rounds": 2, "output.dir": str(tmp_path),
              "run-name": "two"}, 2)
    rows = read_metrics(tmp_path / "two")
    assert [r.get("aggregated") for r in rows[1:]] == [False, False]
    assert all(r["kept_reason"].startswith("2 replies") and r["robust"] is False for r in rows[1:])
    status = read_status(tmp_path / "two")
    assert status["status"] == "failed" and "the rows' 'kept_reason' and 'dropped' say why" in status["detail"]


def test_trained_nothing_reads_the_row():
    assert trained_nothing({"aggregated": False, "clients": {"5": {}}})
    assert trained_nothing({"clients": {}, "dropped": {"5": "no reply within strategy.timeout = 45 s"}})
    assert not trained_nothing({"aggregated": True, "clients": {"5": {}}})
    assert not trained_nothing({"clients": {"5": {}}})  # sapo: no aggregation, a node that replied


@pytest.mark.parametrize("rounds_run, idle, expected_status, words", [
    (3, [], "completed", "3 rounds in 1.5 s"),
    (3, [1, 3], "completed", "3 rounds in 1.5 s; 2 trained nothing (rounds 1, 3;"),
    (3, [1, 2, 3], "failed", "no round trained anything (3 rounds in 1.5 s)"),
    (0, [], "completed", "0 rounds in 1.5 s"),  # a resume of a run whose checkpoint was its last round
])
def test_outcome(rounds_run, idle, expected_status, words):
    status, detail = outcome(rounds_run, idle, 1.5)
    assert status == expected_status and detail.startswith(words)
