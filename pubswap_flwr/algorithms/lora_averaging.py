"""LoRA adapter aggregation (weighted mean of every tensor, A and B separately, as the PubSwap paper does), robust
variants (geometric median, coordinate-wise median, trimmed mean, update-norm clipping, clipping relative to the
round's median update norm), idle replies counted as one vote, when a round's aggregate may be called robust or
applied at all, and parameter-space drift. Pure numpy."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np

log = logging.getLogger("pubswap_flwr")

Adapter = dict[str, np.ndarray]
ROBUST = ("geometric-median", "median", "trimmed-mean")  # rules that outvote b bad clients of n >= 2b + 1
MIN_ROBUST_REPLIES = 3  # 2b + 1 for b = 1: of 2 replies no rule can tell which one is bad


class AggregationError(ValueError):
    """Adapters cannot be combined (no inputs, key or shape mismatch, bad weights)."""


def _check(adapters: Sequence[Adapter], weights: Sequence[float] | None = None) -> list[str]:
    if not adapters:
        raise AggregationError("no adapters to aggregate")
    keys = sorted(adapters[0])
    for i, adapter in enumerate(adapters[1:], start=1):
        if sorted(adapter) != keys:
            raise AggregationError(f"adapter {i} has different tensor keys")
        for key in keys:
            if adapter[key].shape != adapters[0][key].shape:
                raise AggregationError(f"adapter {i}: {key} has shape {adapter[key].shape}, "
                                       f"expected {adapters[0][key].shape}")
    if weights is not None:
        if len(weights) != len(adapters):
            raise AggregationError(f"{len(weights)} weights for {len(adapters)} adapters")
        if any(w < 0 or not np.isfinite(w) for w in weights) or sum(weights) <= 0:
            raise AggregationError(f"weights must be finite, >= 0 and not all 0: {list(weights)}")
    return keys


def weighted_mean(adapters: Sequence[Adapter], weights: Sequence[float]) -> Adapter:
    """Σ w_i·x_i / Σ w_i per tensor, in fp32 (inputs may be fp16)."""
    keys = _check(adapters, weights)
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w.sum()):  # huge but finite weights: scale first so their sum does not overflow
        w = w / w.max()
    w = w / w.sum()
    return {k: np.sum([wi * a[k].astype(np.float64) for wi, a in zip(w, adapters)], axis=0).astype(np.float32)
            for k in keys}


def coordinate_median(adapters: Sequence[Adapter]) -> Adapter:
    keys = _check(adapters)
    return {k: np.median(np.stack([a[k].astype(np.float32) for a in adapters]), axis=0) for k in keys}


def trimmed_mean(adapters: Sequence[Adapter], trim_fraction: float) -> Adapter:
    """Per coordinate, drop the floor(trim·n) largest and smallest values, average the rest."""
    keys = _check(adapters)
    n = len(adapters)
    cut = int(trim_fraction * n)
    if n - 2 * cut < 1:
        raise AggregationError(f"trim fraction {trim_fraction} leaves no values from {n} adapters")
    if cut == 0:
        log.warning("trimmed mean with trim fraction %s trims nothing from %d adapters (floor(%s x %d) = 0): this "
                    "round is a plain mean", trim_fraction, n, trim_fraction, n)
    out = {}
    for k in keys:
        stacked = np.sort(np.stack([a[k].astype(np.float32) for a in adapters]), axis=0)
        out[k] = stacked[cut:n - cut].mean(axis=0)
    return out


def geometric_median(adapters: Sequence[Adapter], weights: Sequence[float] | None = None, *, iterations: int = 200,
                     tolerance: float = 1e-10) -> Adapter:
    """The point minimising the (weighted) sum of L2 distances to the adapters, all tensors as one vector, by
    Weiszfeld's iteration from the mean, in float64. Unlike a coordinate-wise rule it bounds what a minority moves it
    in any direction: each point pulls with its weight whatever its distance (Pillutla et al.'s RFA), so b clients of
    total weight below half move it at most a bounded multiple of the others' spread."""
    keys = _check(adapters, weights)
    w = np.ones(len(adapters)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.max() if np.isfinite(w.max()) and w.max() > 0 else w
    w = w / w.sum()
    points = np.stack([np.concatenate([a[k].astype(np.float64).ravel() for k in keys]) for a in adapters])
    scale = max(float(np.abs(points).max()), 1e-30)
    points = points / scale  # Weiszfeld is scale-equivariant; this keeps the squared distances finite
    # Every iterate is a convex combination c of the points, so the iteration runs on c with the Gram matrix of the
    # points centred at the weighted mean (n x n; centring keeps the distances free of cancellation): no pass over
    # the adapters' millions of values per step. The estimate is mean + c @ centred.
    mean = w @ points
    centred = points - mean
    gram = centred @ centred.T
    mean_sq, mean_dot = float(mean @ mean), centred @ mean
    c = w.copy()
    floor = 1e-12  # smoothing: a point the estimate reaches does not divide by zero
    for _ in range(iterations):
        gc = gram @ c
        distances = np.maximum(np.sqrt(np.maximum(np.diag(gram) - 2 * gc + float(c @ gc), 0.0)), floor)
        beta = w / distances
        nxt = beta / beta.sum()
        step = nxt - c
        moved = float(np.sqrt(max(float(step @ gram @ step), 0.0)))
        c = nxt
        norm_sq = mean_sq + 2 * float(c @ mean_dot) + float(c @ gram @ c)  # |mean + c @ centred|^2
        if moved <= tolerance * max(1.0, float(np.sqrt(max(norm_sq, 0.0)))):
            break
    z = (mean + c @ centred) * scale
    out, at = {}, 0
    for k in keys:
        shape = adapters[0][k].shape
        size = int(np.prod(shape))
        out[k] = z[at:at + size].reshape(shape).astype(np.float32)
        at += size
    return out


def update_norm(adapter: Adapter, reference: Adapter) -> float:
    """The L2 norm of adapter - reference over all tensors, summed in key order (a global restored from a checkpoint
    may list its tensors in another order: a resumed run then repeats the norms to the last bit)."""
    return float(np.sqrt(sum(np.sum((adapter[k].astype(np.float64) - reference[k]) ** 2) for k in sorted(reference))))


def clip_update(adapter: Adapter, reference: Adapter, max_norm: float) -> Adapter:
    """Scale the update (adapter − reference) down to `max_norm` when it is longer."""
    norm = update_norm(adapter, reference)
    if max_norm <= 0 or norm <= max_norm:
        return {k: v.astype(np.float32) for k, v in adapter.items()}
    scale = max_norm / norm
    return {k: (reference[k] + scale * (adapter[k].astype(np.float32) - reference[k])).astype(np.float32)
            for k in reference}


def _scaled(adapter: Adapter, reference: Adapter, scale: float) -> Adapter:
    return {k: (reference[k] + scale * (adapter[k].astype(np.float32) - reference[k])).astype(np.float32)
            for k in reference}


def median_clip(adapters: Sequence[Adapter], reference: Adapter, factor: float
                ) -> tuple[list[Adapter], float, list[float]]:
    """Each update (adapter − reference) scaled down to `factor` × the median of the updates' norms when it is
    longer, so no client moves the average more than `factor` times as far as the middle client does, whatever its
    magnitude. Like the coordinate median it outvotes b clients only when n >= 2b + 1 (the median of 2 norms is
    their mean). A median of 0 (most clients sent no change) clips nothing: scaling the rest to 0 would hand that
    majority the round and name the others as the clipped ones. Returns the adapters (the same objects where not
    clipped), the bound, and every update's norm."""
    norms = [update_norm(a, reference) for a in adapters]
    bound = factor * float(np.median(norms)) if norms else 0.0
    if bound <= 0:
        return list(adapters), bound, norms
    out = [a if norm <= bound else _scaled(a, reference, bound / norm) for a, norm in zip(adapters, norms)]
    return out, bound, norms


def not_robust(method: str, votes: int, median_norm: float, idle: int = 0) -> str | None:
    """Why a round's aggregate by `method` of `votes` updates (`idle` idle replies counted as one of them) with this
    median update norm cannot be called robust (None: it outvotes b bad clients of n >= 2b + 1)."""
    if method not in ROBUST:
        return f"strategy.aggregation = {method!r} bounds no direction (median-clip bounds magnitude only)"
    if votes < MIN_ROBUST_REPLIES:
        counted = f"{votes} votes ({idle} idle replies counted as one)" if idle > 1 else f"{votes} replies"
        return f"{counted}: a robust rule outvotes b bad clients only when n >= 2b + 1 replied (3 for one)"
    if median_norm <= 0:
        return ("the median update norm is 0: most clients sent no change, more than the b < n/2 a robust rule "
                "holds against")
    return None


@dataclass(frozen=True)
class Votes:
    """A round's replies as a robust rule counts them: each moving reply one vote, every idle one (update norm at most
    `bound`) together one more, at their weighted mean with their summed weight."""

    adapters: list[Adapter]  # the moving replies' adapters in reply order, then the idle replies' mean (if any)
    weights: list[float]
    moving: list[int]  # the reply behind each vote but the idle one
    idle: list[int]  # the replies counted together as the last vote
    bound: float  # idle-floor x the round's median update norm
    norms: list[float]  # every reply's update norm


def count_votes(adapters: Sequence[Adapter], weights: Sequence[float], reference: Adapter, idle_floor: float
                ) -> Votes:
    """Replies whose update (adapter - reference) is at most `idle_floor` x the round's median update norm are idle:
    they sent no change (stale, collapsed, idle, or sybils that cost nothing). A robust rule weighs a point by its
    count, not its spread, so a cluster of them pulled the geometric median toward the old global: 2 idle of 5 kept
    0.37 of the honest progress (the plain mean 0.6), 4 of 10 0.24, and 2 of 4 froze it (their weight is half).
    Counted as one vote they pull as one client does: with the honest steps d + noise, noise as long as d, 2 of 5
    keep about 0.75 (the geometric median of 0 and 3 honest updates), 4 of 10 0.86, 2 of 4 2/3 (of 0 and two honest
    updates 60 degrees apart: the centroid of an equilateral triangle). Dropping them instead would keep all of it
    with 3 or more moving replies but leave 2 of 4 with 2 votes, too few to outvote anyone, and hand b moving
    attackers a majority that the idle honest clients had denied them; as one vote they still count against an
    attacker (3 idle + 1 attacker: 2 votes). A median of 0 (most sent exactly 0) makes those idle too; a majority of
    tiny nonzero updates sets the median itself and is not (beyond b < n/2). `idle_floor` 0: every reply its own
    vote."""
    keys = _check(adapters, weights)
    norms = [update_norm(a, reference) for a in adapters]
    bound = idle_floor * float(np.median(norms)) if idle_floor > 0 else -1.0
    idle = [i for i, norm in enumerate(norms) if norm <= bound]
    moving = [i for i in range(len(adapters)) if i not in idle]
    votes, vote_weights = [adapters[i] for i in moving], [weights[i] for i in moving]
    if idle:
        idle_weights = [weights[i] for i in idle]
        mean = weighted_mean([adapters[i] for i in idle], idle_weights)
        votes.append({k: mean[k] for k in keys})
        vote_weights.append(float(sum(idle_weights)))
    return Votes(votes, vote_weights, moving, idle, max(bound, 0.0), norms)


@dataclass(frozen=True)
class AggregationRule:
    """The strategy.* keys that combine a round's replies (config/sections.py: StrategyConfig documents them)."""

    method: str
    trim_fraction: float = 0.2
    median_clip: float = 0.0
    idle_floor: float = 0.0
    apply_below_minimum: bool = False
    clip_norm: float = 0.0
    noise_multiplier: float = 0.0


@dataclass(frozen=True)
class Combined:
    """A round's outcome: the new global (None: kept, `kept_reason` says why), the votes it was taken over, why it
    may not be called robust, and what median-clip did (the clipped replies, by index, with their norms)."""

    adapter: Adapter | None
    votes: Votes
    robust_reason: str | None
    kept_reason: str | None
    clip_bound: float = 0.0
    clip_median: float = 0.0
    clipped: dict[int, float] | None = None


def combine(adapters: Sequence[Adapter], weights: Sequence[float], reference: Adapter, rule: AggregationRule,
            rng: np.random.Generator | None = None) -> Combined:
    """A round's aggregate under `rule`: with a robust method the idle replies become one vote (count_votes); a round
    of fewer than 3 votes then outvotes no one and is kept (the global stays) unless `rule.apply_below_minimum`,
    which takes their example-weighted mean; median-clip is taken over the votes (not under DP noise, whose guarantee
    rests on clip_norm alone); then `aggregate`."""
    robust = rule.method in ROBUST
    votes = count_votes(adapters, weights, reference, rule.idle_floor if robust else 0.0)
    norms = [votes.norms[i] for i in votes.moving]  # each vote's update norm; count_votes measured the moving ones
    if votes.idle:
        norms.append(update_norm(votes.adapters[-1], reference))
    reason = not_robust(rule.method, len(votes.adapters), float(np.median(norms)), len(votes.idle))
    if robust and len(votes.adapters) < MIN_ROBUST_REPLIES and not rule.apply_below_minimum:
        kept = (f"{reason}; global adapter kept (strategy.apply-below-robust = true applies such a round as the "
                "replies' weighted mean, which one of them can move anywhere)")
        return Combined(None, votes, reason, kept)
    chosen, bound, clipped = list(votes.adapters), 0.0, {}
    if rule.median_clip > 0 and rule.noise_multiplier == 0:
        chosen, bound, norms = median_clip(votes.adapters, reference, rule.median_clip)
        for vote, (norm, before, after) in enumerate(zip(norms, votes.adapters, chosen)):
            if after is not before:
                clipped.update({i: norm for i in ([votes.moving[vote]] if vote < len(votes.moving) else votes.idle)})
    out = aggregate(chosen, votes.weights, method=rule.method, trim_fraction=rule.trim_fraction, reference=reference,
                    clip_norm=rule.clip_norm, noise_multiplier=rule.noise_multiplier, rng=rng)
    return Combined(out, votes, reason, None, bound, float(np.median(norms)), clipped)


def dp_noise_std(noise_multiplier: float, clip_norm: float, clients: int) -> float:
    """DP-FedAvg's noise on the average of `clients` updates clipped to `clip_norm`: z·C/n (McMahan et al. 2018;
    Flower's compute_stdv gives the same)."""
    return float(noise_multiplier * clip_norm / clients)


# parameters: the strategy.* keys that combine a round's replies, keyword-only with their defaults
def aggregate(adapters: Sequence[Adapter], weights: Sequence[float], *, method: str = "mean",
              trim_fraction: float = 0.2, reference: Adapter | None = None, clip_norm: float = 0.0,
              noise_multiplier: float = 0.0, rng: np.random.Generator | None = None) -> Adapter:
    """Combine client adapters with `method` ("mean" | "geometric-median" | "median" | "trimmed-mean"), clipping
    updates first.

    With `noise_multiplier` > 0 this is central DP-FedAvg with fixed clipping (McMahan et al. 2018, as in
    Flower's DifferentialPrivacyServerSideFixedClipping): updates clipped to `clip_norm`, averaged with equal
    weights, and Gaussian noise of std noise_multiplier·clip_norm/n added to the average (Flower's compute_stdv).
    """
    if clip_norm > 0:
        if reference is None:
            raise AggregationError("update clipping needs the reference (global) adapter")
        adapters = [clip_update(a, reference, clip_norm) for a in adapters]
    if noise_multiplier > 0:
        if clip_norm <= 0 or method != "mean" or rng is None:
            raise AggregationError("differential privacy needs clip_norm > 0, the mean, and a seeded rng")
        average = weighted_mean(adapters, [1.0] * len(adapters))
        std = dp_noise_std(noise_multiplier, clip_norm, len(adapters))
        return {k: (v + rng.normal(0.0, std, v.shape)).astype(np.float32) for k, v in average.items()}
    if method == "mean":
        return weighted_mean(adapters, weights)
    if method == "median":
        return coordinate_median(adapters)
    if method == "trimmed-mean":
        return trimmed_mean(adapters, trim_fraction)
    if method == "geometric-median":  # clients count equally: its b-of-n claim counts clients, as the median's does
        if len(adapters) < MIN_ROBUST_REPLIES:  # of 2 it would be the heavier one's adapter: take their mean
            return weighted_mean(adapters, weights)
        return geometric_median(adapters)
    raise AggregationError(f"unknown aggregation {method!r}")


def mean_pairwise_l2(adapters: Sequence[Adapter]) -> float:
    """Parameter-space drift: mean L2 distance over client pairs (0 for fewer than two)."""
    if len(adapters) < 2:
        return 0.0
    return float(np.mean([update_norm(a, {k: v.astype(np.float64) for k, v in b.items()})
                          for a, b in combinations(adapters, 2)]))
