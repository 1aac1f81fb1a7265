"""Shortcut detection for held-out evaluation: the best constant answer's accuracy and the model's modal-answer share.

A policy can raise accuracy without learning a task by answering one value to every question: SmolLM2 adapters
trained with GRPO answered "1" to every gcd question, scoring the share of items whose GCD is 1 (0.24-0.34) and
passing for learning. So every evaluation reports, per task, what the best constant answer scores on the same items
and how concentrated the model's own answers are, and flags a task whose answers collapsed onto one value while the
gold answers did not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

SHORTCUT_SHARE = 0.8  # a model answering one value this often, where the gold answers are not that concentrated
MAX_ANSWER_CHARS = 32  # modal answers are recorded in metrics rows: keep them short


def normalize_answer(answer: str | None) -> str | None:
    """An answer compared as text: stripped, lower-cased, inner whitespace collapsed; None or empty stays None."""
    if answer is None:
        return None
    text = " ".join(str(answer).split()).lower()
    return text or None


def modal(answers: Sequence[str | None]) -> tuple[str | None, float]:
    """The most frequent non-empty answer (ties: the first seen) and its share of all answers, missing ones
    included (a model that answers nothing has no modal answer: share 0)."""
    if not answers:
        return None, 0.0
    counts = Counter(a for a in (normalize_answer(x) for x in answers) if a is not None)
    if not counts:
        return None, 0.0
    answer, count = counts.most_common(1)[0]
    return answer, count / len(answers)


@dataclass(frozen=True)
class ShortcutCheck:
    """One task's shortcut figures on one set of items."""

    constant_answer: str | None  # the gold answer that, given to every item, scores best
    constant_accuracy: float  # its accuracy: the share of items whose gold answer it is
    modal_answer: str | None  # the model's most frequent answer
    modal_share: float  # its share of the model's answers

    @property
    def flagged(self) -> bool:
        """The model's answers collapsed onto one value beyond SHORTCUT_SHARE while the gold answers did not."""
        return self.modal_share > SHORTCUT_SHARE and self.constant_accuracy <= SHORTCUT_SHARE


def check_task(golds: Sequence[str | None], answers: Sequence[str | None]) -> ShortcutCheck:
    """Shortcut figures of one task: `golds` one per item, `answers` the model's answers (any number per item).

    The best constant answer is the modal gold answer under normalize_answer: for exact-match verifiers its accuracy
    is exactly the gold share; a verifier that also accepts other spellings can only credit a constant more, so this
    is the share a constant reaches at least."""
    constant, constant_share = modal(golds)
    answer, share = modal(answers)
    return ShortcutCheck(_short(constant), constant_share, _short(answer), share)


def _short(answer: str | None) -> str | None:
    return None if answer is None else answer[:MAX_ANSWER_CHARS]
