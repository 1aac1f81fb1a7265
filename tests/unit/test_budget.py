"""ScoringBudget: per-completion limits, per-sender budgets within a round, skipped completions, usage and reset."""

from __future__ import annotations

import pytest

from pubswap_flwr.tasks import BUDGET_EXHAUSTED_REASON, Score, ScoringBudget, SenderUsage, TaskItem
from pubswap_flwr.tasks.verifiers import TIMEOUT_REASON_PREFIX

ITEM = TaskItem("o/1", "o", "q", "4", "exact")


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeScorer:
    """Takes `cost` seconds of fake time per completion and records the limit it was given; texts containing
    "slow" use the whole limit and time out."""

    def __init__(self, clock: FakeClock, cost: float = 1.0):
        self.clock, self.cost = clock, cost
        self.limits: list[float] = []

    def __call__(self, completion, item, *, max_chars, timeout_s):
        self.limits.append(timeout_s)
        if "slow" in completion:
            self.clock.now += timeout_s
            return Score(0.0, f"{TIMEOUT_REASON_PREFIX}ScoringTimeout: hit the {timeout_s:g} s timeout")
        self.clock.now += self.cost
        return Score(1.0)


def budget(per_completion=2.0, per_sender=5.0, cost=1.0):
    clock = FakeClock()
    scorer = FakeScorer(clock, cost)
    return ScoringBudget(per_completion, per_sender, clock=clock, scorer=scorer), scorer


def test_sender_is_cut_off_once_its_budget_is_spent():
    b, scorer = budget(per_completion=2.0, per_sender=5.0, cost=1.0)
    scores = [b.score("peer-a", "<answer>4</answer>", ITEM) for _ in range(8)]
    assert [s.reward for s in scores] == [1.0] * 5 + [0.0] * 3
    assert all(s.reason == BUDGET_EXHAUSTED_REASON for s in scores[5:])
    assert len(scorer.limits) == 5  # the skipped ones were not scored at all
    assert b.usage("peer-a") == SenderUsage(seconds=5.0, scored=5, timeouts=0, skipped=3)
    assert b.exhausted("peer-a") and b.remaining("peer-a") == 0.0


def test_budgets_are_per_sender():
    b, _ = budget(per_completion=2.0, per_sender=3.0)
    for _ in range(5):
        b.score("greedy", "slow", ITEM)
    assert b.exhausted("greedy")
    assert b.score("honest", "<answer>4</answer>", ITEM) == Score(1.0)
    assert b.remaining("honest") == 2.0 and not b.exhausted("honest")
    assert b.usage("nobody") == SenderUsage()


def test_completion_limit_is_the_smaller_of_per_completion_and_what_is_left():
    b, scorer = budget(per_completion=2.0, per_sender=5.0)
    b.score(1, "slow", ITEM)  # 2 s
    b.score(1, "slow", ITEM)  # 2 s, 1 s left
    last = b.score(1, "slow", ITEM)
    assert scorer.limits == [2.0, 2.0, 1.0]
    assert last.timed_out
    assert b.usage(1) == SenderUsage(seconds=5.0, scored=3, timeouts=3, skipped=0)
    assert b.score(1, "<answer>4</answer>", ITEM).reason == BUDGET_EXHAUSTED_REASON


def test_new_round_restores_every_budget():
    b, _ = budget(per_completion=2.0, per_sender=2.0)
    b.score("a", "slow", ITEM)
    b.score("a", "slow", ITEM)
    assert b.summary() == {"a": {"seconds": 2.0, "scored": 1, "timeouts": 1, "skipped": 1}}
    b.new_round()
    assert b.summary() == {} and b.remaining("a") == 2.0
    assert b.score("a", "<answer>4</answer>", ITEM).reward == 1.0


def test_accounting_without_scoring():
    b = ScoringBudget(1.0, 10.0)
    assert b.timeout_for("x") == 1.0
    b.charge("x", 9.5, timed_out=True)
    assert b.timeout_for("x") == pytest.approx(0.5)
    b.charge("x", -3.0)  # a clock that went backwards charges nothing
    assert b.remaining("x") == pytest.approx(0.5)
    b.charge("x", 0.5)
    assert b.exhausted("x") and b.timeout_for("x") == 0.0
    assert b.skip("x") == Score(0.0, BUDGET_EXHAUSTED_REASON)
    assert b.usage("x") == SenderUsage(seconds=10.0, scored=3, timeouts=1, skipped=1)
    usage = b.usage("x")
    usage.seconds = 0.0  # a copy: the budget is not changed through it
    assert b.exhausted("x")


@pytest.mark.parametrize("per_completion,per_sender", [(0, 1), (1, 0), (-1, 1), (float("nan"), 1)])
def test_limits_must_be_positive(per_completion, per_sender):
    with pytest.raises(ValueError):
        ScoringBudget(per_completion, per_sender)


def test_real_scoring_is_charged():
    b = ScoringBudget(2.0, 30.0)
    assert b.score("a", "<answer>4</answer>", ITEM) == Score(1.0)
    assert b.score("a", "no tag", ITEM).reward == 0.0
    usage = b.usage("a")
    assert usage.scored == 2 and usage.timeouts == 0 and 0.0 <= usage.seconds < 30.0
