"""Counters a client's reply carries and a round adds up, each a small typed block that merges with `+`, writes
itself into a reply's metrics and reads itself back from one (checked, as everything from another party), and gives
its fields of the metrics row: the answer format of a node's own samples, the foreign text it trained on
(train.foreign-correction), how many of the groups it trained on had a learning signal, and its dynamic
sampling (train.dynamic-sampling). The client report, the node's work report and the round log hold the
blocks instead of their loose fields.

Each block is its own schema (pubswap_flwr/schema.py): a msgspec Struct whose fields declare their bounds and, through
`rename`, their key in a reply's metrics; `from_metrics` parses a reply's metrics into it and then checks the rules
across its fields (a part never exceeds its whole)."""

from __future__ import annotations

from typing import Annotated, Any, Iterable, Mapping, Sequence, TypeVar

from msgspec import Meta, Struct
from msgspec.structs import astuple

from .. import metrics_schema as schema
from ..algorithms.group_signal import has_signal
from ..schema import Tally, parse
from .validate import Rejected

C = TypeVar("C", bound=Struct)

# a sum of loss weights: each in [0, max(train.is-cap, 1)], and train.is-cap is at most 1000
WeightSum = Annotated[float, Meta(ge=0, le=1000.0 * 1e12)]
# a sum of mean token log-probs: each <= 0 and, over any vocabulary this project loads, above -50 (fp32 log-softmax)
LogprobSum = Annotated[float, Meta(ge=-1e4 * 1e9, le=0)]
Completions = Annotated[int, Meta(ge=0, le=10**9)]


def _read(metrics: Any, block: type[Any]) -> Any:
    """A reply's metrics (a MetricRecord or dict) as `block`, its cross-field rules checked; Rejected otherwise."""
    counts = parse(dict(metrics), block, "metrics", Rejected)
    problem = counts.problem()
    if problem:
        raise Rejected(f"metrics: {problem}")
    return counts


class FormatCounts(Struct, frozen=True, rename={"sampled": "sampled-completions",
                                                "well_formed": "well-formed-completions"}):
    """Completions a node sampled itself, and how many of them had exactly one <answer>...</answer> and nothing
    after it."""

    sampled: Tally = 0
    well_formed: Tally = 0

    @classmethod
    def of_shapes(cls, shapes: Mapping[str, int]) -> "FormatCounts":
        """From a count of `tasks.verifiers.completion_shape` values."""
        return cls(sum(shapes.values()), shapes.get("well-formed", 0))

    def __add__(self, other: "FormatCounts") -> "FormatCounts":
        return _summed(self, other)

    def to_metrics(self) -> dict[str, int]:
        return {"sampled-completions": self.sampled, "well-formed-completions": self.well_formed}

    @classmethod
    def from_metrics(cls, metrics: Any) -> "FormatCounts":
        return _read(metrics, cls)

    def problem(self) -> str:
        return "well-formed-completions exceeds sampled-completions" if self.well_formed > self.sampled else ""

    def row(self) -> dict[str, float]:
        """The client row's share (none before any own sample)."""
        return {schema.WELL_FORMED: self.well_formed / self.sampled} if self.sampled else {}


class ForeignCounts(Struct, frozen=True, rename={
        "tokens": "foreign-tokens", "weight_sum": "foreign-weight-sum", "capped": "is-capped-tokens",
        "fallbacks": "foreign-fallbacks", "tag_tokens": "foreign-tag-tokens",
        "tag_weight_sum": "foreign-tag-weight-sum"}):
    """Foreign tokens trained on (other clients' or nodes' text), their summed loss weight, how many had their
    importance ratio truncated at train.is-cap, and foreign completions without a usable donor behaviour (trained
    with the fallback weight). All zero without train.foreign-correction: then it is not on the wire at all."""

    tokens: Tally = 0
    weight_sum: WeightSum = 0.0
    capped: Tally = 0
    fallbacks: Tally = 0
    tag_tokens: Tally = 0  # of `tokens`, those that spell an answer tag ("<answer>", "</answer>")
    tag_weight_sum: WeightSum = 0.0  # their summed loss weight

    @classmethod
    def of_step(cls, extra: Mapping[str, Any]) -> "ForeignCounts":
        """From a GRPO update's `UpdateStats.extra` (fallbacks are counted where the completions are built)."""
        return cls(extra.get("foreign_tokens", 0), extra.get("foreign_weight_sum", 0.0),
                   extra.get("is_capped_tokens", 0), 0, extra.get("foreign_tag_tokens", 0),
                   extra.get("foreign_tag_weight_sum", 0.0))

    def __bool__(self) -> bool:
        return bool(self.tokens or self.fallbacks)

    def __add__(self, other: "ForeignCounts") -> "ForeignCounts":
        return _summed(self, other)

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
        return _read(metrics, cls)

    def problem(self) -> str:
        for part, whole in (("foreign-tag-tokens", self.tag_tokens), ("is-capped-tokens", self.capped)):
            if whole > self.tokens:
                return f"{part} exceeds foreign-tokens"
        for key, total, tokens in (("foreign-weight-sum", self.weight_sum, self.tokens),
                                   ("foreign-tag-weight-sum", self.tag_weight_sum, self.tag_tokens)):
            if total > 1000.0 * max(tokens, 1):  # a token's weight is at most max(train.is-cap, 1) <= 1000
                return f"{key} = {total:g} is more than 1000 per token"
        return ""

    def row(self) -> dict[str, float]:
        out = {schema.FOREIGN_WEIGHT_MEAN: self.weight_sum / self.tokens if self.tokens else 0.0,
               schema.IS_CAPPED_FRACTION: self.capped / self.tokens if self.tokens else 0.0,
               schema.FOREIGN_FALLBACKS: self.fallbacks}
        if self.tag_tokens:  # the answer tags apart from the rest of the foreign text
            out[schema.FOREIGN_WEIGHT_MEAN + "_tags"] = self.tag_weight_sum / self.tag_tokens
            rest = self.tokens - self.tag_tokens
            out[schema.FOREIGN_WEIGHT_MEAN + "_other"] = (self.weight_sum - self.tag_weight_sum) / rest if rest else 0.0
        return out


class SamplingCounts(Struct, frozen=True, rename={
        "wanted": "dynamic-groups-wanted", "sampled": "dynamic-groups-sampled",
        "trained": "dynamic-groups-trained", "skipped": "dynamic-steps-skipped",
        "prompts_skipped": "prompts-skipped"}):
    """train.dynamic-sampling: the groups a node's private steps wanted (prompts-per-step each), sampled and trained
    on (those whose rewards differ), and the steps skipped for want of any; train.skip-equal-prompts: the private
    prompts skipped before rollout. Not on the wire without them."""

    wanted: Tally = 0
    sampled: Tally = 0
    trained: Tally = 0
    skipped: Tally = 0
    prompts_skipped: Tally = 0

    def __bool__(self) -> bool:
        return bool(self.wanted or self.prompts_skipped)

    def __add__(self, other: "SamplingCounts") -> "SamplingCounts":
        return _summed(self, other)

    def to_metrics(self) -> dict[str, int]:
        out = {}
        if self.wanted:
            out = {"dynamic-groups-wanted": self.wanted, "dynamic-groups-sampled": self.sampled,
                   "dynamic-groups-trained": self.trained, "dynamic-steps-skipped": self.skipped}
        if self.prompts_skipped:
            out["prompts-skipped"] = self.prompts_skipped
        return out

    @classmethod
    def from_metrics(cls, metrics: Any) -> "SamplingCounts":
        return _read(metrics, cls)

    def problem(self) -> str:
        for part, whole, name in ((self.trained, self.wanted, "wanted"), (self.trained, self.sampled, "sampled")):
            if part > whole:
                return f"dynamic-groups-trained exceeds dynamic-groups-{name}"
        return ""

    def row(self) -> dict[str, float]:
        """Groups sampled and trained, the filled share (trained / wanted) and the sampling factor (sampled /
        wanted: 1 is no extra sampling), the steps skipped; the prompts skipped before rollout (only when any)."""
        out: dict[str, float] = {}
        if self.wanted:
            out = {schema.DYNAMIC_GROUPS_SAMPLED: self.sampled, schema.DYNAMIC_GROUPS_TRAINED: self.trained,
                   schema.DYNAMIC_FILLED_SHARE: self.trained / self.wanted,
                   schema.DYNAMIC_SAMPLING_FACTOR: self.sampled / self.wanted,
                   schema.DYNAMIC_STEPS_SKIPPED: self.skipped}
        if self.prompts_skipped:
            out[schema.PROMPTS_SKIPPED] = self.prompts_skipped
        return out


def _summed(first: C, second: C) -> C:
    """Two blocks of one kind added field by field (a round's segments, a node's steps)."""
    return type(first)(*(a + b for a, b in zip(astuple(first), astuple(second))))


def _uptake_key(field: str) -> str:
    return "uptake-" + field.replace("_", "-")


class UptakeCounts(Struct, frozen=True, rename=_uptake_key):
    """pubswap.measure-uptake: whether a public step's update raised the receiver's log-probs of the responses it was
    given, donors' (foreign) apart from its own: summed per-completion mean token log-probs before and after the
    update, and how many completions of each kind. A swapped-in response that is learned gains like an own one."""

    foreign: Completions = 0
    foreign_before: LogprobSum = 0.0
    foreign_after: LogprobSum = 0.0
    own: Completions = 0
    own_before: LogprobSum = 0.0
    own_after: LogprobSum = 0.0

    def __bool__(self) -> bool:
        return bool(self.foreign or self.own)

    def __add__(self, other: "UptakeCounts") -> "UptakeCounts":
        return _summed(self, other)

    def to_metrics(self) -> dict[str, float]:
        if not self:
            return {}
        keys = ("uptake-foreign", "uptake-foreign-before", "uptake-foreign-after", "uptake-own", "uptake-own-before",
                "uptake-own-after")
        return dict(zip(keys, astuple(self)))

    @classmethod
    def from_metrics(cls, metrics: Any) -> "UptakeCounts":
        return _read(metrics, cls)

    def problem(self) -> str:
        low = -1e4 * max(self.foreign, self.own, 1)  # per completion above -1e4, far below any real mean log-prob
        for key, total in (("before", self.foreign_before), ("after", self.foreign_after),
                           ("before", self.own_before), ("after", self.own_after)):
            if total < low:
                return f"an uptake log-prob sum {key} the update ({total:g}) is below {low:g}"
        return ""

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


class SignalCounts(Struct, frozen=True, rename={"groups": "trained-groups",
                                                "zero_advantage": "zero-advantage-groups"}):
    """The groups in a node's GRPO updates and how many of them had all rewards equal (no learning signal): issue
    #53's measure. Not on the wire before the node trained a group."""

    groups: Tally = 0
    zero_advantage: Tally = 0

    @classmethod
    def of_groups(cls, groups: Iterable[Sequence[float]]) -> "SignalCounts":
        """From the rewards of each group trained on."""
        flags = [not has_signal(rewards) for rewards in groups]
        return cls(len(flags), sum(flags))

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __add__(self, other: "SignalCounts") -> "SignalCounts":
        return _summed(self, other)

    def to_metrics(self) -> dict[str, int]:
        return {"trained-groups": self.groups, "zero-advantage-groups": self.zero_advantage} if self else {}

    @classmethod
    def from_metrics(cls, metrics: Any) -> "SignalCounts":
        return _read(metrics, cls)

    def problem(self) -> str:
        return "zero-advantage-groups exceeds trained-groups" if self.zero_advantage > self.groups else ""

    def row(self) -> dict[str, float]:
        """The client row's counts and share (none before any group was trained)."""
        if not self:
            return {}
        return {schema.TRAINED_GROUPS: self.groups, schema.ZERO_ADVANTAGE_GROUPS: self.zero_advantage,
                schema.ZERO_ADVANTAGE_SHARE: self.zero_advantage / self.groups}
