"""SAPO (swarm mode): nodes keep their own (possibly different) models and share decoded rollouts through the
server, which relays them and never holds or averages weights.

Sync (default), two exchanges per round: `query.rollouts` — each node samples B questions x L completions from its
private stream and replies `sapo.share` of them as packets (question, answer, metadata, completions);
`train.sapo` — each node receives the other nodes' packets, re-scores them with its own verifier (regenerating
reasoning-gym items from their provenance, so forged answers are caught; items it cannot verify are dropped:
sapo_verify.py), drops zero-advantage groups and trains on I own + J external groups drawn round robin over senders
(algorithms/sapo_selection.py has the selection); the relay passes on at most a node's share per sender.
`sapo.async = true`: one `train.sapo_async` message per round that carries the previous round's pool, so no node
waits for a slow peer. Nodes evaluate their own models when asked (round 1 also measures their starting point).
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from functools import partial
from typing import Any, Sequence

import msgspec
from flwr.app import Message, RecordDict
from msgspec import Struct

from .. import metrics_schema as schema
from ..algorithms.group_signal import ExternalSignal
from ..algorithms.sapo_selection import (
    Packet,
    Selection,
    capped,
    fair_share,
    relay,
    reputation,
    select_external,
    select_local,
    shared_groups,
)
from ..config import ExperimentConfig
from ..config.catalog import SapoConfig
from ..node_runtime.learner import Learner, StepRecord, WorkReport
from ..node_runtime.serving import ClientWork, evaluate_own_adapter
from ..policy.behaviour import tokenizer_fingerprint
from ..rollouts import Completion, RolloutGroup
from ..rounds.context import RoundContext
from ..schema import Tally
from ..shared import derive_seed
from ..tasks import ScoringBudget, TaskItem, score_completion, training_reward
from ..tasks.splits import MAX_NODES
from ..tasks.verifiers import VERIFIERS
from ..wire.codecs import DEFAULT_MAX_PAYLOAD_BYTES
from ..wire.records import Adapter, AskedEvaluations
from ..wire.validate import Limits, Rejected, check_packet
from .base import RunSettings, ServerProtocol
from .sapo_messages import (
    SELECTION_KEYS,
    CollectRollouts,
    CollectRolloutsConfig,
    SapoAsyncRound,
    SapoReply,
    SapoTrain,
    SapoTrainConfig,
)
from .sapo_verify import verified_item

log = logging.getLogger("pubswap_flwr")

# the relayed pool must fit the receiver's payload limit, with room for the rest of the message
RELAY_BYTES = DEFAULT_MAX_PAYLOAD_BYTES - 64 * 1024


def packet_bytes(packet: Packet) -> int:
    return len(json.dumps(packet.to_wire(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")) + 1


# -- server --------------------------------------------------------------------------------------------------------
class SapoProtocol(ServerProtocol):
    holds_global_adapter = False
    per_node_models = True
    reward_field = schema.ROLLOUT_REWARD  # SAPO's cumulative reward sums the nodes' own rollout rewards

    def __init__(self, settings: RunSettings, sapo: SapoConfig, public=None):
        super().__init__(settings, public)
        self.sapo = sapo
        self.pool: list[Packet] = []  # async: the previous round's packets
        self.limits = settings.limits
        s = sapo
        # what the config asks of a node each round: the relay passes on no more from any sender
        self.share, self.share_key = (s.local, "sapo.local") if s.sharing == "local" else (s.share, "sapo.share")

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, public=None) -> "SapoProtocol":
        return cls(RunSettings.of(cfg, held_out=True), cfg.sapo, public)

    def describe(self) -> str:
        s = self.sapo
        return f"I/J={s.local}/{s.external} B={s.questions} L={s.completions} async={s.async_mode}"

    def state(self) -> dict:
        return {"sapo_pool": [p.to_wire() for p in self.pool]}

    def restore(self, state: dict, adapters: dict[str, Adapter] | None = None,
                nodes: dict[int, int] | None = None) -> None:
        """The async pool: one round's packets, each checked as a reply's packet is, at most what a node shares in a
        round (sapo.local, or sapo.share with fixed sharing) from each sender, and (given `nodes`) only from nodes
        the checkpoint knows."""
        raw = state.get("sapo_pool", [])
        if not isinstance(raw, list):
            raise ValueError(f"sapo_pool must be a list, got {type(raw).__name__}")
        senders = None if nodes is None else {f"{index:05d}-{node}" for node, index in nodes.items()}
        each = self.share
        most = each * (len(senders) if senders is not None else MAX_NODES)
        if len(raw) > most:
            raise ValueError(f"sapo_pool has {len(raw)} packets, more than {each} ({self.share_key}) from each of "
                             f"{len(senders) if senders is not None else MAX_NODES} senders")
        pool: list[Packet] = []
        counts: Counter[str] = Counter()
        for position, entry in enumerate(raw):
            sender = entry.get("sender") if isinstance(entry, dict) else None
            if not isinstance(sender, str) or (senders is not None and sender not in senders):
                raise ValueError(f"sapo_pool packet {position}: sender {str(sender)[:40]!r} is not a node of the run")
            counts[sender] += 1
            if counts[sender] > each:
                raise ValueError(f"sapo_pool holds more than {each} packets ({self.share_key}) of {sender}")
            try:
                packet = check_packet(entry, self.limits, self.sapo.completions, f"sapo_pool packet {position}")
            except Rejected as err:
                raise ValueError(str(err)) from None
            pool.append(packet.with_sender(sender))
        self.pool = pool

    def _decode(self, packets: bool, trained: bool, initial: bool, current: bool):
        """A reply's decoder; `initial`, `current`: the evaluations its message asked for (AskedEvaluations)."""
        asked = AskedEvaluations(self.settings.held_out, initial, current)
        return lambda node, reply: SapoReply.from_message(reply, self.limits, self.sapo.completions,
                                                          packets=packets, trained=trained, asked=asked)

    def _pool(self, ctx: RoundContext, replies: dict[int, SapoReply]) -> list[Packet]:
        """Every valid packet of the round, tagged with the node that sent it."""
        pool = []
        for node in ctx.exchange.ordered(replies):
            reply = replies[node]
            for reason in reply.packet_rejections:
                log.warning("round %d: dropped a packet from node %d: %s", ctx.number, node, reason)
            if reply.packet_rejections:
                ctx.log.client(node)["packets_rejected"] = len(reply.packet_rejections)
                ctx.log.extra.setdefault("rejected_packets", {})[str(node)] = list(reply.packet_rejections[:10])
            label = ctx.exchange.label(node)
            kept, cut = capped([p.with_sender(label) for p in reply.packets or ()], self.share)  # sender = who sent it
            if cut:
                ctx.log.client(node)["packets_over_cap"] = cut[label]
                log.warning("round %d: node %d sent %d packets, more than the %d a node shares per round (%s): the "
                            "last %d not relayed", ctx.number, node, len(kept) + cut[label], self.share,
                            self.share_key, cut[label])
            pool.extend(kept)
        return pool

    def _train_messages(self, ctx: RoundContext, kind: type[SapoTrain], nodes: list[int], pool: list[Packet],
                        round_start: bool, evaluate_initial: bool) -> list[Message]:
        messages = []
        for node in nodes:
            others = relay(pool, ctx.exchange.label(node))
            relayed = fair_share(others, RELAY_BYTES, packet_bytes)
            if len(relayed) < len(others):
                cut = Counter(p.sender for p in others) - Counter(p.sender for p in relayed)
                ctx.log.extra.setdefault("relay_cut", {})[str(node)] = dict(sorted(cut.items()))
                log.warning("round %d: the pool for node %d is over %d bytes: %d packets of %s not relayed",
                            ctx.number, node, RELAY_BYTES, sum(cut.values()), ", ".join(sorted(cut)))
            config = SapoTrainConfig(evaluate=ctx.evaluate, save_adapter=ctx.final, evaluate_initial=evaluate_initial)
            messages.append(kind(ctx.header(round_start), config, tuple(relayed)).to_message(node))
        return messages

    def run_round(self, ctx: RoundContext) -> None:
        nodes = ctx.exchange.select(ctx.number)
        first = ctx.number == 1
        if self.sapo.async_mode:
            result = ctx.exchange.send(self._train_messages(ctx, SapoAsyncRound, nodes, self.pool, True, first),
                                       self._decode(packets=True, trained=True, initial=first, current=ctx.evaluate))
            ctx.log.absorb(result)
            self.pool = self._pool(ctx, result.replies)
            exchanges = [result]
        else:
            asked = CollectRolloutsConfig(evaluate_initial=first)
            shared = ctx.exchange.send([CollectRollouts(ctx.header(round_start=True), asked).to_message(n)
                                        for n in nodes], self._decode(packets=True, trained=False, initial=first,
                                                                      current=False))
            ctx.log.absorb(shared)
            pool = self._pool(ctx, shared.replies)
            active = [n for n in nodes if n in shared.replies]
            result = ctx.exchange.send(self._train_messages(ctx, SapoTrain, active, pool, False, False),
                                       self._decode(packets=False, trained=True, initial=False, current=ctx.evaluate))
            ctx.log.absorb(result)
            exchanges = [shared, result]
        for exchanged in exchanges:  # the nodes' own evaluations: round 1's starting points, and when asked
            for node in ctx.exchange.ordered(exchanged.replies):
                ctx.log.record_own_evaluations(node, exchanged.replies[node])
        for node in ctx.exchange.ordered(result.replies):  # by node index: means over nodes in one order
            reply = result.replies[node]
            row = ctx.log.client(node)
            for key in SELECTION_KEYS:
                row[key.replace("-", "_")] = reply.selection[key]
            record_external_signal(row, node, reply.selection, ctx.number)
            if reply.rejections:
                row["external_rejections"] = list(reply.rejections)
            for key, count in reply.scoring.items():
                row[key.replace("-", "_")] = count


def record_external_signal(row: dict, node: int, selection: dict[str, int], round_number: int) -> None:
    """The client row's usable external groups and zero-advantage share of those it scored, from the counts its
    reply reported (a metric: nothing is decided on them); counts that cannot come from one selection are
    logged and give neither."""
    signal = ExternalSignal(selection["external-received"], selection["external-rejected"],
                            selection["external-zero-advantage"])
    problem = signal.problem()
    if problem:
        log.warning("round %d: node %d reported selection counts that do not add up (%s): its usable external "
                    "groups are not recorded", round_number, node, problem)
        return
    row[schema.EXTERNAL_USABLE] = signal.usable
    if signal.zero_advantage_share is not None:
        row[schema.EXTERNAL_ZERO_ADVANTAGE_SHARE] = signal.zero_advantage_share


# -- client: the node's SAPO learning ---------------------------------------------------------------------------
def shuffled(seq: Sequence, seed: int) -> list:
    out = list(seq)
    random.Random(seed).shuffle(out)
    return out


class PendingGroup(Struct):
    """One of the node's own groups of the current round: the item, its completions' texts and ids, their rewards."""

    item: dict[str, Any]  # TaskItem.to_dict(), read back through TaskItem.from_dict (the item's own declaration)
    texts: list[str]
    ids: list[list[int]]
    rewards: list[float]


class SapoNodeState(Struct):
    """What a SAPO node keeps between messages (node.json's `mode`): its own groups of the current round, sampled in
    `query.rollouts` and trained on in `train.sapo`, and its record of each peer's packets (sapo.reputation)."""

    pending: list[PendingGroup] = msgspec.field(default_factory=list)
    peers: dict[str, tuple[Tally, Tally]] = msgspec.field(default_factory=dict)  # sender -> (passed, failed)


class SapoNode:
    """A node's side of SAPO: its learner and the run's sapo section, handed to the constructor."""

    def __init__(self, learner: Learner, sapo: SapoConfig):
        self.learner = learner
        self.sapo = sapo
        self.saved = learner.family_state(SapoNodeState)

    def generate_rollouts(self, round_number: int, report: WorkReport) -> list[Packet]:
        """Sample B questions x L completions, keep them for training, and return the groups to share: with
        `sapo.sharing = "local"` B = I and all I are shared, so a node that trains on few of its own
        groups also gives the swarm few; with "fixed", B = sapo.questions and sapo.share of them are shared. With
        sapo.share-informative-only, only those whose rewards differ under the node's own scoring (up to the same
        number)."""
        learner, scfg = self.learner, self.sapo
        count, share = (scfg.local, scfg.local) if scfg.sharing == "local" else (scfg.questions, scfg.share)
        self.saved.pending = []
        if count == 0:
            return []
        items = learner.stream.take(count, learner.state.cursor)
        groups, sample_s = learner.rollout(items, scfg.completions)
        learner.observe_groups(groups)
        self.saved.pending = [PendingGroup(item.to_dict(), [c.text for c in g.completions],
                                           [list(c.token_ids or ()) for c in g.completions], list(g.rewards))
                              for item, g in zip(items, groups)]
        behaviour = learner.settings.train.foreign_correction == "is"  # the receivers weigh completions by them
        fingerprint = tokenizer_fingerprint(learner.policy.tokenizer) if behaviour else ""
        rewards = [r for g in groups for r in g.rewards]
        mean = sum(rewards) / len(rewards)
        learner.state.cumulative_reward += mean
        report.add(StepRecord(learner.state.steps, "rollout", mean, len(rewards), sample_s, 0.0,
                              sum(not g.has_signal for g in groups), 0))
        order = shuffled(range(len(items)), derive_seed(learner.settings.seed, learner.identity.index, round_number,
                                                        "share"))
        chosen = shared_groups(order, [g.rewards for g in groups], share, scfg.share_informative_only)
        return [Packet("", items[i], tuple(c.text for c in groups[i].completions),
                       tuple(c.behaviour for c in groups[i].completions) if behaviour else None, fingerprint)
                for i in chosen]

    def pending_groups(self) -> list[RolloutGroup]:
        out = []
        for group in self.saved.pending:
            item = TaskItem.from_dict(group.item)
            completions = [Completion(t, tuple(ids)) for t, ids in zip(group.texts, group.ids)]
            out.append(RolloutGroup(self.learner.prompt(item), completions, list(group.rewards), item.uid, item.task))
        return out

    def rescore(self, packet: Packet, score=None) -> list[float]:
        """Rewards of a peer's completions under this node's own verifier, or its own tasks.rewards function for the
        item's task (never one a peer could name); `score`: under the sender's scoring budget in a round (the budget
        applies the same rewards), else score_completion. ValueError when it cannot score them."""
        learner = self.learner
        item = verified_item(learner, packet.item, self.sapo)
        if item.verifier not in VERIFIERS:
            raise ValueError(f"unknown verifier {item.verifier!r}")
        if item.answer is None and item.verifier != "rg":
            raise ValueError("packet has no answer")
        if not packet.completions:
            raise ValueError("packet has no completions")
        if len(packet.completions) > self.sapo.completions * 4:
            raise ValueError(f"packet has {len(packet.completions)} completions")
        score = score or partial(score_completion, reward=learner.rewards.for_task(item.task))
        limit = learner.settings.generation.max_completion_chars
        scores = [score(text, item, max_chars=limit) for text in packet.completions]
        return [training_reward(s.reward, learner.settings.tasks.partial_credit) for s in scores]

    def train_on_pool(self, pool: Sequence[Packet], round_number: int, report: WorkReport,
                      budget: ScoringBudget | None = None) -> Selection:
        """Train on I own groups + J external groups (re-scored here under each sender's scoring budget,
        zero-advantage ones dropped)."""
        learner, scfg = self.learner, self.sapo
        index = learner.identity.index
        rng = random.Random(derive_seed(learner.settings.seed, index, round_number, "select"))
        local = select_local(self.pending_groups(), scfg.local, rng)
        weight = None
        if scfg.reputation:
            weight = lambda sender: reputation(*self.saved.peers.get(sender, (0, 0)))  # noqa: E731
        budget = budget or ScoringBudget(Limits.score_seconds, Limits.sender_scoring_seconds, rewards=learner.rewards)

        def scored(packet: Packet) -> list[float]:
            """One peer packet's rewards; any failure rejects that packet only (select_external records
            ValueErrors)."""
            try:
                return self.rescore(packet, partial(budget.score, packet.sender))
            except ValueError:
                raise
            except Exception as err:  # noqa: BLE001 - the receiver's per-packet guard: a peer's packet must not fail it
                raise ValueError(f"cannot be scored ({type(err).__name__}: {str(err)[:200]})") from None

        selection = select_external(pool, scfg.external, scored, rng, weight)
        for sender in sorted({p.sender for p in pool}):  # verification record per peer (reputation)
            passed, failed = self.saved.peers.get(sender, (0, 0))
            count = sum(r.startswith(sender + "/") for r in selection.rejections)
            sent = sum(p.sender == sender for p in pool)
            self.saved.peers[sender] = (passed + sent - count, failed + count)
        for problem in selection.rejections:
            log.warning("node %d dropped a peer packet: %s", index, problem)
        if selection.shortfall and scfg.external:
            log.info("node %d: %d of J=%d external groups available after filtering (%d zero-advantage, "
                     "%d rejected, %d received)", index, len(selection.chosen), scfg.external,
                     selection.zero_advantage, selection.rejected, selection.received)
        external = [RolloutGroup(learner.prompt(s.packet.item), self.external_completions(s.packet, report),
                                 list(s.rewards), s.packet.item.uid, s.packet.item.task) for s in selection.chosen]
        groups = local + external
        learner.log_fallbacks(report)
        if groups:
            learner.learn_step(groups, "sapo", report)
        self.saved.pending = []
        return selection

    def external_completions(self, packet: Packet, report: WorkReport) -> list[Completion]:
        """A peer's completions as foreign members of a group (with their sender's behaviours where usable)."""
        learner = self.learner
        same = learner.settings.train.foreign_correction == "is" and packet.tokenizer == tokenizer_fingerprint(
            learner.policy.tokenizer)
        behaviours = packet.behaviour or (None,) * len(packet.completions)
        return [learner.foreign_completion(text, packet.sender, behaviour, report, same)
                for text, behaviour in zip(packet.completions, behaviours)]


def _train_reply(work: ClientWork[SapoConfig], message: SapoTrain, packets: list[Packet] | None,
                 eval_initial: dict | None) -> RecordDict:
    budget = ScoringBudget(Limits.score_seconds, Limits.sender_scoring_seconds, rewards=work.learner.rewards)
    selection = SapoNode(work.learner, work.section).train_on_pool(message.pool, message.header.server_round,
                                                                   work.report, budget)
    usage = budget.summary().values()
    scoring = {"scoring-timeouts": sum(int(u["timeouts"]) for u in usage),
               "scoring-skipped": sum(int(u["skipped"]) for u in usage)}
    counts = {"external-received": selection.received, "external-used": len(selection.chosen),
              "external-zero-advantage": selection.zero_advantage, "external-rejected": selection.rejected,
              "external-unverifiable": selection.unverifiable, "external-shortfall": selection.shortfall}
    evaluation, seconds = evaluate_own_adapter(work, message.config.evaluate, message.config.save_adapter)
    return SapoReply(work.client_report(), eval_initial, evaluation, seconds,
                     packets=None if packets is None else tuple(packets), selection=counts,
                     rejections=tuple(selection.rejections),
                     scoring={k: v for k, v in scoring.items() if v}).to_record()


def collect_rollouts(work: ClientWork[SapoConfig]) -> RecordDict:
    message = CollectRollouts.from_record(work.message.content)
    eval_initial = work.evaluate() if message.config.evaluate_initial else None
    packets = SapoNode(work.learner, work.section).generate_rollouts(message.header.server_round, work.report)
    return SapoReply(work.client_report(), eval_initial, packets=tuple(packets)).to_record()


def sapo_train(work: ClientWork[SapoConfig]) -> RecordDict:
    message = SapoTrain.from_record(work.message.content)
    eval_initial = work.evaluate() if message.config.evaluate_initial else None
    return _train_reply(work, message, None, eval_initial)


def sapo_async_round(work: ClientWork[SapoConfig]) -> RecordDict:
    message = SapoAsyncRound.from_record(work.message.content)
    eval_initial = work.evaluate() if message.config.evaluate_initial else None
    packets = SapoNode(work.learner, work.section).generate_rollouts(message.header.server_round, work.report)
    return _train_reply(work, message, packets, eval_initial)

