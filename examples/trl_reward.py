"""Rewards in TRL's shape for tasks.trl-rewards, written as TRL's GRPOTrainer docs write reward_funcs.

    tasks.trl-rewards = "examples.trl_reward:reward_len+examples.trl_reward:format_reward"   # every task, summed
    tasks.trl-rewards = "gcd=examples.trl_reward:format_reward"                              # one task

Each gets the batch of one prompt's completions (whole texts, tags and all) and the item's columns as lists
(question, answer, task, uid and its metadata fields) and returns one number (or None) per completion.
"""

import re


def reward_len(completions, **kwargs):
    """Completions near 20 characters: 0 at 20, one less per character away (TRL's docs' length reward)."""
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward(completions, **kwargs):
    """1.0 for a completion that is only an answer in the tags, else 0.0 (a regex over the whole completion)."""
    pattern = r"^\s*<answer>.*?</answer>\s*$"
    matches = [re.match(pattern, content, re.DOTALL) for content in completions]
    return [1.0 if match else 0.0 for match in matches]
