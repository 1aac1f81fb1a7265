"""A node's side of every protocol: the work a client handler is given (ClientWork), the ClientApp function that
serves a handler (`serve`: config, learner from its disk state, round-start snapshot, save), the check that a node's
saved state continues the server's record, and the self-evaluation of a node that keeps its own adapter."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Protocol, TypeVar

import msgspec
from flwr.app import Context, Message, RecordDict

from ..config import ExperimentConfig
from ..evaluation import evaluate
from ..logs import route_logs_to_flower
from ..model_packages import same_shapes, shape_family
from ..shared import eval_settings
from ..wire.counters import FormatCounts
from ..wire.records import ClientReport, Header, config_of
from .learner import Learner, NodeSettings, WorkReport
from .state import NodeIdentity

log = logging.getLogger("pubswap_flwr")


class ModeTraits(Protocol):
    """What a node reads of its run's protocol (a protocols.base.ServerProtocol class): whether nodes may run
    different models. Everything else of the protocol's settings comes in the message."""

    per_node_models: bool


Section = TypeVar("Section")  # a mode's own config section (config/catalog.py), or None for a mode without one


@dataclass
class ClientWork(Generic[Section]):
    """What a client handler works with: this node's learner (with the run-wide settings it reads), the mode's own
    config section (sapo.*, pubswap.*: `ClientWork[SapoConfig]`; None for a mode without one), the decoded message,
    and the report."""

    learner: Learner
    section: Section
    header: Header
    message: Message
    report: WorkReport = field(default_factory=WorkReport)
    started: float = field(default_factory=time.time)

    @property
    def settings(self) -> NodeSettings:
        return self.learner.settings

    def evaluate(self) -> dict:
        """The node's own model on the held-out set (SAPO: there is no global model)."""
        s = self.settings
        return evaluate(self.learner.policy, self.learner.universe.held_out.items,
                        eval_settings(s.eval, s.generation, s.seed), rewards=self.learner.rewards)

    def client_report(self) -> ClientReport:
        return client_report(self.learner, self.report, self.started)


def client_report(learner: Learner, report: WorkReport, started: float) -> ClientReport:
    """The report every reply carries, from the node's learner and what this message's work did (the node builds it;
    the wire only declares and checks it)."""
    return ClientReport(
        node_index=learner.identity.index, num_examples=report.num_examples,
        cumulative_reward=learner.state.cumulative_reward, total_steps=learner.state.steps, t_start=started,
        t_end=time.time(), sample_seconds=report.sample_seconds, update_seconds=report.update_seconds,
        train_reward=report.mean_reward("private") if report.has("private") else None,
        train_completions=sum(s.completions for s in report.steps if s.kind == "private"),
        rollout_reward=report.mean_reward("rollout") if report.has("rollout") else None,
        model=learner.identity.model_name, tasks=tuple(learner.task_names),
        formats=FormatCounts.of_shapes(learner.sampled_shapes),
        foreign=msgspec.structs.replace(report.foreign, fallbacks=sum(report.fallbacks.values())),
        uptake=report.uptake, signal=report.signal, sampling=report.sampling,
        curriculum=learner.curriculum_levels)


ClientHandler = Callable[[ClientWork[Any]], RecordDict]


# -- modes whose nodes keep their own adapters (sapo, local): self-evaluation ------------------------------------
def evaluate_own_adapter(work: ClientWork[Any], evaluate: bool, save: bool) -> tuple[dict | None, float]:
    """A node that keeps its own adapter: its held-out results when asked (`evaluate`), with the seconds they took,
    and at the run's end (`save`) the adapter saved portable in its state dir (tokenizer, card, base-model
    reference)."""
    evaluation, seconds = None, 0.0
    if evaluate:
        started = time.perf_counter()
        evaluation = work.evaluate()
        seconds = time.perf_counter() - started
    if save:
        from ..export import run_summary, save_adapter, write_card

        folder = work.learner.state_dir / "adapter"
        save_adapter(work.learner.policy, folder)
        write_card(folder, run_summary(work.settings, work.header.server_round, {"eval": evaluation or {}},
                                       node=work.learner.state_dir.name, spec=work.learner.policy.spec))
    return evaluation, seconds


class NodeStateError(RuntimeError):
    """A simulated node's saved state is behind the last round the server accepted from it."""


def check_state_continues(learner: Learner, header: Header) -> None:
    """The server accepted this node's reply in round `header.accepted_round(index)`, and a node saves its state
    before it replies, so its state must reach that round. Behind it, the state was lost or is a stale copy: on a
    Ray cluster whose machines do not share the run dir, a node's state is on whichever machine ran it last. A
    simulated node refuses to go on (its reply is dropped with this reason); a deployed node whose state dir was
    lost warns and continues from what it has, as a node that rejoins (the server's record catches up with its next
    reply)."""
    have, accepted = learner.state.last_round, header.accepted_round(learner.identity.index)
    if have >= accepted:
        return
    if learner.identity.simulated:  # the hint first: a reply's error text is cut at 300 characters
        raise NodeStateError(f"node {learner.identity.index}'s saved state is behind the server's record (round "
                             f"{have} < {accepted}): lost, or another machine's stale copy; on a Ray cluster "
                             f"output.dir must be on a filesystem every machine shares. State dir: "
                             f"{learner.identity.state_dir}")
    log.warning("node %d's saved state in %s is behind the server's record (round %d < %d): the state dir was lost "
                "or replaced; continuing from the state it holds", learner.identity.index, learner.identity.state_dir,
                have, accepted)


def serve(handler: ClientHandler, modes: tuple[str, ...],
          resolve: Callable[[ExperimentConfig], ModeTraits], run_config: dict | None = None,
          section: str | None = None):
    """A ClientApp function running `handler` (a message type the protocol of `modes` sends): reads the config,
    builds this node's learner from its disk state, snapshots at a round's start, runs the handler, saves the state.
    `resolve(cfg)` is the run's protocol; `run_config` replaces context.run_config (in-process simulation);
    `section` names the protocol's own config section, which the handler gets as `work.section`."""

    def entry(message: Message, context: Context) -> Message:
        started = time.time()
        route_logs_to_flower()
        cfg = ExperimentConfig.from_flat(run_config if run_config is not None else context.run_config)
        if cfg.strategy.mode not in modes:
            raise ValueError(f"message type {message.metadata.message_type!r} belongs to another mode than this "
                             f"run's strategy.mode = {cfg.strategy.mode!r}")
        protocol = resolve(cfg)
        header = Header.from_config(config_of(message.content))
        identity = NodeIdentity.from_flower(cfg, dict(context.node_config), context.node_id, header.run_dir or None,
                                            header.run_name)
        if not protocol.per_node_models and not same_shapes(identity.model_name, cfg.model.name):
            raise ValueError(f"this node's model {identity.model_name!r} has other parameter shapes than the run's "
                             f"model.name {cfg.model.name!r} ({shape_family(identity.model_name)} against "
                             f"{shape_family(cfg.model.name)}); strategy.mode = {cfg.strategy.mode!r} averages one "
                             "adapter, so every node's base must take it (sapo lets nodes keep different models)")
        learner = Learner(NodeSettings.of(cfg), identity, header.proximal_mu)
        check_state_continues(learner, header)
        if header.round_start:
            learner.begin_round(header.server_round)
        work = ClientWork(learner, getattr(cfg, section) if section else None, header, message, started=started)
        content = handler(work)
        learner.state.rounds = max(learner.state.rounds, header.server_round)
        learner.state.last_round = header.server_round
        learner.save()
        return Message(content, reply_to=message)

    entry.__name__ = getattr(handler, "__name__", "entry")
    return entry

