"""Benchmark: how far one client of n moves the global under each robust aggregation candidate, with modelled updates.

    python benchmarks/robust_aggregation.py [--clients 4] [--attackers 1] [--rounds 20] [--seeds 20] [--dim 256]
                                            [--noise 1.0 2.0]

Each honest client's step is a true direction d (norm 1) plus Gaussian noise of norm `noise` (x d's norm); the global
moves by the aggregate of the round's updates (strategy.median-clip = 3 applied first, as the server does), 20 rounds.
The attackers (colluding: all send the same) send, just under the clip bound (3 x the round's median update norm):
`sign flip`, minus the first one's own honest step; `pusher`, one fixed direction u orthogonal to d. Printed per
candidate, averaged over seeds:
  kept     honest progress (global . d) under the sign flip, over the plain mean's progress without an attacker
  pushed   global . u under the pusher, over the plain mean's honest progress (the attacker's displacement)
  cost     1 - honest-only progress under the candidate / under the plain mean (no attacker)
  one 3x   the same cost when one honest client's true step is 3 d (the others' d): a client that moves much further
           than the others (non-IID data, a task the others lack) is discounted by a robust rule as an attacker is
The aggregators are pubswap_flwr/algorithms/lora_averaging.py's own functions.
"""

from __future__ import annotations

import argparse

import numpy as np

from pubswap_flwr.algorithms.lora_averaging import aggregate, median_clip

CLIP = 3.0
CANDIDATES = {  # name -> strategy.aggregation (after strategy.median-clip = 3)
    "mean (old default)": "mean",
    "coordinate median": "median",
    "trimmed mean (b per end)": "trimmed-mean",
    "geometric median": "geometric-median",
}


def directions(dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The true direction d and the pusher's u: dense unit vectors (an axis-aligned one would be ignored by any
    coordinate-wise rule), u orthogonal to d."""
    rng = np.random.default_rng([seed, 1])
    d = rng.choice([-1.0, 1.0], dim) / np.sqrt(dim)
    u = rng.choice([-1.0, 1.0], dim)
    u = u - (u @ d) * d
    return d, u / np.linalg.norm(u)


def run(method: str, attack: str | None, clients: int, rounds: int, dim: int, noise: float, seed: int,
        clip: float = CLIP, attackers: int = 1, unequal: bool = False) -> np.ndarray:
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
            honest_norms = [float(np.linalg.norm(s)) for s in steps[attackers:]]
            # the median of n norms with the attackers' on top: what the clip bound is computed from
            median = float(np.median(honest_norms + [np.inf] * attackers))
            size = 0.999 * clip * median
            direction = -steps[0] if attack == "sign flip" else u
            for i in range(attackers):
                steps[i] = direction / np.linalg.norm(direction) * size
        reference = {"w": g.astype(np.float32)}
        adapters = [{"w": (g + s).astype(np.float32)} for s in steps]
        if clip > 0:
            adapters = median_clip(adapters, reference, clip)[0]
        trim = attackers / clients if method == "trimmed-mean" else 0.2  # trims as many as attack, per end
        g = aggregate(adapters, [1.0] * clients, method=method, trim_fraction=trim)["w"].astype(np.float64)
    return g


def measure(method: str, clients: int, attackers: int, rounds: int, dim: int, noise: float, seeds: int
            ) -> tuple[float, float, float, float]:
    kept, pushed, cost, unequal = [], [], [], []
    for seed in range(seeds):
        d, u = directions(dim, seed)
        base = run("mean", None, clients, rounds, dim, noise, seed, clip=0.0) @ d
        kept.append(run(method, "sign flip", clients, rounds, dim, noise, seed, attackers=attackers) @ d / base)
        pushed.append(run(method, "pusher", clients, rounds, dim, noise, seed, attackers=attackers) @ u / base)
        cost.append(1.0 - run(method, None, clients, rounds, dim, noise, seed) @ d / base)
        base = run("mean", None, clients, rounds, dim, noise, seed, clip=0.0, unequal=True) @ d
        unequal.append(1.0 - run(method, None, clients, rounds, dim, noise, seed, unequal=True) @ d / base)
    return float(np.mean(kept)), float(np.mean(pushed)), float(np.mean(cost)), float(np.mean(unequal))


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
        print(f"{'candidate':<28}{'kept (sign flip)':>18}{'pushed (pusher)':>17}{'cost (honest)':>15}"
              f"{'one 3x (honest)':>17}")
        for name, method in CANDIDATES.items():
            kept, pushed, cost, unequal = measure(method, args.clients, args.attackers, args.rounds, args.dim, noise,
                                                  args.seeds)
            print(f"{name:<28}{kept:>18.3f}{pushed:>17.3f}{cost:>15.4f}{unequal:>17.4f}")


if __name__ == "__main__":
    main()
