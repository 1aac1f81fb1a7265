"""Rollout groups: a prompt with completions from any source (own samples keep ids, foreign ones are text)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

OWN = "own"
MAX_BEHAVIOUR_TOKENS = 32768  # generation.max-new-tokens' own bound
MIN_LOGPROB = -1e4  # a sampled token's log-prob below this is not one a sampler drew


@dataclass(frozen=True)
class Behaviour:
    """How a donor sampled a completion: its token ids and the per-token log-probs its sampler drew them with
    (train.foreign-correction = "is"). Only meaningful to a receiver with the same tokenizer."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs):
            raise ValueError(f"behaviour has {len(self.ids)} token ids but {len(self.logprobs)} log-probs")

    def to_wire(self) -> dict:
        return {"ids": list(self.ids), "logps": [round(x, 5) for x in self.logprobs]}

    @classmethod
    def from_wire(cls, data: Any, max_tokens: int = MAX_BEHAVIOUR_TOKENS) -> "Behaviour":
        """A peer's behaviour, checked: 1..max_tokens non-negative integer ids (below 2**31) and as many finite
        log-probs in [MIN_LOGPROB, 0]; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"behaviour is {type(data).__name__}, not an object")
        ids, logps = data.get("ids"), data.get("logps")
        if not isinstance(ids, list) or not isinstance(logps, list):
            raise ValueError("behaviour needs 'ids' and 'logps' lists")
        if not 1 <= len(ids) <= max_tokens or len(ids) != len(logps):
            raise ValueError(f"behaviour has {len(ids)} ids and {len(logps)} log-probs (1..{max_tokens}, equal)")
        if not all(type(i) is int and 0 <= i < 2**31 for i in ids):
            raise ValueError("behaviour ids must be integers in [0, 2**31)")
        if not all(type(x) in (int, float) and math.isfinite(x) and MIN_LOGPROB <= x <= 1e-6 for x in logps):
            raise ValueError(f"behaviour log-probs must be finite numbers in [{MIN_LOGPROB:g}, 0]")
        return cls(tuple(ids), tuple(min(float(x), 0.0) for x in logps))


@dataclass(frozen=True)
class Completion:
    """A completion. Own samples carry the token ids they were sampled as; foreign ones only text, plus (with the
    importance-sampling correction, when the receiver accepted them) the donor's sampling ids and log-probs."""

    text: str
    token_ids: tuple[int, ...] | None = None
    source: str = OWN
    behaviour: Behaviour | None = None

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
