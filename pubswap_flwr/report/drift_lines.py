"""report.md's 'Client drift': how far apart the clients' adapters were when the server averaged them, per arm.

PubSwap's argument for swapping grows with drift (clients that train longer between averages move apart and have
more to give each other), so a sweep over tau or strategies shows the drift beside the result it explains.
"""

from __future__ import annotations

import math
import statistics

from ..metrics_schema import PARAMETER_DRIFT
from .formatting import escape_markdown as md
from .formatting import fmt_ci, fmt_rounds, interval_json
from .statistics import CONFIDENCE, mean_ci
from .summaries import RunSummary

Arms = dict[str, list[RunSummary]]


def _drifts(run: RunSummary) -> list[float]:
    """The run's parameter_drift per aggregated round, in round order; ValueError naming the run and round for a value
    that is not a finite number (metrics.jsonl is someone else's file)."""
    out = []
    for row in run.rows:
        value = row.get(PARAMETER_DRIFT)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{run.run_dir}: metrics.jsonl round {row.get('round')}: {PARAMETER_DRIFT} is "
                             f"{value!r}, not a finite number")
        out.append(float(value))
    return out


def drift_lines(arms: Arms, summary: dict) -> list[str]:
    """The section, for the arms whose every run recorded drift (FedAvg-style aggregation; a SAPO swarm averages
    nothing); fills summary["drift"]."""
    per_arm = {arm: [_drifts(r) for r in members] for arm, members in arms.items()}
    shown = {arm: runs for arm, runs in per_arm.items() if runs and all(runs)}
    if not shown:
        return []
    lines = ["", "## Client drift", "",
             "The L2 distance between two clients' adapter weights when the server averaged them (parameter_drift: "
             "mean over client pairs, after each round's local steps): at the first and the last aggregated round and "
             f"the mean over rounds, each a mean over seeds with its {CONFIDENCE:.0%} interval (t over seeds).", "",
             "| arm | first round | last round | mean over rounds | rounds |", "|---|---|---|---|---|"]
    summary["drift"] = {}
    for arm, runs in shown.items():
        columns = {"first": [d[0] for d in runs], "last": [d[-1] for d in runs],
                   "mean": [statistics.fmean(d) for d in runs]}
        intervals = {key: mean_ci(values) for key, values in columns.items()}
        summary["drift"][arm] = {key: interval_json(intervals[key], values) for key, values in columns.items()}
        lines.append(f"| {md(arm)} | " + " | ".join(fmt_ci(i) for i in intervals.values())
                     + f" | {fmt_rounds([len(d) for d in runs])} |")
    return lines
