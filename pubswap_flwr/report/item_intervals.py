"""Intervals that cover both the seeds and the draw of held-out items: two-way cluster-robust over seeds x items.

Every run of a sweep is scored on the same held-out items, so a paired t interval over seeds sees none of the noise
from which questions were drawn: item effects are common to every seed and cancel out of the per-seed differences.
With each item's result per run (eval_items.jsonl) the mean difference over the seed x item table gets the variance
of Cameron, Gelbach & Miller (2011, two-way clustering): V = V_seed + V_item - V_cell, each a cluster-robust sum of
squared residual totals with the small-sample factor G/(G-1); the interval is mean +- t(S-1) sqrt(V), S the seeds.
Where the sum is not positive (a table that is nearly all seed x item interaction) V is the larger one-way part.
Chosen by simulation (benchmarks/interval_coverage.py, docs/results/interval-coverage): of five constructions it is
the narrowest that covers >= 95% (within Monte-Carlo error) over a grid of seed and item variances around
real-fedavg-long, 3 and 5 seeds, 64 and 192 items. The floor V >= max(V_seed, V_item) it replaced covered 99.5% at
the median for 9% more width; Satterthwaite's df, with V or with the unbiased two-way ANOVA variance, covered as
little as 90% and 92.5%.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Mapping

from .statistics import CONFIDENCE, NAN, Interval, t_quantile

INTERVAL_CONSTRUCTION = "two-way cluster-robust over seeds × items (Cameron-Gelbach-Miller), t with seeds - 1 df"
CONSTRUCTION_KEY = "item_interval_construction"  # summary.json's record of INTERVAL_CONSTRUCTION
ItemTable = Mapping[int, Mapping[str, float]]  # seed -> item uid -> value (e.g. arm minus baseline on that item)


def record_construction(summary: dict) -> None:
    """Note in summary.json's dict that some interval in it was made by two_way_interval."""
    summary.setdefault(CONSTRUCTION_KEY, INTERVAL_CONSTRUCTION)


def common_items(table: ItemTable) -> list[str]:
    """The items every seed has, in sorted order (a run that evaluated other items cannot be paired on them)."""
    seeds = list(table)
    if not seeds:
        return []
    shared = set(table[seeds[0]])
    for seed in seeds[1:]:
        shared &= set(table[seed])
    return sorted(shared)


def two_way_interval(table: ItemTable, confidence: float = CONFIDENCE) -> Interval:
    """Mean over the seed x item table with its two-way cluster-robust interval (module docstring); NaN bounds with
    one seed or one item. Items not present for every seed are left out."""
    items = common_items(table)
    seeds = sorted(table)
    n_seeds, n_items = len(seeds), len(items)
    if n_seeds == 0 or n_items == 0:
        return Interval(NAN, NAN, NAN, 0)
    cells = [[float(table[s][i]) for i in items] for s in seeds]
    mean = statistics.fmean(v for row in cells for v in row)
    if n_seeds < 2 or n_items < 2:
        return Interval(mean, NAN, NAN, 1)  # one seed or one item: no interval can be estimated
    residual = [[v - mean for v in row] for row in cells]
    total = n_seeds * n_items
    by_seed = sum(sum(row) ** 2 for row in residual) / total ** 2 * n_seeds / (n_seeds - 1)
    by_item = sum(sum(row[j] for row in residual) ** 2 for j in range(n_items)) / total ** 2 * n_items / (n_items - 1)
    by_cell = sum(v * v for row in residual for v in row) / total ** 2 * total / (total - 1)
    variance = by_seed + by_item - by_cell
    if variance <= 0:  # V_cell outweighs both one-way parts: keep the larger of them rather than no width
        variance = max(by_seed, by_item)
    half = t_quantile((1 + confidence) / 2, n_seeds - 1) * math.sqrt(variance)
    return Interval(mean, mean - half, mean + half, n_seeds)


def difference_table(arm: Mapping[int, Mapping[str, float]], base: Mapping[int, Mapping[str, float]]) -> dict:
    """seed -> item -> arm minus base, on the seeds and items both have."""
    out: dict[int, dict[str, float]] = {}
    for seed in sorted(set(arm) & set(base)):
        shared = set(arm[seed]) & set(base[seed])
        out[seed] = {item: float(arm[seed][item]) - float(base[seed][item]) for item in shared}
    return out


ITEM_METRICS = ("greedy_accuracy", "sampled_accuracy")  # the held-out metrics eval_items.jsonl can resolve by item


def last_evaluated(run) -> int | None:
    """The last round with a held-out evaluation in the run's metrics (None when there is none)."""
    rounds = [row["round"] for row in run.rows if row.get("eval")]
    return rounds[-1] if rounds else None


ItemFilter = Callable[[str], bool]  # keeps an item uid (e.g. one task's items)


def run_items(run, round_number: int | None, metric: str, keep: ItemFilter | None = None
              ) -> dict[str, float] | None:
    """One run's per-item values of `metric` at a round (only the items `keep` accepts, when given), or None when the
    run did not record them or none is kept."""
    if round_number is None:
        return None
    values = run.items.get(round_number, {}).get(metric) or {}
    if keep is not None:
        values = {uid: value for uid, value in values.items() if keep(uid)}
    return values or None


def paired_item_table(arm_runs: list, base_runs: list, metric: str, keep: ItemFilter | None = None
                      ) -> dict[int, dict[str, float]] | None:
    """seed -> item -> arm minus baseline at the last evaluated round (the items `keep` accepts), or None when any
    paired run lacks per-item results or the two runs of a seed last evaluated different rounds (a partial run)."""
    base = {r.seed: r for r in base_runs}
    arm_table, base_table = {}, {}
    for run in arm_runs:
        if run.seed not in base:
            continue
        at = last_evaluated(run)
        if at != last_evaluated(base[run.seed]):
            return None
        mine, theirs = run_items(run, at, metric, keep), run_items(base[run.seed], at, metric, keep)
        if mine is None or theirs is None:
            return None
        arm_table[run.seed], base_table[run.seed] = mine, theirs
    return difference_table(arm_table, base_table) if arm_table else None


def learning_item_table(runs: list, metric: str, keep: ItemFilter | None = None
                        ) -> dict[int, dict[str, float]] | None:
    """seed -> item -> last evaluated round minus round 0 (the items `keep` accepts), or None when any run lacks
    per-item results or was evaluated at round 0 alone."""
    last_table, first_table = {}, {}
    for run in runs:
        at = last_evaluated(run)
        if not at:
            return None
        last, first = run_items(run, at, metric, keep), run_items(run, 0, metric, keep)
        if last is None or first is None:
            return None
        last_table[run.seed], first_table[run.seed] = last, first
    return difference_table(last_table, first_table) if last_table else None


def seed_means(table: ItemTable) -> list[float]:
    """Each seed's mean over the items every seed has (the per-seed values behind two_way_interval's mean)."""
    items = common_items(table)
    return [statistics.fmean(float(table[s][i]) for i in items) for s in sorted(table)] if items else []


def paired_item_interval(arm_runs: list, base_runs: list, metric: str, keep: ItemFilter | None = None
                         ) -> Interval | None:
    """two_way_interval of paired_item_table (None where it is None: the caller then falls back to the seeds-only
    interval)."""
    table = paired_item_table(arm_runs, base_runs, metric, keep)
    return None if table is None else two_way_interval(table)


def learning_item_interval(runs: list, metric: str, keep: ItemFilter | None = None) -> Interval | None:
    """two_way_interval of learning_item_table (None where it is None)."""
    table = learning_item_table(runs, metric, keep)
    return None if table is None else two_way_interval(table)
