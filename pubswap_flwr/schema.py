"""The schema layer: what a party receives is declared once as msgspec Structs (types, bounds, optional fields),
and `parse` checks a decoded JSON value against a declaration, raising an error that names the field; `load_json`
and `parse_file` read a file someone else may have written. Imports nothing of the package: every level declares
its own records with it (wire/payloads.py, server/checkpoint.py, node_runtime/state.py, server/metrics.py,
tasks/items.py).

msgspec was chosen over pydantic v2 (docs/results/schema-decode): it is strict by default (a string is never coerced
into a number, a bool is not an int), it is one small wheel without dependencies, and decoding a SAPO reply's text
it took 0.52x the hand-written checks' time where pydantic took 0.70x (the layer as built converts the parsed JSON
instead: docs/benchmarks.md). Bounds that depend on a run's settings (`Limits`) are
declared by small factories over them, cached per value. What a declaration cannot say (JSON nesting depth, text
that is not valid Unicode, a rule across fields) is checked in the Struct's `__post_init__`, so the error still
names where it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

T = TypeVar("T")


class SchemaError(ValueError):
    """A received value does not match its declaration; the message names the field (`what.key[index]`)."""


def parse(value: Any, schema: type[T], what: str, error: type[ValueError] = SchemaError) -> T:
    """`value` (decoded JSON: dicts, lists, text, numbers) as `schema`, or `error` naming the field that is wrong,
    e.g. "eval.per_task[...].greedy_accuracy: expected `float` <= 1.0"."""
    try:
        return msgspec.convert(value, schema, strict=True)
    except UnicodeEncodeError:  # msgspec encodes text it reports on; a JSON escape can hold a lone surrogate
        raise error(f"{what + ': ' if what else ''}text that is not valid Unicode (a lone surrogate)") from None
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
    return decode_json(raw, path, error)


def decode_json(raw: bytes, path: Path, error: type[ValueError] = SchemaError) -> Any:
    """The JSON value of `raw`, read from the file `path` (`load_json`'s errors for what is not JSON)."""
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
REWARD_BOUND = 1e6  # a training reward: in [0, 1] from a verifier or tasks.rewards, within +-this from a TRL reward
Reward = Annotated[float, Meta(ge=-REWARD_BOUND, le=REWARD_BOUND)]
RewardTotal = Annotated[float, Meta(ge=-1e15, le=1e15)]  # mean rewards added up, one a round
Flag = Annotated[int, Meta(ge=0, le=1)]
Count = Annotated[int, Meta(ge=0, le=1_000_000)]
PositiveCount = Annotated[int, Meta(ge=1, le=1_000_000)]
Name = Annotated[str, Meta(max_length=128)]
Tally = Annotated[int, Meta(ge=0, le=10**12)]  # a count a node adds up over a run (examples, steps, tokens)


# -- checks a declaration cannot state -----------------------------------------------------------------------------
def check_utf8(value: str, what: str) -> str:
    """Text that can be encoded as UTF-8 (JSON allows lone surrogates such as "\\ud800"; forwarding them fails)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} is not valid Unicode text ({err.reason} at position {err.start})") from None
    return value


def check_depth(value: Any, limit: int, what: str, start: int = 1) -> None:
    """Objects and lists (and tuples) nested at most `limit` deep, `value` itself at depth `start` (checked without
    recursion)."""
    stack = [(value, start)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, (dict, list, tuple)):
            if depth > limit:
                raise ValueError(f"{what} is nested more than {limit} levels deep")
            children = current.values() if isinstance(current, dict) else current
            stack.extend((child, depth + 1) for child in children)


