"""Benchmark: how far one client of n moves the global under each robust aggregation candidate, with modelled updates.

    python benchmarks/robust_aggregation.py [--clients 4] [--attackers 1] [--rounds 20] [--seeds 20] [--dim 256]
                                            [--noise 1.0 2.0]

Each honest client's step is a true direction d (norm 1) plus Gaussian noise of norm `noise` (x d's norm); the global
moves by the aggregate of the round's updates (strategy.median-clip = 3 applied first, as the server does), 20 rounds.
The attackers (colluding: all send the same) send, just under the clip bound (3 x the round's median update norm):
`sign flip`, minus the first one's own honest step; `pusher`, one fixed direction u orthogonal to d. Or they send
no change (#54): `idle`, an update of 0 (a stale, collapsed or idle client, or a sybil); `near idle`, each a
different random direction just over strategy.idle-floor x the round's median update norm (1.01 x 0.1), the
cheapest way past the new default's rule. Printed per candidate, averaged over seeds:
  kept       honest progress (global . d) under the sign flip, over the plain mean's progress without an attacker
  pushed     global . u under the pusher, over the plain mean's honest progress (the attacker's displacement)
             (these two: "-" for b >= n/2 attackers, whose norms are the clip bound's median)
  idle       honest progress with the attackers idle, over the plain mean's without them (the plain mean's own
             with b idle of n: 1 - b/n)
  near idle  the same with the attackers near idle
  cost       1 - honest-only progress under the candidate / under the plain mean (no attacker)
  one 3x     the same cost when one honest client's true step is 3 d (the others' d): a client that moves much
             further than the others (non-IID data, a task the others lack) is discounted by a robust rule as an
             attacker is
A round the candidate keeps (fewer than 3 votes, strategy.apply-below-robust false) leaves the global where it was.
Each candidate is an AggregationRule run by pubswap_flwr/algorithms/lora_averaging.py's combine, as the server runs it.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from pubswap_flwr.algorithms.lora_averaging import AggregationRule, combine

CLIP, IDLE_FLOOR = 3.0, 0.1
BEFORE_54 = {"idle_floor": 0.0, "apply_below_minimum": True}  # every reply its own vote, rounds of 2 applied
CANDIDATES = {  # name -> the rule (strategy.aggregation after strategy.median-clip = 3)
    "mean (default before #34)": AggregationRule("mean", median_clip=CLIP),
    "coordinate median": AggregationRule("median", median_clip=CLIP, **BEFORE_54),
    "trimmed mean (b per end)": AggregationRule("trimmed-mean", median_clip=CLIP, **BEFORE_54),
    "geometric median (#34)": AggregationRule("geometric-median", median_clip=CLIP, **BEFORE_54),
    "geo. median, idle floor (#54)": AggregationRule("geometric-median", median_clip=CLIP, idle_floor=IDLE_FLOOR),
}
PLAIN_MEAN = AggregationRule("mean")


def directions(dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The true direction d and the pusher's u: dense unit vectors (an axis-aligned one would be ignored by any
    coordinate-wise rule), u orthogonal to d."""
    rng = np.random.default_rng([seed, 1])
    d = rng.choice([-1.0, 1.0], dim) / np.sqrt(dim)
    u = rng.choice([-1.0, 1.0], dim)
    u = u - (u @ d) * d
    return d, u / np.linalg.norm(u)


def run(rule: AggregationRule, attack: str | None, clients: int, rounds: int, dim: int, noise: float, seed: int,
        attackers: int = 1, unequal: bool = False) -> np.ndarray:
    """The global after `rounds` rounds (starting at 0) with `attackers` of `clients` (attack None: all honest)."""
    rng = np.random.default_rng(seed)
    d, u = directions(dim, seed)
    sizes = np.ones(clients)
    if unequal:
        sizes[-1] = 3.0
    g = np.zeros(dim)
    for _ in range(rounds):
        steps = [size * d + rng.normal(0.0, noise / np.sqrt(dim), dim) for size in sizes]
        if attack is not None:
            honest_norms, first = [float(np.linalg.norm(s)) for s in steps[attackers:]], steps[0]
            for i in range(attackers):
                steps[i] = attacker_step(attack, first, u, honest_norms, attackers, rng)
        if rule.method == "trimmed-mean":  # trims as many as attack, per end (fewer than half)
            rule = replace(rule, trim_fraction=min(attackers, (clients - 1) // 2) / clients)
        reference = {"w": g.astype(np.float32)}
        adapters = [{"w": (g + s).astype(np.float32)} for s in steps]
        out = combine(adapters, [1.0] * clients, reference, rule).adapter
        g = g if out is None else out["w"].astype(np.float64)
    return g


def attacker_step(attack: str, first: np.ndarray, u: np.ndarray, honest_norms: list[float], attackers: int,
                  rng: np.random.Generator) -> np.ndarray:
    if attack == "idle":
        return np.zeros_like(first)
    if attack == "near idle":  # just over the floor of the median it sets itself: a fixed point, found by iterating
        size = 0.0
        for _ in range(20):
            size = 1.01 * IDLE_FLOOR * float(np.median(honest_norms + [size] * attackers))
        direction = rng.normal(size=first.shape)
        return direction / np.linalg.norm(direction) * size
    # the median of n norms with the attackers' on top: what the clip bound is computed from
    size = 0.999 * CLIP * float(np.median(honest_norms + [np.inf] * attackers))
    direction = -first if attack == "sign flip" else u
    return direction / np.linalg.norm(direction) * size


def measure(rule: AggregationRule, clients: int, attackers: int, rounds: int, dim: int, noise: float, seeds: int
            ) -> list[float]:
    """kept, pushed, idle, near idle, cost and one 3x (the module's doc), averaged over seeds."""
    columns: list[list[float]] = [[] for _ in range(6)]
    for seed in range(seeds):
        d, u = directions(dim, seed)
        base = run(PLAIN_MEAN, None, clients, rounds, dim, noise, seed) @ d
        if 2 * attackers < clients:  # else the clip bound, the median of the norms, is the attackers' own
            columns[0].append(run(rule, "sign flip", clients, rounds, dim, noise, seed, attackers) @ d / base)
            columns[1].append(run(rule, "pusher", clients, rounds, dim, noise, seed, attackers) @ u / base)
        columns[2].append(run(rule, "idle", clients, rounds, dim, noise, seed, attackers) @ d / base)
        columns[3].append(run(rule, "near idle", clients, rounds, dim, noise, seed, attackers) @ d / base)
        columns[4].append(1.0 - run(rule, None, clients, rounds, dim, noise, seed) @ d / base)
        base = run(PLAIN_MEAN, None, clients, rounds, dim, noise, seed, unequal=True) @ d
        columns[5].append(1.0 - run(rule, None, clients, rounds, dim, noise, seed, unequal=True) @ d / base)
    return [float(np.mean(c)) if c else float("nan") for c in columns]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--attackers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--noise", type=float, nargs="+", default=[1.0, 2.0])
    args = parser.parse_args()
    print(f"{args.attackers} attacker(s) of {args.clients} clients, {args.rounds} rounds, {args.seeds} seeds, dim "
          f"{args.dim}, strategy.median-clip = {CLIP} first")
    for noise in args.noise:
        print(f"\nhonest noise norm = {noise} x the true step's norm")
        print(f"{'candidate':<31}{'kept (sign flip)':>17}{'pushed (pusher)':>16}{'kept (idle)':>12}"
              f"{'kept (near idle)':>17}{'cost (honest)':>14}{'one 3x (honest)':>16}")
        for name, rule in CANDIDATES.items():
            kept, pushed, idle, near, cost, unequal = measure(rule, args.clients, args.attackers, args.rounds,
                                                              args.dim, noise, args.seeds)
            print(f"{name:<31}{kept:>17.3f}{pushed:>16.3f}{idle:>12.3f}{near:>17.3f}{cost:>14.4f}{unequal:>16.4f}"
                  .replace("nan", "  -"))


if __name__ == "__main__":
    main()
