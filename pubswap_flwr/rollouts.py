"""Rollout groups: a prompt with completions from any source (own samples keep ids, foreign ones are text)."""

from __future__ import annotations

from dataclasses import dataclass, field

OWN = "own"


@dataclass(frozen=True)
class Completion:
    """A completion. Own samples carry the token ids they were sampled as; foreign ones only text."""

    text: str
    token_ids: tuple[int, ...] | None = None
    source: str = OWN

    @property
    def is_own(self) -> bool:
        return self.token_ids is not None


@dataclass
class RolloutGroup:
    """One GRPO group: the rendered local prompt, its completions and their rewards (same length)."""

    prompt: str
    completions: list[Completion]
    rewards: list[float]
    item_uid: str = ""
    task: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.rewards):
            raise ValueError(f"group {self.item_uid or self.prompt[:30]!r}: {len(self.completions)} completions "
                             f"but {len(self.rewards)} rewards")
        if not self.completions:
            raise ValueError(f"group {self.item_uid or self.prompt[:30]!r} has no completions")

    @property
    def has_signal(self) -> bool:
        """False when every reward is equal: the group's advantages are all zero."""
        return max(self.rewards) - min(self.rewards) > 1e-12
