"""report.md's 'Harder tier' and 'Sampling cost and gain per CPU-hour' (issue #53): held-out accuracy one curriculum
level above the start, and what each arm's trained groups and held-out gain cost in sampling and machine time."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from ..metrics_schema import (
    CLIENTS,
    CURRICULUM_LEVELS,
    DYNAMIC_FILLED_SHARE,
    EVAL,
    GREEDY_ACCURACY,
    HARDER_TIER,
    SAMPLED_ACCURACY,
    SAMPLING_S,
    TIME,
    TRAINED_GROUPS,
)
from .formatting import escape_markdown as md
from .formatting import fmt_ci, fmt_spread, fmt_value, interval_json, spread_json
from .item_intervals import learning_item_interval, paired_item_interval, record_construction
from .statistics import CONFIDENCE, Interval, finite, mean_ci, mean_ci_with_item_variance
from .summaries import RunSummary

Arms = dict[str, list[RunSummary]]
NAN = float("nan")
HARDER = [("greedy strict", GREEDY_ACCURACY), ("sampled strict", SAMPLED_ACCURACY)]
SAMPLE_S = "sample_s"  # a client's seconds sampling its own rollouts (the runner's client row)
APPROXIMATE = "seeds + items (approx.)"
SEEDS_ITEMS = "seeds × items"


def _tier(numbers: dict, tier: str | None) -> dict:
    return (numbers.get(tier) or {}) if tier else numbers


def tier_ends(run: RunSummary, tier: str | None = None) -> tuple[dict, dict] | None:
    """A run's held-out numbers at round 0 and at its last evaluated round (`tier`: HARDER_TIER for the harder tier),
    or None when it has no evaluated round after round 0 or that tier was not evaluated at both."""
    evaluated = [row for row in run.rows if row.get(EVAL)]
    if len(evaluated) < 2 or evaluated[0]["round"] != 0:
        return None
    first, last = _tier(evaluated[0][EVAL], tier), _tier(evaluated[-1][EVAL], tier)
    return (first, last) if first and last else None


def item_variance(numbers: dict, key: str) -> float:
    """The squared standard error over items of one held-out mean: the recorded SE for sampled accuracy, the
    binomial p(1-p)/items for greedy accuracy (one 0/1 per item); NaN when neither can be had."""
    se = numbers.get(f"{key}_se")
    if se is not None:
        return float(se) ** 2
    value, items = numbers.get(key), numbers.get("items")
    if value is None or not items:
        return NAN
    return float(value) * (1 - float(value)) / float(items)


def _change(runs: list[RunSummary], key: str, tier: str | None) -> tuple[Interval, list[float], str]:
    """last − round 0 over the arm's seeds: two-way over seeds × items where eval_items.jsonl resolves it, else the
    t interval widened by the runs' item variances."""
    ends = [e for e in (tier_ends(r, tier) for r in runs) if e is not None]
    changes = [last[key] - first[key] for first, last in ends if key in first and key in last]
    by_item = learning_item_interval(_on_tier(runs, tier), key)
    if by_item is not None:
        return by_item, changes, SEEDS_ITEMS
    variances = [item_variance(first, key) + item_variance(last, key) for first, last in ends
                 if key in first and key in last]
    interval, covers = _widened(changes, variances)
    return interval, changes, covers


def _on_tier(runs: list[RunSummary], tier: str | None) -> list[RunSummary]:
    """The runs with their per-item results of `tier` where the item intervals look for the held-out ones."""
    return runs if tier is None else [replace(r, items=r.harder_items) for r in runs]


def _widened(values: list[float], variances: list[float]) -> tuple[Interval, str]:
    """The interval over seeds widened by the item variances, or the plain t interval over seeds where a run did not
    record what its item variance needs; and what the interval covers."""
    if not values or any(math.isnan(v) for v in variances):
        return mean_ci(values), "seeds"
    return mean_ci_with_item_variance(values, variances), APPROXIMATE


def _paired_last(runs: list[RunSummary], base_runs: list[RunSummary], key: str
                 ) -> tuple[Interval, list[float], str]:
    """The arm minus the baseline at the harder tier's last evaluation, seed by seed: two-way over seeds × items where
    the runs recorded the tier's items, else the t interval widened by both runs' item variances."""
    base = {r.seed: tier_ends(r, HARDER_TIER) for r in base_runs}
    diffs, variances = [], []
    for run in runs:
        mine, theirs = tier_ends(run, HARDER_TIER), base.get(run.seed)
        if mine is None or theirs is None or key not in mine[1] or key not in theirs[1]:
            continue
        diffs.append(mine[1][key] - theirs[1][key])
        variances.append(item_variance(mine[1], key) + item_variance(theirs[1], key))
    by_item = paired_item_interval(_on_tier(runs, HARDER_TIER), _on_tier(base_runs, HARDER_TIER), key)
    if by_item is not None:
        return by_item, diffs, SEEDS_ITEMS
    interval, covers = _widened(diffs, variances)
    return interval, diffs, covers


def harder_tier_lines(arms: Arms, baseline: str | None, summary: dict) -> list[str]:
    """The section, only when every run evaluated the harder tier at round 0 and after; fills summary["harder"]."""
    if not arms or any(tier_ends(r, HARDER_TIER) is None for runs in arms.values() for r in runs):
        return []
    lines = ["", "## Harder tier", "",
             "Held-out strict accuracy on eval.harder-tier's items (the task mix one curriculum level above "
             "tasks.curriculum-start, items disjoint from the held-out ones), at round 0 and the last evaluated round, "
             f"mean over seeds, with {CONFIDENCE:.0%} intervals: over *{SEEDS_ITEMS}* as for the held-out tier where "
             "the runs recorded the tier's per-item results; for runs that did not (made before they were written), "
             "every seed evaluating the same items, the t interval over seeds widened by the runs' own variance over "
             "items (var = s²/n + mean SE²; greedy: the binomial p(1−p)/items): *"
             f"{APPROXIMATE}*, conservative; *seeds* where a run recorded no standard error.", "",
             f"| arm | metric | round 0 | last | last − round 0 [95% CI] | arm − {md(baseline or '–')}, last [95% CI] "
             "| CI covers |", "|---|---|---|---|---|---|---|"]
    summary["harder"] = {}
    for arm, runs in arms.items():
        summary["harder"][arm] = {}
        for label, key in HARDER:
            ends = [tier_ends(r, HARDER_TIER) for r in runs]
            start = [e[0][key] for e in ends if e and key in e[0]]
            end = [e[1][key] for e in ends if e and key in e[1]]
            change, changes, covers = _change(runs, key, HARDER_TIER)
            if covers == SEEDS_ITEMS:
                record_construction(summary)
            round0, last = (statistics.fmean(start) if start else NAN), (statistics.fmean(end) if end else NAN)
            entry: dict = {"round0": round0, "last": last,
                           "change": {**interval_json(change, changes), "covers": covers}}
            paired = "–"
            if baseline is not None and arm != baseline:
                against, diffs, paired_covers = _paired_last(runs, arms[baseline], key)
                entry["against_baseline"] = {**interval_json(against, diffs), "covers": paired_covers}
                paired = fmt_ci(against, 3, True)
            summary["harder"][arm][key] = entry
            lines.append(f"| {md(arm)} | {label} | {fmt_value(round0)} | {fmt_value(last)} | "
                         f"{fmt_ci(change, 3, True)} | {paired} | {covers} |")
    return lines


def sampling_per_round(run: RunSummary) -> float:
    """The mean over trained rounds of the clients' summed sampling seconds; NaN when no round recorded it."""
    values = [row[TIME][SAMPLING_S] for row in run.rows
              if row["round"] > 0 and TIME in row and row[TIME].get(SAMPLING_S) is not None]
    return statistics.fmean(values) if values else NAN


def sampling_per_trained_group(run: RunSummary) -> float:
    """The clients' sampling seconds over the run divided by the groups they trained on; NaN without both."""
    seconds = groups = 0.0
    for row in run.rows:
        for client in (row.get(CLIENTS) or {}).values():
            if client.get(SAMPLE_S) is not None and client.get(TRAINED_GROUPS) is not None:
                seconds += client[SAMPLE_S]
                groups += client[TRAINED_GROUPS]
    return seconds / groups if groups else NAN


def _client_mean(rows: list[dict], read) -> float:
    """The mean over the rows' client entries of what `read(client)` gives (None: left out); NaN when none gives one."""
    values = [v for row in rows for client in (row.get(CLIENTS) or {}).values() if (v := read(client)) is not None]
    return statistics.fmean(values) if values else NAN


def _levels(client: dict) -> float | None:
    levels = client.get(CURRICULUM_LEVELS)
    return statistics.fmean(levels.values()) if levels else None


def mean_level(run: RunSummary, last_only: bool = False) -> float:
    """tasks.curriculum: the mean level of the nodes' private tasks over client-rounds (or in the last round)."""
    rows = [row for row in run.rows if row.get(CLIENTS)]
    return _client_mean(rows[-1:] if last_only else rows, _levels)


def machine_cpu_hours(run: RunSummary) -> float:
    """Wall time × the CPUs of the machine that ran it (provenance.json's last start), in hours; NaN unrecorded."""
    from ..provenance import read

    starts = read(run.run_dir)
    cpus = starts[-1].device.cpus if starts else 0
    return run.values["wall_s"] * cpus / 3600 if cpus else NAN


def _ratio(value: float, base: float) -> str:
    """`value / base` as `1.23×`; `–` where the baseline is not a positive number (a ratio would mislead)."""
    if not (base > 0) or math.isnan(value):
        return "–"
    return f"{value / base:.2f}×"


def median(values: list[float]) -> float:
    """The median of the finite values; NaN without one."""
    clean = finite(values)
    return statistics.median(clean) if clean else NAN


def _scaled(interval: Interval, by: float) -> Interval:
    return replace(interval, mean=interval.mean * by, low=interval.low * by, high=interval.high * by,
                   sd=interval.sd * by)


def cost_lines(arms: Arms, baseline: str | None, summary: dict) -> list[str]:
    """The section, only when some run recorded the groups its clients trained on (the runs of issue #53 on; older ones
    can say no cost per group); fills summary["cost"]."""
    per_group = {arm: [sampling_per_trained_group(r) for r in runs] for arm, runs in arms.items()}
    if not any(not math.isnan(v) for values in per_group.values() for v in values):
        return []
    per_round = {arm: [sampling_per_round(r) for r in runs] for arm, runs in arms.items()}
    hours = {arm: [machine_cpu_hours(r) for r in runs] for arm, runs in arms.items()}
    base = baseline if baseline in arms else None

    def arm_median(values: dict[str, list[float]], arm: str | None) -> float:
        return median(values[arm]) if arm is not None else NAN

    lines = ["", "## Sampling cost and gain per CPU-hour", "",
             "Times are machine load, not a spread around a mean: each is the median over seeds with its range "
             "(fastest–slowest), and × baseline the ratio of the two arms' medians. *Sampling s per round*: the "
             "clients' summed seconds sampling their own rollouts, mean over the run's rounds; *per trained group*: "
             "those seconds over the run divided by the groups the clients trained on. *Filled*: "
             "train.dynamic-sampling's trained groups over the batch's (mean over client-rounds and seeds). *Level*: "
             "tasks.curriculum's mean level of the nodes' private tasks over client-rounds and seeds (last round in "
             "parentheses). *CPU-hours*: wall time × the CPUs of the machine that ran the run (provenance.json).", "",
             "| arm | sampling s per round | × baseline | sampling s per trained group | × baseline | filled | level | "
             "CPU-hours, median (range) |", "|---|---|---|---|---|---|---|---|"]
    summary["cost"] = {}
    for arm, runs in arms.items():
        filled = mean_ci(_client_mean(r.rows, lambda c: c.get(DYNAMIC_FILLED_SHARE)) for r in runs)
        level, level_last = mean_ci(mean_level(r) for r in runs), mean_ci(mean_level(r, True) for r in runs)
        summary["cost"][arm] = {"sampling_s_per_round": spread_json(per_round[arm]),
                                "sampling_s_per_trained_group": spread_json(per_group[arm]),
                                "filled_share": filled.mean, "level": level.mean, "level_last": level_last.mean,
                                "cpu_hours": spread_json(hours[arm])}
        level_text = "–" if level.n == 0 else f"{level.mean:.2f} ({level_last.mean:.2f})"
        lines.append(f"| {md(arm)} | {fmt_spread(per_round[arm], 1)} | "
                     f"{_ratio(median(per_round[arm]), arm_median(per_round, base))} | "
                     f"{fmt_spread(per_group[arm], 2)} | {_ratio(median(per_group[arm]), arm_median(per_group, base))} "
                     f"| {fmt_value(filled.mean, 2)} | {level_text} | {fmt_spread(hours[arm], 3)} |")
    tiers = [None] + ([HARDER_TIER] if any(tier_ends(r, HARDER_TIER) for runs in arms.values() for r in runs) else [])
    lines += ["", "*Gain*: held-out sampled strict accuracy, last evaluated round − round 0 (the intervals of 'Change "
              "since round 0' and 'Harder tier'); *per CPU-hour*: the gain and its interval divided by the arm's "
              "median CPU-hours (their spread over seeds, in the table above, is left out of the interval). "
              "*× baseline*: the ratio of the two arms' gains per CPU-hour, shown only where the baseline's gain is "
              "positive.", "",
              "| arm | gain [95% CI] | per CPU-hour [95% CI] | × baseline | "
              + ("harder-tier gain [95% CI] | per CPU-hour [95% CI] | × baseline | " if len(tiers) > 1 else "")
              + "CI covers |", "|---|---|---|---|" + "---|---|---|" * (len(tiers) - 1) + "---|"]
    gains = {arm: _gains(runs, median(hours[arm]), tiers, summary) for arm, runs in arms.items()}
    for arm, by_tier in gains.items():
        row, covered = [md(arm)], []
        for tier, found in by_tier.items():
            if found is None:
                row += ["–", "–", "–"]
                continue
            gain, rate, changes, covers = found
            covered.append(covers)
            summary["cost"][arm][f"gain_{tier}"] = {**interval_json(gain, changes), "covers": covers,
                                                    "per_cpu_hour": interval_json(rate, [])}
            base_found = gains[base][tier] if base is not None else None
            row += [fmt_ci(gain, 3, True), fmt_ci(rate, 3, True),
                    _ratio(rate.mean, base_found[1].mean if base_found is not None else NAN)]
        lines.append("| " + " | ".join(row + ["; ".join(covered) or "–"]) + " |")
    return lines


def _gains(runs: list[RunSummary], mean_hours: float, tiers: list[str | None], summary: dict
           ) -> dict[str, tuple[Interval, Interval, list[float], str] | None]:
    """Per tier ("held_out", HARDER_TIER): the arm's gain in sampled strict accuracy since round 0, that gain per
    CPU-hour, the per-seed gains and what the interval covers; None for a tier some run did not evaluate."""
    found: dict[str, tuple[Interval, Interval, list[float], str] | None] = {}
    for tier in tiers:
        name = tier or "held_out"
        if any(tier_ends(r, tier) is None for r in runs):
            found[name] = None
            continue
        gain, changes, covers = _change(runs, SAMPLED_ACCURACY, tier)
        if covers == SEEDS_ITEMS:
            record_construction(summary)
        rate = _scaled(gain, 1 / mean_hours) if mean_hours > 0 else Interval(NAN, NAN, NAN, 0)
        found[name] = (gain, rate, changes, covers)
    return found
