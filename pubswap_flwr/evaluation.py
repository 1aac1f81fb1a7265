"""Held-out evaluation of a policy: greedy pass@1 and sampled (T=1) accuracy and mean reward, per task and overall.

At this model scale RL moves sampled behaviour first (greedy accuracy can even dip while sampled reward
rises; tests/integration/test_learning.py), so both are reported. Sampling uses a
fixed seed so rounds are comparable.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .policy import Policy
from .tasks import TaskItem, score_completion


def _score(policy: Policy, items: Sequence[TaskItem], greedy: bool, batch_size: int,
           max_chars: int) -> dict[str, list[float]]:
    rewards: dict[str, list[float]] = {}
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        out = policy.sample(chunk, 1, greedy=greedy, with_logprobs=False)
        for item, samples in zip(chunk, out):
            rewards.setdefault(item.task, []).append(score_completion(samples[0].text, item, max_chars=max_chars).reward)
    return rewards


def _summary(rewards: dict[str, list[float]], prefix: str, out: dict) -> None:
    every = [r for rs in rewards.values() for r in rs]
    out[f"{prefix}_accuracy"] = sum(r >= 1.0 for r in every) / len(every)
    out[f"{prefix}_reward"] = sum(every) / len(every)
    for task, rs in rewards.items():
        row = out["per_task"].setdefault(task, {})
        row[f"{prefix}_accuracy"] = sum(r >= 1.0 for r in rs) / len(rs)
        row[f"{prefix}_reward"] = sum(rs) / len(rs)


def evaluate(policy: Policy, items: Sequence[TaskItem], *, sampled: bool = True, batch_size: int = 256,
             seed: int = 0, max_chars: int = 4096) -> dict:
    """{"greedy_accuracy", "greedy_reward", ["sampled_accuracy", "sampled_reward"], "per_task": {...}}"""
    if not items:
        raise ValueError("no held-out items to evaluate")
    out: dict = {"per_task": {}, "items": len(items)}
    _summary(_score(policy, items, True, batch_size, max_chars), "greedy", out)
    if sampled:
        state = torch.get_rng_state()
        torch.manual_seed(seed)
        try:
            _summary(_score(policy, items, False, batch_size, max_chars), "sampled", out)
        finally:
            torch.set_rng_state(state)
    return out
