"""report.md's 'Per task, over seeds × items': each arm minus the baseline and each arm's change since round 0, task by
task, with intervals that also cover the draw of held-out items (item_intervals.two_way_interval).

A control's question is often about one task (the task a weak client trains on, the task only a peer practises), and
the overall figures dilute it with the others; the per-task means in 'Per task' carry no paired interval.
"""

from __future__ import annotations

from ..metrics_schema import CONSTANT_ACCURACY
from .formatting import escape_markdown as md
from .formatting import fmt_ci, interval_json
from .item_intervals import (
    INTERVAL_CONSTRUCTION,
    ItemFilter,
    learning_item_table,
    paired_item_table,
    record_construction,
    seed_means,
    two_way_interval,
)
from .statistics import CONFIDENCE, Interval
from .summaries import RunSummary

Arms = dict[str, list[RunSummary]]
METRIC = "sampled_accuracy"  # sampled pass@1 (strict where answers are tagged): what every control is judged on
Cell = tuple[Interval, list[float]]  # the interval and the per-seed means it was estimated from


def _only(task: str, item_tasks: dict[str, str]) -> ItemFilter:
    return lambda uid: item_tasks.get(uid) == task


def _item_tasks(runs: list[RunSummary]) -> tuple[dict[str, str], str]:
    """Item uid -> task over every run, or {} and why not: a run without per-item results says nothing, one whose
    records name no tasks (or two runs naming different tasks for one item) is worth a line."""
    if not runs or any(not r.items for r in runs):
        return {}, ""
    untasked = [r.run_dir.name for r in runs if not r.item_tasks]
    if untasked:
        return {}, f"{len(untasked)} of {len(runs)} runs recorded no task per held-out item ({md(untasked[0])}, ...)"
    merged: dict[str, str] = {}
    for run in runs:
        for uid, task in run.item_tasks.items():
            if merged.setdefault(uid, task) != task:
                return {}, f"runs disagree on the task of held-out item {md(uid)} ({md(run.run_dir.name)})"
    return merged, ""


def _cell(table: dict[int, dict[str, float]] | None) -> Cell | None:
    return None if table is None else (two_way_interval(table), seed_means(table))


def task_difference_lines(arms: Arms, baseline: str | None, runs: list[RunSummary], summary: dict) -> list[str]:
    """The section (only when every run recorded per-item results and their tasks, and some row has more than one
    seed); fills summary["task_differences"]: {"paired": {arm: {task: interval}}, "learning": {arm: {task: ...}}}."""
    item_tasks, why_not = _item_tasks(runs)
    if why_not:
        return ["", f"*Per task, over seeds × items*: left out: {why_not}."]
    tasks = sorted(set(item_tasks.values()))
    if not tasks:
        return []
    rows: list[tuple[str, str, str, dict[str, Cell | None]]] = []  # (label, kind, arm, task -> cell)
    if baseline is not None and baseline in arms:
        for arm, members in arms.items():
            if arm != baseline:
                rows.append((f"{md(arm)} − {md(baseline)}", "paired", arm, {t: _cell(paired_item_table(
                    members, arms[baseline], METRIC, _only(t, item_tasks))) for t in tasks}))
    for arm, members in arms.items():
        rows.append((f"{md(arm)}: last − round 0", "learning", arm, {
            t: _cell(learning_item_table(members, METRIC, _only(t, item_tasks))) for t in tasks}))
    rows = [row for row in rows if any(c is None or c[0].n > 1 for c in row[3].values())]  # not one seed's alone
    if not any(c is not None and c[0].n > 1 for row in rows for c in row[3].values()):
        return []
    record: dict = {"baseline": baseline, "covers": "seeds × items", "paired": {}, "learning": {}}
    for _, kind, arm, cells in rows:
        record[kind][arm] = {t: interval_json(*c) for t, c in cells.items() if c is not None}
    summary["task_differences"] = record
    record_construction(summary)
    own = " (self-reported: each item's value is the mean over the nodes' own adapters, as they reported them)" if any(
        r.values["self_reported"] for r in runs) else ""
    shortcut = (" Compare a task's gain with its best constant answer in 'Shortcut check'."
                if any(CONSTANT_ACCURACY in v for r in runs for v in r.per_task.values()) else "")
    lines = ["", "## Per task, over seeds × items", "",
             "Held-out sampled pass@1 (each item's share of samples scored right: `sampled acc` above) task by "
             f"task{own}: each arm minus the baseline at the last evaluated round, and each arm's last "
             "evaluated round minus round 0, mean over the paired items of every seed with its "
             f"{CONFIDENCE:.0%} interval: {INTERVAL_CONSTRUCTION} (– where a run lacks the round or the items)."
             f"{shortcut}", "",
             "| | " + " | ".join(md(t) for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    for label, _, _, cells in rows:
        lines.append(f"| {label} | " + " | ".join(
            "–" if (c := cells[t]) is None else fmt_ci(c[0], 3, True) for t in tasks) + " |")
    return lines
