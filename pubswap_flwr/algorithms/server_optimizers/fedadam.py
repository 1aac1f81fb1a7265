"""FedAdam: Adam on the round's update (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2; Flower's
FedAdam).

With x the global the round's clients started from and u = aggregate − x the round's update, per value:
m ← β1·m + (1 − β1)·u, v ← β2·v + (1 − β2)·u², and after t steps x ← x + η·m̂ / (√v̂ + τ) with Adam's bias
corrections m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t) (as torch.optim.Adam; Reddi et al.'s Algorithm 2 has none, and
Flower folds them into η with exponent round + 1), so the first step already moves each value by about η·sign(u)
where |u| ≫ τ. Every LoRA value gets its own step size: values the clients move little (|u| ≲ τ) move by about
η·u/τ, the rest by at most about η.

η defaults to 0.003: on the embedded tiny model in the PubSwap positive control one round's update moves a LoRA
value by 0.0035 (median; mean 0.004, 99th percentile 0.013), so FedAdam's steps start as large as FedAvg's.
"""

from __future__ import annotations

import numpy as np

from .base import Adapter, ServerOptimizer, register


# parameters: FedAdam's step as Reddi et al. write it (its state m, v and hyper-parameters), a pure function
def adam_step(current: Adapter, aggregate: Adapter, m: Adapter | None, v: Adapter | None, step: int, lr: float,
              beta1: float, beta2: float, tau: float) -> tuple[Adapter, Adapter, Adapter]:
    """Step `step` (1-based) of FedAdam: (the new global, m, v), fp32 (computed in fp64); m and v None at step 1."""
    new, m_out, v_out = {}, {}, {}
    correct1, correct2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    for key, x in current.items():
        x64 = x.astype(np.float64)
        update = aggregate[key].astype(np.float64) - x64
        m64 = (1.0 - beta1) * update + (0.0 if m is None else beta1 * m[key].astype(np.float64))
        v64 = (1.0 - beta2) * update ** 2 + (0.0 if v is None else beta2 * v[key].astype(np.float64))
        m_out[key], v_out[key] = m64.astype(np.float32), v64.astype(np.float32)
        m_hat = m_out[key].astype(np.float64) / correct1  # from the kept fp32 moments: a resume repeats it
        v_hat = v_out[key].astype(np.float64) / correct2
        new[key] = (x64 + lr * m_hat / (np.sqrt(v_hat) + tau)).astype(np.float32)
    return new, m_out, v_out


@register("fedadam")
class FedAdam(ServerOptimizer):
    golden_runs = {"fedadam": {"config": {"strategy.mode": "fedavg", "strategy.server-optimizer": "fedadam"},
                               "nodes": 3}}  # FedAvg with it, at its defaults
    doc = ("Adam on the round's update: global += eta m / (sqrt(v) + server-tau), moments decaying by server-beta1 and "
           "server-beta2, bias-corrected (Reddi et al. 2021; eta defaults to 0.003)")
    default_lr = 0.003
    array_names = ("m", "v")

    def step(self, current: Adapter, aggregate: Adapter) -> Adapter:
        s = self.settings
        new, self.arrays["m"], self.arrays["v"] = adam_step(
            current, aggregate, self.arrays.get("m"), self.arrays.get("v"), self.steps + 1, self.lr,
            s.server_beta1, s.server_beta2, s.server_tau)
        self.steps += 1
        return new

    def describe(self) -> str:
        s = self.settings
        return (f"{super().describe()} server-beta1={s.server_beta1:g} server-beta2={s.server_beta2:g} "
                f"server-tau={s.server_tau:g}")

    def check_arrays(self, arrays: dict[str, Adapter]) -> None:
        if any(np.any(a < 0) for a in arrays.get("v", {}).values()):
            raise ValueError(f"{self.saved_name('v')} holds a negative second moment")
