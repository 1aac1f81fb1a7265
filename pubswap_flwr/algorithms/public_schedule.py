"""PubSwap's public-step schedule: where in a round of tau local steps the public steps fall. Pure functions.

fixed (the paper): every tau_swap-th step. adaptive (pubswap.schedule, beyond the paper, which leaves adaptive
schedules to future work): the number of public steps follows a measured signal, the clients' policy disagreement
on the last round's public prompts (the share of client pairs whose most frequent answers differ), from
`min_steps` at or below `low` to the budget `max_steps` at or above `high`, linearly between; the steps are spread
evenly over the round.
"""

from __future__ import annotations

import math


def fixed_positions(tau: int, tau_swap: int) -> list[int]:
    """Steps 1..tau that are public under the fixed schedule: the multiples of tau_swap."""
    return [t for t in range(1, tau + 1) if t % tau_swap == 0]


def public_step_count(signal: float, low: float, high: float, min_steps: int, max_steps: int) -> int:
    """Public steps for a round whose driving signal is `signal`: min_steps .. max_steps, linear in between."""
    if not low < high:
        raise ValueError(f"low = {low} must be below high = {high}")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps ({min_steps}) <= max_steps ({max_steps})")
    share = min(max((signal - low) / (high - low), 0.0), 1.0)
    return min_steps + round(share * (max_steps - min_steps))


def even_positions(tau: int, count: int) -> list[int]:
    """`count` public steps spread evenly over steps 1..tau, the last at step tau (so a count of tau / tau_swap
    gives exactly the fixed schedule's positions)."""
    if not 1 <= count <= tau:
        raise ValueError(f"cannot place {count} public steps in a round of {tau} steps")
    return [math.ceil(i * tau / count) for i in range(1, count + 1)]
