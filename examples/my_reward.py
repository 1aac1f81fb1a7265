"""A user reward for tasks.rewards: numeric answers with a tolerance and partial credit for near misses.

    tasks.rewards = "examples.my_reward:reward"                    # every task
    tasks.rewards = "gcd=examples.my_reward:reward,chain_sum=examples.my_reward:reward"   # some tasks

Needs tasks.partial-credit = true to train on the partial credit (false pays 1 for a reward of 1, else 0).
"""

from __future__ import annotations

import math

RELATIVE_TOLERANCE = 0.01  # within 1% of the reference answer: full credit


def as_number(text: str | None) -> float | None:
    """"12", "-3.5", "1,000" or "3/4" as a float, else None (never evaluates the text)."""
    if text is None:
        return None
    cleaned = text.strip().replace(",", "")
    numerator, slash, denominator = cleaned.partition("/")
    try:
        value = float(numerator) / float(denominator) if slash else float(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def reward(answer: str, item) -> float:
    """1.0 within RELATIVE_TOLERANCE of item.answer; otherwise 1 - relative error, at least 0 (closer is better);
    0.0 for an answer that is not a number. `answer` is the text inside the <answer> tags."""
    got, gold = as_number(answer), as_number(item.answer)
    if got is None or gold is None:
        return 0.0
    error = abs(got - gold) / max(1.0, abs(gold))
    return 1.0 if error <= RELATIVE_TOLERANCE else max(0.0, 1.0 - error)
