"""report.md's 'Per task, over seeds × items': each arm minus the baseline and each arm's change since round 0, task by
task, with intervals that also cover the draw of held-out items (item_intervals.two_way_interval).

A control's question is often about one task (the task a weak client trains on, the task only a peer practises), and
the overall figures dilute it with the others; the per-task means in 'Per task' carry no paired interval.
"""

from __future__ import annotations

from .formatting import escape_markdown as md
from .formatting import fmt_ci
from .item_intervals import ItemFilter, learning_item_interval, paired_item_interval
from .statistics import CONFIDENCE
from .summaries import RunSummary

Arms = dict[str, list[RunSummary]]
METRIC = "sampled_accuracy"  # strict sampled pass@1: the headline every control is judged on


def _only(task: str, item_tasks: dict[str, str]) -> ItemFilter:
    return lambda uid: item_tasks.get(uid) == task


def _item_tasks(runs: list[RunSummary]) -> dict[str, str]:
    """Item uid -> task over every run; {} when any run lacks per-item results or their tasks, or two runs give one
    uid different tasks (they were not scored on the same items)."""
    if not runs or any(not r.items or not r.item_tasks for r in runs):
        return {}
    merged: dict[str, str] = {}
    for run in runs:
        for uid, task in run.item_tasks.items():
            if merged.setdefault(uid, task) != task:
                return {}
    return merged


def task_difference_lines(arms: Arms, baseline: str | None, runs: list[RunSummary], summary: dict) -> list[str]:
    """The section (only when every run recorded per-item results of tasks it can name, and some row has more than
    one seed); fills summary["per_task"] with each row's intervals by task."""
    item_tasks = _item_tasks(runs)
    tasks = sorted(set(item_tasks.values()))
    if not tasks:
        return []
    rows: list[tuple[str, str, dict]] = []  # (row label, summary key, task -> interval)
    if baseline is not None and baseline in arms:
        for arm, members in arms.items():
            if arm != baseline:
                rows.append((f"{md(arm)} − {md(baseline)}", f"{arm} - {baseline}", {
                    t: paired_item_interval(members, arms[baseline], METRIC, _only(t, item_tasks)) for t in tasks}))
    for arm, members in arms.items():
        rows.append((f"{md(arm)}: last − round 0", f"{arm}: last - round 0", {
            t: learning_item_interval(members, METRIC, _only(t, item_tasks)) for t in tasks}))
    rows = [(label, key, cells) for label, key, cells in rows
            if any(c is not None and c.n > 1 for c in cells.values())]
    if not rows:
        return []
    summary["per_task"] = {key: {t: {"mean": c.mean, "ci_low": c.low, "ci_high": c.high, "n": c.n,
                                     "covers": "seeds × items"} for t, c in cells.items() if c is not None}
                           for _, key, cells in rows}
    lines = ["", "## Per task, over seeds × items", "",
             "Held-out strict sampled pass@1, task by task: each arm minus the baseline at the last evaluated round, "
             "and each arm's last evaluated round minus round 0, mean over the paired items of every seed with its "
             f"{CONFIDENCE:.0%} interval over seeds × items (two-way cluster-robust). Compare a task's gain with its "
             "best constant answer in 'Shortcut check'.", "",
             "| | " + " | ".join(md(t) for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    for label, _, cells in rows:
        lines.append(f"| {label} | " + " | ".join(
            "–" if cells[t] is None else fmt_ci(cells[t], 3, True) for t in tasks) + " |")
    return lines
