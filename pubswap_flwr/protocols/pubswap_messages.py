"""PubSwap's messages: the `train.segment` instruction (response sets of the pending public step, private steps
to run, next public prompt ids) and its reply (scored public responses, sampling behaviours, the last segment's
adapter), as Flower records; and what a node keeps between segments (PubSwapNodeState)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Callable, ClassVar, Generic, TypeVar

import msgspec
from flwr.app import Message, RecordDict
from msgspec import Meta, Struct

from ..rollouts import Behaviour
from ..schema import Count, Fraction, PositiveCount, parse
from ..tasks import extract_answer, score_completion, training_reward
from ..wire.codecs import DEFAULT_MAX_PAYLOAD_BYTES
from ..wire.compression import Codec, Quantized
from ..wire.records import (
    Adapter,
    ClientReport,
    Instruction,
    InstructionConfig,
    adapter_of,
    config_of,
    payload_of,
    read_reply,
    records,
    reply_records,
)
from ..wire.validate import Limits, Rejected, check_behaviour, check_public_responses
from .fedavg import checked_adapter
from .transfer import Downlink, put_quantized

Scored = dict[str, list[tuple[str, float]]]  # public prompt id -> (response text, server's reward)
Responses = TypeVar("Responses", dict[str, list[str]], Scored)  # a SegmentReply's, as sent or as the server scored


@dataclass(frozen=True)
class SwapEntry:
    """One member of a client's response set: its own response `own_index`, or another client's text."""

    reward: float
    own_index: int = -1
    text: str = ""
    source: str = ""
    behaviour: Behaviour | None = None  # the donor's sampling ids and log-probs (train.foreign-correction = "is")

    def to_dict(self) -> dict:
        if self.own_index >= 0:
            return {"own_index": self.own_index, "reward": self.reward}
        out = {"own_index": -1, "text": self.text, "reward": self.reward, "source": self.source}
        if self.behaviour is not None:
            out["behaviour"] = self.behaviour.to_wire()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "SwapEntry":
        return cls.of(parse(data, SwapEntryRecord, "a response-set entry", ValueError))

    @classmethod
    def of(cls, record: "SwapEntryRecord") -> "SwapEntry":
        if record.own_index >= 0:
            return cls(record.reward, record.own_index)
        behaviour = Behaviour.from_wire(record.behaviour) if record.behaviour is not None else None
        return cls(record.reward, -1, record.text or "", record.source, behaviour)


class SwapEntryRecord(Struct):
    """A SwapEntry on the wire: an own response by index, or a foreign one with its text, source and, optionally,
    the donor's behaviour (decoded and checked by Behaviour.from_wire)."""

    reward: Fraction
    own_index: int = -1
    text: str | None = None
    source: str = "peer"
    behaviour: str | None = None

    def __post_init__(self) -> None:
        if self.own_index < 0 and self.text is None:
            raise ValueError("a foreign response needs its text")


MAX_CANDIDATES = 64  # pubswap.donor-candidates' bound
# the behaviours one segment carries to a node: at generation.max-new-tokens = 32768, 4 public prompts x 16 donor
# candidates of colluders' full-length behaviours made 11.2 MB, over the 8 MB payload, and every honest node failed;
# beyond this budget the longest are withheld (those responses train without IS, as foreign fallbacks)
BEHAVIOUR_BYTES = DEFAULT_MAX_PAYLOAD_BYTES // 2


def _wire_chars(behaviour: Behaviour) -> int:
    """An upper bound of `Behaviour.to_wire`'s length: base64 of a width byte and at most 6 bytes a token."""
    return 4 * (1 + 6 * len(behaviour.ids) + 2) // 3


def fit_behaviours(sets: dict, choices: dict, budget: int = BEHAVIOUR_BYTES) -> tuple[dict, dict, int]:
    """One node's response sets ({uid: entries}) and donor choices ({uid: DonorChoice}) with the longest donor
    behaviours withheld until the rest fit `budget` characters; returns them and how many were withheld."""
    found = [(_wire_chars(e.behaviour), kind, uid, i) for kind, entries in
             (("set", sets), ("choice", {u: c.candidates for u, c in choices.items()}))
             for uid, row in entries.items() for i, e in enumerate(row) if e.behaviour is not None]
    total = sum(size for size, *_ in found)
    withheld = set()
    for size, kind, uid, i in sorted(found, key=lambda f: -f[0]):
        if total <= budget:
            break
        withheld.add((kind, uid, i))
        total -= size
    if not withheld:
        return sets, choices, 0

    def strip(kind: str, uid: str, row: tuple) -> tuple:
        return tuple(replace(e, behaviour=None) if (kind, uid, i) in withheld else e for i, e in enumerate(row))

    return ({uid: strip("set", uid, row) for uid, row in sets.items()},
            {uid: replace(c, candidates=strip("choice", uid, c.candidates)) for uid, c in choices.items()},
            len(withheld))


@dataclass(frozen=True)
class DonorChoice:
    """donor = likely, on the wire: the client's own slots to fill with the most likely of `candidates`."""

    slots: tuple[int, ...]
    candidates: tuple[SwapEntry, ...]

    def to_dict(self) -> dict:
        return {"slots": list(self.slots), "candidates": [c.to_dict() for c in self.candidates]}

    @classmethod
    def from_dict(cls, data: Any, k: int) -> "DonorChoice":
        record = parse(data, DonorChoiceRecord, "a donor choice", ValueError)
        if len(set(record.slots)) != len(record.slots) or not all(0 <= i < k for i in record.slots):
            raise ValueError(f"donor choice slots must be distinct integers in [0, {k})")
        if len(record.candidates) < len(record.slots) or any(e.own_index >= 0 for e in record.candidates):
            raise ValueError(f"a donor choice needs {len(record.slots)}..{MAX_CANDIDATES} foreign candidates")
        return cls(tuple(record.slots), tuple(SwapEntry.of(e) for e in record.candidates))


class DonorChoiceRecord(Struct):
    """A DonorChoice on the wire: the slots (checked against K after parsing) and the foreign candidates."""

    slots: Annotated[list[int], Meta(min_length=1)]
    candidates: Annotated[list[SwapEntryRecord], Meta(max_length=MAX_CANDIDATES)]


class SegmentConfig(InstructionConfig, frozen=True, kw_only=True):
    private_steps: Count = 0  # before the segment's public step
    public_uids: str = ""  # the next public prompts' uids, one per line (none in the last segment)
    k: PositiveCount  # responses per public prompt
    final: bool = False  # the round's last segment: reply the adapter

    @property
    def uids(self) -> tuple[str, ...]:
        return tuple(uid for uid in self.public_uids.split("\n") if uid)


@dataclass(frozen=True)
class Segment(Instruction):
    message_type: ClassVar[str] = "train.segment"
    config: SegmentConfig
    adapter: Adapter | None = None  # segment 0: the global adapter
    response_sets: dict[str, tuple[SwapEntry, ...]] | None = None  # the pending public step's sets
    downlink: Downlink | None = None  # segment 0 with strategy.compression (then `adapter` may be None)
    choices: dict[str, DonorChoice] | None = None  # pubswap.donor = likely: slots to fill per prompt

    def to_record(self) -> RecordDict:
        config = {**self.config_record(), **(self.downlink.config() if self.downlink is not None else {})}
        payload: dict[str, Any] | None = None
        if self.response_sets is not None:
            payload = {"response-sets": {uid: [e.to_dict() for e in entries]
                                         for uid, entries in self.response_sets.items()}}
            if self.choices:
                payload["donor-choices"] = {uid: c.to_dict() for uid, c in self.choices.items()}
        return put_quantized(records(config, adapter=self.adapter, payload=payload),
                             self.downlink.delta if self.downlink is not None else None)

    @classmethod
    def from_record(cls, content: RecordDict) -> "Segment":
        header, config = cls.read(content)
        payload = payload_of(content)
        sets, choices = payload.get("response-sets"), payload.get("donor-choices")
        k = config.k
        try:
            response_sets = None if sets is None else {str(uid): tuple(SwapEntry.from_dict(e) for e in entries)
                                                       for uid, entries in dict(sets).items()}
            donor_choices = None if choices is None else {str(uid): DonorChoice.from_dict(c, k)
                                                          for uid, c in dict(choices).items()}
        except (TypeError, KeyError, ValueError) as err:
            raise ValueError(f"malformed response sets: {type(err).__name__}: {err}") from None
        return cls(header, config, adapter_of(content), response_sets, Downlink.read(config_of(content), content),
                   donor_choices)


@dataclass(frozen=True)
class SegmentReply(Generic[Responses]):
    """K responses per requested public prompt; the last segment's reply also carries the adapter. On the server,
    `responses` holds each response with the server's own reward."""

    report: ClientReport
    responses: Responses
    adapter: Adapter | Quantized | None = None  # Quantized: strategy.compression's delta
    modal: dict[str, str | None] = field(default_factory=dict)  # server side: each prompt's most frequent answer
    behaviour: dict[str, list[Behaviour | None]] = field(default_factory=dict)  # foreign-correction = is

    def to_record(self) -> RecordDict:
        payload: dict | None = {"responses": self.responses} if self.responses else None
        if payload is not None and self.behaviour:
            payload["behaviour"] = {uid: [b.to_wire() if b is not None else None for b in rows]
                                    for uid, rows in self.behaviour.items()}
        if isinstance(self.adapter, Quantized):
            return put_quantized(reply_records(self.report, payload=payload), self.adapter)
        return reply_records(self.report, payload=payload, adapter=self.adapter)

    @classmethod
    def from_message(cls, message: Message, ask: "SegmentAsk") -> "SegmentReply[Scored]":
        """Decode and check a client's reply against what the server asked (`ask`), scoring its responses with the
        server's verifier or the run's tasks.rewards function for the item's task; with `ask.with_behaviour`, also
        its responses' sampling log-probs (checked; a missing one is passed on as None)."""
        _, payload, report = read_reply(message)
        scored: Scored = {}
        behaviour: dict[str, list[Behaviour | None]] = {}
        uids, k, limits = list(ask.uids), ask.k, ask.limits
        if uids:
            texts = check_public_responses(payload, uids, k, limits)
            if ask.with_behaviour:
                behaviour = check_behaviours(payload.get("behaviour"), uids, k, limits)
            limit = limits.max_completion_chars
            scored = {uid: [(t, training_reward(ask.score(t, ask.public.get(uid), max_chars=limit).reward,
                                                ask.partial_credit))
                            for t in texts[uid]]
                      for uid in uids}
        adapter = checked_adapter(message.content, ask.reference, ask.codec) if ask.reference is not None else None
        modal = {uid: Counter(extract_answer(t) for t in texts).most_common(1)[0][0]
                 for uid, texts in (texts.items() if uids else ())}
        return SegmentReply(report, scored, adapter, modal, behaviour)


@dataclass(frozen=True)
class SegmentAsk:
    """What the server asked of one segment's replies, and how it scores them: the public prompts (`uids`, K
    responses each, with their sampling behaviours when `with_behaviour`), the last segment's adapter checked
    against `reference` (under strategy.compression's `codec`), responses scored by `score` (the client's scoring
    budget in a round) against the public set's items, graded or 0/1 as tasks.partial-credit says."""

    uids: tuple[str, ...]
    k: int
    limits: Limits
    public: Any  # the public set: .get(uid) -> its TaskItem
    reference: Adapter | None = None
    score: Callable[..., Any] = score_completion
    partial_credit: bool = True
    codec: Codec | None = None
    with_behaviour: bool = False


def check_behaviours(raw: Any, uids: list[str], k: int, limits: Limits) -> dict[str, list[Behaviour | None]]:
    """A reply's sampling behaviours: None for prompts or responses that sent none; anything malformed or longer
    than generation.max-new-tokens rejects the reply, as a malformed response does."""
    if raw is None:
        return {uid: [None] * k for uid in uids}
    if not isinstance(raw, dict) or not set(raw) <= set(uids):
        raise Rejected("'behaviour' must be an object keyed by the requested prompt ids")
    out = {}
    for uid in uids:
        rows = raw.get(uid, [None] * k)
        if not isinstance(rows, list) or len(rows) != k:
            raise Rejected(f"prompt {uid}: behaviour must list {k} entries")
        try:
            out[uid] = [None if row is None else check_behaviour(row, limits) for row in rows]
        except Rejected as err:
            raise Rejected(f"prompt {uid}: {err}") from None
    return out


# -- the node's state between segments ------------------------------------------------------------------------
class PendingSample(Struct):
    """One of the node's own responses to a public prompt: its text and the ids it sampled."""

    text: str
    ids: list[int]


class PubSwapNodeState(Struct):
    """What a PubSwap node keeps between segments (node.json's `mode`): its own responses to the pending public
    prompts, which the next segment's response sets name by index."""

    pending: dict[str, list[PendingSample]] = msgspec.field(default_factory=dict)  # public uid -> own responses
