"""Server optimizers: how the global adapter moves from the round's aggregate of the clients' adapters, under fedavg,
fedprox and pubswap (Reddi et al., "Adaptive Federated Optimization", 2021: the FedOpt family; Flower ships FedAvgM
and FedAdam for whole models). `strategy.server-optimizer` names one; `strategy.server-lr` (eta) and the FedOpt
family's shared keys (`server-momentum`, `server-beta1`, `server-beta2`, `server-tau`) set it.

Every module in this folder registers its optimizer with `@register("<name>")` (base.py) and is imported here, so
the config's choices and the protocols find it without a list to extend: adding an optimizer is its module (its
class declares its golden run in `golden_runs`), its tests, its recorded tests/golden/<name>.json and
its docs. Importing this package loads numpy only (config.py imports it).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from .base import OPTIMIZERS, STATE_KEY, Adapter, ServerOptimizer, norm, register

if TYPE_CHECKING:
    from ...config import StrategyConfig

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


def build(settings: "StrategyConfig") -> ServerOptimizer:
    return OPTIMIZERS[settings.server_optimizer](settings)


__all__ = ["OPTIMIZERS", "STATE_KEY", "Adapter", "ServerOptimizer", "build", "described", "golden_runs", "names",
           "norm", "register"]
