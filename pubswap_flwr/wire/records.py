"""The records every protocol's messages share, and their codecs: the instruction header, the client report every
reply carries (typed, with `to_record` / `from_record`), and the reply of a node that keeps its own adapter.

Records: an instruction holds a ConfigRecord `config` (scalars), optionally an fp16 ArrayRecord `adapter` and a
JSON ConfigRecord `payload` (structured text). A reply holds a MetricRecord `metrics` (numbers), a JSON `payload`
and optionally an `adapter`. The server decodes replies from untrusted parties: every `from_record` used there
checks types and ranges and raises on anything malformed (the exchange's per-reply guard turns that into a drop).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Mapping, TypeVar

import msgspec
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from msgspec import Meta, Struct

from ..config.sections import MAX_PROXIMAL_MU
from ..schema import Count, Reward, RewardTotal, Tally, parse
from ..tasks.curriculum import Level
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
    metrics_record,
    payload_from_record,
    payload_record,
    record_of,
)
from .counters import ForeignCounts, FormatCounts, SamplingCounts, SignalCounts, UptakeCounts
from .validate import HeldOutRequest, Rejected, check_eval

Adapter = dict[str, Any]
MAX_SECONDS = 1e7  # any duration a client reports (about 4 months)
MAX_TIMESTAMP = 1e11  # a Unix time (year 5138)
Seconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
Timestamp = Annotated[float, Meta(ge=0, le=MAX_TIMESTAMP)]


# -- reading untrusted records ---------------------------------------------------------------------------------
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
class InstructionConfig(Struct, frozen=True, kw_only=True, rename="kebab"):
    """A message type's own keys in its instruction's config record, each declared once with its type and bounds:
    the server writes them from the fields (kebab-case names), a node parses them back against the same declaration,
    as in "instruction config.local-steps: expected `int`, got `float`" (a subclass per message type:
    fedavg.LocalRoundConfig, ...). The header's keys are InstructionFields'."""


InstructionT = TypeVar("InstructionT", bound="Instruction")


@dataclass(frozen=True)
class Instruction:
    """A server-to-client message type: its header, its own config keys (`config`, whose annotation in the subclass
    names the type's InstructionConfig) and, in a subclass, what travels beside them (an adapter, a payload), which
    its `to_record` and `from_record` add to `config_record()` and `read()`. A subclass must name its
    `message_type` (`train.<action>` or `query.<action>`, Flower's only forms)."""

    message_type: ClassVar[str]
    header: Header
    config: InstructionConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "message_type", None), str):
            raise TypeError(f"{cls.__name__}: an instruction must name its message_type")

    def config_record(self) -> dict:
        return {**self.header.to_config(), **msgspec.to_builtins(self.config)}

    def to_record(self) -> RecordDict:
        """The message's content as the node reads it back with `from_record` (here: the config record alone)."""
        return records(self.config_record())

    @classmethod
    def config_type(cls) -> type[InstructionConfig]:
        """The InstructionConfig subclass the type's `config` annotation names."""
        return typing.get_type_hints(cls)["config"]

    @classmethod
    def read(cls, content: RecordDict) -> tuple[Header, Any]:
        """The header and the type's own keys of a received instruction, each checked against its declaration."""
        config = config_of(content)
        return Header.from_config(config), instruction_fields(config, cls.config_type())

    @classmethod
    def from_record(cls: type[InstructionT], content: RecordDict) -> InstructionT:
        """The instruction a node received, every field checked (ValueError naming the field)."""
        return cls(*cls.read(content))

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
    proximal_mu: float = 0.0  # FedProx's term for this message's local steps (Flower's FedProx sends it the same way)

    def accepted_round(self, index: int) -> int:
        return self.node_rounds.get(index, 0) if self.node_rounds is not None else self.node_round

    def to_config(self) -> dict:
        config = {"server-round": self.server_round, "run-name": self.run_name, "run-dir": self.run_dir,
                  "round-start": self.round_start}
        if self.proximal_mu:  # only FedProx's messages carry it: the others' bytes stay as they were
            config["proximal-mu"] = self.proximal_mu
        return config

    @classmethod
    def from_config(cls, config: ConfigRecord | dict) -> "Header":
        return instruction_fields(config, InstructionFields).header()


class InstructionFields(Struct, frozen=True, kw_only=True, rename="kebab"):
    """The header's keys in an instruction's config record, which every instruction carries beside its type's own
    (an InstructionConfig). Keys neither declares (strategy.compression's downlink keys, which transfer.Downlink
    reads) are left to their readers."""

    server_round: Count
    run_name: Annotated[str, Meta(max_length=255)]  # one path component (node_runtime.state.safe_component checks it)
    run_dir: str = ""
    round_start: bool = False
    node_round: Count = 0  # NODE_ROUND_KEY
    node_rounds: str | None = None  # NODE_ROUNDS_KEY: JSON text, checked by _node_rounds
    proximal_mu: Annotated[float, Meta(ge=0, le=MAX_PROXIMAL_MU)] = 0.0

    def header(self) -> Header:
        if self.node_round > self.server_round:
            raise ValueError(f"{NODE_ROUND_KEY} = {self.node_round} is not a round in [0, {self.server_round}]")
        return Header(self.server_round, self.run_name, self.run_dir, self.round_start, self.node_round,
                      _node_rounds(self.node_rounds, self.server_round), self.proximal_mu)


F = TypeVar("F", bound=Struct)


def instruction_fields(config: ConfigRecord | dict, fields: type[F]) -> F:
    """An instruction's config record checked against its declaration; ValueError naming the key, as in
    "instruction config.local-steps: expected `int`, got `float`"."""
    return parse(dict(config), fields, "instruction config", ValueError)


# the longest {"<node index>": round} map: MAX_NODES entries of at most 32 characters each (an index below MAX_NODES
# and a round of at most 1e6, quoted and separated)
MAX_NODE_ROUNDS_CHARS = 32 * MAX_NODES


# \Z, not $: msgspec matches a pattern with re.search, and "$" also matches before a final newline ("3\n")
NodeRounds = dict[Annotated[str, Meta(pattern=r"^[0-9]{1,5}\Z")], Annotated[int, Meta(ge=0)]]


def _node_rounds(value: str | None, server_round: int) -> dict[int, int] | None:
    """The exchange's {"<node index>": round} map, checked (ValueError names what is wrong): node indices below
    MAX_NODES, rounds not after this one, and the text no longer than such a map can be."""
    if value is None:
        return None
    if len(value) > MAX_NODE_ROUNDS_CHARS:
        raise ValueError(f"{NODE_ROUNDS_KEY} is {len(value)} chars, longer than a map of {MAX_NODES} node indices")
    try:
        raw = msgspec.json.decode(value)
    except RecursionError:
        raise ValueError(f"{NODE_ROUNDS_KEY} is JSON nested too deeply") from None
    except msgspec.DecodeError as err:  # also an integer too large for 64 bits
        raise ValueError(f"{NODE_ROUNDS_KEY} is not JSON: {str(err)[:200]}") from None
    rounds = {int(k): v for k, v in parse(raw, NodeRounds, NODE_ROUNDS_KEY, ValueError).items()}
    if any(index >= MAX_NODES for index in rounds) or any(r > server_round for r in rounds.values()):
        raise ValueError(f"{NODE_ROUNDS_KEY} must map node indices < {MAX_NODES} to rounds in [0, {server_round}]")
    return rounds


class ReportMetrics(Struct, frozen=True, rename="kebab"):
    """A ClientReport's numbers in a reply's metrics (its counter blocks read their own keys)."""

    node_index: Annotated[int, Meta(ge=0, lt=MAX_NODES)]
    num_examples: Tally = 0
    cumulative_reward: RewardTotal = 0.0  # adds one mean reward per round
    total_steps: Tally = 0
    t_start: Timestamp = 0.0
    t_end: Timestamp | None = None  # t_start when absent
    sample_seconds: Seconds = 0.0
    update_seconds: Seconds = 0.0
    train_reward: Reward | None = None
    train_completions: Tally = 0
    rollout_reward: Reward | None = None

    def __post_init__(self) -> None:
        if self.t_end is not None and self.t_end < self.t_start:
            raise ValueError(f"t-end = {self.t_end} is before t-start = {self.t_start}")


class ReportPayload(Struct, frozen=True):
    """A ClientReport's text in a reply's payload."""

    model: Annotated[str, Meta(max_length=1024)] = ""
    tasks: Annotated[list[Annotated[str, Meta(max_length=256)]], Meta(max_length=256)] = []
    curriculum: Annotated[dict[Annotated[str, Meta(max_length=256)], Level], Meta(max_length=256)] = {}


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
    signal: SignalCounts = SignalCounts()  # the groups it trained on, and those whose rewards were all equal
    curriculum: Mapping[str, int] = field(default_factory=dict)  # tasks.curriculum: task -> level (a metric only)
    sampling: SamplingCounts = SamplingCounts()  # train.dynamic-sampling

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
        out.update(self.signal.to_metrics())  # only once it trained a group
        out.update(self.sampling.to_metrics())  # only with train.dynamic-sampling
        return out

    def payload(self) -> dict:
        levels = {"curriculum": dict(self.curriculum)} if self.curriculum else {}
        return {"model": self.model, "tasks": list(self.tasks), **levels}

    @classmethod
    def from_records(cls, metrics: Any, payload: dict) -> "ClientReport":
        numbers = parse(dict(metrics), ReportMetrics, "metrics", Rejected)
        texts = parse(payload, ReportPayload, "payload", Rejected)
        return cls(
            node_index=numbers.node_index, num_examples=numbers.num_examples,
            cumulative_reward=numbers.cumulative_reward, total_steps=numbers.total_steps, t_start=numbers.t_start,
            t_end=numbers.t_start if numbers.t_end is None else numbers.t_end,
            sample_seconds=numbers.sample_seconds, update_seconds=numbers.update_seconds,
            train_reward=numbers.train_reward, train_completions=numbers.train_completions,
            rollout_reward=numbers.rollout_reward, formats=FormatCounts.from_metrics(metrics),
            foreign=ForeignCounts.from_metrics(metrics), uptake=UptakeCounts.from_metrics(metrics),
            signal=SignalCounts.from_metrics(metrics), sampling=SamplingCounts.from_metrics(metrics),
            model=texts.model, tasks=tuple(texts.tasks), curriculum=texts.curriculum)


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
class AskedEvaluations:
    """Which of its own evaluations one message asked a node for: `initial` (round 1: its starting point) and
    `current` (its adapter now), both on the held-out items of `held_out` (None: the server knows of none, so no
    evaluation is accepted)."""

    held_out: HeldOutRequest | None
    initial: bool = False
    current: bool = False


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
    def from_message(cls, message: Message, asked: AskedEvaluations) -> "OwnAdapterReply":
        metrics, payload, report = read_reply(message)
        return cls(report, **own_evaluations(metrics, payload, asked))


def own_evaluations(metrics: Any, payload: dict, asked: AskedEvaluations) -> dict:
    """A reply's OwnAdapterReply fields besides the report. An evaluation the message did not ask for, or one that
    fails check_eval against the held-out items asked (an item listed twice or not asked for, another task, counts
    over the samples asked), rejects the reply, as a malformed eval-seconds does: it is never averaged."""
    return {"eval_initial": _asked_eval(payload.get("eval-initial"), "eval-initial", asked.initial, asked.held_out),
            "eval": _asked_eval(payload.get("eval"), "eval", asked.current, asked.held_out),
            "eval_seconds": parse(dict(metrics), EvalSeconds, "metrics", Rejected).eval_seconds}


class EvalSeconds(Struct, frozen=True, rename="kebab"):
    eval_seconds: Seconds = 0.0


def _asked_eval(value: Any, what: str, asked: bool, held_out: HeldOutRequest | None) -> dict | None:
    if value is None:
        return None
    if not asked or held_out is None:
        raise Rejected(f"{what}: the server did not ask for this evaluation")
    return check_eval(value, held_out, what)
