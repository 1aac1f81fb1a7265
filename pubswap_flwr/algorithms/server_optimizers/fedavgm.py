"""FedAvgM: server momentum on the round's update (Hsu et al. 2019, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification"; Flower's FedAvgM).

With x the global the round's clients started from and u = aggregate − x the round's update: v ← μ·v + u (v = u at
the first step) and x ← x + η·v (Flower writes it with the pseudo-gradient x − aggregate: the same step). η
defaults to 1 − μ, so a steady update moves the global as far per round as FedAvg does (Hsu et al.'s effective
learning rate η / (1 − μ) = 1) while the rounds' updates are smoothed; μ = 0 with η = 1 is FedAvg.
"""

from __future__ import annotations

import numpy as np

from .base import Adapter, ServerOptimizer, register


def momentum_step(current: Adapter, aggregate: Adapter, velocity: Adapter | None, momentum: float,
                  lr: float) -> tuple[Adapter, Adapter]:
    """One FedAvgM step: (the new global, the new velocity), fp32 (computed in fp64); `velocity` None at the first
    step."""
    new, kept = {}, {}
    for key, x in current.items():
        x64 = x.astype(np.float64)
        update = aggregate[key].astype(np.float64) - x64
        v = update if velocity is None else momentum * velocity[key].astype(np.float64) + update
        kept[key] = v.astype(np.float32)
        new[key] = (x64 + lr * kept[key].astype(np.float64)).astype(np.float32)
    return new, kept


@register("fedavgm")
class FedAvgM(ServerOptimizer):
    golden_runs = {"fedavgm": {"config": {"strategy.mode": "fedavg", "strategy.server-optimizer": "fedavgm"},
                               "nodes": 3}}  # FedAvg with it, at its defaults
    doc = ("server momentum: v = server-momentum x v + update, global += eta v (Hsu et al. 2019; eta defaults to 1 - "
           "server-momentum, FedAvg's long-run step)")
    array_names = ("velocity",)

    @property
    def lr(self) -> float:
        return self.settings.server_lr or 1.0 - self.settings.server_momentum

    def step(self, current: Adapter, aggregate: Adapter) -> Adapter:
        new, self.arrays["velocity"] = momentum_step(current, aggregate, self.arrays.get("velocity"),
                                                     self.settings.server_momentum, self.lr)
        self.steps += 1
        return new

    def describe(self) -> str:
        return f"{super().describe()} server-momentum={self.settings.server_momentum:g}"
