"""Rollout groups: a prompt with completions from any source (own samples keep ids, foreign ones are text)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OWN = "own"
MAX_BEHAVIOUR_TOKENS = 32768  # generation.max-new-tokens' own bound
MIN_LOGPROB = -1e4  # a sampled token's log-prob below this is not one a sampler drew


@dataclass(frozen=True)
class Behaviour:
    """How a donor sampled a completion: its token ids and the per-token log-probs its sampler drew them with
    (train.foreign-correction = "is"). Only meaningful to a receiver with the same tokenizer.

    On the wire (`to_wire`): one base64 string of a byte W (2 or 4), the ids as little-endian uint16 (W = 2, every id
    below 65536) or uint32, then the log-probs as little-endian fp16. A completion of n tokens takes about
    4(1 + (W + 2) n)/3 characters (JSON number lists took about 12.5 n + 22; completions are often under 20 tokens,
    so the fixed part matters). fp16 keeps a log-prob within 2**-11 of its magnitude (0.002 at -4), far inside what
    truncated IS at C tolerates.
    """

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs):
            raise ValueError(f"behaviour has {len(self.ids)} token ids but {len(self.logprobs)} log-probs")

    def to_wire(self) -> str:
        width = 2 if max(self.ids, default=0) < 2**16 else 4
        ids = np.asarray(self.ids, dtype="<u2" if width == 2 else "<u4")
        logps = np.asarray(self.logprobs, dtype=np.float64).clip(MIN_LOGPROB, 0.0).astype("<f2")
        logps = (logps + np.float16(0.0)).astype("<f2")  # -0 (also what tiny negatives round to) as +0: one encoding
        return base64.b64encode(bytes([width]) + ids.tobytes() + logps.tobytes()).decode("ascii")

    @classmethod
    def from_wire(cls, data: Any, max_tokens: int = MAX_BEHAVIOUR_TOKENS) -> "Behaviour":
        """A peer's behaviour, checked: 1..max_tokens ids below 2**31 and as many finite log-probs in
        [MIN_LOGPROB, 0], in `to_wire`'s encoding; ValueError naming what is wrong."""
        if not isinstance(data, str):
            raise ValueError(f"behaviour is {type(data).__name__}, not a base64 string")
        if len(data) > 4 * (1 + 6 * max_tokens + 2) // 3:
            raise ValueError(f"behaviour is longer than {max_tokens} tokens")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as err:
            raise ValueError(f"behaviour is not valid base64 ({err})") from None
        if not raw or raw[0] not in (2, 4):
            raise ValueError(f"behaviour's id width must be 2 or 4 bytes, got {raw[0] if raw else 'nothing'}")
        width, body = raw[0], raw[1:]
        if len(body) % (width + 2):
            raise ValueError(f"behaviour's {len(body)} bytes are not whole tokens of a {width}-byte id and an fp16")
        count = len(body) // (width + 2)
        if not 1 <= count <= max_tokens:
            raise ValueError(f"behaviour has {count} tokens (1..{max_tokens})")
        token_ids = np.frombuffer(body[:count * width], dtype="<u2" if width == 2 else "<u4")
        values = np.frombuffer(body[count * width:], dtype="<f2").astype(np.float64)
        if (token_ids >= 2**31).any():
            raise ValueError("behaviour ids must be integers in [0, 2**31)")
        if not (np.isfinite(values).all() and (values >= MIN_LOGPROB).all() and (values <= 0.0).all()):
            raise ValueError(f"behaviour log-probs must be finite numbers in [{MIN_LOGPROB:g}, 0]")
        return cls(tuple(int(i) for i in token_ids), tuple(float(x) + 0.0 for x in values))


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
