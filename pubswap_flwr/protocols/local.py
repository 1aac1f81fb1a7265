"""Local training alone (the baseline of federating at all): one `train.alone` message per client per round.

Server → client: tau, and whether to evaluate. The client runs tau private GRPO steps (the learner every mode
uses) on its own adapter, which stays in its node state across rounds as a SAPO node's does; no adapter and no
rollout travels either way, and the server keeps no model. Nodes evaluate their own adapters on the run's held-out
items when asked (round 1 also measures their starting point): the metrics row's eval is the mean over nodes,
self-reported, as SAPO's, of the results that cover exactly the held-out items asked (wire/validate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from flwr.app import RecordDict

from ..node_runtime.serving import ClientWork, evaluate_own_adapter
from ..rounds.context import RoundContext
from ..schema import Count
from ..wire.records import (
    AskedEvaluations,
    Instruction,
    InstructionConfig,
    OwnAdapterReply,
)
from .base import ServerProtocol


# -- messages ------------------------------------------------------------------------------------------------------
class TrainAloneConfig(InstructionConfig, frozen=True, kw_only=True):
    local_steps: Count
    evaluate: bool = False  # its own adapter on the held-out set, after the steps
    save_adapter: bool = False  # the run's last round: save the adapter portable
    evaluate_initial: bool = False  # round 1: its starting point first


@dataclass(frozen=True)
class TrainAlone(Instruction):
    message_type: ClassVar[str] = "train.alone"
    config: TrainAloneConfig


# -- server --------------------------------------------------------------------------------------------------------
class LocalProtocol(ServerProtocol):
    holds_global_adapter = False
    per_node_models = True  # nothing is averaged, so nodes may run different models

    def describe(self) -> str:
        return f"tau={self.settings.train.local_steps} (nodes train alone)"

    def run_round(self, ctx: RoundContext) -> None:
        """tau private steps on every selected node's own adapter; their own evaluations recorded when asked."""
        nodes = ctx.exchange.select(ctx.number)
        asked = AskedEvaluations(self.settings.held_out, initial=ctx.number == 1, current=ctx.evaluate)
        config = TrainAloneConfig(local_steps=self.settings.train.local_steps, evaluate=asked.current,
                                  save_adapter=ctx.final, evaluate_initial=asked.initial)
        messages = [TrainAlone(ctx.header(round_start=True), config).to_message(node) for node in nodes]
        result = ctx.exchange.send(messages, lambda node, reply: OwnAdapterReply.from_message(reply, asked))
        ctx.log.absorb(result)
        for node in ctx.exchange.ordered(result.replies):  # by node index: means over nodes in one order
            ctx.log.record_own_evaluations(node, result.replies[node])


# -- client --------------------------------------------------------------------------------------------------------
def train_alone(work: ClientWork[None]) -> RecordDict:
    """Evaluate the starting point if asked, run tau private GRPO steps on the node's own adapter, evaluate (and at
    the end save) it if asked; reply the report and the evaluations, no adapter."""
    asked = TrainAlone.from_record(work.message.content).config
    eval_initial = work.evaluate() if asked.evaluate_initial else None
    work.learner.private_steps(asked.local_steps, work.report)
    evaluation, seconds = evaluate_own_adapter(work, asked.evaluate, asked.save_adapter)
    return OwnAdapterReply(work.client_report(), eval_initial, evaluation, seconds).to_record()
