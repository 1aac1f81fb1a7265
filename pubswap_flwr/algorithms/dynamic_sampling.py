"""DAPO's dynamic sampling (train.dynamic-sampling): a step keeps the groups whose rewards differ and samples further
prompts until it has its prompts' worth of them or has sampled its cap; and skipping prompts before rollout. Pure
functions.

A group whose rewards all agree has advantage 0 everywhere and teaches nothing (without a KL term), yet costs its
sampling time. The first draw is the step's usual prompts; each further draw asks for the shortfall scaled up by the
informative share seen so far (everything the cap still allows while none was informative), never past the cap, so
a step samples at most floor(prompts x max-factor) prompts. Of the groups whose rewards differ, the first ones in
sampling order, up to the step's prompts, are trained.

Skipping before rollout (train.skip-equal-prompts, after GRESO): a prompt whose task's last groups at the node all had
rewards that agree is skipped with a probability before any sampling is spent on it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..rollouts import RolloutGroup


@dataclass(frozen=True)
class SamplingBudget:
    """A step's `wanted` groups (train.prompts-per-step) and the most prompts it may sample to find them."""

    wanted: int
    max_factor: float  # train.dynamic-sampling-max-factor, >= 1

    def __post_init__(self) -> None:
        if self.wanted < 1 or not self.max_factor >= 1:
            raise ValueError(f"a sampling budget needs wanted >= 1 and max_factor >= 1, got {self.wanted} and "
                             f"{self.max_factor}")

    @property
    def cap(self) -> int:
        """Prompts a step samples at most: floor(wanted x max_factor), at least `wanted`."""
        return max(self.wanted, math.floor(self.wanted * self.max_factor + 1e-9))


def next_draw(budget: SamplingBudget, sampled: int, kept: int) -> int:
    """How many prompts to sample next, after `sampled` of which `kept` had rewards that differ: 0 once the step is
    full or the cap reached; first the wanted number; then the shortfall divided by the informative share so far
    (all the cap leaves when none was informative), within the cap."""
    short, left = budget.wanted - kept, budget.cap - sampled
    if short <= 0 or left <= 0:
        return 0
    if sampled == 0:
        return min(budget.wanted, left)
    if kept == 0:
        return left
    return min(left, math.ceil(short * sampled / kept))


@dataclass(frozen=True)
class FilledStep:
    """What a dynamic step sampled (in order) and the groups it trains on (at most the budget's wanted)."""

    sampled: list[RolloutGroup]
    trained: list[RolloutGroup]
    draws: int  # rollout calls made

    @property
    def zero_advantage(self) -> int:
        """Sampled groups whose rewards all agree."""
        return sum(not group.has_signal for group in self.sampled)


def fill_step(budget: SamplingBudget, draw: Callable[[int], Sequence[RolloutGroup]]) -> FilledStep:
    """Sample with `draw(n)` (n fresh prompts' groups) as `next_draw` says, keeping the groups whose rewards differ."""
    sampled: list[RolloutGroup] = []
    kept: list[RolloutGroup] = []
    draws = 0
    while (count := next_draw(budget, len(sampled), len(kept))) > 0:
        groups = list(draw(count))
        if len(groups) != count:
            raise ValueError(f"asked for {count} groups, the draw gave {len(groups)}")
        draws += 1
        sampled.extend(groups)
        kept.extend(group for group in groups if group.has_signal)
    return FilledStep(sampled, kept[:budget.wanted], draws)


# -- skipping before rollout (train.skip-equal-prompts, GRESO's idea) ----------------------------------------------
RECENT_EQUAL = 2  # a task whose last this many groups at the node all had rewards that agree is a candidate to skip


def equal_streaks(streaks: Mapping[str, int], groups: Sequence[RolloutGroup]) -> dict[str, int]:
    """Per task, how many of its latest groups in a row had rewards that all agree, after `groups` (in order): one
    whose rewards differ resets its task's count to 0."""
    out = dict(streaks)
    for group in groups:
        out[group.task] = 0 if group.has_signal else out.get(group.task, 0) + 1
    return out


def skips(task: str, streaks: Mapping[str, int], probability: float, rng: random.Random) -> bool:
    """Whether a prompt of `task` is skipped before rollout: with `probability` when the task's last RECENT_EQUAL
    groups all had rewards that agree, never otherwise (`rng` is drawn from only then)."""
    return streaks.get(task, 0) >= RECENT_EQUAL and probability > 0 and rng.random() < probability
