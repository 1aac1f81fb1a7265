"""The schema layer: what a party receives, declared once as msgspec Structs (types, bounds, optional fields), and
`parse`, which checks a decoded JSON value against a declaration and raises an error that names the field.

msgspec was chosen over pydantic v2 (docs/results/schema-decode): it is strict by default (a string is never coerced
into a number, a bool is not an int), it is one small wheel without dependencies, and it decoded a SAPO reply in 0.52x
the hand-written checks' time where pydantic took 0.70x. Bounds that depend on a run's settings (`Limits`) are
declared by small factories over them, cached per value. What a declaration cannot say (JSON nesting depth, text
that is not valid Unicode, a rule across fields) is checked in the Struct's `__post_init__`, so the error still
names where it is.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta, Struct

from ..config import ExperimentConfig
from ..metrics_schema import ITEM_RESULTS, SHORTCUT_TASKS
from ..rollouts import MAX_BEHAVIOUR_TOKENS
from ..tasks import items
from ..tasks.verifiers import VERIFIERS

T = TypeVar("T")


class SchemaError(ValueError):
    """A received value does not match its declaration; the message names the field (`what.key[index]`)."""


def parse(value: Any, schema: type[T], what: str, error: type[ValueError] = SchemaError) -> T:
    """`value` (decoded JSON: dicts, lists, text, numbers) as `schema`, or `error` naming the field that is wrong,
    e.g. "eval.per_task[...].greedy_accuracy: expected `float` <= 1.0"."""
    try:
        return msgspec.convert(value, schema, strict=True)
    except msgspec.ValidationError as err:
        message, _, path = str(err).partition(" - at `")
        path = path.rstrip("`")
        key = path.startswith("key` in `")  # msgspec's form for an object's key: "key` in `$.per_task"
        where = what + path.removeprefix("key` in `").removeprefix("$") + (" (a key)" if key else "")
        where = where if what else where.removeprefix(".")  # a file's fields: "round", not ".round"
        raise error(f"{where}: {message[:1].lower()}{message[1:]}" if where else
                    f"{message[:1].lower()}{message[1:]}") from None


def load_json(path: Path, error: type[ValueError] = SchemaError) -> Any:
    """The JSON value of a file another party may have written (a run directory, node state): `error` naming the
    file when it is missing, unreadable, not UTF-8 text, not JSON or nested too deeply."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: missing") from None
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror or err})") from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise error(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply") from None
    except ValueError as err:  # an integer of more digits than Python converts (4300)
        raise error(f"{path}: not valid JSON ({err})") from None


def parse_file(path: Path, schema: type[T], error: type[ValueError] = SchemaError) -> T:
    """A JSON file (load_json) as `schema`; `error` names the file, then the field."""
    return parse_value_of(path, load_json(path, error), schema, error)


def parse_value_of(path: Path, value: Any, schema: type[T], error: type[ValueError] = SchemaError) -> T:
    """`value`, read from the file `path`, as `schema`; `error` names the file, then the field."""
    try:
        return parse(value, schema, "")
    except SchemaError as err:
        raise error(f"{path}: {err}") from None


def text(longest: int, shortest: int = 0) -> Any:
    """A string type of `shortest`..`longest` characters."""
    return Annotated[str, Meta(min_length=shortest, max_length=longest)]


def texts(longest: int, fewest: int, most: int) -> Any:
    """A list type of `fewest`..`most` strings of at most `longest` characters."""
    return Annotated[list.__class_getitem__(text(longest)), Meta(min_length=fewest, max_length=most)]


Fraction = Annotated[float, Meta(ge=0, le=1)]
Flag = Annotated[int, Meta(ge=0, le=1)]
Count = Annotated[int, Meta(ge=0, le=1_000_000)]
PositiveCount = Annotated[int, Meta(ge=1, le=1_000_000)]
Name = Annotated[str, Meta(max_length=128)]
Tally = Annotated[int, Meta(ge=0, le=10**12)]  # a count a node adds up over a run (examples, steps, tokens)


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


# -- checks a declaration cannot state -----------------------------------------------------------------------------
def check_utf8(value: str, what: str) -> str:
    """Text that can be encoded as UTF-8 (JSON allows lone surrogates such as "\\ud800"; forwarding them fails)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} is not valid Unicode text ({err.reason} at position {err.start})") from None
    return value


def check_depth(value: Any, limit: int, what: str) -> None:
    """Objects and lists nested at most `limit` deep (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, (dict, list)):
            if depth > limit:
                raise ValueError(f"{what} is nested more than {limit} levels deep")
            children = current.values() if isinstance(current, dict) else current
            stack.extend((child, depth + 1) for child in children)


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
        check_utf8(json.dumps([self.uid, self.task, self.question, self.answer, self.family, self.metadata,
                               self.provenance], ensure_ascii=False), "the item")

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
        if results is not None and results.sampled is not None and max(results.sampled, default=0) > top:
            raise ValueError(f"{ITEM_RESULTS}.sampled has a count over the evaluation's {top} samples")

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
