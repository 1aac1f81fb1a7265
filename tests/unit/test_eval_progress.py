"""Held-out evaluation reports its progress with an ETA (items done of all, elapsed, ETA) on the project's logger,
at most every few seconds: a real model's evaluation takes many minutes and printed nothing meanwhile."""

from __future__ import annotations

import itertools
import logging
import re

from pubswap_flwr.evaluation import ProgressLog, evaluate
from pubswap_flwr.settings import EvalSettings
from pubswap_flwr.tasks import TaskItem
from tests.unit.test_evaluation import ScriptedPolicy

LINE = re.compile(r"held-out evaluation: greedy (\d+)/40 items, (?:(\d+) min )?(\d+) s elapsed, "
                  r"ETA (?:(\d+) min )?(\d+) s$")


def _seconds(minutes: str | None, seconds: str) -> int:
    return int(minutes or 0) * 60 + int(seconds)


def test_eval_progress_eta_lines_count_items_and_the_eta_falls(caplog):
    items = [TaskItem(f"u{i}", "gcd", f"question {i}", "1", "exact") for i in range(40)]
    policy = ScriptedPolicy({i.uid: "<answer>1</answer>" for i in items}, {})
    ticks = itertools.count(0, 7)  # a fake clock: 7 s pass between two readings
    progress = ProgressLog("held-out evaluation", clock=lambda: float(next(ticks)), every=20.0)
    with caplog.at_level(logging.INFO, logger="pubswap_flwr"):
        evaluate(policy, items, EvalSettings(sampled=False, batch_size=4), progress=progress)
    lines = [r.getMessage() for r in caplog.records if r.name == "pubswap_flwr"]
    parsed = [LINE.fullmatch(line) for line in lines]
    assert all(parsed), lines
    done = [int(m.group(1)) for m in parsed]
    etas = [_seconds(m.group(4), m.group(5)) for m in parsed]
    elapsed = [_seconds(m.group(2), m.group(3)) for m in parsed]
    assert len(lines) >= 3 and done == sorted(set(done)) and done[-1] == 40  # the last batch always reports
    assert etas == sorted(etas, reverse=True) and etas[0] > etas[-1] == 0
    assert all(b - a >= 20 for a, b in zip(elapsed, elapsed[1:-1]))  # not more often than `every`
    assert etas[0] == round(elapsed[0] * (40 - done[0]) / done[0])  # the rate so far, over the items left


def test_eval_progress_eta_formats_minutes():
    ticks = iter([0.0, 600.0])
    lines = []
    progress = ProgressLog("held-out evaluation", clock=lambda: next(ticks), every=0.0, emit=lines.append)
    progress("greedy + sampled", 50, 200)
    assert lines == ["held-out evaluation: greedy + sampled 50/200 items, 10 min 0 s elapsed, ETA 30 min 0 s"]


def test_eval_progress_eta_the_servers_evaluation_logs_it_and_stops_on_ctrl_c(caplog):
    """The server's evaluator passes the progress lines to every evaluation, and each batch checks for a Ctrl-C (the
    flag `pubswap simulate` sets when Ray's ServerApp thread is not the one interrupted)."""
    import pytest

    from pubswap_flwr import interruption
    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.server.app import GlobalEvaluator

    evaluator = GlobalEvaluator(ExperimentConfig.from_flat({"eval.items-per-task": 2, "eval.samples": 1,
                                                            "model.threads": 1}))
    adapter = evaluator.initial_adapter()
    with caplog.at_level(logging.INFO, logger="pubswap_flwr"):
        evaluator.evaluate(adapter)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("held-out evaluation: ")]
    total = len(evaluator.items)
    assert lines and lines[-1].startswith("held-out evaluation: ") and f" {total}/{total} items, " in lines[-1]
    assert lines[-1].endswith("ETA 0 s")
    interruption.interrupt()
    try:
        with pytest.raises(interruption.RunInterrupted):
            evaluator.evaluate(adapter)
    finally:
        interruption.clear_interrupt()


def test_eval_progress_eta_each_pass_is_timed_from_its_own_start():
    # a greedy pass of 10 items in 100 s, then a sampled pass 4x slower per item: its ETA is its own rate
    now = [0.0]
    lines: list[str] = []
    progress = ProgressLog("held-out evaluation", clock=lambda: now[0], every=0.0, emit=lines.append)
    for done in (5, 10):
        now[0] += 50.0
        progress("greedy", done, 10)
    now[0] += 200.0
    progress("sampled", 5, 10)
    assert lines[-1].endswith("sampled 5/10 items, 3 min 20 s elapsed, ETA 3 min 20 s")
