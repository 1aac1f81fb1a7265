"""Counters a client's reply carries and a round adds up, each a small typed block that merges with `+`, writes
itself into a reply's metrics and reads itself back from one (checked, as everything from another party), and gives
its fields of the metrics row: the answer format of a node's own samples, and the foreign text it trained on
(train.foreign-correction). The client report, the node's work report and the round log hold the blocks instead of
their loose fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .. import metrics_schema as schema
from .validate import number


@dataclass(frozen=True)
class FormatCounts:
    """Completions a node sampled itself, and how many of them had exactly one <answer>...</answer> and nothing
    after it."""

    sampled: int = 0
    well_formed: int = 0

    @classmethod
    def of_shapes(cls, shapes: Mapping[str, int]) -> "FormatCounts":
        """From a count of `tasks.verifiers.completion_shape` values."""
        return cls(sum(shapes.values()), shapes.get("well-formed", 0))

    def __add__(self, other: "FormatCounts") -> "FormatCounts":
        return FormatCounts(self.sampled + other.sampled, self.well_formed + other.well_formed)

    def to_metrics(self) -> dict[str, int]:
        return {"sampled-completions": self.sampled, "well-formed-completions": self.well_formed}

    @classmethod
    def from_metrics(cls, metrics: Any) -> "FormatCounts":
        sampled = int(number(metrics, "sampled-completions", 0.0, low=0, high=1e12))
        return cls(sampled, int(number(metrics, "well-formed-completions", 0.0, low=0, high=sampled)))

    def row(self) -> dict[str, float]:
        """The client row's share (none before any own sample)."""
        return {schema.WELL_FORMED: self.well_formed / self.sampled} if self.sampled else {}


@dataclass(frozen=True)
class ForeignCounts:
    """Foreign tokens trained on (other clients' or nodes' text), their summed loss weight, how many had their
    importance ratio truncated at train.is-cap, and foreign completions without a usable donor behaviour (trained
    with the fallback weight). All zero without train.foreign-correction: then it is not on the wire at all."""

    tokens: int = 0
    weight_sum: float = 0.0
    capped: int = 0
    fallbacks: int = 0
    tag_tokens: int = 0  # of `tokens`, those that spell an answer tag ("<answer>", "</answer>")
    tag_weight_sum: float = 0.0  # their summed loss weight

    @classmethod
    def of_step(cls, extra: Mapping[str, Any]) -> "ForeignCounts":
        """From a GRPO update's `UpdateStats.extra` (fallbacks are counted where the completions are built)."""
        return cls(extra.get("foreign_tokens", 0), extra.get("foreign_weight_sum", 0.0),
                   extra.get("is_capped_tokens", 0), 0, extra.get("foreign_tag_tokens", 0),
                   extra.get("foreign_tag_weight_sum", 0.0))

    def __bool__(self) -> bool:
        return bool(self.tokens or self.fallbacks)

    def __add__(self, other: "ForeignCounts") -> "ForeignCounts":
        return ForeignCounts(self.tokens + other.tokens, self.weight_sum + other.weight_sum,
                             self.capped + other.capped, self.fallbacks + other.fallbacks,
                             self.tag_tokens + other.tag_tokens, self.tag_weight_sum + other.tag_weight_sum)

    def to_metrics(self) -> dict[str, float]:
        if not self:
            return {}
        out = {"foreign-tokens": self.tokens, "foreign-weight-sum": self.weight_sum,
               "is-capped-tokens": self.capped, "foreign-fallbacks": self.fallbacks}
        if self.tag_tokens:
            out.update({"foreign-tag-tokens": self.tag_tokens, "foreign-tag-weight-sum": self.tag_weight_sum})
        return out

    @classmethod
    def from_metrics(cls, metrics: Any) -> "ForeignCounts":
        tokens = int(number(metrics, "foreign-tokens", 0.0, low=0, high=1e12))
        tags = int(number(metrics, "foreign-tag-tokens", 0.0, low=0, high=tokens))
        # weights are in [0, max(train.is-cap, 1)]; train.is-cap is at most 1000
        return cls(tokens, number(metrics, "foreign-weight-sum", 0.0, low=0, high=1000.0 * max(tokens, 1)),
                   int(number(metrics, "is-capped-tokens", 0.0, low=0, high=tokens)),
                   int(number(metrics, "foreign-fallbacks", 0.0, low=0, high=1e12)), tags,
                   number(metrics, "foreign-tag-weight-sum", 0.0, low=0, high=1000.0 * max(tags, 1)))

    def row(self) -> dict[str, float]:
        out = {schema.FOREIGN_WEIGHT_MEAN: self.weight_sum / self.tokens if self.tokens else 0.0,
               schema.IS_CAPPED_FRACTION: self.capped / self.tokens if self.tokens else 0.0,
               schema.FOREIGN_FALLBACKS: self.fallbacks}
        if self.tag_tokens:  # the answer tags apart from the rest of the foreign text
            out[schema.FOREIGN_WEIGHT_MEAN + "_tags"] = self.tag_weight_sum / self.tag_tokens
            rest = self.tokens - self.tag_tokens
            out[schema.FOREIGN_WEIGHT_MEAN + "_other"] = (self.weight_sum - self.tag_weight_sum) / rest if rest else 0.0
        return out


@dataclass(frozen=True)
class UptakeCounts:
    """pubswap.measure-uptake: whether a public step's update raised the receiver's log-probs of the responses it was
    given, donors' (foreign) apart from its own: summed per-completion mean token log-probs before and after the
    update, and how many completions of each kind. A swapped-in response that is learned gains like an own one."""

    foreign: int = 0
    foreign_before: float = 0.0
    foreign_after: float = 0.0
    own: int = 0
    own_before: float = 0.0
    own_after: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.foreign or self.own)

    def __add__(self, other: "UptakeCounts") -> "UptakeCounts":
        return UptakeCounts(*(a + b for a, b in zip(self._values(), other._values())))

    def _values(self) -> tuple:
        return (self.foreign, self.foreign_before, self.foreign_after, self.own, self.own_before, self.own_after)

    def to_metrics(self) -> dict[str, float]:
        if not self:
            return {}
        keys = ("uptake-foreign", "uptake-foreign-before", "uptake-foreign-after", "uptake-own", "uptake-own-before",
                "uptake-own-after")
        return dict(zip(keys, self._values()))

    @classmethod
    def from_metrics(cls, metrics: Any) -> "UptakeCounts":
        foreign = int(number(metrics, "uptake-foreign", 0.0, low=0, high=1e9))
        own = int(number(metrics, "uptake-own", 0.0, low=0, high=1e9))
        # a mean token log-prob is <= 0 and, over any vocabulary this project loads, above -50 (fp32 log-softmax)
        low = -1e4 * max(foreign, own, 1)
        return cls(foreign, number(metrics, "uptake-foreign-before", 0.0, low=low, high=0.0),
                   number(metrics, "uptake-foreign-after", 0.0, low=low, high=0.0),
                   own, number(metrics, "uptake-own-before", 0.0, low=low, high=0.0),
                   number(metrics, "uptake-own-after", 0.0, low=low, high=0.0))

    def row(self) -> dict[str, float]:
        """Mean per-completion log-prob before and after the updates, per kind (only kinds that occurred)."""
        out = {}
        for kind, count, before, after in (("foreign", self.foreign, self.foreign_before, self.foreign_after),
                                           ("own", self.own, self.own_before, self.own_after)):
            if count:
                out[f"uptake_{kind}_before"] = before / count
                out[f"uptake_{kind}_after"] = after / count
                out[f"uptake_{kind}_completions"] = count
        return out
