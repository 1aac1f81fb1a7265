"""Report grouping: arms keep the order they were given in (a sweep's order), seeds ascend within an arm."""

from __future__ import annotations

from pathlib import Path

from pubswap_flwr.report import RunSummary, group


def _run(arm: str, seed: int) -> RunSummary:
    return RunSummary(arm, seed, Path(f"runs/{arm}-s{seed}"), "sapo", {}, {}, [])


def test_group_keeps_the_given_arm_order_and_sorts_seeds():
    runs = [_run("sapo-8-0", 2), _run("sapo-8-0", 0), _run("sapo-2-6", 1), _run("sapo-4-4", 0), _run("sapo-2-6", 0)]
    arms = group(runs)
    assert list(arms) == ["sapo-8-0", "sapo-2-6", "sapo-4-4"]
    assert [r.seed for r in arms["sapo-8-0"]] == [0, 2]
    assert [r.seed for r in arms["sapo-2-6"]] == [0, 1]
