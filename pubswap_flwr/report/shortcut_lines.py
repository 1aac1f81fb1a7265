"""report.md's 'Shortcut check': per task, the best constant answer's accuracy beside each arm's, the models'
modal-answer share, and every run whose answers collapsed onto one value (tasks/shortcuts.py)."""

from __future__ import annotations

import statistics

from ..metrics_schema import CONSTANT_ACCURACY, SHORTCUT_TASKS
from ..tasks.shortcuts import SHORTCUT_SHARE
from .formatting import code_span, fmt_value
from .formatting import escape_markdown as md
from .summaries import RunSummary

Arms = dict[str, list[RunSummary]]


def _mean(values: list) -> float:
    clean = [float(v) for v in values if isinstance(v, (int, float))]
    return statistics.fmean(clean) if clean else float("nan")


def flagged_runs(runs: list[RunSummary]) -> dict[str, list[str]]:
    """run name -> the tasks its last evaluation flagged (greedy or sampled answers collapsed)."""
    out = {}
    for run in runs:
        evaluated = [row["eval"] for row in run.rows if row.get("eval")]
        last = evaluated[-1] if evaluated else {}
        tasks = sorted({t for key in SHORTCUT_TASKS for t in (last.get(key) or []) if isinstance(t, str)})
        if tasks:
            out[run.run_dir.name] = tasks
    return out


def shortcut_lines(arms: Arms, runs: list[RunSummary], summary: dict) -> list[str]:
    """The section, only for runs whose evaluation recorded the constant-answer baseline; fills summary["shortcuts"]."""
    tasks = sorted({t for r in runs for t, v in r.per_task.items() if CONSTANT_ACCURACY in v})
    if not tasks:
        return []
    lines = ["", "## Shortcut check", "",
             "Per task: the accuracy of the best constant answer on the same held-out items (one answer given to "
             "every question), each arm's sampled accuracy minus it (mean over seeds), and the share of the model's "
             "greedy answers equal to its most frequent one (mean over seeds; highest seed in parentheses). A gain "
             "that a constant answer also reaches, or a modal share near 1, is a shortcut, not skill: a run is "
             f"flagged when a task's answers collapse onto one value more than {SHORTCUT_SHARE:.0%} of the time "
             "while the gold answers do not.", "",
             "| | " + " | ".join(md(t) for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    constant = {t: _mean([r.per_task.get(t, {}).get(CONSTANT_ACCURACY) for r in runs]) for t in tasks}
    answers = {t: next((r.per_task[t].get("constant_answer") for r in runs if t in r.per_task), None) for t in tasks}
    lines.append("| best constant answer | " + " | ".join(
        f"{fmt_value(constant[t])} (`{code_span(answers[t])}`)" if answers[t] else fmt_value(constant[t])
        for t in tasks) + " |")
    summary["shortcuts"] = {"constant_accuracy": constant, "arms": {}}
    for arm, members in arms.items():
        above = {t: _mean([r.per_task.get(t, {}).get("sampled_accuracy") for r in members]) - constant[t]
                 for t in tasks}
        shares = {t: [r.per_task.get(t, {}).get("greedy_modal_share") for r in members] for t in tasks}
        lines.append(f"| {md(arm)}: sampled − constant | " + " | ".join(
            "–" if above[t] != above[t] else f"{above[t]:+.3f}" for t in tasks) + " |")
        lines.append(f"| {md(arm)}: greedy modal share | " + " | ".join(
            _share_cell(shares[t]) for t in tasks) + " |")
        summary["shortcuts"]["arms"][arm] = {"sampled_minus_constant": above,
                                             "greedy_modal_share": {t: _mean(v) for t, v in shares.items()}}
    flagged = flagged_runs(runs)
    summary["shortcuts"]["flagged"] = flagged
    lines += ["", ("**Flagged**: " + "; ".join(f"{md(run)} ({', '.join(md(x) for x in t)})"
                                                for run, t in flagged.items()) + ".")
              if flagged else "No run's answers collapsed onto one value."]
    return lines


def _share_cell(values: list) -> str:
    clean = [float(v) for v in values if isinstance(v, (int, float))]
    if not clean:
        return "–"
    return f"{statistics.fmean(clean):.2f}" + (f" ({max(clean):.2f})" if len(clean) > 1 else "")
