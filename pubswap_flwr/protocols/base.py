"""The server side every protocol shares: the round context a protocol's server round works with, the base class
of a mode's server side, and the record of a round's scoring budget."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from .. import metrics_schema as schema
from ..config import ExperimentConfig
from ..config.sections import StrategyConfig, TasksConfig, TrainConfig
from ..rounds.context import RoundContext
from ..shared import task_universe
from ..wire.records import Adapter
from ..wire.validate import HeldOutRequest, Limits

log = logging.getLogger("pubswap_flwr")


@dataclass(frozen=True)
class RunSettings:
    """What every protocol's server side reads of the run, handed to its constructor: the seed, the number of
    rounds, the run-wide sections it acts on, and the limits of what a reply may hold."""

    seed: int
    rounds: int
    train: TrainConfig
    strategy: StrategyConfig
    tasks: TasksConfig
    limits: Limits
    held_out: HeldOutRequest | None = None  # the evaluation nodes that evaluate their own adapters are asked for

    @classmethod
    def of(cls, cfg: ExperimentConfig, held_out: bool = False) -> "RunSettings":
        """The run's settings; with `held_out`, also the held-out items (the task universe every party derives) and
        samples a node evaluating itself is asked for."""
        request = None
        if held_out:
            request = HeldOutRequest.of(task_universe(cfg).held_out.items, cfg.eval.sampled, cfg.eval.samples)
        return cls(cfg.seed, cfg.num_server_rounds, cfg.train, cfg.strategy, cfg.tasks, Limits.of(cfg), request)


class ServerProtocol(ABC):
    """A mode's server side. Subclasses set the class attributes and implement `run_round`; their parameters come
    through the constructor (`from_config` reads them from a run's config once: the run-wide RunSettings, and a
    mode with its own section adds that section)."""

    holds_global_adapter: ClassVar[bool] = True  # the server keeps, evaluates and saves a global adapter
    per_node_models: ClassVar[bool] = False  # nodes may run different models
    reward_field: ClassVar[str] = schema.TRAIN_REWARD  # the client field the round's train_reward averages

    def __init__(self, settings: RunSettings, public=None):
        self.settings = settings
        self.public = public  # the public set (PubSwap's public prompts), from shared.task_universe
        self.master: Adapter | None = None  # fp32 global adapter when holds_global_adapter

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, public=None) -> "ServerProtocol":
        # a mode without a global adapter has its nodes evaluate their own: the server checks them against held_out
        return cls(RunSettings.of(cfg, held_out=not cls.holds_global_adapter), public)

    @property
    def proximal_mu(self) -> float:
        """FedProx's mu for the nodes' GRPO loss (0 = none), sent in every message's header."""
        return 0.0

    def describe(self) -> str:
        return ""

    @abstractmethod
    def run_round(self, ctx: RoundContext) -> None:
        """One round: send the mode's messages through `ctx.exchange`, fold the replies into `ctx.log`, and leave
        the new global adapter in `self.master` when the mode keeps one."""

    def state(self) -> dict:
        """JSON-able protocol state for the checkpoint (the global adapter is saved apart)."""
        return {}

    def saved_adapters(self) -> dict[str, Adapter]:
        """Adapters besides the global that the checkpoint keeps, by name (the compressed downlink's H)."""
        return {}

    def restore(self, state: dict, adapters: dict[str, Adapter] | None = None,
                nodes: dict[int, int] | None = None) -> None:
        """Continue from a checkpoint's `state()` and `saved_adapters()` (`nodes`: the node ids it knows, with
        their indices). The state comes from a file: anything of the wrong type or out of its range raises
        ValueError naming the key (checkpoint.load then falls back to the previous checkpoint)."""


def record_scoring(ctx: RoundContext, budget) -> None:
    """Per client, how many of its answers the server's scoring timed out on or skipped (budget spent) this round;
    only clients with any are listed."""
    for node, usage in budget.summary().items():
        if usage["timeouts"] or usage["skipped"]:
            row = ctx.log.client(node)
            row["scoring_timeouts"] = int(usage["timeouts"])
            row["scoring_skipped"] = int(usage["skipped"])
            log.warning("round %d: scoring client %d's answers: %d timed out, %d skipped (budget spent)", ctx.number,
                        node, usage["timeouts"], usage["skipped"])
