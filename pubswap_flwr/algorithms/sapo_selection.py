"""SAPO (Swarm sAmpling Policy Optimization): rollout packets, the relay pool, and the I local + J external
selection. Pure functions.

A node trains on I of its own rollout groups and J external groups drawn from other nodes' packets, after the
receiver re-scores every external completion with its own verifier (dropping what it cannot verify) and discards
zero-advantage groups (all rewards equal: no learning signal). The relay passes on at most a node's share per sender
and the receiver draws J round robin over senders, so packet counts buy no sender more than its fair share.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Sequence

from msgspec import Meta, Struct

from ..rollouts import MAX_BEHAVIOUR_TOKENS, Behaviour
from ..schema import parse
from ..tasks import TaskItem
from .group_signal import has_signal


@dataclass(frozen=True)
class Packet:
    """A shared rollout: the question with its answer and task metadata, and the sender's completions; with
    train.foreign-correction = "is", also how the sender sampled each completion and its tokenizer's fingerprint."""

    sender: str
    item: TaskItem
    completions: tuple[str, ...]
    behaviour: tuple[Behaviour | None, ...] | None = None
    tokenizer: str = ""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sender": self.sender, "item": self.item.to_dict(),
                               "completions": list(self.completions)}
        if self.behaviour is not None:
            out["behaviour"] = [None if b is None else b.to_wire() for b in self.behaviour]
            out["tokenizer"] = self.tokenizer
        return out

    @classmethod
    def from_wire(cls, data: Any) -> "Packet":
        """A packet as the server relays it (RelayedPacket); behaviours are checked again (ValueError) since they
        feed the loss."""
        record = parse(data, RelayedPacket, "a relayed packet", ValueError)
        return cls(record.sender, TaskItem.from_dict(record.item), tuple(record.completions),
                   behaviours_from_wire(record.behaviour, len(record.completions)), record.tokenizer)

    def with_sender(self, sender: str) -> "Packet":
        return Packet(sender, self.item, self.completions, self.behaviour, self.tokenizer)


class RelayedPacket(Struct):
    """A packet in the pool the server relays: its sender, its item (TaskItem.from_dict checks it), its completions
    and, optionally, a behaviour per completion with the sampler's tokenizer fingerprint."""

    sender: str
    item: dict[str, Any]
    completions: Annotated[list[str], Meta(min_length=1)]
    behaviour: list[str | None] | None = None
    tokenizer: Annotated[str, Meta(max_length=64)] = ""


def behaviours_from_wire(raw: Any, count: int, max_tokens: int = MAX_BEHAVIOUR_TOKENS
                         ) -> tuple[Behaviour | None, ...] | None:
    """A packet's behaviours: one per completion (None where the sender sent none), each at most `max_tokens` long;
    ValueError when malformed."""
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != count:
        raise ValueError(f"behaviour must list one entry per completion ({count})")
    return tuple(None if row is None else Behaviour.from_wire(row, max_tokens) for row in raw)


def capped(packets: Sequence[Packet], most: int) -> tuple[list[Packet], dict[str, int]]:
    """Each sender's first `most` packets (the order of `packets` kept) and, per sender, how many were cut."""
    kept: list[Packet] = []
    seen: dict[str, int] = {}
    cut: dict[str, int] = {}
    for packet in packets:
        seen[packet.sender] = seen.get(packet.sender, 0) + 1
        if seen[packet.sender] <= most:
            kept.append(packet)
        else:
            cut[packet.sender] = cut.get(packet.sender, 0) + 1
    return kept, cut


def relay(pool: Sequence[Packet], receiver: str) -> list[Packet]:
    """The packets `receiver` gets: everyone else's (a node never receives its own)."""
    return [p for p in pool if p.sender != receiver]


def fair_share(packets: Sequence[Packet], max_bytes: int, size: Callable[[Packet], int]) -> list[Packet]:
    """The packets that fit a message of `max_bytes`: each sender gets an equal share of the bytes and keeps its
    packets in order until its next one would overrun the share, so one sender's large packets can only crowd out
    its own (the order of `packets` is kept)."""
    senders = list(dict.fromkeys(p.sender for p in packets))
    if not senders:
        return []
    share = max_bytes // len(senders)
    used = {s: 0 for s in senders}
    full = set()
    kept = []
    for packet in packets:
        if packet.sender in full:
            continue
        cost = size(packet)
        if used[packet.sender] + cost > share:
            full.add(packet.sender)
            continue
        used[packet.sender] += cost
        kept.append(packet)
    return kept


@dataclass(frozen=True)
class ScoredPacket:
    packet: Packet
    rewards: tuple[float, ...]

    @property
    def has_signal(self) -> bool:
        return bool(self.rewards) and max(self.rewards) - min(self.rewards) > 1e-12


class Unverifiable(ValueError):
    """The receiver cannot check a peer's item itself (no provenance it can regenerate, no copy in its own data)."""


@dataclass
class Selection:
    chosen: list[ScoredPacket]
    received: int = 0
    zero_advantage: int = 0  # discarded: all rewards equal
    rejected: int = 0  # could not be re-scored (reasons in `rejections`)
    shortfall: int = 0  # J minus what could be used
    rejections: list[str] = field(default_factory=list)
    unverifiable: int = 0  # of `rejected`: items the receiver could not verify itself


def select_external(packets: Sequence[Packet], j: int, rescore: Callable[[Packet], Sequence[float]],
                    rng: random.Random, sender_weight: Callable[[str], float] | None = None) -> Selection:
    """Re-score every packet with the receiver's verifier, drop zero-advantage groups, draw J round robin over
    senders (`fair_draw`) in a uniformly random order (or, with `sender_weight`, one drawn in proportion to the
    sender's weight: reputation orders the draw but buys no sender more than its fair share).

    `rescore` raises ValueError for a packet it cannot score (unknown verifier, forged answer, Unverifiable...);
    such packets are rejected with the reason recorded.
    """
    selection = Selection(chosen=[], received=len(packets))
    usable: list[ScoredPacket] = []
    for packet in packets:
        try:
            rewards = tuple(float(r) for r in rescore(packet))
        except ValueError as err:
            selection.rejected += 1
            selection.unverifiable += isinstance(err, Unverifiable)
            selection.rejections.append(f"{packet.sender}/{packet.item.uid}: {err}")
            continue
        scored = ScoredPacket(packet, rewards)
        if not scored.has_signal:
            selection.zero_advantage += 1
            continue
        usable.append(scored)
    take = min(j, len(usable))
    if sender_weight is None:
        order = rng.sample(usable, len(usable))
    else:
        order = weighted_sample(usable, [sender_weight(s.packet.sender) for s in usable], len(usable), rng)
    selection.chosen = fair_draw(order, take, lambda s: s.packet.sender) if take else []
    selection.shortfall = j - take
    return selection


def fair_draw(order: Sequence[Any], k: int, sender: Callable[[Any], str]) -> list[Any]:
    """k items of `order`, round robin over senders (in the order each first appears): every sender's first item,
    then every sender's second, ...; so a sender gets more than one over another only once that one has none left
    (max-min fair), whatever its count."""
    queues: dict[str, list[Any]] = {}
    for item in order:
        queues.setdefault(sender(item), []).append(item)
    chosen: list[Any] = []
    level = 0
    k = min(k, len(order))
    while len(chosen) < k:
        for queue in queues.values():
            if level < len(queue) and len(chosen) < k:
                chosen.append(queue[level])
        level += 1
    return chosen


def weighted_sample(items: Sequence[Any], weights: Sequence[float], k: int, rng: random.Random) -> list[Any]:
    """k items without replacement, each draw in proportion to the remaining items' weights (all > 0)."""
    pool = list(zip(items, weights))
    chosen = []
    for _ in range(min(k, len(pool))):
        total = sum(w for _, w in pool)
        point = rng.random() * total
        for position, (item, weight) in enumerate(pool):
            point -= weight
            if point <= 0 or position == len(pool) - 1:
                chosen.append(item)
                pool.pop(position)
                break
    return chosen


def reputation(passed: int, failed: int) -> float:
    """A sender's sampling weight: its Laplace-smoothed share of packets that passed verification."""
    return (passed + 1) / (passed + failed + 2)


def shared_groups(order: Sequence[int], rewards: Sequence[Sequence[float]], share: int,
                  informative_only: bool = False) -> list[int]:
    """The groups a node shares, by index: the first `share` of `order` (its seeded shuffle of its groups); with
    `informative_only` (sapo.share-informative-only), the first `share` of those whose rewards differ under its own
    scoring, so no packet it sends is one a receiver would drop as zero-advantage."""
    eligible = [i for i in order if has_signal(rewards[i])] if informative_only else list(order)
    return eligible[:share]


def select_local(groups: Sequence[Any], i: int, rng: random.Random) -> list[Any]:
    """I of the node's own B groups, uniformly without replacement."""
    return rng.sample(list(groups), min(i, len(groups)))
