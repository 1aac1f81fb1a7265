"""Reward functions for tests/unit/test_rewards.py, named in tasks.rewards as tests.unit.reward_fixtures:NAME."""

import time

NOT_A_FUNCTION = 0.5


def half_for_any_answer(answer, item):
    """0.5 for every tagged answer: no built-in verifier pays that, so its use shows in the metrics."""
    return 0.5


def sleeps_past_the_limit(answer, item):
    time.sleep(60)
    return 1.0


def loops_forever(answer, item):
    while True:
        pass


def one_in_the_scoring_worker(answer, item):
    """1.0 when called in the isolated scoring worker (whose loop module is `_worker_loop`), else 0.0."""
    import sys

    return 1.0 if "_worker_loop" in sys.modules else 0.0
