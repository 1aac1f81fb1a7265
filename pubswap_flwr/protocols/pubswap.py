"""PubSwap: FedAvg/FedProx rounds of tau local GRPO steps where every tau_swap-th step is a public step on
responses the server pools across clients and hands back by the Balanced or Random rule
(algorithms/pubswap_response_sets.py).

One `train.segment` message per segment keeps round trips few. Segment s carries the response sets of the pending
public step (none in segment 0, which carries the global adapter instead), the number of private steps to run
next, and the ids of the next public prompts; the client applies the public step, runs the private steps, samples K
responses on the next public prompts with its current policy and replies them. The server scores every response
with its own verifier (public prompts are referenced by id; client-claimed rewards are never read) and builds the
next sets. The last segment's reply carries the adapter, aggregated as in fedavg/fedprox (`pubswap.base`).

Beyond the paper (each off by default): with `train.foreign-correction = "is"` replies carry each response's
sampling ids and log-probs, which travel with a donated response to its receiver; with `pubswap.donor = "likely"`
a failing client gets candidates and keeps the ones its own policy finds most likely; with `pubswap.schedule =
"adaptive"` the number of public steps per round follows the last round's policy disagreement
(algorithms/public_schedule.py).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from functools import partial
from itertools import combinations

import numpy as np
from flwr.app import RecordDict

from .. import metrics_schema as schema
from ..algorithms.group_signal import has_signal, zero_advantage_share
from ..algorithms.public_schedule import even_positions, fixed_positions, public_step_count
from ..algorithms.pubswap_response_sets import Response, build_response_sets, most_likely, rewards_after_swap
from ..config import ExperimentConfig
from ..config.catalog import PubSwapConfig
from ..node_runtime.serving import ClientWork
from ..rollouts import OWN, Behaviour, Completion, RolloutGroup
from ..rounds.context import RoundContext
from ..tasks import ScoringBudget
from ..tasks.rewards import parse_rewards
from ..tasks.verifiers import completion_shape
from ..wire.counters import UptakeCounts
from ..wire.records import Adapter
from .base import RunSettings, record_scoring
from .fedavg import AveragingProtocol, aggregate_adapters
from .pubswap_messages import (
    DonorChoice,
    PendingSample,
    PubSwapNodeState,
    Scored,
    Segment,
    SegmentAsk,
    SegmentConfig,
    SegmentReply,
    SwapEntry,
    fit_behaviours,
)
from .transfer import Downlink, adapter_to_send, decoded, global_for, start_round, take_global

log = logging.getLogger("pubswap_flwr")


# -- server --------------------------------------------------------------------------------------------------------
class PubSwapProtocol(AveragingProtocol):
    def __init__(self, settings: RunSettings, pubswap: PubSwapConfig, public=None):
        super().__init__(settings, public)
        self.pubswap = pubswap
        self.public_cursor = 0
        self.limits = settings.limits
        self.last_disagreement: float | None = None  # schedule = adaptive: the signal for the next round

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, public=None) -> "PubSwapProtocol":
        return cls(RunSettings.of(cfg), cfg.pubswap, public)

    @property
    def proximal_mu(self) -> float:
        return self.settings.strategy.proximal_mu if self.pubswap.base == "fedprox" else 0.0

    def describe(self) -> str:
        p = self.pubswap
        extra = "".join(f" {key}={value}" for key, value, default in (
            ("donor", p.donor, "uniform"), ("schedule", p.schedule, "fixed"),
            ("foreign-correction", self.settings.train.foreign_correction, "none")) if value != default)
        optimizer = self.optimizer.describe()
        return (f"swap={p.swap} tau={self.settings.train.local_steps} tau-swap={p.tau_swap} "
                f"public-prompts={p.public_prompts} base={p.base}{extra}" + (f" {optimizer}" if optimizer else ""))

    def state(self) -> dict:
        state: dict = {"public_cursor": self.public_cursor, **super().state()}
        if self.last_disagreement is not None:
            state["last_disagreement"] = self.last_disagreement
        return state

    def restore(self, state: dict, adapters: dict[str, Adapter] | None = None,
                nodes: dict[int, int] | None = None) -> None:
        cursor = state.get("public_cursor", 0)
        t = self.settings.train  # a round has at most tau public steps of public-prompts prompts each
        most = self.settings.rounds * t.local_steps * self.pubswap.public_prompts
        if isinstance(cursor, bool) or not isinstance(cursor, int) or not 0 <= cursor <= most:
            raise ValueError(f"public_cursor must be an integer in [0, {most}] (rounds x tau x public prompts), got "
                             f"{str(cursor)[:40]}")
        last = state.get("last_disagreement")
        if last is not None and (isinstance(last, bool) or not isinstance(last, (int, float)) or not 0 <= last <= 1):
            raise ValueError(f"last_disagreement must be a number in [0, 1], got {str(last)[:40]}")
        super().restore(state, adapters, nodes)
        self.public_cursor = cursor
        self.last_disagreement = None if last is None else float(last)

    def public_step_positions(self) -> list[int]:
        """This round's public steps: every tau-swap-th (fixed), or as many as the last round's policy
        disagreement asks for, spread evenly (adaptive; round 1 has no signal and uses the fixed count)."""
        p, tau = self.pubswap, self.settings.train.local_steps
        fixed = fixed_positions(tau, p.tau_swap)
        if p.schedule == "fixed":
            return fixed
        if self.last_disagreement is None:
            count = min(max(len(fixed), p.min_public_steps), p.max_public_steps)
        else:
            count = public_step_count(self.last_disagreement, p.disagreement_low, p.disagreement_high,
                                      p.min_public_steps, p.max_public_steps)
        return even_positions(tau, count)

    def next_public_uids(self) -> list[str]:
        """The next prompts of the public set, in a fresh seeded order each pass over it."""
        items = self.public.items
        uids = []
        for _ in range(self.pubswap.public_prompts):
            epoch, pos = divmod(self.public_cursor, len(items))
            order = list(range(len(items)))
            random.Random(f"{self.settings.seed}:public:{epoch}").shuffle(order)
            uids.append(items[order[pos]].uid)
            self.public_cursor += 1
        return uids

    def run_round(self, ctx: RoundContext) -> None:
        assert self.master is not None and self.public is not None
        k = self.settings.train.completions_per_prompt
        positions = self.public_step_positions()
        if self.pubswap.schedule == "adaptive":
            ctx.log.extra["schedule"] = {"signal": self.last_disagreement, "public_steps": len(positions),
                                         "positions": positions}
            log.info("round %d: %d public steps (last round's policy disagreement %s)", ctx.number, len(positions),
                     "n/a" if self.last_disagreement is None else f"{self.last_disagreement:.3f}")
        active = ctx.exchange.select(ctx.number)
        pending_sets: dict[int, dict] = {}
        pending_choices: dict[int, dict] = {}
        previous = 0
        ctx.log.extra["public_steps"] = []
        final_replies: dict[int, SegmentReply[Scored]] = {}
        master = self.master
        t = self.settings.train
        expected = {node: 0.0 for node in active}  # completions the server asks each client to train on
        budget = ScoringBudget(self.limits.score_seconds, self.limits.sender_scoring_seconds,
                               rewards=parse_rewards(self.settings.tasks.rewards))  # the run's own rewards
        master, codec = start_round(self.broadcast, master)  # compression: replies decoded against what was sent
        for segment in range(len(positions) + 1):
            is_final = segment == len(positions)
            next_public = positions[segment] if not is_final else self.settings.train.local_steps + 1
            for node in active:
                public = sum(len(entries) for entries in pending_sets.get(node, {}).values())
                expected[node] += (next_public - previous - 1) * t.prompts_per_step * t.completions_per_prompt + public
            uids = [] if is_final else self.next_public_uids()
            header = ctx.header(round_start=segment == 0, proximal_mu=self.proximal_mu)
            config = SegmentConfig(private_steps=next_public - previous - 1, public_uids="\n".join(uids), k=k,
                                   final=is_final)
            messages = [Segment(header, config, *self.global_for(node, master, segment, pending_sets.get(node)),
                                choices=pending_choices.get(node) or None)
                        .to_message(node) for node in active]
            ask = SegmentAsk(tuple(uids), k, self.limits, self.public, master if is_final else None,
                             partial_credit=self.settings.tasks.partial_credit, codec=codec,
                             with_behaviour=self.settings.train.foreign_correction == "is")
            result = ctx.exchange.send(messages, lambda node, reply: SegmentReply.from_message(
                reply, replace(ask, score=partial(budget.score, node))))
            if segment == 0 and self.broadcast is not None:
                self.broadcast.confirm(result.replies)
            ctx.log.absorb(result)
            active = [n for n in active if n in result.replies]
            if is_final:
                final_replies = result.replies
                break
            started = time.perf_counter()
            pending_sets, pending_choices, step_metrics = self.swap(
                ctx, {n: result.replies[n].responses for n in active}, uids, k, segment,
                {n: result.replies[n].modal for n in active}, {n: result.replies[n].behaviour for n in active})
            step_metrics["step"] = next_public
            ctx.log.extra["public_steps"].append(step_metrics)
            ctx.log.server_seconds += time.perf_counter() - started
            previous = next_public
        self.master = aggregate_adapters(ctx, self.settings, self.master,
                                         {n: decoded(r.adapter) for n, r in final_replies.items()}, expected,
                                         base=master, optimizer=self.optimizer)
        ctx.log.extra[schema.SWAP] = summarise_public_steps(ctx.log.extra["public_steps"])
        if ctx.log.extra["public_steps"]:
            self.last_disagreement = ctx.log.extra[schema.SWAP]["policy_disagreement"]
        record_scoring(ctx, budget)

    def global_for(self, node: int, master: Adapter, segment: int, sets: dict | None
                   ) -> tuple[Adapter | None, dict | None, Downlink | None]:
        """Segment's last fields for `node`: (the global adapter, the response sets, the compressed downlink); only
        segment 0 carries the global."""
        if segment != 0:
            return None, sets, None
        whole, downlink = global_for(self.broadcast, master, node)
        return whole, sets, downlink

    def swap(self, ctx: RoundContext, responses: dict[int, Scored], uids: list[str], k: int, segment: int,
             modal: dict[int, dict[str, str | None]], behaviour: dict[int, dict[str, list]] | None = None
             ) -> tuple[dict[int, dict], dict[int, dict], dict]:
        """Each client's response set per prompt by the configured rule, its donor choices (pubswap.donor =
        likely), and the public step's metrics (`modal`: each client's most frequent answer per prompt, for policy
        disagreement; `behaviour`: each response's sampling log-probs, passed on with donated responses)."""
        p = self.pubswap
        rng = random.Random(f"{self.settings.seed}:swap:{ctx.number}:{segment}")
        label = ctx.exchange.label
        nodes = ctx.exchange.ordered(responses)
        sets: dict[int, dict] = {node: {} for node in nodes}
        choices: dict[int, dict] = {node: {} for node in nodes}
        behaviour = behaviour or {}
        candidates = []
        swapped = {node: 0 for node in nodes}
        swapped_pairs = 0
        donors = []
        disagreement = []
        own_reward: dict[int, list[float]] = {node: [] for node in nodes}
        equal_before: list[float] = []  # per prompt: the share of the clients' groups with all rewards equal
        equal_after: list[float] = []
        mixed_before = {node: 0 for node in nodes}  # per client: its groups with unequal rewards, before and after
        mixed_after = {node: 0 for node in nodes}
        for uid in uids:
            pool = [Response(label(node), i, text, reward, (behaviour.get(node) or {}).get(uid, [None] * k)[i])
                    for node in nodes for i, (text, reward) in enumerate(responses[node][uid])]
            outcomes = build_response_sets(pool, p.swap, p.correct_threshold, k, rng, p.donor,
                                           p.donor_candidates) if pool else {}
            groups_before, groups_after = [], []  # this prompt's group of each client, rewards before and after
            for node in nodes:
                me = label(node)
                outcome = outcomes[me]
                sets[node][uid] = tuple(SwapEntry(r.reward, r.index) if r.client == me
                                        else SwapEntry(r.reward, -1, r.text, r.client, r.behaviour)
                                        for r in outcome.responses)
                if outcome.choice is not None:
                    choices[node][uid] = DonorChoice(outcome.choice.slots, tuple(
                        SwapEntry(r.reward, -1, r.text, r.client, r.behaviour) for r in outcome.choice.candidates))
                    candidates.append(len(outcome.choice.candidates))
                swapped[node] += outcome.swapped
                swapped_pairs += outcome.swapped > 0
                donors.append(outcome.donors_available)
                own = [reward for _, reward in responses[node][uid]]
                kept = rewards_after_swap(outcome)
                own_reward[node].extend(own)
                groups_before.append(own)
                groups_after.append(kept)
                mixed_before[node] += has_signal(own)
                mixed_after[node] += has_signal(kept)
            before, after = zero_advantage_share(groups_before), zero_advantage_share(groups_after)
            if before is not None and after is not None:
                equal_before.append(before)
                equal_after.append(after)
            pairs = list(combinations([modal[node][uid] for node in nodes], 2))
            if pairs:
                disagreement.append(sum(a != b for a, b in pairs) / len(pairs))
        withheld = {}
        for node in nodes:  # each node's segment must fit the payload limit whatever behaviours donors sent
            sets[node], choices[node], withheld[node] = fit_behaviours(sets[node], choices[node])
        pair_count = max(len(nodes) * len(uids), 1)
        metrics = {
            "prompts": uids,
            "clients": len(nodes),
            "swapped_pair_fraction": swapped_pairs / pair_count,
            "responses_swapped": {str(n): c for n, c in swapped.items()},
            "mean_donors": float(np.mean(donors)) if donors else 0.0,
            "public_reward_before_swap": {str(n): float(np.mean(r)) if r else 0.0 for n, r in own_reward.items()},
            "policy_disagreement": float(np.mean(disagreement)) if disagreement else 0.0,
            schema.ZERO_ADVANTAGE_BEFORE_SWAP: equal_before,
            schema.ZERO_ADVANTAGE_AFTER_SWAP: equal_after,
            schema.MIXED_GROUPS_BEFORE_SWAP: {str(n): c for n, c in mixed_before.items()},
            schema.MIXED_GROUPS_AFTER_SWAP: {str(n): c for n, c in mixed_after.items()},
        }
        if any(withheld.values()):
            metrics["behaviours_withheld"] = {str(n): c for n, c in withheld.items()}
        if p.donor == "likely":
            metrics["mean_donor_candidates"] = float(np.mean(candidates)) if candidates else 0.0
        return sets, choices, metrics


def summarise_public_steps(steps: list[dict]) -> dict:
    if not steps:
        return {"swapped_pair_fraction": 0.0, "responses_swapped": 0, "policy_disagreement": 0.0}
    summary: dict = {
        "swapped_pair_fraction": float(np.mean([s["swapped_pair_fraction"] for s in steps])),
        "responses_swapped": int(sum(sum(s["responses_swapped"].values()) for s in steps)),
        "mean_donors": float(np.mean([s["mean_donors"] for s in steps])),
        "policy_disagreement": float(np.mean([s["policy_disagreement"] for s in steps])),
    }
    for key in (schema.ZERO_ADVANTAGE_BEFORE_SWAP, schema.ZERO_ADVANTAGE_AFTER_SWAP):
        shares = [share for s in steps for share in s.get(key, ())]  # over every public prompt of the round
        if shares:
            summary[key] = float(np.mean(shares))
    for key in (schema.MIXED_GROUPS_BEFORE_SWAP, schema.MIXED_GROUPS_AFTER_SWAP, "behaviours_withheld"):
        counts = [s[key] for s in steps if key in s]  # per client, summed over the steps that recorded it
        if counts:
            summary[key] = {n: sum(c.get(n, 0) for c in counts) for n in dict.fromkeys(n for c in counts for n in c)}
    return summary


# -- client --------------------------------------------------------------------------------------------------------
def public_items(work: ClientWork[PubSwapConfig], uids) -> list:
    items = []
    for uid in uids:
        item = work.learner.universe.public.get(uid)
        if item is None:
            raise ValueError(f"unknown public prompt id {uid!r}")
        items.append(item)
    return items


def public_generate(work: ClientWork[PubSwapConfig], uids: tuple[str, ...], k: int
                    ) -> tuple[dict[str, list[str]], dict[str, list[Behaviour | None]]]:
    """K responses per public prompt with the node's current policy, and with train.foreign-correction = is their
    sampling behaviours (else {}); own ids are kept for the public step."""
    learner = work.learner
    items = public_items(work, uids)
    learner.seed_sampling()
    started = time.perf_counter()
    samples = learner.policy.sample(items, k)
    learner.sampled_shapes.update(completion_shape(s.text) for row in samples for s in row)
    saved = learner.family_state(PubSwapNodeState)
    saved.pending = {item.uid: [PendingSample(s.text, list(s.token_ids)) for s in row]
                     for item, row in zip(items, samples)}
    work.report.sample_seconds += time.perf_counter() - started
    if learner.settings.train.foreign_correction == "is":  # the log-probs travel with whatever is donated
        return {uid: [s.text for s in row] for uid, row in zip(uids, samples)}, {
            uid: [Behaviour(tuple(s.token_ids), tuple(s.logprobs)) if s.token_ids else None for s in row]
            for uid, row in zip(uids, samples)}
    return {uid: [s.text for s in rows] for uid, rows in saved.pending.items()}, {}


def likeliest(work: ClientWork[PubSwapConfig], prompt: str, entries: tuple[SwapEntry, ...],
              choice: DonorChoice) -> tuple:
    """The response set with `choice.slots` filled by the candidates this client's policy finds most likely."""
    for slot in choice.slots:
        if slot >= len(entries) or entries[slot].own_index < 0:
            raise ValueError(f"donor choice slot {slot} is not one of the client's own responses")
    learner = work.learner  # candidates are scored as they would train; fallbacks count once, for those kept
    scores = learner.policy.learner.mean_logprobs(prompt, [learner.foreign_completion(c.text, c.source, c.behaviour,
                                                                                      None)
                                                           for c in choice.candidates])
    picked = [choice.candidates[i] for i in most_likely(scores, len(choice.slots))]
    out = list(entries)
    for slot, entry in zip(choice.slots, picked):
        out[slot] = entry
    return tuple(out)


def public_update(work: ClientWork[PubSwapConfig], response_sets: dict[str, tuple[SwapEntry, ...]],
                  choices: dict[str, DonorChoice] | None = None) -> None:
    """One GRPO step on the server-built response sets (with pubswap.donor = likely, the chosen slots filled by
    the candidates this policy finds most likely). Own responses keep their sampled ids; foreign text is
    re-tokenized, or takes its donor's ids with the importance-sampling correction; rewards are the server's (it
    re-verified every response)."""
    learner = work.learner
    groups = []
    for uid, entries in response_sets.items():
        item = public_items(work, [uid])[0]
        own = learner.family_state(PubSwapNodeState).pending.get(uid, [])
        if choices and uid in choices:
            entries = likeliest(work, learner.prompt(item), entries, choices[uid])
        completions = []
        for entry in entries:
            if entry.own_index >= 0:
                if entry.own_index >= len(own):
                    raise ValueError(f"response set for {uid!r} names own response {entry.own_index}, "
                                     f"but only {len(own)} exist")
                sample = own[entry.own_index]
                completions.append(Completion(sample.text, tuple(sample.ids)))
            else:
                completions.append(learner.foreign_completion(entry.text, entry.source, entry.behaviour,
                                                              work.report))
        groups.append(RolloutGroup(learner.prompt(item), completions, [e.reward for e in entries], uid, item.task))
    if not groups:
        return
    learner.log_fallbacks(work.report)
    before = response_logprobs(learner, groups) if work.section.measure_uptake else None
    learner.learn_step(groups, "public", work.report)
    if before is not None:
        work.report.uptake += uptake(groups, before, response_logprobs(learner, groups))
    learner.family_state(PubSwapNodeState).pending = {}


def response_logprobs(learner, groups: list[RolloutGroup]) -> list[list[float]]:
    """Each response's mean per-token log-prob under the node's current policy, tokenized as its update sees it."""
    return [learner.policy.learner.mean_logprobs(group.prompt, group.completions) for group in groups]


def uptake(groups: list[RolloutGroup], before: list[list[float]], after: list[list[float]]) -> UptakeCounts:
    """pubswap.measure-uptake's counts: donors' responses (another client's source) apart from the node's own."""
    count = {"foreign": 0, "own": 0}
    before_sum = {"foreign": 0.0, "own": 0.0}
    after_sum = {"foreign": 0.0, "own": 0.0}
    for group, old, new in zip(groups, before, after):
        for completion, a, b in zip(group.completions, old, new):
            kind = "own" if completion.source == OWN else "foreign"
            count[kind] += 1
            before_sum[kind] += a
            after_sum[kind] += b
    return UptakeCounts(count["foreign"], before_sum["foreign"], after_sum["foreign"],
                        count["own"], before_sum["own"], after_sum["own"])


def segment(work: ClientWork[PubSwapConfig]) -> RecordDict:
    """[load the global adapter] [public step on the sent sets] private steps [K responses to the next public
    prompts] [last segment: the adapter]."""
    message = Segment.from_record(work.message.content)
    if message.header.round_start:  # segment 0 carries the global
        take_global(work, message.adapter, message.downlink)
    if message.response_sets is not None:
        public_update(work, message.response_sets, message.choices)
    asked = message.config
    work.learner.private_steps(asked.private_steps, work.report)
    responses, behaviour = public_generate(work, asked.uids, asked.k) if asked.uids else ({}, {})
    adapter = adapter_to_send(work) if asked.final else None
    return SegmentReply(work.client_report(), responses, adapter, behaviour=behaviour).to_record()

