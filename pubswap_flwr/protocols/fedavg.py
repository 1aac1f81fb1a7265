"""FedAvg-GRPO and FedProx-GRPO (FedProx = FedAvg + mu): one `train.local_round` message per client per round.

Server → client: the global adapter (fp16) and tau. The client loads it (it is also the FedProx reference), runs
tau private GRPO steps and replies its adapter. The server checks every adapter against the global one (keys,
shapes, finite values) and averages every LoRA tensor weighted by the client's examples into fp32 master weights
(or a robust variant: `strategy.aggregation`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from flwr.app import Message, RecordDict

from .. import metrics_schema as schema
from ..algorithms.lora_averaging import MIN_ROBUST_REPLIES, AggregationRule, Combined, combine, mean_pairwise_l2
from ..algorithms.server_optimizers import ServerOptimizer, norm
from ..algorithms.server_optimizers import build as build_optimizer
from ..config.sections import StrategyConfig
from ..node_runtime.serving import ClientWork
from ..rounds.context import RoundContext
from ..schema import Count
from ..wire.compression import Codec, Quantized
from ..wire.records import (
    Adapter,
    ClientReport,
    Instruction,
    InstructionConfig,
    adapter_of,
    config_of,
    read_reply,
    records,
    reply_records,
)
from ..wire.validate import Rejected, check_adapter, check_weight
from .base import RunSettings, ServerProtocol, log
from .transfer import (
    Downlink,
    adapter_to_send,
    broadcast_of,
    checked_upload,
    decoded,
    downlink_checkpoint,
    global_for,
    put_quantized,
    restore_downlink,
    start_round,
    take_global,
)


# -- messages ------------------------------------------------------------------------------------------------------
class LocalRoundConfig(InstructionConfig, frozen=True, kw_only=True):
    local_steps: Count  # tau, the node's private steps this round


@dataclass(frozen=True)
class LocalRound(Instruction):
    message_type: ClassVar[str] = "train.local_round"
    config: LocalRoundConfig
    adapter: Adapter | None  # None only when `downlink` carries the global as a delta
    downlink: Downlink | None = None  # strategy.compression

    def to_record(self) -> RecordDict:
        extra = self.downlink.config() if self.downlink is not None else {}
        content = records({**self.config_record(), **extra}, adapter=self.adapter)
        return put_quantized(content, self.downlink.delta if self.downlink is not None else None)

    @classmethod
    def from_record(cls, content: RecordDict) -> "LocalRound":
        header, config = cls.read(content)
        adapter = adapter_of(content)
        downlink = Downlink.read(config_of(content), content)
        if adapter is None and (downlink is None or downlink.delta is None):
            raise ValueError("a local round needs the global adapter")
        return cls(header, config, adapter, downlink)


@dataclass(frozen=True)
class AdapterReply:
    """The client's adapter after its local steps (fedavg/fedprox; pubswap's last segment adds it too)."""

    report: ClientReport
    adapter: Adapter | Quantized  # Quantized: strategy.compression's delta against the global the node holds

    def to_record(self) -> RecordDict:
        if isinstance(self.adapter, Quantized):
            return put_quantized(reply_records(self.report), self.adapter)
        return reply_records(self.report, adapter=self.adapter)

    @classmethod
    def from_message(cls, message: Message, reference: Adapter, codec: Codec | None = None) -> "AdapterReply":
        _, _, report = read_reply(message)
        return cls(report, checked_adapter(message.content, reference, codec))


def checked_adapter(content: RecordDict, reference: Adapter, codec: Codec | None = None) -> Adapter:
    """The reply's adapter as fp32 after key, shape and finiteness checks against the global adapter (with
    compression: decoded as a delta against `reference`, the global the node was sent, and checked)."""
    if codec is not None:
        return checked_upload(content, reference, codec)
    adapter = adapter_of(content)
    if adapter is None:
        raise Rejected("reply has no adapter")
    return check_adapter(adapter, reference)


# -- server --------------------------------------------------------------------------------------------------------
def aggregate_adapters(ctx: RoundContext, settings: RunSettings, master: Adapter, adapters: dict[int, Adapter],
                       expected: dict[int, float], base: Adapter | None = None,
                       optimizer: ServerOptimizer | None = None) -> Adapter:
    """The new global adapter from the round's valid adapters, each weighted by the examples its client reported over
    the round but never more than the server asked it for (`expected`: steps x prompts x K), so no claim can take the
    average over; a client with no valid weight is dropped, one that trained on no examples is left out
    (`untrained_clients`); `master` is kept when fewer than min-clients remain, or when a robust rule has fewer than 3
    votes (lora_averaging.combine). `base` is the global the clients started from (update clipping and the server
    optimizer measure from it; default `master`); `optimizer` (strategy.server-optimizer) moves it from the
    aggregate."""
    started = time.perf_counter()
    valid: dict[int, tuple[Adapter, float]] = {}
    untrained = []
    for node in ctx.exchange.ordered(adapters):
        if not ctx.log.client(node).get("examples", 0):  # no bad reply: every step was skipped (dynamic sampling)
            untrained.append(node)
            continue
        try:
            claimed = check_weight(ctx.log.client(node).get("examples", 0))
            valid[node] = adapters[node], min(claimed, float(expected.get(node, 0.0)))
            check_weight(valid[node][1])
        except Rejected as err:
            ctx.log.drop(node, f"rejected reply: {err}")
            valid.pop(node, None)
    if untrained:
        ctx.log.extra[schema.UNTRAINED_CLIENTS] = untrained
        log.info("round %d: clients %s trained on no examples (train.dynamic-sampling skipped every step: no group "
                 "whose rewards differ), left out of the aggregate", ctx.number, untrained)
    s = settings.strategy
    if len(valid) < s.min_clients:
        ctx.log.extra["aggregated"] = False
        ctx.log.extra[schema.KEPT_REASON] = (f"{len(valid)} valid adapters (< strategy.min-clients = "
                                             f"{s.min_clients})")
        log.warning("round %d: %d valid adapters (< strategy.min-clients = %d): global adapter kept",
                    ctx.number, len(valid), s.min_clients)
    else:
        chosen = [a for a, _ in valid.values()]
        reference = master if base is None else base
        ctx.log.extra[schema.PARAMETER_DRIFT] = mean_pairwise_l2(chosen)
        rule = rule_of(s)
        result = combine(chosen, [w for _, w in valid.values()], reference, rule,
                         rng=np.random.default_rng([settings.seed, ctx.number]))
        record_combination(ctx, list(valid), result, rule)
        if result.adapter is not None:
            master = result.adapter
            if optimizer is not None:
                master = server_step(ctx, optimizer, reference, master)
        ctx.log.extra["aggregated"] = result.adapter is not None
    ctx.log.extra["aggregated_clients"] = sorted(valid)
    ctx.log.server_seconds += time.perf_counter() - started
    return master


def rule_of(strategy: StrategyConfig) -> AggregationRule:
    return AggregationRule(strategy.aggregation, trim_fraction=strategy.trim_fraction,
                           median_clip=strategy.median_clip, idle_floor=strategy.idle_floor,
                           apply_below_minimum=strategy.apply_below_robust, clip_norm=strategy.clip_norm,
                           noise_multiplier=strategy.dp_noise_multiplier)


def record_combination(ctx: RoundContext, nodes: list[int], result: Combined, rule: AggregationRule) -> None:
    """The metrics row's account of the round's aggregation, each part also logged under a robust rule: `robust` (true
    when the aggregate outvotes b bad clients of n >= 2b + 1, else false with `robust_reason`), `idle` (only when any
    reply was: the bound and each idle client's update norm; together they counted as one vote), `kept_reason` (a
    round below the robust minimum, not applied), `median_clip` (only when any client was scaled: the bound, the
    median of the votes' norms and each client actually scaled with its norm)."""
    extra, votes = ctx.log.extra, result.votes
    extra["robust"] = result.robust_reason is None
    if result.robust_reason is not None:
        extra["robust_reason"] = result.robust_reason
    if votes.idle:
        norms = {nodes[i]: votes.norms[i] for i in votes.idle}
        extra["idle"] = {"bound": votes.bound, "clients": norms}
        log.warning("round %d: clients %s sent updates of norm at most strategy.idle-floor = %g x the median "
                    "(%.4g): counted as one vote", ctx.number, ", ".join(map(str, norms)), rule.idle_floor,
                    votes.bound)
    if result.kept_reason is not None:
        extra[schema.KEPT_REASON] = result.kept_reason
        log.warning("round %d: %s", ctx.number, result.kept_reason)
    elif result.robust_reason is not None and rule.method != "mean":
        below = len(votes.adapters) < MIN_ROBUST_REPLIES
        log.warning("round %d: not robust: %s%s", ctx.number, result.robust_reason,
                    "; applied anyway (strategy.apply-below-robust = true)" if below else "")
    if result.clipped:
        over = {nodes[i]: norm for i, norm in result.clipped.items()}
        extra["median_clip"] = {"bound": result.clip_bound, "median": result.clip_median, "clipped": over}
        for node, norm in over.items():
            log.warning("round %d: client %d's update norm %.4g is over strategy.median-clip = %g x the median "
                        "%.4g: scaled down to %.4g", ctx.number, node, norm, rule.median_clip, result.clip_median,
                        result.clip_bound)


def server_step(ctx: RoundContext, optimizer: ServerOptimizer, current: Adapter, aggregate: Adapter) -> Adapter:
    """The server optimizer's new global from the round's aggregate; unless it is `none`, the metrics row gets
    `server_optimizer`: its step count, and the norms of the aggregate's update and of the step it took."""
    new = optimizer.step(current, aggregate)
    if optimizer.name != "none":
        ctx.log.extra[schema.SERVER_OPTIMIZER] = {
            "steps": optimizer.steps, "aggregate_norm": norm({k: aggregate[k] - current[k] for k in current}),
            "update_norm": norm({k: new[k] - current[k] for k in current})}
    return new


class AveragingProtocol(ServerProtocol):
    """A mode whose server averages the nodes' adapters into a global one (fedavg, fedprox, pubswap): the global's
    downlink (strategy.compression) and the server optimizer, both kept in its checkpoint."""

    def __init__(self, settings: RunSettings, public=None):
        super().__init__(settings, public)
        self.broadcast = broadcast_of(settings.strategy)
        self.optimizer = build_optimizer(settings.strategy)

    def state(self) -> dict:
        downlink, _ = downlink_checkpoint(self.broadcast)
        return {**downlink, **self.optimizer.state()}

    def saved_adapters(self) -> dict[str, Adapter]:
        _, adapters = downlink_checkpoint(self.broadcast)
        return {**adapters, **self.optimizer.saved_arrays()}

    def restore(self, state: dict, adapters: dict[str, Adapter] | None = None,
                nodes: dict[int, int] | None = None) -> None:
        restore_downlink(self.broadcast, state, adapters or {})
        self.optimizer.restore(state, adapters or {}, self.settings.rounds)


class FedAvgProtocol(AveragingProtocol):
    def describe(self) -> str:
        return " ".join(filter(None, [f"tau={self.settings.train.local_steps}", self.optimizer.describe()]))

    def run_round(self, ctx: RoundContext) -> None:
        """The global to every selected node (with compression: as a quantized delta to nodes holding the last one),
        tau local steps, the replies' adapters averaged."""
        assert self.master is not None
        nodes = ctx.exchange.select(ctx.number)
        sent, codec = start_round(self.broadcast, self.master)
        messages = []
        for node in nodes:
            whole, downlink = global_for(self.broadcast, sent, node)
            messages.append(LocalRound(ctx.header(round_start=True, proximal_mu=self.proximal_mu),
                                       LocalRoundConfig(local_steps=self.settings.train.local_steps), whole,
                                       downlink).to_message(node))
        result = ctx.exchange.send(messages, lambda node, reply: AdapterReply.from_message(reply, sent, codec))
        if self.broadcast is not None:
            self.broadcast.confirm(result.replies)
        ctx.log.absorb(result)
        t = self.settings.train
        expected = {n: float(t.local_steps * t.prompts_per_step * t.completions_per_prompt) for n in nodes}
        self.master = aggregate_adapters(ctx, self.settings, self.master,
                                         {n: decoded(r.adapter) for n, r in result.replies.items()}, expected,
                                         base=sent, optimizer=self.optimizer)


class FedProxProtocol(FedAvgProtocol):
    """FedAvg + mu/2·||w − w_global||² in every client's GRPO loss."""

    @property
    def proximal_mu(self) -> float:
        return self.settings.strategy.proximal_mu

    def describe(self) -> str:
        return f"{super().describe()} mu={self.settings.strategy.proximal_mu}"


# -- client --------------------------------------------------------------------------------------------------------
def local_round(work: ClientWork[None]) -> RecordDict:
    """Load the global adapter, run tau private GRPO steps, reply the adapter."""
    message = LocalRound.from_record(work.message.content)
    take_global(work, message.adapter, message.downlink)
    work.learner.private_steps(message.config.local_steps, work.report)
    return AdapterReply(work.client_report(), adapter_to_send(work)).to_record()

