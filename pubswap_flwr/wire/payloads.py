"""What replies' payloads carry, declared in the schema layer (pubswap_flwr/schema.py): a shared SAPO packet and its
item, a public prompt's responses, a node's self-reported evaluation; with `Limits`, the bounds a run's settings set,
over which the declarations that depend on them are built (cached per value)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from ..config import ExperimentConfig
from ..metrics_schema import ITEM_RESULTS, SHORTCUT_TASKS
from ..rollouts import MAX_BEHAVIOUR_TOKENS
from ..schema import Count, Flag, Fraction, Name, PositiveCount, check_depth, check_utf8, parse, text, texts
from ..tasks import items
from ..tasks.verifiers import VERIFIERS


# -- the bounds a run sets -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """How large what a party sends may be (the server's checks of replies, a node's of its relayed pool)."""

    max_completion_chars: int = 4096
    score_seconds: float = 5.0  # scoring time per completion (the server's own scoring of public responses)
    sender_scoring_seconds: float = 60.0  # scoring time per sender per round; the rest of its answers get reward 0
    max_depth: int = 16  # nesting of JSON objects and lists in packet metadata and provenance
    max_question_chars: int = items.max_question_chars(256)  # generation.max-prompt-tokens x 32 (Limits.of)
    max_answer_chars: int = items.MAX_ANSWER_CHARS
    max_completions: int = 64  # per packet
    max_packets: int = 256  # per reply
    max_metadata_chars: int = 65536
    # a sampling behaviour's tokens (train.foreign-correction = "is"): the run's generation.max-new-tokens, the most
    # any sampler of the run draws; a longer one would only bloat what the server relays
    max_behaviour_tokens: int = MAX_BEHAVIOUR_TOKENS

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> "Limits":
        """The limits a run's own settings set: completion, behaviour and question length."""
        g = cfg.generation
        return cls(max_completion_chars=g.max_completion_chars, max_behaviour_tokens=g.max_new_tokens,
                   max_question_chars=items.max_question_chars(g.max_prompt_tokens))


# -- a shared SAPO rollout -------------------------------------------------------------------------------------------
class ItemProvenance(Struct, frozen=True):
    """The keys of an item's provenance a receiver regenerates the item from, when given (others pass through)."""

    generator: str | None = None
    config: dict[str, Any] | None = None
    seed: int | None = None
    index: int | None = None


@functools.cache
def item_schema(limits: Limits) -> Any:
    """A task item from a peer: text fields bounded, a known verifier, an answer unless reasoning-gym scores it,
    metadata and provenance objects of bounded depth and size, every string valid Unicode."""

    def check(self: Any) -> None:
        if not self.question.strip():
            raise ValueError("'question' is empty")
        if self.verifier not in VERIFIERS:  # read at each check: verifiers registered later count too
            raise ValueError(f"unknown verifier {self.verifier!r}")
        if self.answer is None and self.verifier != "rg":
            raise ValueError("'answer' is missing")
        parse(self.provenance, ItemProvenance, "provenance")
        for key in ("metadata", "provenance"):
            value = getattr(self, key)
            check_depth(value, limits.max_depth, f"'{key}'")
            if len(repr(value)) > limits.max_metadata_chars:
                raise ValueError(f"'{key}' is over the {limits.max_metadata_chars}-char limit")
        for key in ("uid", "task", "question", "answer", "family"):
            if getattr(self, key) is not None:
                check_utf8(getattr(self, key), f"'{key}'")
        for key in ("metadata", "provenance"):  # the strings inside them too
            check_utf8(json.dumps(getattr(self, key), ensure_ascii=False), f"'{key}'")

    return msgspec.defstruct("SharedItem", [
        ("uid", text(256)), ("task", text(256)), ("question", text(limits.max_question_chars, 1)),
        ("verifier", text(64)), ("answer", text(limits.max_answer_chars) | None, None),
        ("family", text(256) | None, None), ("metadata", dict[str, Any], {}), ("provenance", dict[str, Any], {}),
    ], namespace={"__post_init__": check}, frozen=True, module=__name__)


@functools.cache
def packet_schema(limits: Limits, max_completions: int) -> Any:
    """One shared rollout: its item, 1..L completions within the size limit, and optionally a behaviour per
    completion (decoded by `Behaviour.from_wire`) with the fingerprint of the tokenizer that sampled it."""

    def check(self: Any) -> None:
        for completion in self.completions:
            check_utf8(completion, "a completion")
        if self.behaviour is not None and len(self.behaviour) != len(self.completions):
            raise ValueError(f"behaviour must list one entry per completion ({len(self.completions)})")

    return msgspec.defstruct("SharedPacket", [
        ("item", item_schema(limits)), ("completions", texts(limits.max_completion_chars, 1, max_completions)),
        ("behaviour", list[str | None] | None, None), ("tokenizer", text(64), ""), ("sender", str, ""),
    ], namespace={"__post_init__": check}, frozen=True, module=__name__)


@functools.cache
def responses_schema(k: int, limits: Limits) -> Any:
    """One public prompt's responses: exactly K valid texts within the size limit."""
    return texts(limits.max_completion_chars, k, k)


# -- a node's self-reported held-out evaluation ----------------------------------------------------------------------
class EvalRow(Struct, frozen=True, kw_only=True):
    """The held-out metrics a node reports, overall or for one task: shares and rewards in [0, 1]."""

    greedy_accuracy: Fraction
    greedy_reward: Fraction | None = None
    sampled_accuracy: Fraction | None = None
    sampled_reward: Fraction | None = None
    sampled_accuracy_se: Fraction | None = None
    sampled_reward_se: Fraction | None = None
    greedy_lenient_accuracy: Fraction | None = None
    greedy_well_formed: Fraction | None = None
    sampled_lenient_accuracy: Fraction | None = None
    sampled_lenient_accuracy_se: Fraction | None = None
    sampled_well_formed: Fraction | None = None
    constant_accuracy: Fraction | None = None
    greedy_modal_share: Fraction | None = None
    sampled_modal_share: Fraction | None = None

    def numbers(self) -> dict[str, float]:
        """This row's metrics given, in declaration order."""
        return {key: getattr(self, key) for key in EvalRow.__struct_fields__ if getattr(self, key) is not None}


MAX_EVAL_ITEMS = 100_000


class ItemResults(Struct, frozen=True):
    """evaluate()'s per-item correct counts: equal-length lists of uids, task names, greedy counts in {0, 1} and,
    when sampled, counts in [0, samples] (the evaluation's own `samples`: checked by EvalResult)."""

    uids: Annotated[list[Name], Meta(min_length=1, max_length=MAX_EVAL_ITEMS)]
    tasks: list[Name]
    greedy: list[Flag] | None = None
    sampled: list[Count] | None = None

    def __post_init__(self) -> None:
        for key in ("tasks", "greedy", "sampled"):
            value = getattr(self, key)
            if value is not None and len(value) != len(self.uids):
                raise ValueError(f"'{key}' lists {len(value)} entries for {len(self.uids)} uids")


class EvalResult(EvalRow, frozen=True, kw_only=True):
    """A node's whole self-reported evaluation (SAPO, local): the overall row, counts, a row per task (at most 256),
    the tasks whose answers collapsed to one (only tasks it reports), and its per-item counts."""

    items: PositiveCount | None = None
    samples: PositiveCount | None = None
    per_task: Annotated[dict[Name, EvalRow], Meta(max_length=256)] = {}
    greedy_shortcut_tasks: list[str] | None = None
    sampled_shortcut_tasks: list[str] | None = None
    item_results: ItemResults | None = None

    def __post_init__(self) -> None:
        for task in self.per_task:
            check_utf8(task, "a task name")
        for key in SHORTCUT_TASKS:
            flagged = getattr(self, key)
            if flagged is not None and not set(flagged) <= set(self.per_task):
                raise ValueError(f"{key} names tasks the evaluation does not report")
        results = self.item_results
        top = self.samples or 1
        for uid, count in zip(results.uids, results.sampled or ()) if results is not None else ():
            if count > top:
                raise ValueError(f"{ITEM_RESULTS} counts {count} right of {top} samples for item {uid!r}")

    def to_dict(self) -> dict[str, Any]:
        """The evaluation as the metrics row keeps it: the numbers given, then counts, tasks and item results."""
        out: dict[str, Any] = self.numbers()
        for key in ("items", "samples"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["per_task"] = {task: row.numbers() for task, row in self.per_task.items()}
        for key in SHORTCUT_TASKS:
            if getattr(self, key) is not None:
                out[key] = sorted(set(getattr(self, key)))
        if self.item_results is not None:
            results = msgspec.structs.asdict(self.item_results)
            out[ITEM_RESULTS] = {key: value for key, value in results.items() if value is not None}
            if self.item_results.sampled is not None:
                out[ITEM_RESULTS]["samples"] = self.samples or 1
        return out
