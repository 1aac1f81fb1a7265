"""The report's statistics: Student t quantiles, the t interval of a mean, and paired differences between arms by
seed."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Iterable

from .summaries import RunSummary

CONFIDENCE = 0.95
NAN = float("nan")
PAIRED = [  # the metrics each arm is compared to the baseline on, seed by seed
    ("sampled acc", "sampled_accuracy"),
    ("greedy pass@1", "greedy_accuracy"),
    ("sampled reward", "sampled_reward"),
    ("cumulative reward", "cumulative_reward"),
]
PAIRED_KEYS = tuple(key for _, key in PAIRED)


def t_two_sided_cdf(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer number of degrees of freedom (closed form, Abramowitz &
    Stegun 26.7.3-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        series, term = 1.0, 1.0
        for k in range(1, (df - 3) // 2 + 1):  # 1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...
            term *= (2 * k) / (2 * k + 1) * cos2
            series += term
        inner = theta + (sin * math.cos(theta) * series if df > 1 else 0.0)
        return min(1.0, 2.0 / math.pi * inner)
    series, term = 1.0, 1.0
    for k in range(1, (df - 2) // 2 + 1):  # 1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...
        term *= (2 * k - 1) / (2 * k) * cos2
        series += term
    return min(1.0, sin * series)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom, e.g. t_quantile(0.975, 2) =
    4.3027; by bisection on the closed-form CDF, to about 1e-12."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    coverage = 2 * p - 1
    low, high = 0.0, 1.0
    while t_two_sided_cdf(high, df) < coverage:
        low, high = high, high * 2
    for _ in range(200):
        mid = (low + high) / 2
        if t_two_sided_cdf(mid, df) < coverage:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """Mean of n values with its two-sided confidence interval (Student t, n-1 df); low/high are NaN for n < 2."""

    mean: float
    low: float
    high: float
    n: int
    sd: float = NAN

    @property
    def has_interval(self) -> bool:
        return self.n >= 2


def finite(values: Iterable[float | None]) -> list[float]:
    """The values as floats, None and NaN left out."""
    return [float(v) for v in values if v is not None and v == v]


def mean_ci(values: Iterable[float | None], confidence: float = CONFIDENCE) -> Interval:
    """Mean and its t confidence interval over the values (None and NaN left out)."""
    clean = finite(values)
    n = len(clean)
    if n == 0:
        return Interval(NAN, NAN, NAN, 0)
    mean = statistics.fmean(clean)
    if n == 1:
        return Interval(mean, NAN, NAN, 1)
    sd = statistics.stdev(clean)
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd)


def within(interval: Interval, low: float, high: float) -> Interval:
    """The interval cut to [low, high], the values the quantity can take (a t interval on a share near 0 or 1 can
    reach past them); the mean is left as it is."""
    if not interval.has_interval:
        return interval
    return replace(interval, low=min(max(interval.low, low), high), high=max(min(interval.high, high), low))


def mean_ci_with_item_variance(values: Iterable[float | None], item_variances: Iterable[float | None],
                               confidence: float = CONFIDENCE) -> Interval:
    """Mean of per-seed values whose held-out items are the same for every seed, where no item-level record exists:
    the t interval over seeds widened by the mean of the runs' own item variances (each a squared standard error over
    items), var = s²/n + mean(SE²). The item part does not shrink with more seeds, since every seed draws the same
    items; taking each run's SE² whole is conservative (a difference of two correlated evaluations is narrower)."""
    pairs = [(float(v), float(w)) for v, w in zip(values, item_variances)
             if v is not None and w is not None and v == v and w == w]
    n = len(pairs)
    if n < 2:
        return Interval(pairs[0][0], NAN, NAN, 1) if n else Interval(NAN, NAN, NAN, 0)
    clean = [v for v, _ in pairs]
    mean, sd = statistics.fmean(clean), statistics.stdev(clean)
    half = t_quantile((1 + confidence) / 2, n - 1) * math.sqrt(sd * sd / n + statistics.fmean(w for _, w in pairs))
    return Interval(mean, mean - half, mean + half, n, sd)


@dataclass
class PairedDifference:
    """One arm minus the baseline on the same seeds."""

    arm: str
    baseline: str
    seeds: list[int]                            # seeds both arms ran
    only_arm: list[int]                         # seeds left out: run by the arm only
    only_baseline: list[int]                    # ... by the baseline only
    per_seed: dict[str, dict[int, float]]       # metric -> seed -> arm - baseline
    intervals: dict[str, Interval]              # metric -> mean difference with its paired-t interval


def paired_differences(arms: dict[str, list[RunSummary]], baseline: str,
                       metrics: Iterable[str] = PAIRED_KEYS) -> list[PairedDifference]:
    """Every other arm minus `baseline`, seed by seed; seeds present in only one of the two are left out (and
    named). A seed whose value is missing (NaN) in either arm is left out of that metric only."""
    if baseline not in arms:
        raise ValueError(f"baseline arm {baseline!r} has no runs; arms: {list(arms)}")
    base = {r.seed: r for r in arms[baseline]}
    out = []
    for arm, members in arms.items():
        if arm == baseline:
            continue
        mine = {r.seed: r for r in members}
        seeds = sorted(set(mine) & set(base))
        per_seed: dict[str, dict[int, float]] = {}
        for key in metrics:
            diffs = {s: mine[s].values[key] - base[s].values[key] for s in seeds}
            per_seed[key] = {s: d for s, d in diffs.items() if d == d}
        out.append(PairedDifference(arm, baseline, seeds, sorted(set(mine) - set(base)),
                                    sorted(set(base) - set(mine)), per_seed,
                                    {key: mean_ci(values.values()) for key, values in per_seed.items()}))
    return out
