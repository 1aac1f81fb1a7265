"""A node's learner: its policy with its own adapter and optimizer, its private task stream, and the learning
steps every mode shares (rollouts on private prompts, GRPO updates). State persists through NodeStore.

Sampling seeds derive from (run seed, node, call counter), so a restarted node draws exactly what it would have drawn.
"""

from __future__ import annotations

import collections
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Sequence, TypeVar

import msgspec
import torch

from ..algorithms.dynamic_sampling import FilledStep, SamplingBudget, equal_streaks, fill_step, skips
from ..config import ExperimentConfig
from ..config.sections import EvalConfig, GenerationConfig, ModelConfig, StrategyConfig, TasksConfig, TrainConfig
from ..policy import Policy, cached_policy
from ..policy.behaviour import accept_behaviour
from ..policy.threads import apply_threads
from ..rollouts import Behaviour, Completion, RolloutGroup
from ..schema import parse
from ..shared import TaskUniverse, derive_seed, policy_spec, resolve_data_path, task_universe
from ..tasks import (
    ItemListStream,
    MixtureStream,
    TaskItem,
    TaskSpec,
    load_items,
    node_mixes,
    parse_custom_tasks,
    parse_mix,
    score_completion,
    training_reward,
)
from ..tasks.curriculum import Band, TaskLevel, at_level, group_success, next_level, observe, top_level
from ..tasks.isolation import check_rewards
from ..tasks.items import max_question_chars
from ..tasks.rewards import TRL_REWARDS_KEY, parse_rewards, parse_trl_rewards
from ..tasks.verifiers import completion_shape, score_trl_group
from ..wire.counters import ForeignCounts, SamplingCounts, SignalCounts, UptakeCounts
from .state import NodeIdentity, NodeState, NodeStore, plain

log = logging.getLogger(__name__)
SKIP_LOOK_AHEAD = 4  # train.skip-equal-prompts: a step looks at most this x its prompts ahead in its stream
FamilyState = TypeVar("FamilyState", bound=msgspec.Struct)


@dataclass
class StepRecord:
    step: int
    kind: str  # "private" | "rollout" | "public" | "sapo"
    mean_reward: float
    completions: int
    sample_seconds: float
    update_seconds: float
    zero_advantage_groups: int = 0
    foreign_completions: int = 0


@dataclass
class WorkReport:
    """What a node did during one message: per-step records and timings."""

    steps: list[StepRecord] = field(default_factory=list)
    sample_seconds: float = 0.0
    update_seconds: float = 0.0
    num_examples: int = 0
    foreign: ForeignCounts = ForeignCounts()  # train.foreign-correction: the foreign text trained on,
    fallbacks: collections.Counter = field(default_factory=collections.Counter)  # and why some of it had no IS
    uptake: UptakeCounts = UptakeCounts()  # pubswap.measure-uptake: log-probs of the public step's responses
    signal: SignalCounts = SignalCounts()  # the groups trained on, and those whose rewards were all equal
    sampling: SamplingCounts = SamplingCounts()  # train.dynamic-sampling: groups wanted, sampled and trained

    def add(self, record: StepRecord) -> None:
        self.steps.append(record)
        self.sample_seconds += record.sample_seconds
        self.update_seconds += record.update_seconds

    def mean_reward(self, kind: str | None = None) -> float:
        rows = [s for s in self.steps if kind is None or s.kind == kind]
        total = sum(s.completions for s in rows)
        return sum(s.mean_reward * s.completions for s in rows) / total if total else 0.0

    def has(self, kind: str) -> bool:
        return any(s.kind == kind for s in self.steps)


@dataclass(frozen=True)
class NodeSettings:
    """What a node reads of the run, handed to its learner's constructor: the seed, the run-wide sections it acts on,
    the facts its adapter card states (mode, rounds), and the task universe every party derives from the run config.
    A mode's own section (sapo.*, pubswap.*) reaches that mode's node side apart, through serving.ClientWork."""

    seed: int
    num_server_rounds: int
    model: ModelConfig
    generation: GenerationConfig
    train: TrainConfig
    tasks: TasksConfig
    eval: EvalConfig
    strategy: StrategyConfig
    universe: TaskUniverse

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> "NodeSettings":
        return cls(cfg.seed, cfg.num_server_rounds, cfg.model, cfg.generation, cfg.train, cfg.tasks, cfg.eval,
                   cfg.strategy, task_universe(cfg))


class Learner:
    """One organization's learner; `proximal_mu` > 0 adds FedProx's term towards the last global adapter."""

    def __init__(self, settings: NodeSettings, identity: NodeIdentity, proximal_mu: float = 0.0):
        self.settings = settings
        self.identity = identity
        self.universe = settings.universe
        self.rewards = parse_rewards(settings.tasks.rewards)  # tasks.rewards: user reward functions by task
        check_rewards(self.rewards)  # a node that cannot import one fails here, before it trains
        self.trl_rewards = parse_trl_rewards(settings.tasks.trl_rewards)  # tasks.trl-rewards: its rollouts' rewards
        check_rewards(self.trl_rewards, TRL_REWARDS_KEY)
        apply_threads(settings.model.threads, identity.cpus)
        self.policy: Policy = cached_policy(policy_spec(settings, identity.model_name, proximal_mu,
                                                        identity.learning_rate))
        self.uses_proximal = proximal_mu > 0
        self.store = NodeStore(identity.state_dir, identity.model_name)
        t = settings.tasks  # tasks.curriculum: the frontier controller's band (tasks/curriculum.py)
        self.band = Band(t.curriculum_low, t.curriculum_high, t.curriculum_window) if t.curriculum else None
        self._family_state: msgspec.Struct | None = None  # family_state's parse of state.mode
        self.state = self._load()
        self.stream = self._build_stream()
        self._by_question: dict[str, list[TaskItem]] | None = None  # own_items' index of self.stream
        self.sampled_shapes: collections.Counter[str] = collections.Counter()  # of this message's own samples
        # FedProx pulls towards the last global adapter; it is kept on disk because a round may span several
        # messages (PubSwap segments), each served by a fresh Learner
        self.proximal_reference: dict[str, torch.Tensor] | None = (
            self._device_reference(self.store.load_reference()) if self.uses_proximal else None)

    @property
    def state_dir(self):
        return self.identity.state_dir

    # -- persistence -----------------------------------------------------------------------------------------
    def _load(self) -> NodeState:
        self.policy.reset(derive_seed(self.settings.seed, self.identity.index, "init"))  # the cached policy is shared
        self._family_state = None
        return self.store.load(self.policy)

    def family_state(self, kind: type[FamilyState]) -> FamilyState:
        """This node's state of its mode family, as the family declares it (`kind`, the catalog's node_state), kept
        in node.json under `mode`: parsed on first use, saved back by `save`."""
        if not isinstance(self._family_state, kind):
            self._family_state = parse(self.state.mode, kind, "node state.mode", ValueError)
        return self._family_state

    def save(self) -> None:
        if self._family_state is not None:
            self.state.mode = msgspec.to_builtins(self._family_state, enc_hook=plain)
        self.store.save(self.policy, self.state)

    def begin_round(self, round_number: int) -> bool:
        """Called by a round's first message. A node that already began this round (the server was restarted and
        resumed from an earlier checkpoint) restores the state it had at the start of the round, so the round is
        repeated exactly; otherwise its current state is kept as that round's starting point. The snapshot's
        marker alone decides: a handler killed mid-message may have written files (the compressed global) without
        saving node.json, so last_round can still say the round never began. Returns True when it restored."""
        if self.store.has_round_start(round_number):
            self.store.restore_round_start()
            self.state = self._load()
            self.stream = self._build_stream()
            self._by_question = None
            log.info("node %d: repeating round %d from its saved start", self.identity.index, round_number)
            return True
        self._move_levels(round_number)
        self.save()
        self.store.snapshot_round_start(round_number)
        return False

    def _build_stream(self):
        settings = self.settings
        exclude = self.universe.training_exclude
        if self.identity.data_path:
            items = load_items(resolve_data_path(self.identity.data_path), fmt=settings.tasks.data_format,
                               uid_prefix=f"node{self.identity.index}",
                               max_question=max_question_chars(settings.generation.max_prompt_tokens))
            return ItemListStream(items, exclude, seed=derive_seed(settings.seed, self.identity.index, "data"))
        custom = parse_custom_tasks(settings.tasks.custom)
        if self.identity.task_mix:
            mix = parse_mix(self.identity.task_mix, custom, key="node-config task-mix")
        elif settings.tasks.node_mixes.strip():
            mixes = [m for m in settings.tasks.node_mixes.split(";") if m.strip()]
            mix = parse_mix(mixes[self.identity.index % len(mixes)], custom, key="tasks.node-mixes")
        else:
            base = parse_mix(settings.tasks.mix, custom)
            mix = node_mixes(base, self.identity.index + 1, settings.tasks.per_node)[self.identity.index]
        names = [t.name for t in self.universe.tasks]
        unknown = [s.name for s in mix if s.name not in names]
        if unknown:
            raise ValueError(f"node task mix names tasks outside tasks.mix: {unknown}")
        if self.band is not None:
            mix = [at_level(spec, self._curriculum_level(spec)) for spec in mix]
        return MixtureStream(mix, self.universe.tasks, self.identity.index, exclude, settings.tasks.data_seed)

    # -- tasks.curriculum: the private stream's levels -----------------------------------------------------------
    def _curriculum_level(self, spec: TaskSpec) -> int:
        """The node's saved level of `spec` (the start level for a task it has none of yet), checked against the
        task's range: node.json is untrusted input."""
        saved = self.state.curriculum.setdefault(spec.name, TaskLevel(self.settings.tasks.curriculum_start))
        if saved.level > top_level(spec):
            raise ValueError(f"node state {self.store.directory / 'node.json'}: curriculum level {saved.level} of "
                             f"task {spec.name!r} is above its top level {top_level(spec)}")
        return saved.level

    def _curriculum_stream(self) -> MixtureStream:
        """The generated private stream the controller moves; ValueError for a data file or saved levels of tasks
        this node does not train."""
        if not isinstance(self.stream, MixtureStream):
            raise ValueError(f"tasks.curriculum = true, but node {self.identity.index} trains on its data file "
                             f"{self.identity.data_path}, which has no curriculum levels")
        extra = sorted(set(self.state.curriculum) - set(self.task_names))
        if extra:
            raise ValueError(f"node state {self.store.directory / 'node.json'}: curriculum names tasks this node "
                             f"does not train: {extra}")
        return self.stream

    def observe_groups(self, groups: Sequence[RolloutGroup]) -> None:
        """Add this node's own private groups' success rates to its curriculum windows (tasks.curriculum)."""
        if self.band is None:
            return
        for name in dict.fromkeys(g.task for g in groups):
            state = self.state.curriculum.get(name)
            if state is not None:
                successes = [group_success(g.rewards) for g in groups if g.task == name]
                self.state.curriculum[name] = observe(state, successes, self.band)

    def _move_levels(self, round_number: int) -> None:
        """A round's start: the frontier rule moves each task's level (tasks.curriculum), the stream follows."""
        if self.band is None:
            return
        moved = False
        for spec in self._curriculum_stream().mix:
            before = self.state.curriculum[spec.name]
            after = next_level(before, self.band, top_level(spec))
            self.state.curriculum[spec.name] = after
            if after.level != before.level:
                moved = True
                log.info("node %d: round %d trains %s at curriculum level %d (was %d)", self.identity.index,
                         round_number, spec.name, after.level, before.level)
        if moved:
            self.stream = self._build_stream()

    @property
    def curriculum_levels(self) -> dict[str, int]:
        """Task -> the curriculum level this node's private items are drawn at (empty with the controller off)."""
        return {name: self.state.curriculum[name].level for name in self.task_names
                if self.band is not None and name in self.state.curriculum}

    def own_items(self, question: str) -> list[TaskItem]:
        """This node's own training items (an organization data file) with this question text; none for a generated
        task stream, whose items a peer's are checked against through provenance (protocols/sapo_verify.py)."""
        if not isinstance(self.stream, ItemListStream):
            return []
        if self._by_question is None:
            self._by_question = collections.defaultdict(list)
            for item in self.stream.items:
                self._by_question[item.question].append(item)
        return list(self._by_question.get(question, ()))

    @property
    def task_names(self) -> list[str]:
        if isinstance(self.stream, MixtureStream):
            return [s.name for s in self.stream.mix]
        return sorted({i.task for i in self.stream.items})

    # -- global adapter --------------------------------------------------------------------------------------
    def _device_reference(self, saved: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        if saved is None:
            return None
        params = self.policy.learner.params
        return {n: saved[n].to(params[n].device, params[n].dtype) for n in params if n in saved}

    def receive_global(self, adapter: dict[str, torch.Tensor]) -> None:
        """Start a round from the server's adapter; it is also the FedProx reference."""
        self.policy.load_adapter(adapter)
        self.proximal_reference = ({n: p.detach().clone() for n, p in self.policy.learner.params.items()}
                                   if self.uses_proximal else None)
        if self.proximal_reference is not None:
            self.store.save_reference(self.proximal_reference)
        if self.settings.train.reset_optimizer:
            self.policy.learner.reset_optimizer()

    # -- rollouts and updates --------------------------------------------------------------------------------
    def seed_sampling(self) -> None:
        torch.manual_seed(derive_seed(self.settings.seed, self.identity.index, self.state.sample_calls, "sample"))
        self.state.sample_calls += 1

    def rollout(self, items: Sequence[TaskItem], k: int) -> tuple[list[RolloutGroup], float]:
        """Sample `k` completions per item with the current policy and score them; (groups, seconds)."""
        started = time.perf_counter()
        self.seed_sampling()
        samples = self.policy.sample(items, k)
        prompts = self.policy.prompts(items)
        groups = []
        limit, partial = self.settings.generation.max_completion_chars, self.settings.tasks.partial_credit
        for item, prompt, row in zip(items, prompts, samples):
            completions = [Completion(s.text, tuple(s.token_ids), behaviour=Behaviour(tuple(s.token_ids),
                                                                                      tuple(s.logprobs))
                                      if len(s.logprobs) == len(s.token_ids) else None) for s in row]
            self.sampled_shapes.update(completion_shape(s.text) for s in row)
            reward, trl = self.rewards.for_task(item.task), self.trl_rewards.for_task(item.task)
            scores = ([score_completion(s.text, item, max_chars=limit, reward=reward) for s in row] if trl is None
                      else score_trl_group([s.text for s in row], item, trl, max_chars=limit, fallback=reward))
            rewards = [s.reward if s.trl else training_reward(s.reward, partial) for s in scores]
            groups.append(RolloutGroup(prompt, completions, rewards, item.uid, item.task))
        return groups, time.perf_counter() - started

    def prompt(self, item: TaskItem) -> str:
        return self.policy.formatter(item)

    def learn(self, groups: Sequence[RolloutGroup]):
        started = time.perf_counter()
        stats = self.policy.update(groups, self.proximal_reference)
        return stats, time.perf_counter() - started

    def foreign_completion(self, text: str, source: str, behaviour: Behaviour | None, report: WorkReport | None,
                           same_tokenizer: bool = True) -> Completion:
        """Another party's text as a foreign group member. With train.foreign-correction = "is" it keeps the sender's
        behaviour when this node can use it (same tokenizer, ids decoding to the text); otherwise it is text only,
        weighted by train.foreign-weight, and the reason is counted in `report.fallbacks` (when given)."""
        if self.settings.train.foreign_correction != "is":
            return Completion(text, None, source)
        usable, why = (accept_behaviour(self.policy.tokenizer, text, behaviour, self.settings.generation.max_new_tokens)
                       if same_tokenizer else (None, "the sender's tokenizer differs"))
        if usable is None and report is not None:
            report.fallbacks[why] += 1
        return Completion(text, None, source, usable)

    def log_fallbacks(self, report: WorkReport) -> None:
        """Say which foreign completions fell back to train.foreign-weight, and why."""
        if report.fallbacks:
            log.info("node %d: %d foreign completions without a usable sender behaviour, weighted by "
                     "train.foreign-weight = %g: %s", self.identity.index, sum(report.fallbacks.values()),
                     self.settings.train.foreign_weight,
                     "; ".join(f"{why} ({n})" for why, n in report.fallbacks.most_common()))

    def learn_step(self, groups: Sequence[RolloutGroup], kind: str, report: WorkReport,
                   sample_seconds: float = 0.0, filled: FilledStep | None = None) -> None:
        """One GRPO update on `groups`, counted as a step of `kind` (its completions count as examples). A dynamic
        step's record (`filled`) has the reward of every group it sampled, and counts those whose rewards agree."""
        stats, update_s = self.learn(groups)
        self.state.steps += 1
        report.num_examples += stats.completions
        report.foreign += ForeignCounts.of_step(stats.extra)
        report.signal += SignalCounts.of_groups(g.rewards for g in groups)  # the groups trained
        reward, completions, zero_advantage = stats.mean_reward, stats.completions, stats.zero_advantage_groups
        if filled is not None:
            reward, completions = _mean_reward(filled.sampled)
            zero_advantage = filled.zero_advantage
        report.add(StepRecord(self.state.steps, kind, reward, completions, sample_seconds, update_s, zero_advantage,
                              stats.foreign_completions))

    def private_steps(self, count: int, report: WorkReport) -> None:
        """`count` GRPO steps on fresh prompts from the private stream (with train.dynamic-sampling, on the groups
        whose rewards differ: `dynamic_step`)."""
        cfg = self.settings.train
        for _ in range(count):
            if cfg.dynamic_sampling:
                self.dynamic_step(report)
                continue
            items = self.take_private(cfg.prompts_per_step, report)
            groups, sample_s = self.rollout(items, cfg.completions_per_prompt)
            self.observe_groups(groups)
            self.note_equal_groups(groups)
            rewards = [r for g in groups for r in g.rewards]
            self.state.cumulative_reward += sum(rewards) / len(rewards)
            self.learn_step(groups, "private", report, sample_s)

    def take_private(self, count: int, report: WorkReport) -> list[TaskItem]:
        """The next `count` prompts of the private stream; with train.skip-equal-prompts, prompts whose task's
        recent groups here all had rewards that agree are skipped with its probability (seeded by the run seed,
        node and sampling call, so a resumed node skips the same), looking at most SKIP_LOOK_AHEAD x `count` ahead."""
        probability = self.settings.train.skip_equal_prompts
        if probability == 0:
            return self.stream.take(count, self.state.cursor)
        rng = random.Random(derive_seed(self.settings.seed, self.identity.index, self.state.sample_calls, "skip"))
        kept: list[TaskItem] = []
        looked = skipped = 0
        while len(kept) < count:
            item = self.stream.take(1, self.state.cursor)[0]
            looked += 1
            if looked <= SKIP_LOOK_AHEAD * count and skips(item.task, self.state.equal_streaks, probability, rng):
                skipped += 1
                continue
            kept.append(item)
        report.sampling += SamplingCounts(prompts_skipped=skipped)
        return kept

    def note_equal_groups(self, groups: Sequence[RolloutGroup]) -> None:
        """Keep each task's run of private groups whose rewards agree (train.skip-equal-prompts reads it)."""
        if self.settings.train.skip_equal_prompts > 0:
            self.state.equal_streaks = equal_streaks(self.state.equal_streaks, groups)

    def dynamic_step(self, report: WorkReport) -> None:
        """train.dynamic-sampling: sample the step's prompts, then further prompts of the private stream (each draw
        seeded as every rollout is), until prompts-per-step groups have rewards that differ or the cap is reached
        (algorithms/dynamic_sampling.py); train on those. With none the step is skipped and logged."""
        cfg = self.settings.train
        seconds = 0.0

        def draw(count: int) -> list[RolloutGroup]:
            nonlocal seconds
            groups, sample_s = self.rollout(self.take_private(count, report), cfg.completions_per_prompt)
            self.observe_groups(groups)  # every group sampled, kept or not: else the success rate is biased
            self.note_equal_groups(groups)
            seconds += sample_s
            return groups

        filled = fill_step(SamplingBudget(cfg.prompts_per_step, cfg.dynamic_sampling_max_factor), draw)
        reward, completions = _mean_reward(filled.sampled)
        self.state.cumulative_reward += reward
        report.sampling += SamplingCounts(cfg.prompts_per_step, len(filled.sampled), len(filled.trained),
                                          int(not filled.trained))
        if filled.trained:
            self.learn_step(filled.trained, "private", report, seconds, filled)
            return
        log.info("node %d: private step skipped: none of the %d groups it sampled had rewards that differ "
                 "(train.dynamic-sampling, at most %g x %d prompts)", self.identity.index, len(filled.sampled),
                 cfg.dynamic_sampling_max_factor, cfg.prompts_per_step)
        report.add(StepRecord(self.state.steps, "private", reward, completions, seconds, 0.0, filled.zero_advantage))


def _mean_reward(groups: Sequence[RolloutGroup]) -> tuple[float, int]:
    """The mean reward of `groups`' completions, and how many there are."""
    rewards = [r for group in groups for r in group.rewards]
    return sum(rewards) / len(rewards), len(rewards)
