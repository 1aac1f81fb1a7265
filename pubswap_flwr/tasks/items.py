"""The task item: one verifiable question with its answer, verifier name and provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from msgspec import Struct

from ..schema import parse

# A question's characters per token of generation.max-prompt-tokens: a prompt keeps only its last max-prompt-tokens
# tokens, and a token of these tokenizers spans far fewer characters, so text beyond this is never seen and only
# costs tokenizing (an 8 MB question took 18 s). 8192 at the default 256, and never less.
QUESTION_CHARS_PER_PROMPT_TOKEN = 32
MIN_QUESTION_CHARS = 8192
MAX_ANSWER_CHARS = 2048  # a reference answer (verifiers compare answers; peers' packets have the same bound)


def max_question_chars(max_prompt_tokens: int) -> int:
    """The longest question a run takes from a file or a peer: generation.max-prompt-tokens x 32, at least 8192."""
    return max(MIN_QUESTION_CHARS, QUESTION_CHARS_PER_PROMPT_TOKEN * max_prompt_tokens)


@dataclass(frozen=True)
class TaskItem:
    """One verifiable question.

    `uid` is stable and unique within a run ("public/gcd/17", "org/3"); `verifier` names the scorer in
    `tasks.verifiers`; `metadata` carries what the verifier needs (for reasoning-gym items the generator entry's
    metadata) and `provenance` says how to regenerate the item (generator, config, seed, index) when it can be.
    """

    uid: str
    task: str
    question: str
    answer: str | None
    verifier: str
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    family: str = "plain"

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "task": self.task,
            "question": self.question,
            "answer": self.answer,
            "verifier": self.verifier,
            "metadata": self.metadata,
            "provenance": self.provenance,
            "family": self.family,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "TaskItem":
        """The inverse of `to_dict`, also for items from elsewhere (peers' SAPO packets, saved node state), as
        ItemRecord declares it; anything else raises ValueError naming the field (nothing is coerced with str():
        a dict is not a question)."""
        record = parse(data, ItemRecord, "task item", ValueError)
        return cls(uid=record.uid, task=record.task, question=record.question, answer=record.answer,
                   verifier=record.verifier, metadata=dict(record.metadata or {}),
                   provenance=dict(record.provenance or {}), family=record.family or "plain")


class ItemRecord(Struct):
    """A task item in JSON: `uid`, `task`, `question` and `verifier` text, `answer` text or null, `family` text,
    `metadata` and `provenance` objects; all but the first four may be absent or null."""

    uid: str
    task: str
    question: str
    verifier: str
    answer: str | None = None
    family: str | None = None
    metadata: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
