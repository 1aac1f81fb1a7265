"""How much learning signal groups carry: GRPO learns only from a group whose rewards differ. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

TOLERANCE = 1e-12  # rewards closer than this are equal (the loss's own test: policy/grpo.py)


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether the rewards differ, so that the group's advantages are not all zero (none or one: no signal)."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > TOLERANCE


def zero_advantage_share(groups: Iterable[Sequence[float]]) -> float | None:
    """The share of the groups (each its rewards) whose rewards are all equal; None for no groups."""
    flags = [not has_signal(rewards) for rewards in groups]
    return sum(flags) / len(flags) if flags else None


@dataclass(frozen=True)
class ExternalSignal:
    """What a SAPO receiver found in the groups it received: how many it could not score (rejected) and how many
    of the scored ones had equal rewards; the rest are usable (it trains on at most J of them)."""

    received: int
    rejected: int
    zero_advantage: int

    @property
    def usable(self) -> int:
        return max(0, self.received - self.rejected - self.zero_advantage)

    @property
    def zero_advantage_share(self) -> float | None:
        """Of the groups it could score, the share whose rewards were all equal; None when it scored none."""
        scored = self.received - self.rejected
        return self.zero_advantage / scored if scored > 0 else None

    def problem(self) -> str:
        """Why these counts cannot come from one selection (a part over its whole), or ""."""
        parts = self.zero_advantage + self.rejected
        if parts > self.received:
            return (f"external-zero-advantage + external-rejected = {parts} exceed external-received = "
                    f"{self.received}")
        return ""
