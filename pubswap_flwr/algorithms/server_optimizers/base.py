"""A server optimizer's interface and registry, and `none` (the new global is the round's aggregate: FedAvg)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Protocol

import numpy as np

from ...registry import Registry

Adapter = dict[str, np.ndarray]
STATE_KEY = "server_optimizer"  # its entry in the protocol's checkpoint state

OPTIMIZERS: Registry[type["ServerOptimizer"]] = Registry("server optimizer")


class OptimizerSettings(Protocol):
    """The `strategy.*` keys a server optimizer reads (the config's StrategyConfig has them): which optimizer, its
    learning rate (0: the optimizer's default) and the FedOpt family's shared keys."""

    @property
    def server_optimizer(self) -> str: ...
    @property
    def server_lr(self) -> float: ...
    @property
    def server_momentum(self) -> float: ...
    @property
    def server_beta1(self) -> float: ...
    @property
    def server_beta2(self) -> float: ...
    @property
    def server_tau(self) -> float: ...


def register(name: str) -> Callable[[type["ServerOptimizer"]], type["ServerOptimizer"]]:
    """Class decorator: the optimizer `strategy.server-optimizer = name` selects (a name is registered once)."""

    def wrap(cls: type[ServerOptimizer]) -> type[ServerOptimizer]:
        if name in OPTIMIZERS:
            raise ValueError(f"server optimizer {name!r} is already registered by {OPTIMIZERS[name].__name__}")
        OPTIMIZERS.add(name, cls)
        cls.name = name
        return cls

    return wrap


def norm(adapter: Adapter) -> float:
    """The L2 norm over every tensor, summed in key order (a checkpointed adapter comes back in another order)."""
    return math.sqrt(sum(float(np.sum(np.square(adapter[k], dtype=np.float64))) for k in sorted(adapter)))


class ServerOptimizer(ABC):
    """Moves the global adapter from the round's aggregate. `step(current, aggregate)` gets the global the round's
    clients started from and the aggregate of their adapters, and returns the new global (fp32). State: `steps`
    taken and `arrays`, named adapter-shaped fp32 arrays (moments), both checkpointed with the protocol so a
    resumed run continues exactly; a subclass lists the names it keeps in `array_names`."""

    name: ClassVar[str] = ""
    doc: ClassVar[str] = ""  # one line for `strategy.server-optimizer`'s doc
    default_lr: ClassVar[float] = 1.0  # eta when strategy.server-lr = 0
    array_names: ClassVar[tuple[str, ...]] = ()
    # its golden runs (tests/golden): run name -> {"config": flat overrides naming it, "nodes": how many}
    golden_runs: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, settings: OptimizerSettings):
        self.settings = settings
        self.steps = 0
        self.arrays: dict[str, Adapter] = {}

    @property
    def lr(self) -> float:
        return self.settings.server_lr or self.default_lr

    @abstractmethod
    def step(self, current: Adapter, aggregate: Adapter) -> Adapter:
        """The new global adapter (fp32) from the one the round's clients started from and their aggregate."""

    def describe(self) -> str:
        return f"server-optimizer={self.name} server-lr={self.lr:g}"

    # -- checkpoint ------------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {STATE_KEY: {"name": self.name, "steps": self.steps}}

    def saved_arrays(self) -> dict[str, Adapter]:
        """The arrays under the checkpoint's adapter names (`server-<optimizer>-<array>`)."""
        return {self.saved_name(k): v for k, v in self.arrays.items()}

    def saved_name(self, array: str) -> str:
        return f"server-{self.name}-{array}"

    def restore(self, state: dict, adapters: dict[str, Adapter], most_steps: int) -> None:
        """Take back what `state()` and `saved_arrays()` kept (the checkpoint already checked the arrays' files,
        keys, shapes and finite values against the global adapter). A checkpoint without this optimizer's entry
        (written before it, or by a run without one) starts it afresh. ValueError names what does not fit."""
        saved = state.get(STATE_KEY)
        if saved is None:
            return
        if not isinstance(saved, dict) or saved.get("name") != self.name:
            raise ValueError(f"{STATE_KEY} must be an object naming {self.name!r}, got {str(saved)[:80]}")
        steps = saved.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= most_steps:
            raise ValueError(f"{STATE_KEY}.steps must be an integer in [0, {most_steps}], got {str(steps)[:40]}")
        arrays = {name: adapters.get(self.saved_name(name)) for name in self.array_names}
        missing = [self.saved_name(n) for n, a in arrays.items() if a is None]
        if steps > 0 and missing:
            raise ValueError(f"{STATE_KEY} took {steps} steps but the checkpoint lacks {', '.join(missing)}")
        self.check_arrays({n: a for n, a in arrays.items() if a is not None})
        self.steps = steps
        self.arrays = {n: {k: np.asarray(v, dtype=np.float32) for k, v in a.items()}
                       for n, a in arrays.items() if a is not None and steps > 0}

    def check_arrays(self, arrays: dict[str, Adapter]) -> None:
        """Optimizer-specific checks of restored arrays (ValueError); none by default."""


@register("none")
class Plain(ServerOptimizer):
    doc = "the new global is the aggregate (FedAvg)"

    def step(self, current: Adapter, aggregate: Adapter) -> Adapter:
        return aggregate

    def describe(self) -> str:
        return ""

    def state(self) -> dict[str, Any]:
        return {}
