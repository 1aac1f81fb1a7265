"""report.md's 'Per task, over seeds × items' (report/task_differences.py): each arm minus the baseline and each arm's
change since round 0, task by task, from the tasks eval_items.jsonl records per item."""

from __future__ import annotations

import json
from pathlib import Path

from pubswap_flwr.report import write_report
from pubswap_flwr.report.formatting import fmt_ci
from pubswap_flwr.report.item_intervals import two_way_interval
from pubswap_flwr.report.summaries import item_values
from tests.report_tables import table_row

UIDS = ["eval/gcd/0", "eval/gcd/1", "eval/chain_sum/0", "eval/chain_sum/1"]
TASKS = ["gcd", "gcd", "chain_sum", "chain_sum"]


def _run(root: Path, arm: str, seed: int, final: list[int], start: list[int] | None = None,
         tasks: list[str] | None = TASKS) -> Path:
    """A 1-round run whose four held-out items score `start` (correct of 4 samples; 0 by default) at round 0 and
    `final` at round 1; `tasks=None` writes records without their tasks (as runs before them did)."""
    run = root / f"{arm}-s{seed}"
    run.mkdir(parents=True)
    start = start or [0, 0, 0, 0]

    def evaluation(counts: list[int]) -> dict:
        accuracy = sum(counts) / 16
        return {"greedy_accuracy": accuracy, "sampled_accuracy": accuracy, "sampled_reward": accuracy, "samples": 4,
                "per_task": {t: {"sampled_accuracy": sum(c for c, u in zip(counts, TASKS) if u == t) / 8}
                             for t in ("gcd", "chain_sum")}}

    rows = [{"round": 0, "mode": "fedavg", "eval": evaluation(start)},
            {"round": 1, "mode": "fedavg", "eval": evaluation(final), "train_reward": 0.1, "cumulative_reward": 0.1,
             "clients": {}, "dropped": {}}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    def record(counts: list[int]) -> dict:
        out = {"uids": UIDS, "greedy": [int(c >= 2) for c in counts], "sampled": counts, "samples": 4}
        return out if tasks is None else {**out, "tasks": tasks}

    items = [{"round": 0, "global": record(start)}, {"round": 1, "global": record(final)}]
    (run / "eval_items.jsonl").write_text("\n".join(json.dumps(r) for r in items) + "\n")
    return run


def _sweep(root: Path) -> list[Path]:
    # the arm solves gcd item 0 in seeds 0-1 and both gcd items in seed 2; chain_sum is the baseline's in every seed
    runs = [_run(root, "base", s, [0, 0, 2, 2]) for s in range(3)]
    runs += [_run(root, "arm", s, [4, 4 if s == 2 else 0, 2, 2], start=[0, 0, 2, 0]) for s in range(3)]
    return runs


def test_each_task_gets_the_paired_difference_of_its_own_items_over_seeds_and_items(tmp_path):
    text = write_report(tmp_path / "out", _sweep(tmp_path / "runs"), arm_order=["base", "arm"]).read_text()
    assert "## Per task, over seeds × items" in text

    def row(label: str) -> list[str]:
        return table_row(text, "Per task, over seeds × items", label)

    header = next(line for line in text.splitlines() if line.startswith("| | "))
    assert header == "| | chain_sum | gcd |"
    gcd = two_way_interval({0: {"eval/gcd/0": 1.0, "eval/gcd/1": 0.0}, 1: {"eval/gcd/0": 1.0, "eval/gcd/1": 0.0},
                            2: {"eval/gcd/0": 1.0, "eval/gcd/1": 1.0}})
    assert abs(gcd.mean - 4 / 6) < 1e-12 and gcd.has_interval
    assert row("arm − base") == ["0.000 [0.000, 0.000]", fmt_ci(gcd, 3, True)]
    # change since round 0: chain_sum item 0 stays at 0.5, item 1 rises 0 -> 0.5 in every seed; the baseline moves
    # only on chain_sum (0 -> 0.5 on both items)
    chain = two_way_interval({s: {"eval/chain_sum/0": 0.0, "eval/chain_sum/1": 0.5} for s in range(3)})
    assert row("arm: last − round 0") == [fmt_ci(chain, 3, True), fmt_ci(gcd, 3, True)]
    assert row("base: last − round 0") == ["+0.500 [+0.500, +0.500]", "0.000 [0.000, 0.000]"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    cell = summary["per_task"]["arm - base"]["gcd"]
    assert cell["mean"] == gcd.mean and cell["ci_low"] == gcd.low and cell["n"] == 3
    assert cell["covers"] == "seeds × items"
    assert set(summary["per_task"]) == {"arm - base", "base: last - round 0", "arm: last - round 0"}


def test_the_section_is_left_out_without_the_items_tasks_or_with_one_seed(tmp_path):
    runs = [_run(tmp_path / "old", "base", s, [0, 0, 2, 2], tasks=None) for s in range(2)]
    runs += [_run(tmp_path / "old", "arm", s, [4, 0, 2, 2], tasks=None) for s in range(2)]
    text = write_report(tmp_path / "out-old", runs, arm_order=["base", "arm"]).read_text()
    assert "## Paired differences against base" in text and "Per task, over seeds" not in text
    assert "per_task" not in json.loads((tmp_path / "out-old" / "summary.json").read_text())
    one = [_run(tmp_path / "one", "base", 0, [0, 0, 2, 2]), _run(tmp_path / "one", "arm", 0, [4, 0, 2, 2])]
    assert "Per task, over seeds" not in write_report(tmp_path / "out-one", one, arm_order=["base", "arm"]).read_text()


def test_runs_that_disagree_on_an_items_task_get_no_per_task_section(tmp_path):
    runs = [_run(tmp_path / "runs", "base", s, [0, 0, 2, 2]) for s in range(2)]
    runs += [_run(tmp_path / "runs", "arm", s, [4, 0, 2, 2], tasks=["gcd", "gcd", "chain_sum", "gcd"])
             for s in range(2)]
    text = write_report(tmp_path / "out", runs, arm_order=["base", "arm"]).read_text()
    assert "## Paired differences against base" in text and "Per task, over seeds" not in text


def test_item_values_reads_each_items_task_and_skips_a_task_list_of_another_length(tmp_path):
    run = _run(tmp_path, "fedavg", 0, [4, 2, 0, 0])
    values, tasks = item_values(run)
    assert tasks == dict(zip(UIDS, TASKS))
    assert values[1]["sampled_accuracy"] == dict(zip(UIDS, [1.0, 0.5, 0.0, 0.0]))
    short = _run(tmp_path / "short", "fedavg", 0, [4, 2, 0, 0], tasks=["gcd"])
    assert item_values(short)[1] == {}
