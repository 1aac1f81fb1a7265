"""Held-out evaluation of a policy: greedy pass@1, and sampled (T=1) pass@1 and mean reward averaged over n samples
per item, each with its standard error over items, per task and overall.

At this model scale RL moves sampled behaviour first (greedy accuracy can even dip while sampled reward
rises; tests/integration/test_learning.py), so both are reported. One sample per item leaves a standard error of
about 0.02 on a few hundred items, the size of a whole short run's gain; n samples per item shrink the part of it
that comes from sampling. Sampling uses a fixed seed so rounds and arms are comparable.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .policy import Policy
from .tasks import TaskItem, lenient_score, score_completion
from .tasks.verifiers import completion_shape


def _scores(policy: Policy, items: Sequence[TaskItem], greedy: bool, samples: int, batch_size: int,
            max_chars: int, lenient: bool = False) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]]]:
    """(task -> per item, the rewards of its samples (one when greedy); with `lenient`, task -> per item, each
    sample's lenient correctness (1/0) followed by whether it is well-formed (1/0), else {})."""
    rewards: dict[str, list[list[float]]] = {}
    extra: dict[str, list[list[float]]] = {}
    per_call = max(1, batch_size // samples)
    for start in range(0, len(items), per_call):
        chunk = items[start:start + per_call]
        out = policy.sample(chunk, 1 if greedy else samples, greedy=greedy, with_logprobs=False)
        for item, row in zip(chunk, out):
            rewards.setdefault(item.task, []).append(
                [score_completion(s.text, item, max_chars=max_chars).reward for s in row])
            if lenient:
                extra.setdefault(item.task, []).append(
                    [float(lenient_score(s.text, item, max_chars=max_chars).reward >= 1.0) for s in row]
                    + [float(completion_shape(s.text) == "well-formed") for s in row])
    return rewards, extra


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample SD / sqrt(n); 0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def item_estimates(rewards: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Per item: the fraction of its samples that are correct (reward >= 1), and its mean reward."""
    accuracy = [sum(r >= 1.0 for r in row) / len(row) for row in rewards]
    reward = [sum(row) / len(row) for row in rewards]
    return accuracy, reward


def _summary(rewards: dict[str, list[list[float]]], prefix: str, out: dict, with_se: bool) -> None:
    def fill(target: dict, rows: list[list[float]]) -> None:
        accuracy, reward = item_estimates(rows)
        target[f"{prefix}_accuracy"], accuracy_se = mean_and_se(accuracy)
        target[f"{prefix}_reward"], reward_se = mean_and_se(reward)
        if with_se:
            target[f"{prefix}_accuracy_se"], target[f"{prefix}_reward_se"] = accuracy_se, reward_se

    fill(out, [row for rows in rewards.values() for row in rows])
    for task, rows in rewards.items():
        fill(out["per_task"].setdefault(task, {}), rows)


def _lenient_summary(extra: dict[str, list[list[float]]], prefix: str, out: dict, with_se: bool) -> None:
    """`{prefix}_lenient_accuracy` (answers right whatever the format, tasks.lenient_answer) and
    `{prefix}_well_formed` (share of samples with exactly one <answer>...</answer> and nothing after it)."""
    def fill(target: dict, rows: list[list[float]]) -> None:
        half = [len(row) // 2 for row in rows]
        right = [sum(row[:h]) / h for row, h in zip(rows, half)]
        formed = [sum(row[h:]) / h for row, h in zip(rows, half)]
        target[f"{prefix}_lenient_accuracy"], lenient_se = mean_and_se(right)
        target[f"{prefix}_well_formed"] = mean_and_se(formed)[0]
        if with_se:
            target[f"{prefix}_lenient_accuracy_se"] = lenient_se

    fill(out, [row for rows in extra.values() for row in rows])
    for task, rows in extra.items():
        fill(out["per_task"].setdefault(task, {}), rows)


def evaluate(policy: Policy, items: Sequence[TaskItem], *, sampled: bool = True, samples: int = 1,
             batch_size: int = 256, seed: int = 0, max_chars: int = 4096, lenient: bool = False) -> dict:
    """{"greedy_accuracy", "greedy_reward", ["sampled_accuracy", "sampled_reward" and their "_se", "samples"],
    "per_task": {...}, "items"}: sampled metrics average `samples` T=1 samples per item; the standard errors are
    over items (the overall one treats items as independent draws of the task mix). With `lenient` (eval.lenient),
    also the lenient accuracy and the well-formed share of the same samples (`_lenient_summary`)."""
    if not items:
        raise ValueError("no held-out items to evaluate")
    if samples < 1:
        raise ValueError(f"samples per item must be >= 1, got {samples}")
    out: dict = {"per_task": {}, "items": len(items)}
    rewards, extra = _scores(policy, items, True, 1, batch_size, max_chars, lenient)
    _summary(rewards, "greedy", out, with_se=False)
    if lenient:
        _lenient_summary(extra, "greedy", out, with_se=False)
    if sampled:
        state = torch.get_rng_state()
        torch.manual_seed(seed)
        try:
            rewards, extra = _scores(policy, items, False, samples, batch_size, max_chars, lenient)
            _summary(rewards, "sampled", out, with_se=True)
            if lenient:
                _lenient_summary(extra, "sampled", out, with_se=True)
        finally:
            torch.set_rng_state(state)
        out["samples"] = samples
    return out
