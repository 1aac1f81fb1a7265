"""The task item: one verifiable question with its answer, verifier name and provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    def from_dict(cls, data: dict[str, Any]) -> "TaskItem":
        return cls(
            uid=str(data["uid"]),
            task=str(data["task"]),
            question=str(data["question"]),
            answer=None if data.get("answer") is None else str(data["answer"]),
            verifier=str(data["verifier"]),
            metadata=dict(data.get("metadata") or {}),
            provenance=dict(data.get("provenance") or {}),
            family=str(data.get("family") or "plain"),
        )
