"""report.md's 'Per task, over seeds × items' (report/task_differences.py): each arm minus the baseline and each arm's
change since round 0, task by task, from the tasks eval_items.jsonl records per item."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pubswap_flwr.report import write_report
from pubswap_flwr.report.formatting import fmt_ci
from pubswap_flwr.report.item_intervals import INTERVAL_CONSTRUCTION, two_way_interval
from pubswap_flwr.report.summaries import item_values
from tests.report_tables import table_row

UIDS = ["eval/gcd/0", "eval/gcd/1", "eval/chain_sum/0", "eval/chain_sum/1"]
TASKS = ["gcd", "gcd", "chain_sum", "chain_sum"]


def _run(root: Path, arm: str, seed: int, final: list[int] | None, start: list[int] | None = None,
         tasks: list[str] | None = TASKS) -> Path:
    """A 1-round run whose four held-out items score `start` (correct of 4 samples; 0 by default) at round 0 and
    `final` at round 1 (`final=None`: evaluated at round 0 only, as a run stopped early); `tasks=None` writes
    records without their tasks (as runs before them did)."""
    run = root / f"{arm}-s{seed}"
    run.mkdir(parents=True)
    start = start or [0, 0, 0, 0]

    def evaluation(counts: list[int]) -> dict:
        accuracy = sum(counts) / 16
        return {"greedy_accuracy": accuracy, "sampled_accuracy": accuracy, "sampled_reward": accuracy, "samples": 4,
                "per_task": {t: {"sampled_accuracy": sum(c for c, u in zip(counts, TASKS) if u == t) / 8}
                             for t in ("gcd", "chain_sum")}}

    rows = [{"round": 0, "mode": "fedavg", "eval": evaluation(start)},
            {"round": 1, "mode": "fedavg", "train_reward": 0.1, "cumulative_reward": 0.1, "clients": {}, "dropped": {}}]
    if final is not None:
        rows[1]["eval"] = evaluation(final)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    def record(counts: list[int]) -> dict:
        out = {"uids": UIDS, "greedy": [int(c >= 2) for c in counts], "sampled": counts, "samples": 4}
        return out if tasks is None else {**out, "tasks": tasks}

    items = [{"round": 0, "global": record(start)}] + ([] if final is None else [{"round": 1, "global": record(final)}])
    (run / "eval_items.jsonl").write_text("\n".join(json.dumps(r) for r in items) + "\n")
    return run


BASE_GCD = {0: [0, 0], 1: [4, 0], 2: [0, 0]}  # the baseline's gcd counts per seed (seed 1 solves item 0)


def _sweep(root: Path) -> list[Path]:
    # the arm solves gcd item 0 in every seed and item 1 in seed 2; chain_sum is the baseline's in every seed
    runs = [_run(root, "base", s, BASE_GCD[s] + [2, 2]) for s in range(3)]
    runs += [_run(root, "arm", s, [4, 4 if s == 2 else 0, 2, 2], start=[0, 0, 2, 0]) for s in range(3)]
    return runs


def test_each_task_gets_the_paired_difference_of_its_own_items_over_seeds_and_items(tmp_path):
    text = write_report(tmp_path / "out", _sweep(tmp_path / "runs"), arm_order=["base", "arm"]).read_text()
    assert "## Per task, over seeds × items" in text

    def row(label: str) -> list[str]:
        return table_row(text, "Per task, over seeds × items", label)

    header = next(line for line in text.splitlines() if line.startswith("| | "))
    assert header == "| | chain_sum | gcd |"
    # arm minus base on gcd, seed by seed: (1, 0), (0, 0), (1, 1): a wrong pairing of seeds would change it
    paired = two_way_interval({0: {"eval/gcd/0": 1.0, "eval/gcd/1": 0.0}, 1: {"eval/gcd/0": 0.0, "eval/gcd/1": 0.0},
                               2: {"eval/gcd/0": 1.0, "eval/gcd/1": 1.0}})
    assert abs(paired.mean - 3 / 6) < 1e-12 and paired.has_interval
    assert row("arm − base") == ["0.000 [0.000, 0.000]", fmt_ci(paired, 3, True)]
    gcd = two_way_interval({0: {"eval/gcd/0": 1.0, "eval/gcd/1": 0.0}, 1: {"eval/gcd/0": 1.0, "eval/gcd/1": 0.0},
                            2: {"eval/gcd/0": 1.0, "eval/gcd/1": 1.0}})
    # change since round 0: chain_sum item 0 stays at 0.5, item 1 rises 0 -> 0.5 in every seed; the baseline moves
    # only on chain_sum (0 -> 0.5 on both items)
    chain = two_way_interval({s: {"eval/chain_sum/0": 0.0, "eval/chain_sum/1": 0.5} for s in range(3)})
    assert row("arm: last − round 0") == [fmt_ci(chain, 3, True), fmt_ci(gcd, 3, True)]
    base_gcd = two_way_interval({s: {"eval/gcd/0": BASE_GCD[s][0] / 4, "eval/gcd/1": 0.0} for s in range(3)})
    assert row("base: last − round 0") == ["+0.500 [+0.500, +0.500]", fmt_ci(base_gcd, 3, True)]
    record = json.loads((tmp_path / "out" / "summary.json").read_text())["task_differences"]
    assert record["baseline"] == "base" and record["covers"] == "seeds × items"
    cell = record["paired"]["arm"]["gcd"]
    assert (cell["mean"], cell["ci_low"], cell["n"]) == (paired.mean, paired.low, 3)
    assert cell["values"] == [0.5, 0.0, 1.0]  # the per-seed means the interval was estimated from
    assert set(record["learning"]) == {"base", "arm"} and set(record["paired"]) == {"arm"}


def test_interval_construction_is_quoted_by_the_per_task_section(tmp_path):
    text = write_report(tmp_path / "out", _sweep(tmp_path / "runs"), arm_order=["base", "arm"]).read_text()
    section = text.split("## Per task, over seeds × items\n", 1)[1].split("\n## ", 1)[0]
    assert f"interval: {INTERVAL_CONSTRUCTION} (– where a run lacks the round or the items)." in section
    assert "two-way cluster-robust;" not in section  # the old wording named no construction


def test_a_run_evaluated_at_round_0_alone_gets_no_difference_rather_than_a_false_zero(tmp_path):
    # arm seed 2 stopped before its last evaluation: its paired and change cells need a round it does not have
    runs = [_run(tmp_path / "runs", "base", s, [0, 0, 2, 2]) for s in range(3)]
    runs += [_run(tmp_path / "runs", "arm", s, [4, 0, 2, 2] if s < 2 else None) for s in range(3)]
    text = write_report(tmp_path / "out", runs, arm_order=["base", "arm"]).read_text()
    assert table_row(text, "Per task, over seeds × items", "arm − base") == ["–", "–"]
    assert table_row(text, "Per task, over seeds × items", "arm: last − round 0") == ["–", "–"]
    assert table_row(text, "Per task, over seeds × items", "base: last − round 0") == [
        "+0.500 [+0.500, +0.500]", "0.000 [0.000, 0.000]"]


def test_the_section_is_left_out_without_the_items_tasks_or_with_one_seed(tmp_path):
    runs = [_run(tmp_path / "old", "base", s, [0, 0, 2, 2], tasks=None) for s in range(2)]
    runs += [_run(tmp_path / "old", "arm", s, [4, 0, 2, 2], tasks=None) for s in range(2)]
    text = write_report(tmp_path / "out-old", runs, arm_order=["base", "arm"]).read_text()
    assert "## Paired differences against base" in text and "## Per task, over seeds" not in text
    assert ("*Per task, over seeds × items*: left out: 4 of 4 runs recorded no task per held-out item (base-s0, ...)."
            in text)
    assert "task_differences" not in json.loads((tmp_path / "out-old" / "summary.json").read_text())
    one = [_run(tmp_path / "one", "base", 0, [0, 0, 2, 2]), _run(tmp_path / "one", "arm", 0, [4, 0, 2, 2])]
    assert "Per task, over seeds" not in write_report(tmp_path / "out-one", one, arm_order=["base", "arm"]).read_text()


def test_runs_that_disagree_on_an_items_task_get_no_per_task_section(tmp_path):
    runs = [_run(tmp_path / "runs", "base", s, [0, 0, 2, 2]) for s in range(2)]
    runs += [_run(tmp_path / "runs", "arm", s, [4, 0, 2, 2], tasks=["gcd", "gcd", "chain_sum", "gcd"])
             for s in range(2)]
    text = write_report(tmp_path / "out", runs, arm_order=["base", "arm"]).read_text()
    assert "## Paired differences against base" in text and "## Per task, over seeds" not in text
    assert "left out: runs disagree on the task of held-out item eval/chain_sum/1 (arm-s0)." in text


def test_item_values_reads_each_items_task_and_refuses_a_task_list_of_another_length(tmp_path):
    run = _run(tmp_path, "fedavg", 0, [4, 2, 0, 0])
    values, tasks = item_values(run)
    assert tasks == dict(zip(UIDS, TASKS))
    assert values[1]["sampled_accuracy"] == dict(zip(UIDS, [1.0, 0.5, 0.0, 0.0]))
    short = _run(tmp_path / "short", "fedavg", 0, [4, 2, 0, 0], tasks=["gcd"])
    with pytest.raises(ValueError, match=r"eval_items.jsonl:1: round 0: 'global' lists 1 tasks for 4 uids$"):
        item_values(short)
    # two records of one run (two SAPO nodes) naming different tasks for one item: the server never writes that (it
    # rejects a node's evaluation naming another task than the item's), so the file is refused, not half-read
    split = _run(tmp_path / "split", "sapo", 0, [4, 2, 0, 0])
    rows = [json.loads(line) for line in (split / "eval_items.jsonl").read_text().splitlines()]
    for row in rows:
        node = row.pop("global")
        row["0"], row["1"] = node, {**node, "tasks": ["gcd", "gcd", "chain_sum", "gcd"]}
    (split / "eval_items.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match=r"round 0: '1' names task 'gcd' for item 'eval/chain_sum/1', recorded "
                                         r"before as 'chain_sum'$"):
        item_values(split)
