"""Server optimizers: how the global adapter moves from the round's aggregate of the clients' adapters, under fedavg,
fedprox and pubswap (Reddi et al., "Adaptive Federated Optimization", 2021: the FedOpt family; Flower ships FedAvgM
and FedAdam for whole models). `strategy.server-optimizer` names one; `strategy.server-lr` (eta) and the FedOpt
family's shared keys (`server-momentum`, `server-beta1`, `server-beta2`, `server-tau`) set it.

Every module in this folder registers its optimizer with `@register("<name>")` (base.py) and is imported here, so
the config's choices and the protocols find it without a list to extend: adding an optimizer is its module (its
class declares its golden run in `golden_runs`), its tests, its recorded tests/golden/<name>.json and its docs.
Importing this package loads numpy only (config/sections.py imports it for `strategy.server-optimizer`'s choices)."""

from __future__ import annotations

import importlib
import pkgutil

from .base import OPTIMIZERS, STATE_KEY, Adapter, OptimizerSettings, ServerOptimizer, norm, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def names() -> tuple[str, ...]:
    """Every registered optimizer, `none` first."""
    return ("none", *sorted(n for n in OPTIMIZERS if n != "none"))


def golden_runs() -> dict[str, dict]:
    """Every optimizer's golden runs (tests/golden), name -> {"config", "nodes"}, in `names()` order."""
    return {run: spec for name in names() for run, spec in OPTIMIZERS[name].golden_runs.items()}


def described() -> str:
    """Each optimizer with its one-line doc (`strategy.server-optimizer`'s doc)."""
    return "; ".join(f"{name}: {OPTIMIZERS[name].doc}" for name in names())


def build(settings: OptimizerSettings) -> ServerOptimizer:
    return OPTIMIZERS[settings.server_optimizer](settings)


__all__ = ["OPTIMIZERS", "STATE_KEY", "Adapter", "OptimizerSettings", "ServerOptimizer", "build", "described",
           "golden_runs", "names", "norm", "register"]
