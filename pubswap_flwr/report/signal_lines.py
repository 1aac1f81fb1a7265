"""report.md's 'Learning signal': the share of trained groups whose rewards differed (GRPO learns only from those),
and in SAPO the external groups a receiver could use per round, per arm (issue #53)."""

from __future__ import annotations

import math
import statistics

from ..metrics_schema import CLIENTS, EXTERNAL_USABLE, ZERO_ADVANTAGE_SHARE
from .formatting import escape_markdown as md
from .formatting import fmt_ci, interval_json
from .statistics import CONFIDENCE, mean_ci, within
from .summaries import RunSummary

Arms = dict[str, list[RunSummary]]
NAN = float("nan")


def informative_share(run: RunSummary) -> float:
    """The mean over the run's rounds that recorded it of the share of trained groups with a signal (1 minus the
    round's mean zero-advantage share over clients); NaN when no round did. The rows were checked on reading
    (server/metrics.py's MetricsRow bounds the share to [0, 1])."""
    shares = [1.0 - row[ZERO_ADVANTAGE_SHARE] for row in run.rows
              if row["round"] > 0 and row.get(ZERO_ADVANTAGE_SHARE) is not None]
    return statistics.fmean(shares) if shares else NAN


def usable_external(run: RunSummary) -> float:
    """SAPO: the mean over receiver-rounds of the external groups that passed re-scoring with rewards that differ;
    NaN when none recorded it."""
    counts = [client[EXTERNAL_USABLE] for row in run.rows for client in (row.get(CLIENTS) or {}).values()
              if client.get(EXTERNAL_USABLE) is not None]
    return statistics.fmean(counts) if counts else NAN


def signal_lines(arms: Arms, summary: dict) -> list[str]:
    """The section, only when some run recorded the share; fills summary["signal"] and each run's entry in
    summary["runs"] (which per_run_lines made)."""
    values = {arm: [(informative_share(r), usable_external(r)) for r in members] for arm, members in arms.items()}
    if not any(not math.isnan(share) for runs in values.values() for share, _ in runs):
        return []
    lines = ["", "## Learning signal", "",
             "Share of the groups the clients trained on whose rewards differed (GRPO learns nothing from a group "
             "whose rewards are all equal): per run the mean over rounds of the round's mean over clients, then the "
             f"mean over seeds with its {CONFIDENCE:.0%} interval (t over seeds, cut to the values a share or a "
             "count can take). SAPO: the external groups a receiver could use per round (re-scored, rewards that "
             "differ; it trains on at most J of them), the mean "
             "over receiver-rounds. Both are what the nodes reported.", "",
             "| arm | informative share of trained groups | usable external groups per receiver-round |",
             "|---|---|---|"]
    summary["signal"] = {}
    for arm, runs in values.items():
        shares, usable = [s for s, _ in runs], [u for _, u in runs]
        share_ci, usable_ci = within(mean_ci(shares), 0.0, 1.0), within(mean_ci(usable), 0.0, math.inf)
        summary["signal"][arm] = {"informative_share": interval_json(share_ci, shares),
                                  "external_usable": interval_json(usable_ci, usable)}
        for run, (share, count) in zip(arms[arm], runs):
            entry = summary["runs"].get(run.run_dir.name)
            if entry is not None:
                entry.update(informative_share=share, external_usable=count)
        lines.append(f"| {md(arm)} | {fmt_ci(share_ci)} | {fmt_ci(usable_ci)} |")
    return lines
