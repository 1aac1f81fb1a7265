"""The records every protocol's messages share, and their codecs: the instruction header, the client report every
reply carries (typed, with `to_record` / `from_record`), and the reply of a node that keeps its own adapter.

Records: an instruction holds a ConfigRecord `config` (scalars), optionally an fp16 ArrayRecord `adapter` and a
JSON ConfigRecord `payload` (structured text). A reply holds a MetricRecord `metrics` (numbers), a JSON `payload`
and optionally an `adapter`. The server decodes replies from untrusted parties: every `from_record` used there
checks types and ranges and raises on anything malformed (the exchange's per-reply guard turns that into a drop).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from ..tasks.splits import MAX_NODES
from .codecs import (
    ADAPTER_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    NODE_ROUND_KEY,
    NODE_ROUNDS_KEY,
    PAYLOAD_KEY,
    adapter_from_record,
    adapter_record,
    config_int,
    metrics_record,
    payload_from_record,
    payload_record,
    record_of,
)
from .counters import ForeignCounts, FormatCounts, UptakeCounts
from .validate import Rejected, check_eval, number

if TYPE_CHECKING:
    from ..node.learner import Learner, WorkReport
    from ..protocols.base import RoundContext

log = logging.getLogger("pubswap_flwr")

Adapter = dict[str, Any]
MAX_SECONDS = 1e7  # any duration a client reports (about 4 months)
MAX_TIMESTAMP = 1e11  # a Unix time (year 5138)


# -- reading untrusted records (number() is validate's) ----------------------------------------------------------
def text(value: Any, what: str, limit: int = 1024) -> str:
    if not isinstance(value, str):
        raise Rejected(f"{what} must be text, got {type(value).__name__}")
    if len(value) > limit:
        raise Rejected(f"{what} has {len(value)} chars, over the {limit} limit")
    return value


def payload_of(content: RecordDict) -> dict:
    if PAYLOAD_KEY not in content:
        return {}
    payload = payload_from_record(record_of(content, PAYLOAD_KEY, ConfigRecord))
    if not isinstance(payload, dict):
        raise Rejected("payload is not a JSON object")
    return payload


def config_of(content: RecordDict) -> ConfigRecord:
    return record_of(content, CONFIG_KEY, ConfigRecord)


def adapter_of(content: RecordDict) -> Adapter | None:
    return adapter_from_record(record_of(content, ADAPTER_KEY, ArrayRecord)) if ADAPTER_KEY in content else None


def records(config: dict, *, adapter: Adapter | None = None, payload: dict | None = None) -> RecordDict:
    content = RecordDict({CONFIG_KEY: ConfigRecord(config)})
    if adapter is not None:
        content[ADAPTER_KEY] = adapter_record(adapter)
    if payload is not None:
        content[PAYLOAD_KEY] = payload_record(payload)
    return content


# -- messages every protocol shares ----------------------------------------------------------------------------
class Instruction:
    """A server-to-client message type: a frozen dataclass with `message_type`, `to_record` and `from_record`."""

    message_type: ClassVar[str]

    def to_record(self) -> RecordDict:
        raise NotImplementedError

    def to_message(self, node: int) -> Message:
        return Message(self.to_record(), dst_node_id=node, message_type=self.message_type)


@dataclass(frozen=True)
class Header:
    """In every instruction: the round, where the run lives, and whether this is the round's first message (the
    node then snapshots its state, so a resumed server can repeat the round exactly). Stamped per node by the
    exchange: `node_round`, the last round whose reply from this node was accepted, or, where the exchange does not
    know the node's id yet, `node_rounds`, that round for every node index (`accepted_round` picks)."""

    server_round: int
    run_name: str
    run_dir: str = ""
    round_start: bool = False
    node_round: int = 0
    node_rounds: dict[int, int] | None = None

    def accepted_round(self, index: int) -> int:
        return self.node_rounds.get(index, 0) if self.node_rounds is not None else self.node_round

    def to_config(self) -> dict:
        return {"server-round": self.server_round, "run-name": self.run_name, "run-dir": self.run_dir,
                "round-start": self.round_start}

    @classmethod
    def from_config(cls, config: ConfigRecord) -> "Header":
        server_round = config_int(config, "server-round")
        node_round = config_int(config, NODE_ROUND_KEY, 0)
        if not 0 <= node_round <= server_round:
            raise ValueError(f"{NODE_ROUND_KEY} = {node_round} is not a round in [0, {server_round}]")
        return cls(server_round, str(config["run-name"]), str(config.get("run-dir", "")),
                   bool(config.get("round-start", False)), node_round,
                   _node_rounds(config.get(NODE_ROUNDS_KEY), server_round))


# the longest {"<node index>": round} map: MAX_NODES entries of at most 32 characters each (an index below MAX_NODES
# and a round of at most 1e6, quoted and separated)
MAX_NODE_ROUNDS_CHARS = 32 * MAX_NODES


def _node_rounds(text: Any, server_round: int) -> dict[int, int] | None:
    """The exchange's {"<node index>": round} map, checked (ValueError names what is wrong): node indices below
    MAX_NODES, rounds not after this one, and the text no longer than such a map can be."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{NODE_ROUNDS_KEY} must be JSON text, got {type(text).__name__}")
    if len(text) > MAX_NODE_ROUNDS_CHARS:
        raise ValueError(f"{NODE_ROUNDS_KEY} is {len(text)} chars, longer than a map of {MAX_NODES} node indices")
    try:
        raw = json.loads(text)
    except RecursionError:
        raise ValueError(f"{NODE_ROUNDS_KEY} is JSON nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, or an integer of more than 4300 digits
        raise ValueError(f"{NODE_ROUNDS_KEY} is not JSON: {str(err)[:200]}") from None
    if not isinstance(raw, dict) or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 5 and int(k) < MAX_NODES
            and type(v) is int and 0 <= v <= server_round for k, v in raw.items()):
        raise ValueError(f"{NODE_ROUNDS_KEY} must map node indices < {MAX_NODES} to rounds in [0, {server_round}]")
    return {int(k): v for k, v in raw.items()}


@dataclass(frozen=True)
class ClientReport:
    """In every reply: who the node is, what it did (examples, rewards, steps) and when (its handler's clock)."""

    node_index: int
    num_examples: int
    cumulative_reward: float
    total_steps: int
    t_start: float
    t_end: float
    sample_seconds: float = 0.0
    update_seconds: float = 0.0
    train_reward: float | None = None  # mean reward of this message's private steps
    train_completions: int = 0
    rollout_reward: float | None = None  # SAPO: mean reward of this message's own rollouts
    model: str = ""
    tasks: tuple[str, ...] = ()
    formats: FormatCounts = FormatCounts()  # this message's own samples, and how many kept the answer format
    foreign: ForeignCounts = ForeignCounts()  # train.foreign-correction: the foreign text it trained on
    uptake: UptakeCounts = UptakeCounts()  # pubswap.measure-uptake

    @classmethod
    def of(cls, learner: Learner, report: WorkReport, started: float) -> "ClientReport":
        return cls(
            node_index=learner.identity.index, num_examples=report.num_examples,
            cumulative_reward=learner.state.cumulative_reward, total_steps=learner.state.steps, t_start=started,
            t_end=time.time(), sample_seconds=report.sample_seconds, update_seconds=report.update_seconds,
            train_reward=report.mean_reward("private") if report.has("private") else None,
            train_completions=sum(s.completions for s in report.steps if s.kind == "private"),
            rollout_reward=report.mean_reward("rollout") if report.has("rollout") else None,
            model=learner.identity.model_name, tasks=tuple(learner.task_names),
            formats=FormatCounts.of_shapes(learner.sampled_shapes),
            foreign=replace(report.foreign, fallbacks=sum(report.fallbacks.values())), uptake=report.uptake)

    def metrics(self) -> dict:
        out = {"node-index": self.node_index, "num-examples": self.num_examples,
               "cumulative-reward": self.cumulative_reward, "total-steps": self.total_steps,
               "t-start": self.t_start, "t-end": self.t_end, "sample-seconds": self.sample_seconds,
               "update-seconds": self.update_seconds, "train-completions": self.train_completions,
               **self.formats.to_metrics()}
        if self.train_reward is not None:
            out["train-reward"] = self.train_reward
        if self.rollout_reward is not None:
            out["rollout-reward"] = self.rollout_reward
        out.update(self.foreign.to_metrics())  # only with train.foreign-correction
        out.update(self.uptake.to_metrics())  # only with pubswap.measure-uptake
        return out

    def payload(self) -> dict:
        return {"model": self.model, "tasks": list(self.tasks)}

    @classmethod
    def from_records(cls, metrics: Any, payload: dict) -> "ClientReport":
        tasks = payload.get("tasks", [])
        if not isinstance(tasks, list) or len(tasks) > 256:
            raise Rejected("'tasks' must be a list of at most 256 names")
        # rewards are in [0, 1]; a node's cumulative reward adds one mean reward per round
        optional = {key: number(metrics, key, low=0, high=1) if key in metrics else None
                    for key in ("train-reward", "rollout-reward")}
        t_start = number(metrics, "t-start", 0.0, low=0, high=MAX_TIMESTAMP)
        t_end = number(metrics, "t-end", t_start, low=t_start, high=MAX_TIMESTAMP)
        return cls(
            node_index=int(number(metrics, "node-index", low=0, high=MAX_NODES - 1)),
            num_examples=int(number(metrics, "num-examples", 0.0, low=0, high=1e12)),
            cumulative_reward=number(metrics, "cumulative-reward", 0.0, low=0, high=1e9),
            total_steps=int(number(metrics, "total-steps", 0.0, low=0, high=1e12)),
            t_start=t_start, t_end=t_end,
            sample_seconds=number(metrics, "sample-seconds", 0.0, low=0, high=MAX_SECONDS),
            update_seconds=number(metrics, "update-seconds", 0.0, low=0, high=MAX_SECONDS),
            train_reward=optional["train-reward"],
            train_completions=int(number(metrics, "train-completions", 0.0, low=0, high=1e12)),
            rollout_reward=optional["rollout-reward"],
            formats=FormatCounts.from_metrics(metrics), foreign=ForeignCounts.from_metrics(metrics),
            uptake=UptakeCounts.from_metrics(metrics),
            model=text(payload.get("model", ""), "'model'"),
            tasks=tuple(text(t, "a task name", 256) for t in tasks))


def reply_records(report: ClientReport, *, payload: dict | None = None, metrics: dict | None = None,
                  adapter: Adapter | None = None) -> RecordDict:
    content = RecordDict({METRICS_KEY: metrics_record({**report.metrics(), **(metrics or {})}),
                          PAYLOAD_KEY: payload_record({**report.payload(), **(payload or {})})})
    if adapter is not None:
        content[ADAPTER_KEY] = adapter_record(adapter)
    return content


def read_reply(message: Message) -> tuple[Any, dict, ClientReport]:
    """(metrics, payload, report) of a reply; raises Rejected when either record is missing or malformed."""
    content = message.content
    if METRICS_KEY not in content or PAYLOAD_KEY not in content:
        raise Rejected("reply lacks its metrics or payload record")
    metrics = content[METRICS_KEY]
    payload = payload_of(content)
    return metrics, payload, ClientReport.from_records(metrics, payload)


# -- the reply of a node that keeps its own adapter (sapo, local) ------------------------------------------
@dataclass(frozen=True)
class OwnAdapterReply:
    """The reply of a node that keeps its own adapter: its report and, when asked, its self-reported held-out
    results of that adapter: `eval_initial` (round 1: its starting point) and `eval` (taking `eval_seconds`)."""

    report: ClientReport
    eval_initial: dict | None = None
    eval: dict | None = None
    eval_seconds: float = 0.0

    def to_record(self, payload: dict | None = None, metrics: dict | None = None) -> RecordDict:
        """The reply's records; a subclass adds its own `payload` and `metrics` entries."""
        payload, metrics = dict(payload or {}), dict(metrics or {})
        if self.eval_initial is not None:
            payload["eval-initial"] = self.eval_initial
        if self.eval is not None:
            payload["eval"] = self.eval
            metrics["eval-seconds"] = self.eval_seconds
        return reply_records(self.report, payload=payload, metrics=metrics)

    @classmethod
    def from_message(cls, message: Message) -> "OwnAdapterReply":
        metrics, payload, report = read_reply(message)
        return cls(report, **own_evaluations(metrics, payload, report))

    def record(self, ctx: RoundContext, node: int) -> None:
        """Into the round's log: the node's results (the metrics row's node_eval, their mean its eval, labelled
        self-reported; round 1's starting points make round 0's row) and the seconds they took."""
        if self.eval_initial is not None:
            ctx.log.initial_evals[str(node)] = self.eval_initial
        if self.eval is not None:
            ctx.log.node_evals[str(node)] = self.eval
        ctx.log.eval_seconds += self.eval_seconds


def own_evaluations(metrics: Any, payload: dict, report: ClientReport) -> dict:
    """A reply's OwnAdapterReply fields besides the report; a self-reported evaluation that fails validation is
    ignored with a warning, a malformed eval-seconds rejects the reply."""
    return {"eval_initial": _optional_eval(payload.get("eval-initial"), report, "initial evaluation"),
            "eval": _optional_eval(payload.get("eval"), report, "evaluation"),
            "eval_seconds": number(metrics, "eval-seconds", 0.0, low=0, high=MAX_SECONDS)}


def _optional_eval(value: Any, report: ClientReport, what: str) -> dict | None:
    if not value:
        return None
    try:
        return check_eval(value)
    except Rejected as err:
        log.warning("ignored node %d's %s: %s", report.node_index, what, err)
        return None
