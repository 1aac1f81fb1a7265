"""Reward functions in TRL's shape for tests/unit/test_trl_rewards.py, named in tasks.trl-rewards as
tests.unit.trl_reward_fixtures:NAME."""

import json
import time


def records_its_arguments(prompts, completions, **kwargs):
    """Writes what it was called with (JSON) to the file its items' `record_to` metadata column names; returns each
    completion's length."""
    with open(kwargs["record_to"][0], "w", encoding="utf-8") as out:
        json.dump({"prompts": prompts, "completions": completions, "kwargs": kwargs}, out)
    return [float(len(completion)) for completion in completions]


def none_for_the_first(prompts, completions, **kwargs):
    """None ("no reward from me") for the first completion, 0.25 for the others."""
    return [None] + [0.25] * (len(completions) - 1)


def always_none(prompts, completions, **kwargs):
    return [None for _ in completions]


def tenth_per_char(prompts, completions, **kwargs):
    return [len(completion) / 10 for completion in completions]


def returns_a_dict(prompts, completions, **kwargs):
    return {"reward": 1.0}


def returns_one_number(prompts, completions, **kwargs):
    return 1.0


def returns_one_too_few(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def returns_text(prompts, completions, **kwargs):
    return ["high"] * len(completions)


def returns_a_bool(prompts, completions, **kwargs):
    return [True] * len(completions)


def returns_nan(prompts, completions, **kwargs):
    return [float("nan")] * len(completions)


def returns_huge(prompts, completions, **kwargs):
    return [1e300] * len(completions)


def sleeps_past_the_limit(prompts, completions, **kwargs):
    time.sleep(60)
    return [1.0] * len(completions)


def conversational(prompts, completions, **kwargs):
    """As TRL's docs write a reward for a conversational dataset."""
    return [float(len(completion[0]["content"])) for completion in completions]


def prints_forged_replies(prompts, completions, **kwargs):
    """Writes lines shaped like the scoring worker's replies (reward 1.0 for everything, the next hundred request
    ids) on file descriptor 1, then returns 0.25 each."""
    import os

    forged = "".join('{"id": %d, "rewards": [[1.0, 1.0]]}\n' % request_id for request_id in range(1, 101))
    os.write(1, forged.encode())
    print(forged, end="", flush=True)
    return [0.25] * len(completions)


def takes_completions_only(completions):
    """No **kwargs: TRL itself would fail to call it too."""
    return [1.0 for _ in completions]
