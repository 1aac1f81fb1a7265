"""Per-sender, per-round scoring budgets: stop scoring one sender's completions once it has used its share of time.

A sender (a PubSwap client answering public prompts, a SAPO peer whose completions a receiver re-scores) controls
the text that gets scored; each completion is bounded by `score_completion`'s time limit, but many distinct slow
answers (thousands of math answers at a few seconds each) would still hold up a round. A `ScoringBudget` gives each
sender at most `seconds_per_sender` of scoring time per round and each completion at most `seconds_per_completion`
(or what is left of its sender's budget, if less); once a sender's budget is spent, its remaining completions get
reward 0 with the reason BUDGET_EXHAUSTED_REASON without being scored.

Use one budget per round (or call `new_round()`), from one thread::

    budget = ScoringBudget(seconds_per_completion=2.0, seconds_per_sender=30.0)
    for sender, completions in replies.items():
        rewards = [budget.score(sender, text, item, max_chars=limit).reward for text, item in completions]
    log(budget.summary())   # {sender: {"seconds", "scored", "timeouts", "skipped"}}

Callers that time their own scoring can use the accounting alone: `timeout_for(sender)` for the limit to pass to
`score_completion(..., timeout_s=)`, then `charge(sender, seconds, timed_out=...)`, and `exhausted(sender)` before
the next completion. Time is wall time from `clock` (time.monotonic), including waiting for a scoring worker.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Hashable

from .items import TaskItem
from .rewards import RewardTable
from .verifiers import DEFAULT_MAX_COMPLETION_CHARS, Score, score_completion

BUDGET_EXHAUSTED_REASON = "scoring budget exhausted"


@dataclass
class SenderUsage:
    """One sender's scoring this round: seconds charged, completions scored, of which timed out, and skipped."""

    seconds: float = 0.0
    scored: int = 0
    timeouts: int = 0
    skipped: int = 0


class ScoringBudget:
    """Scoring time per completion and per sender for one round (module docstring)."""

    def __init__(self, seconds_per_completion: float, seconds_per_sender: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 scorer: Callable[..., Score] | None = None, rewards: RewardTable | None = None):
        if not seconds_per_completion > 0:
            raise ValueError(f"seconds_per_completion must be positive, got {seconds_per_completion}")
        if not seconds_per_sender > 0:
            raise ValueError(f"seconds_per_sender must be positive, got {seconds_per_sender}")
        self.seconds_per_completion = float(seconds_per_completion)
        self.seconds_per_sender = float(seconds_per_sender)
        self._clock = clock
        self._scorer = scorer  # score_completion unless given (tests)
        self._rewards = rewards or RewardTable()  # tasks.rewards: user reward functions by task
        self._usage: dict[Hashable, SenderUsage] = {}

    def _of(self, sender: Hashable) -> SenderUsage:
        return self._usage.setdefault(sender, SenderUsage())

    def remaining(self, sender: Hashable) -> float:
        """Seconds of scoring left to `sender` this round (never negative)."""
        used = self._usage[sender].seconds if sender in self._usage else 0.0
        return max(0.0, self.seconds_per_sender - used)

    def exhausted(self, sender: Hashable) -> bool:
        return self.remaining(sender) <= 0.0

    def timeout_for(self, sender: Hashable) -> float:
        """The time limit for `sender`'s next completion: seconds_per_completion, or less when less is left."""
        return min(self.seconds_per_completion, self.remaining(sender))

    def charge(self, sender: Hashable, seconds: float, *, timed_out: bool = False) -> None:
        """Record one scored completion of `sender` that took `seconds`."""
        usage = self._of(sender)
        usage.seconds += max(0.0, float(seconds))
        usage.scored += 1
        usage.timeouts += int(timed_out)

    def skip(self, sender: Hashable) -> Score:
        """Record one completion of `sender` not scored because its budget is spent; its Score."""
        self._of(sender).skipped += 1
        return Score(0.0, BUDGET_EXHAUSTED_REASON)

    def score(self, sender: Hashable, completion: str, item: TaskItem, *,
              max_chars: int = DEFAULT_MAX_COMPLETION_CHARS) -> Score:
        """`score_completion` (with the user reward of the item's task, if any) under `sender`'s budget: reward 0
        with BUDGET_EXHAUSTED_REASON, unscored, once it is spent; otherwise scored with `timeout_for(sender)` and
        the time charged to `sender`."""
        if self.exhausted(sender):
            return self.skip(sender)
        scorer = self._scorer or score_completion
        reward = self._rewards.for_task(item.task)
        start = self._clock()
        score = scorer(completion, item, max_chars=max_chars, timeout_s=self.timeout_for(sender),
                       **({"reward": reward} if reward is not None else {}))
        self.charge(sender, self._clock() - start, timed_out=score.timed_out)
        return score

    def usage(self, sender: Hashable) -> SenderUsage:
        """A copy of `sender`'s usage this round (zeros when it has none)."""
        return SenderUsage(**asdict(self._usage[sender])) if sender in self._usage else SenderUsage()

    def summary(self) -> dict[Hashable, dict[str, float]]:
        """{sender: {"seconds", "scored", "timeouts", "skipped"}} for every sender seen this round (for metrics)."""
        return {sender: asdict(usage) for sender, usage in self._usage.items()}

    def new_round(self) -> None:
        """Forget all usage: every sender starts the next round with its full budget."""
        self._usage.clear()
