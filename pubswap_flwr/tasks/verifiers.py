"""Verifiers: reward in [0, 1] for (completion, item), with a reason whenever the reward is 0 by failure.

reasoning-gym items are scored by the dataset instance that generated them (its config sets tolerances). The
generators whose `score_answer` calls `eval()` on model or entry text are scored by safe re-implementations
(reasoning_gym_scoring.py); no model or peer text is ever evaluated as code.

Time limits. Every completion is scored under a time limit (`score_completion(..., timeout_s=)`, default
`DEFAULT_SCORE_TIMEOUT_S`). Scorers that can blow up (sympy-based and unvetted reasoning-gym scorers) run in a
killable worker process (`isolation.py`, whose docstring says what runs where and why); `math` runs in its own
worker and is given what is left of the budget (`remaining_seconds`); the rest are linear-time string code run in
the caller. A completion that runs out of time gets reward 0 with a reason starting "scoring timeout: "
(`Score.timed_out`, for counting); per-sender budgets across a round are `budget.ScoringBudget`.
"""

from __future__ import annotations

import contextvars
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..registry import Registry
from .isolation import RemoteScorerError, default_isolated_scorer
from .items import TaskItem
from .reasoning_gym_scoring import MAX_LITERAL_CHARS, score_reasoning_gym, scored_in_worker
from .rewards import TRL_REWARD_BOUND, RewardRef, TrlReward, trl_columns, trl_prompt
from .specs import TaskError
from .workers import ScoringTimeout

log = logging.getLogger(__name__)

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
DEFAULT_MAX_COMPLETION_CHARS = 4096
DEFAULT_SCORE_TIMEOUT_S = 5.0
TIMEOUT_REASON_PREFIX = "scoring timeout: "


@dataclass(frozen=True)
class Score:
    reward: float
    reason: str | None = None  # why the reward is 0 when it is a failure (no tag, scorer error, timeout, ...)
    trl: bool = False  # a tasks.trl-rewards sum: trained on as it is (any finite value, never made 0/1)

    @property
    def failed(self) -> bool:
        return self.reason is not None

    @property
    def timed_out(self) -> bool:
        """The scorer ran out of time (the reason starts with TIMEOUT_REASON_PREFIX); the reward is 0."""
        return self.reason is not None and self.reason.startswith(TIMEOUT_REASON_PREFIX)


def extract_answer(completion: str) -> str | None:
    """The stripped text of the last <answer>...</answer>, or None when there is none.

    The same result as the last match of `<answer>(.*?)</answer>` (DOTALL), found in linear time: that regex scans
    to the end of the text once per unclosed "<answer>", which is quadratic in long texts."""
    last = None
    position = 0
    while True:
        start = completion.find(ANSWER_OPEN, position)
        if start < 0:
            break
        end = completion.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            break  # no later "<answer>" has a closing tag either
        last = completion[start + len(ANSWER_OPEN):end]
        position = end + len(ANSWER_CLOSE)
    return last.strip() if last is not None else None


_NUMBER = re.compile(r"-?\d+(?:/\d+|\.\d+)?")
_WORD = re.compile(r"[^\W\d_]+")
_NUMERIC_ANSWER = re.compile(r"\s*-?\d+(?:/\d+|\.\d+)?\s*")


def lenient_answer(completion: str, gold: str | None) -> str | None:
    """The answer a reader would take from a completion that may not use the tags: the tagged answer when there is
    one; otherwise, when the reference answer is a number (integer, decimal or fraction), the last number in the text,
    else its last word. Reported beside strict (tag) scores so format learning and skill can be told apart; never a
    training reward (it pays for a number anywhere at the end)."""
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    text = completion[-MAX_LITERAL_CHARS:]
    pattern = _NUMBER if _NUMERIC_ANSWER.fullmatch(str(gold)) else _WORD
    found = pattern.findall(text)
    return found[-1] if found else None


def completion_shape(completion: str) -> str:
    """How a completion uses the answer tags: "well-formed" (exactly one <answer>...</answer>, only whitespace
    after it), "no-answer" (no closed answer), "several-answers", "stray-close" (a "</answer>" outside any answer,
    e.g. "<answer>1</answer>1</answer>"), or "text-after" (other text after the answer)."""
    opens, closes = completion.count(ANSWER_OPEN), completion.count(ANSWER_CLOSE)
    if extract_answer(completion) is None:
        return "no-answer"
    if opens > 1:
        return "several-answers"
    if closes > opens:
        return "stray-close"
    tail = completion[completion.rfind(ANSWER_CLOSE) + len(ANSWER_CLOSE):]
    return "well-formed" if not tail.strip() else "text-after"


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("scoring_deadline", default=None)


def remaining_seconds() -> float | None:
    """Seconds left of the completion being scored by `score_completion` in this thread, or None outside it; for
    scorers that enforce a time limit themselves (the math checker)."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


# --- plain data --------------------------------------------------------------------------------------------------

_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _normalize_text(text: str) -> str:
    return " ".join(text.strip().split()).casefold()


def _score_exact(answer: str, item: TaskItem) -> float:
    if item.answer is None:
        raise ValueError("item has no reference answer")
    return 1.0 if _normalize_text(answer) == _normalize_text(item.answer) else 0.0


def parse_number(text: str) -> float | None:
    """A plain decimal number ("1,000", "-2.5", "3e2", "1/4"), or None; never evaluates text."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    if _NUMBER_RE.match(cleaned):
        return float(cleaned)
    num, slash, den = cleaned.partition("/")
    if slash and _NUMBER_RE.match(num.strip()) and _NUMBER_RE.match(den.strip()):
        denominator = float(den)
        return float(num) / denominator if denominator != 0 else None
    return None


def _score_numeric(answer: str, item: TaskItem) -> float:
    if item.answer is None:
        raise ValueError("item has no reference answer")
    gold = parse_number(item.answer)
    if gold is None:
        raise ValueError(f"reference answer {item.answer!r} is not a number")
    got = parse_number(answer)
    if got is None:
        return 0.0
    tolerance = item.metadata.get("tolerance")
    tolerance = 1e-6 if tolerance is None else float(tolerance)  # parquet fills absent metadata keys with None
    return 1.0 if math.isclose(got, gold, rel_tol=tolerance, abs_tol=tolerance) else 0.0


# name -> scorer(answer, item) -> float in [0, 1]. Exceptions become reward 0 with the reason logged.
# A name registered again replaces its scorer (an organization may override a built-in).
VERIFIERS: Registry[Callable[[str, TaskItem], float]] = Registry(
    "verifier", {"rg": score_reasoning_gym, "exact": _score_exact, "numeric": _score_numeric}, replace=True)


def register_verifier(name: str, scorer: Callable[[str, TaskItem], float]) -> None:
    VERIFIERS.add(name, scorer)


def check_verifier(name: str, where: str = "verifier") -> None:
    VERIFIERS.lookup(name, TaskError, where)


def score_completion(
    completion: str, item: TaskItem, *, max_chars: int = DEFAULT_MAX_COMPLETION_CHARS, timeout_s: float | None = None,
    reward: RewardRef | None = None,
) -> Score:
    """Reward of `completion` for `item`; never raises for bad model text.

    `timeout_s` (default DEFAULT_SCORE_TIMEOUT_S) bounds the scorer's time: isolated scorers are stopped within
    `timeout_s` plus the isolated scorer's grace (its worker killed if need be), the math check likewise; running out
    gives reward 0 with a "scoring timeout: " reason (`Score.timed_out`), and so does `timeout_s <= 0` without
    scoring. Scorers run in the caller are linear-time string code and are not interrupted. A non-finite `timeout_s`
    is a ValueError (a caller's mistake, not model text).

    `reward` (a tasks.rewards function: `RewardTable.for_task(item.task)`) scores the answer instead of the item's
    verifier, always in the isolated worker under the same limits; its failures are reward 0 with a reason too."""
    if not isinstance(completion, str):
        return Score(0.0, f"completion is {type(completion).__name__}, not text")
    if len(completion) > max_chars:
        return Score(0.0, f"completion has {len(completion)} chars, over the {max_chars} limit")
    scorer = VERIFIERS.get(item.verifier)
    if scorer is None and reward is None:
        return Score(0.0, f"unknown verifier {item.verifier!r}")
    answer = extract_answer(completion)
    if answer is None:
        return Score(0.0, "no <answer>...</answer> in completion")
    limit = DEFAULT_SCORE_TIMEOUT_S if timeout_s is None else float(timeout_s)
    if not math.isfinite(limit):
        raise ValueError(f"timeout_s must be a finite number of seconds, got {timeout_s}")
    if limit <= 0:
        return Score(0.0, f"{TIMEOUT_REASON_PREFIX}no time left to score")
    name = item.verifier if reward is None else f"reward {reward.name}"
    try:
        if reward is not None:
            value = float(default_isolated_scorer().score_reward(reward, answer, item, limit))
        elif scored_in_worker(item):
            value = float(default_isolated_scorer().score(answer, item, limit))
        else:
            if scorer is None:  # cannot be: without a reward, an unknown verifier returned above
                raise TaskError(f"unknown verifier {item.verifier!r}")
            token = _DEADLINE.set(time.monotonic() + limit)
            try:
                value = float(scorer(answer, item))
            finally:
                _DEADLINE.reset(token)
    except ScoringTimeout as err:
        log.warning("scorer %s timed out on item %s: %s", name, item.uid, err)
        return Score(0.0, f"{TIMEOUT_REASON_PREFIX}{type(err).__name__}: {err}")
    except RemoteScorerError as err:  # raised by the scorer in the worker: the same reason as in-process
        log.warning("scorer %s failed on item %s: %s: %s", name, item.uid, err.type_name, err)
        return Score(0.0, f"scorer error: {err.type_name}: {err}")
    except Exception as err:  # noqa: BLE001 - third-party scorer code: any failure is reward 0, logged with reason
        log.warning("scorer %s failed on item %s: %s: %s", name, item.uid, type(err).__name__, err)
        return Score(0.0, f"scorer error: {type(err).__name__}: {err}")
    if not math.isfinite(value):
        return Score(0.0, f"scorer returned {value}")
    return Score(min(1.0, max(0.0, float(value))))


def score_trl_group(
    completions: Sequence[str], item: TaskItem, reward: TrlReward, *, max_chars: int = DEFAULT_MAX_COMPLETION_CHARS,
    timeout_s: float | None = None, fallback: RewardRef | None = None,
) -> list[Score]:
    """The rewards of `completions` (one group: all of them answers to `item`) under the TRL reward `reward`
    (tasks.trl-rewards); never raises for bad model text or a bad function.

    Each function runs once on the whole group in the isolated worker (`trl_prompt` and `trl_columns` say what it
    gets), all of them within one time limit for the group, `timeout_s` (default DEFAULT_SCORE_TIMEOUT_S). A
    completion's reward is the sum of the functions' values for it (Score.trl), held within +-TRL_REWARD_BOUND as each
    value is, never clipped to [0, 1]; one every function gave
    None is scored as if there were no TRL reward: by `fallback` (the task's tasks.rewards function) or its
    verifier. A completion that is not text or is over `max_chars` is not sent and gets 0 with the reason; a timeout
    or a failure (an exception, a reply that is not one finite number or None per completion) gives every completion
    sent 0 with the reason."""
    scores: list[Score | None] = [None] * len(completions)
    sent: list[int] = []
    for index, text in enumerate(completions):
        if not isinstance(text, str):
            scores[index] = Score(0.0, f"completion is {type(text).__name__}, not text")
        elif len(text) > max_chars:
            scores[index] = Score(0.0, f"completion has {len(text)} chars, over the {max_chars} limit")
        else:
            sent.append(index)
    limit = DEFAULT_SCORE_TIMEOUT_S if timeout_s is None else float(timeout_s)
    if not math.isfinite(limit):
        raise ValueError(f"timeout_s must be a finite number of seconds, got {timeout_s}")
    texts = [str(completions[index]) for index in sent]
    failure: Score | None = None
    try:
        values = default_isolated_scorer().score_trl(reward, [trl_prompt(item)] * len(texts), texts,
                                                     trl_columns(item, len(texts)), limit) if texts else []
    except ScoringTimeout as err:
        failure = Score(0.0, f"{TIMEOUT_REASON_PREFIX}{type(err).__name__}: {err}")
    except RemoteScorerError as err:
        failure = Score(0.0, f"scorer error: {err.type_name}: {err}")
    except (OSError, RuntimeError) as err:  # the worker could not start, died or answered out of turn (BadReply)
        failure = Score(0.0, f"scorer error: {type(err).__name__}: {err}")
    if failure is not None:
        log.warning("reward %s failed on item %s (%d completions): %s", reward.name, item.uid, len(texts),
                    failure.reason)
        values = [[None] * len(texts)]
    for position, index in enumerate(sent):
        given = [value for row in values if (value := row[position]) is not None]
        if failure is not None:
            scores[index] = failure
        elif given:
            scores[index] = Score(min(TRL_REWARD_BOUND, max(-TRL_REWARD_BOUND, float(sum(given)))), trl=True)
        else:
            scores[index] = score_completion(texts[position], item, max_chars=max_chars, timeout_s=limit,
                                             reward=fallback)
    return [score for score in scores if score is not None]  # every one was set above


def lenient_score(completion: str, item: TaskItem, *, max_chars: int = DEFAULT_MAX_COMPLETION_CHARS,
                  reward: RewardRef | None = None) -> Score:
    """`score_completion` of the `lenient_answer` (for evaluation only: how often the answer is right whatever the
    format)."""
    if not isinstance(completion, str) or len(completion) > max_chars:
        return score_completion(completion, item, max_chars=max_chars, reward=reward)
    answer = lenient_answer(completion, item.answer)
    if answer is None:
        return Score(0.0, "no answer in completion")
    return score_completion(f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}", item, max_chars=max_chars + len(answer) + 17,
                            reward=reward)


def training_reward(reward: float, partial_credit: bool) -> float:
    """The reward GRPO trains on: the verifier's graded reward, or with `partial_credit` off 1.0 for a correct
    answer and 0.0 for anything less (reasoning-gym's graded scores can be farmed by answers that merely contain the
    reference, e.g. "31" for 3 earns 0.5; docs/results/README.md, node collapses)."""
    return reward if partial_credit else float(reward >= 1.0)


def is_correct(reward: float, threshold: float = 1.0) -> bool:
    return reward >= threshold
