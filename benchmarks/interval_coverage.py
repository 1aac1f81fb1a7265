"""Benchmark: how often each seed x item interval construction covers the true difference, on simulated evaluations.

    PYTHONPATH=. nice -n 10 python benchmarks/interval_coverage.py [--reps 4000] [--seed 0]
                                                                   [--fit-from docs/results/real-fedavg-long]

The report's held-out intervals (report/item_intervals.py) are built from a seed x item table of differences: arm
minus baseline on each item (`paired`), or a run's last evaluated round minus round 0 (`learning`). This simulates
that table as the evaluation produces it and counts how often each construction's nominal 95% interval holds the
true difference, the mean over the population of items and of seeds (what "covers both the seeds and the draw of
held-out items" promises).

The model, on the logit scale, of the probability that a sample answers item i right under seed s:
    round 0 (learning):  mu0 + u_i                               one model shared by every seed
    trained:             mu0 + u_i + delta + d_i + a_s + g_si     one trained model per seed
u_i ~ N(0, sigma_u^2) is the item's difficulty, d_i ~ N(0, sigma_item^2) how much more than average training moves
that item, a_s ~ N(0, sigma_seed^2) the seed's luck, g_si ~ N(0, sigma_g^2) the seed x item interaction. Each cell
scores k samples (binomial); greedy is k = 1 and, at round 0, one draw per item that every seed shares (one model,
no sampling). In `paired` both arms are trained models of the same seed: each has its own d (sigma_item^2 / 2),
a (sigma_seed^2 / 2) and g, so their difference has item and seed variance as `learning`'s. The true difference is
E[p(arm)] - E[p(baseline)] over items and seeds (Gauss-Hermite quadrature); delta is solved for it.

mu0, sigma_u, delta, sigma_item and sigma_g are fitted to the learning table of --fit-from (sampled pass@1, its
last round minus round 0): round 0's mean and item mean square, the last round's mean, and the difference's item
and residual mean squares, matched by their expectations under the model. Its seed component is estimated below
zero (mean square by seed < residual mean square), so the fit has sigma_seed = 0; the grid varies it.

Constructions (each a 95% interval around the grand mean of the S x I table):
  (a) current      CGM two-way V = V_seed + V_item - V_cell, floored at max(V_seed, V_item); t with S-1 df
  (b) CGM t(S-1)   the same V without the floor (the floor only where V <= 0); t with S-1 df
  (c) CGM Satt.    (b)'s V; t with Satterthwaite's df of MS_seed + MS_item - MS_cell (the two-way ANOVA mean
                   squares, independent under normality), rounded down
  (d) ANOVA Satt.  the two-way random-effects variance of the grand mean, (MS_seed + MS_item - MS_cell) / (S I),
                   each variance component truncated at 0; t with the Satterthwaite df of the terms kept, rounded down
  (e) ANOVA Hillis (MS_seed + max(MS_item - MS_cell, 0)) / (S I) with Hillis's (2007) df, (S-1) x (that sum /
                   MS_seed)^2, rounded down: the multi-reader multi-case (DBM) choice, items taken as many
  (f) seeds only   paired t over the S seed means (the report's fallback; blind to the item draw), for reference
Printed per grid cell: coverage (share of replicates whose interval holds the truth; MC SE sqrt(.95 x .05 / reps))
and mean half-width; the prob-scale variance components the cell's tables show (mean of the ANOVA estimates); then
per construction the worst and median coverage over the grid, the cells below the rule's bound and the median of
its mean half-width over the current one's. The rule (docs/results/interval-coverage/README.md): the construction
whose coverage stays >= 95% within Monte-Carlo error in every cell, with the smallest median half-width; if none
does, the one with the highest worst coverage.
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Callable

import numpy as np

from pubswap_flwr.report.item_intervals import learning_item_table, two_way_interval
from pubswap_flwr.report.statistics import t_quantile
from pubswap_flwr.report.summaries import summarize_run

NOMINAL = 0.95
CONSTRUCTIONS = {  # key -> label
    "a": "(a) current: CGM floored, t(S-1)",
    "b": "(b) CGM, t(S-1)",
    "c": "(c) CGM, Satterthwaite df",
    "d": "(d) ANOVA, Satterthwaite df",
    "e": "(e) ANOVA, Hillis df",
    "f": "(f) seeds only, t(S-1)",
}
ELIGIBLE = "abcde"  # (f) is a reference: it does not claim to cover the draw of items
PACKAGE = "b"  # the construction item_intervals.two_way_interval computes (checked at start-up; "a" until the fix
#               that followed this benchmark's first run)
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(64)
WEIGHTS = WEIGHTS / WEIGHTS.sum()


def logistic(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # 1 / (1 + e^-x) without overflow


@dataclass(frozen=True)
class Population:
    """The fitted model's logit-scale parameters (module docstring)."""

    mu0: float
    sigma_u: float
    delta: float
    sigma_item: float
    sigma_g: float
    samples: int = 4


@dataclass(frozen=True)
class Cell:
    design: str          # learning (sampled), greedy (learning with k = 1) or paired (arm - baseline, sampled)
    seeds: int
    items: int
    sigma_seed: float    # logit scale
    item_scale: float    # sigma_item as a multiple of the fitted one
    theta: float         # the true difference


# ---------------------------------------------------------------- the fit to a published sweep's learning table


def mean_squares(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-way ANOVA mean squares (by seed, by item, residual) of tables x[..., S, I]."""
    n_seeds, n_items = x.shape[-2:]
    grand = x.mean(axis=(-2, -1), keepdims=True)
    by_seed = x.mean(axis=-1, keepdims=True) - grand
    by_item = x.mean(axis=-2, keepdims=True) - grand
    rest = x - grand - by_seed - by_item
    ms_seed = n_items * (by_seed ** 2).sum(axis=(-2, -1)) / (n_seeds - 1)
    ms_item = n_seeds * (by_item ** 2).sum(axis=(-2, -1)) / (n_items - 1)
    ms_cell = (rest ** 2).sum(axis=(-2, -1)) / ((n_seeds - 1) * (n_items - 1))
    return ms_seed, ms_item, ms_cell


def observed_moments(sweep: Path) -> tuple[dict[str, float], np.ndarray]:
    """The fit's targets from a sweep's runs (sampled pass@1, last evaluated round and round 0) and its difference
    table (seeds x items)."""
    runs = [summarize_run(path) for path in sorted((sweep / "runs").iterdir()) if path.is_dir()]
    table = learning_item_table(runs, "sampled_accuracy")
    if table is None:
        raise SystemExit(f"{sweep}: its runs lack per-item results at round 0 or their last round")
    items = sorted(set.intersection(*(set(row) for row in table.values())))
    first = np.array([[run.items[0]["sampled_accuracy"][i] for i in items] for run in runs])
    last = np.array([[run.items[max(run.items)]["sampled_accuracy"][i] for i in items] for run in runs])
    diff = last - first
    ms = {name: mean_squares(x) for name, x in (("first", first), ("last", last), ("diff", diff))}
    moments = {"first mean": first.mean(), "first MS item": ms["first"][1], "first MS cell": ms["first"][2],
               "last mean": last.mean(), "last MS item": ms["last"][1],
               "diff MS seed": ms["diff"][0], "diff MS item": ms["diff"][1], "diff MS cell": ms["diff"][2]}
    return {k: float(v) for k, v in moments.items()}, diff


def expected_moments(pop: Population, n_seeds: int) -> dict[str, float]:
    """The fit's moments under the model with sigma_seed = 0 (quadrature over u, d and g)."""
    k = pop.samples
    u = pop.sigma_u * NODES[:, None, None]
    d = pop.sigma_item * NODES[None, :, None]
    g = pop.sigma_g * NODES[None, None, :]
    p0 = logistic(pop.mu0 + u[:, :, 0])                          # [u, 1]
    p1 = logistic(pop.mu0 + pop.delta + u + d + g)                # [u, d, g]
    m1 = (p1 * WEIGHTS).sum(axis=-1)                              # [u, d]: the item's mean over seeds
    q1 = (p1 ** 2 * WEIGHTS).sum(axis=-1)
    within = (q1 - m1 ** 2) + (m1 - q1) / k + p0 * (1 - p0) / k  # a cell's variance across seeds, given the item
    w2 = WEIGHTS[:, None] * WEIGHTS[None, :]
    change = m1 - p0
    e0 = float((WEIGHTS * p0[:, 0]).sum())
    e1 = float((w2 * m1).sum())
    var_first = float((WEIGHTS * p0[:, 0] ** 2).sum()) - e0 ** 2
    var_last = float((w2 * m1 ** 2).sum()) - e1 ** 2
    cell_last = float((w2 * ((q1 - m1 ** 2) + (m1 - q1) / k)).sum())
    cell = float((w2 * within).sum())
    cell_first = float((WEIGHTS * p0[:, 0] * (1 - p0[:, 0])).sum()) / k
    return {"first mean": e0, "first MS item": n_seeds * var_first + cell_first, "first MS cell": cell_first,
            "last mean": e1, "last MS item": n_seeds * var_last + cell_last,
            "diff MS seed": cell, "diff MS item": n_seeds * (float((w2 * change ** 2).sum()) - (e1 - e0) ** 2) + cell,
            "diff MS cell": cell}


FITTED = ("first mean", "first MS item", "last mean", "diff MS item", "diff MS cell")


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, iterations: int = 2000,
                tolerance: float = 1e-12) -> np.ndarray:
    """Minimise f from x0 (the textbook simplex: reflect, expand, contract, shrink)."""
    simplex = [x0] + [x0 + step * np.eye(len(x0))[i] for i in range(len(x0))]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tolerance:
            break
        centre = np.mean(simplex[:-1], axis=0)
        reflected = centre + (centre - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centre + 2 * (centre - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (simplex[-1] - centre)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def fit(moments: dict[str, float], n_seeds: int, samples: int) -> Population:
    """mu0, sigma_u, delta, sigma_item, sigma_g matching FITTED (sigma_seed = 0)."""
    def population(x: np.ndarray) -> Population:
        return Population(float(x[0]), math.exp(x[1]), float(x[2]), math.exp(x[3]), math.exp(x[4]), samples)

    def loss(x: np.ndarray) -> float:
        model = expected_moments(population(x), n_seeds)
        return sum(math.log(model[k] / moments[k]) ** 2 for k in FITTED)

    return population(nelder_mead(loss, np.array([-2.0, 1.0, 0.5, 0.0, -1.0])))


# ---------------------------------------------------------------- the true difference and the simulated tables


def mean_p(location: float, sd: float) -> float:
    return float((WEIGHTS * logistic(location + sd * NODES)).sum())


def arm_sds(pop: Population, cell: Cell) -> tuple[float, float]:
    """The logit-scale sd of (trained arm, baseline) around their locations, over items and seeds."""
    item = pop.sigma_item * cell.item_scale
    if cell.design == "paired":
        sd = math.sqrt(pop.sigma_u ** 2 + item ** 2 / 2 + cell.sigma_seed ** 2 / 2 + pop.sigma_g ** 2)
        return sd, sd
    return math.sqrt(pop.sigma_u ** 2 + item ** 2 + cell.sigma_seed ** 2 + pop.sigma_g ** 2), pop.sigma_u


def shift_for(pop: Population, cell: Cell) -> float:
    """The logit shift of the trained arm (over the baseline's location) whose true difference is cell.theta."""
    arm_sd, base_sd = arm_sds(pop, cell)
    base_location = pop.mu0 + (pop.delta if cell.design == "paired" else 0.0)
    base = mean_p(base_location, base_sd)
    low, high = -10.0, 10.0
    for _ in range(100):
        mid = (low + high) / 2
        if mean_p(base_location + mid, arm_sd) - base < cell.theta:
            low = mid
        else:
            high = mid
    return (low + high) / 2 + base_location


def simulate(pop: Population, cell: Cell, reps: int, rng: np.random.Generator) -> np.ndarray:
    """reps simulated difference tables [reps, S, I]."""
    shape, item = (reps, cell.seeds, cell.items), pop.sigma_item * cell.item_scale
    k = 1 if cell.design == "greedy" else pop.samples

    def normal(size: tuple[int, ...]) -> np.ndarray:
        return rng.standard_normal(size, dtype=np.float32)

    def scores(p: np.ndarray) -> np.ndarray:
        """The share of k samples right, each right with probability p (binomial, as k uniforms: faster)."""
        return (rng.random((k, *p.shape), dtype=np.float32) < p).sum(axis=0) / k

    u = pop.sigma_u * normal((reps, 1, cell.items))
    location = shift_for(pop, cell)

    def trained(where: float, item_sd: float, seed_sd: float) -> np.ndarray:
        """k-sample scores of one trained model per seed, at logit location `where`."""
        logit = (where + u + item_sd * normal((reps, 1, cell.items)) + seed_sd * normal((reps, cell.seeds, 1))
                 + pop.sigma_g * normal(shape))
        return scores(logistic(logit))

    if cell.design == "paired":
        half_item, half_seed = item / math.sqrt(2), cell.sigma_seed / math.sqrt(2)
        return trained(location, half_item, half_seed) - trained(pop.mu0 + pop.delta, half_item, half_seed)
    last = trained(location, item, cell.sigma_seed)
    first_p = np.broadcast_to(logistic(pop.mu0 + u), (reps, 1 if cell.design == "greedy" else cell.seeds, cell.items))
    return last - scores(first_p)  # greedy: one round-0 answer per item, the same for every seed


# ---------------------------------------------------------------- the constructions


class TCache:
    """t(0.975, df) for df rounded down to an integer and capped at `cap` (no estimate from an S x I table has more
    than S I - 1 df), computed once each (report/statistics.t_quantile)."""

    def __init__(self) -> None:
        self.known: dict[int, float] = {}

    def __call__(self, df: np.ndarray, cap: int) -> np.ndarray:
        df = np.clip(np.floor(df), 1, cap).astype(int)
        for value in np.unique(df):
            if int(value) not in self.known:
                self.known[int(value)] = t_quantile((1 + NOMINAL) / 2, int(value))
        return np.vectorize(self.known.__getitem__)(df)


def satterthwaite(terms: list[tuple[np.ndarray | float, np.ndarray, float]]) -> np.ndarray:
    """df of sum(sign * ms) from (sign or 0/1 mask, ms, its df) terms."""
    total = sum(sign * ms for sign, ms, _ in terms)
    spread = sum((sign * ms) ** 2 / df for sign, ms, df in terms)
    return np.where(spread > 0, total ** 2 / np.where(spread > 0, spread, 1.0), 1.0)


def half_widths(x: np.ndarray, t: TCache) -> dict[str, np.ndarray]:
    """Each construction's half-width for tables x[reps, S, I]."""
    n_seeds, n_items = x.shape[-2:]
    total = n_seeds * n_items
    resid = x - x.mean(axis=(1, 2), keepdims=True)
    v_seed = (resid.sum(axis=2) ** 2).sum(axis=1) / total ** 2 * n_seeds / (n_seeds - 1)
    v_item = (resid.sum(axis=1) ** 2).sum(axis=1) / total ** 2 * n_items / (n_items - 1)
    v_cell = (resid ** 2).sum(axis=(1, 2)) / total ** 2 * total / (total - 1)
    cgm = v_seed + v_item - v_cell
    floor = np.maximum(v_seed, v_item)
    ms_seed, ms_item, ms_cell = mean_squares(x)
    df_seed, df_item, df_cell = n_seeds - 1, n_items - 1, (n_seeds - 1) * (n_items - 1)
    cap = total - 1
    t_seeds = t(np.full(len(x), df_seed), cap)
    full = satterthwaite([(1, ms_seed, df_seed), (1, ms_item, df_item), (-1, ms_cell, df_cell)])
    df_c = np.where(ms_seed + ms_item - ms_cell > 0, full, df_seed)
    keep_seed, keep_item = (ms_seed > ms_cell).astype(float), (ms_item > ms_cell).astype(float)
    kept = satterthwaite([(keep_seed, ms_seed, df_seed), (keep_item, ms_item, df_item),
                          (1 - keep_seed - keep_item, ms_cell, df_cell)])
    v_anova = (ms_cell + np.maximum(ms_seed - ms_cell, 0) + np.maximum(ms_item - ms_cell, 0)) / total
    hillis_sum = ms_seed + np.maximum(ms_item - ms_cell, 0)
    df_hillis = np.where(ms_seed > 0, hillis_sum ** 2 / np.where(ms_seed > 0, ms_seed, 1.0) ** 2 * df_seed, df_seed)
    seed_means = x.mean(axis=2)
    return {
        "a": t_seeds * np.sqrt(np.maximum(cgm, floor)),
        "b": t_seeds * np.sqrt(np.where(cgm > 0, cgm, floor)),
        "c": t(df_c, cap) * np.sqrt(np.where(cgm > 0, cgm, floor)),
        "d": t(kept, cap) * np.sqrt(v_anova),
        "e": t(np.maximum(df_hillis, df_seed), cap) * np.sqrt(hillis_sum / total),
        "f": t_seeds * seed_means.std(axis=1, ddof=1) / math.sqrt(n_seeds),
    }


def check_against_package(t: TCache) -> None:
    """The construction the package computes (PACKAGE) gives two_way_interval's numbers on random tables."""
    rng = np.random.default_rng(12345)
    for shape in ((3, 7), (5, 4), (2, 30)):
        x = rng.binomial(4, 0.4, shape) / 4 - rng.binomial(4, 0.3, shape) / 4 + rng.normal(0, 0.1, (shape[0], 1))
        interval = two_way_interval({s: {f"i{j}": float(v) for j, v in enumerate(row)} for s, row in enumerate(x)})
        mine = float(half_widths(x[None], t)[PACKAGE][0])
        if not math.isclose(interval.high - interval.mean, mine, rel_tol=1e-9):
            raise SystemExit(f"construction {PACKAGE} gives {mine}, two_way_interval {interval.high - interval.mean}")


# ---------------------------------------------------------------- the grid


def grid(theta_fit: float) -> list[Cell]:
    cells = []
    for design, seeds, items, sigma_seed, item_scale, theta in itertools.product(
            ("learning", "greedy", "paired"), (3, 5), (64, 192), (0.0, 0.2, 0.4, 0.8), (0.0, 0.5, 1.0, 1.5),
            (0.0, theta_fit)):
        cells.append(Cell(design, seeds, items, sigma_seed, item_scale, theta))
    return cells


def part(**wanted: object) -> Callable[[Cell], bool]:
    """Whether a cell has the wanted values (a part of the grid)."""
    return lambda cell: all(getattr(cell, name) == value for name, value in wanted.items())


def run_cell(pop: Population, cell: Cell, reps: int, seed: int, index: int, t: TCache
             ) -> tuple[dict[str, float], dict[str, float], tuple[float, float, float]]:
    """Coverage and mean half-width per construction, and the mean ANOVA variance components (seed, item, cell)."""
    rng = np.random.default_rng([seed, index])
    hits = {key: 0 for key in CONSTRUCTIONS}
    widths = {key: 0.0 for key in CONSTRUCTIONS}
    components = np.zeros(3)
    done = 0
    while done < reps:
        block = min(1000, reps - done)
        x = simulate(pop, cell, block, rng)
        mean = x.mean(axis=(1, 2))
        for key, half in half_widths(x, t).items():
            hits[key] += int((np.abs(mean - cell.theta) <= half).sum())
            widths[key] += float(half.sum())
        ms_seed, ms_item, ms_cell = mean_squares(x)
        components += [((ms_seed - ms_cell) / cell.items).sum(), ((ms_item - ms_cell) / cell.seeds).sum(),
                       ms_cell.sum()]
        done += block
    seed_var, item_var, cell_var = (float(c) / reps for c in components)
    return ({k: v / reps for k, v in hits.items()}, {k: v / reps for k, v in widths.items()},
            (seed_var, item_var, cell_var))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=4000, help="simulated sweeps per grid cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit-from", type=Path, default=Path("docs/results/real-fedavg-long"))
    args = parser.parse_args()
    t = TCache()
    check_against_package(t)
    moments, real = observed_moments(args.fit_from)
    n_seeds = real.shape[0]
    pop = fit(moments, n_seeds, samples=4)
    model = expected_moments(pop, n_seeds)
    print(f"fit to {args.fit_from} (sampled pass@1, last round - round 0; {real.shape[0]} seeds x {real.shape[1]} "
          f"items, k = {pop.samples}):")
    print(f"  mu0 {pop.mu0:+.3f}  sigma_u {pop.sigma_u:.3f}  delta {pop.delta:+.3f}  sigma_item {pop.sigma_item:.3f}  "
          f"sigma_g {pop.sigma_g:.3f}  sigma_seed 0 (logit scale)")
    for key, value in moments.items():
        print(f"  {key:<14} observed {value:.4f}  model {model[key]:.4f}{'  (fitted)' if key in FITTED else ''}")
    theta_fit = round(mean_p(pop.mu0 + pop.delta, math.sqrt(pop.sigma_u ** 2 + pop.sigma_item ** 2
                                                            + pop.sigma_g ** 2)) - mean_p(pop.mu0, pop.sigma_u), 3)
    cells = grid(theta_fit)
    se = math.sqrt(NOMINAL * (1 - NOMINAL) / args.reps)
    z = NormalDist().inv_cdf(1 - 0.05 / len(cells))
    bound = NOMINAL - z * se
    print(f"\n{len(cells)} cells x {args.reps} replicates, RNG seed {args.seed}; coverage MC SE at 95% = {se:.4f}; "
          f"the rule's bound: coverage >= 0.95 - {z:.2f} SE = {bound:.4f} (Bonferroni over the cells)")
    print("seed/item/cell var: the mean two-way ANOVA estimates of the prob-scale components in the cell's tables")
    keys = list(CONSTRUCTIONS)
    print(f"\n{'design':<9}{'S':>2}{'I':>5}{'s_seed':>7}{'x item':>7}{'theta':>7}{'seed var':>10}{'item var':>10}"
          f"{'cell var':>9}  " + "  ".join(f"{k}: cover  half" for k in keys))
    coverage: dict[str, list[float]] = {k: [] for k in keys}
    width: dict[str, list[float]] = {k: [] for k in keys}
    for index, cell in enumerate(cells):
        hits, widths, components = run_cell(pop, cell, args.reps, args.seed, index, t)
        for k in keys:
            coverage[k].append(hits[k])
            width[k].append(widths[k])
        print(f"{cell.design:<9}{cell.seeds:>2}{cell.items:>5}{cell.sigma_seed:>7.1f}{cell.item_scale:>7.1f}"
              f"{cell.theta:>+7.3f}{components[0]:>10.5f}{components[1]:>10.5f}{components[2]:>9.4f}  "
              + "  ".join(f"{hits[k]:>8.3f}{'*' if hits[k] < bound else ' '}{widths[k]:.3f}" for k in keys),
              flush=True)
    print("\n* below the bound. Per construction over the grid:")
    print(f"{'construction':<32}{'worst':>7}{'median':>8}{'below':>7}{'median half / (a)':>19}")
    ratios = {k: float(np.median(np.array(width[k]) / np.array(width["a"]))) for k in keys}
    for k in keys:
        below = sum(c < bound for c in coverage[k])
        print(f"{CONSTRUCTIONS[k]:<32}{min(coverage[k]):>7.3f}{float(np.median(coverage[k])):>8.3f}{below:>7}"
              f"{ratios[k]:>19.3f}")
    parts = [(design, part(design=design)) for design in ("learning", "greedy", "paired")]
    parts += [(f"{n} seeds", part(seeds=n)) for n in (3, 5)]
    parts += [("the fitted point", part(design="learning", seeds=n_seeds, items=real.shape[1], sigma_seed=0.0,
                                        item_scale=1.0, theta=theta_fit))]
    print("worst coverage / median half-width over (a)'s, by part of the grid:")
    for name, keep in parts:
        rows = [i for i, c in enumerate(cells) if keep(c)]
        print(f"  {name:<17}" + "  ".join(
            f"{k} {min(coverage[k][i] for i in rows):.3f}/{np.median([width[k][i] / width['a'][i] for i in rows]):.2f}"
            for k in keys))
    holding = [k for k in ELIGIBLE if min(coverage[k]) >= bound]
    if holding:
        chosen = min(holding, key=lambda k: ratios[k])
        print(f"\nchosen by the rule: {CONSTRUCTIONS[chosen]} (holds in every cell; smallest median half-width of "
              f"{', '.join(holding)})")
    else:
        chosen = max(ELIGIBLE, key=lambda k: min(coverage[k]))
        print(f"\nno construction holds in every cell; the safest (highest worst coverage): {CONSTRUCTIONS[chosen]}")


if __name__ == "__main__":
    main()
