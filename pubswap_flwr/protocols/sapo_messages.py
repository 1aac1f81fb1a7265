"""SAPO's messages: `query.rollouts` (CollectRollouts), `train.sapo` and `train.sapo_async` (SapoTrain,
SapoAsyncRound: the relayed pool of the other nodes' packets) and the reply to each (SapoReply: shared packets,
selection counts, rejections, an optional evaluation), as Flower records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

import msgspec
from flwr.app import Message, RecordDict
from msgspec import Meta, Struct

from ..algorithms.sapo_selection import Packet
from ..schema import parse
from ..wire.records import (
    AskedEvaluations,
    Instruction,
    InstructionConfig,
    OwnAdapterReply,
    own_evaluations,
    payload_of,
    read_reply,
    records,
)
from ..wire.validate import Limits, Rejected, check_packets

Groups = Annotated[int, Meta(ge=0, le=10**9)]


class SelectionCounts(Struct, frozen=True, rename="kebab"):
    """What a node's SAPO training did with the external groups it received, in a reply's metrics."""

    external_received: Groups = 0
    external_used: Groups = 0
    external_zero_advantage: Groups = 0
    external_rejected: Groups = 0
    external_unverifiable: Groups = 0
    external_shortfall: Groups = 0


class ScoringCounts(Struct, frozen=True, rename="kebab", omit_defaults=True):
    """Peers' answers whose scoring timed out or was skipped, in a reply's metrics (sent only when not 0)."""

    scoring_timeouts: Groups | None = None
    scoring_skipped: Groups | None = None


SELECTION_KEYS = tuple(f.encode_name for f in msgspec.structs.fields(SelectionCounts))


class CollectRolloutsConfig(InstructionConfig, frozen=True, kw_only=True):
    evaluate_initial: bool = False  # round 1: evaluate the node's own starting model first


class SapoTrainConfig(CollectRolloutsConfig, frozen=True, kw_only=True):
    evaluate: bool = False  # its own adapter on the held-out set, after training
    save_adapter: bool = False  # the run's last round: save the adapter portable


@dataclass(frozen=True)
class CollectRollouts(Instruction):
    """Sync phase 1: sample this round's rollouts and share some as packets."""

    message_type: ClassVar[str] = "query.rollouts"
    config: CollectRolloutsConfig


@dataclass(frozen=True)
class SapoTrain(Instruction):
    """Sync phase 2 (`train.sapo`) or the async round (`train.sapo_async`, which also samples and shares)."""

    message_type: ClassVar[str] = "train.sapo"
    config: SapoTrainConfig
    pool: tuple[Packet, ...]  # the other nodes' packets

    def to_record(self) -> RecordDict:
        return records(self.config_record(), payload={"pool": [p.to_wire() for p in self.pool]})

    @classmethod
    def from_record(cls, content: RecordDict) -> "SapoTrain":
        header, config = cls.read(content)
        pool = payload_of(content).get("pool", [])
        if not isinstance(pool, list):
            raise ValueError("the relayed pool is not a list")
        packets = []
        for index, entry in enumerate(pool):
            try:
                packets.append(Packet.from_wire(entry))
            except ValueError as err:  # its message names the field
                raise ValueError(f"relayed packet {index}: {err}") from None
        return cls(header, config, tuple(packets))


@dataclass(frozen=True)
class SapoAsyncRound(SapoTrain):
    message_type: ClassVar[str] = "train.sapo_async"


@dataclass(frozen=True, kw_only=True)
class SapoReply(OwnAdapterReply):
    """Packets the node shares (rollouts, async), and what its training did (train, async): the external groups
    it received, used, found without signal or rejected, and its held-out results when asked."""

    packets: tuple[Packet, ...] | None = None
    packet_rejections: tuple[str, ...] = ()  # server side: why packets of this reply were dropped
    selection: dict[str, int] = field(default_factory=dict)
    rejections: tuple[str, ...] = ()  # the node's reasons for dropping peers' packets
    scoring: dict[str, int] = field(default_factory=dict)  # peers' answers whose scoring timed out / was skipped

    def to_record(self) -> RecordDict:  # type: ignore[override]
        payload: dict[str, Any] = {}
        if self.packets is not None:
            payload["packets"] = [p.to_wire() for p in self.packets]
        if self.selection:
            payload["rejections"] = list(self.rejections[:20])
        return super().to_record(payload, {**self.selection, **self.scoring})

    @classmethod
    def from_message(cls, message: Message, limits: Limits, max_completions: int, *,  # type: ignore[override]
                     packets: bool, trained: bool, asked: AskedEvaluations) -> "SapoReply":
        """Decode a node's reply. Packets that fail validation are dropped one by one (reasons kept); an evaluation
        the message did not ask for, or one other than the server asked, rejects the reply (own_evaluations)."""
        metrics, payload, report = read_reply(message)
        shared, reasons = check_packets(payload, limits, max_completions) if packets else (None, [])
        numbers = dict(metrics)
        selection = msgspec.to_builtins(parse(numbers, SelectionCounts, "metrics", Rejected)) if trained else {}
        rejections = payload.get("rejections", [])
        rejections = tuple(str(r)[:300] for r in rejections[:5]) if isinstance(rejections, list) else ()
        scoring = msgspec.to_builtins(parse(numbers, ScoringCounts, "metrics", Rejected))
        return cls(report, **own_evaluations(metrics, payload, asked),
                   packets=None if shared is None else tuple(shared), packet_rejections=tuple(reasons),
                   selection=selection, rejections=rejections, scoring=scoring)
