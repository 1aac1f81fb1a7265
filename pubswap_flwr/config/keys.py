"""The typed run-config key: a dataclass field with its check and doc (`opt`), the checks keys use, ConfigError,
and how flat keys are read from TOML files and key=value text.

config/__init__.py builds the experiment config from these; a protocol's own section (config/catalog.py) uses them too.
"""

from __future__ import annotations

import tomllib
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, Mapping


class ConfigError(ValueError):
    """A run-config key is unknown or its value is invalid; the message names the key."""


Check = Callable[[str, Any], None]


def _check(predicate: Callable[[Any], bool], text: str) -> Check:
    def check(key: str, value: Any) -> None:
        if not predicate(value):
            raise ConfigError(f"{key} = {value!r}: must be {text}")

    return check


positive = _check(lambda v: v > 0, "> 0")
non_negative = _check(lambda v: v >= 0, ">= 0")
fraction = _check(lambda v: 0 < v <= 1, "in (0, 1]")
below_half = _check(lambda v: 0 <= v < 0.5, "in [0, 0.5)")
below_one = _check(lambda v: 0 <= v < 1, "in [0, 1)")
at_least_one = _check(lambda v: v >= 1, ">= 1")
at_least_two = _check(lambda v: v >= 2, ">= 2")

INT64_MAX = 2**63 - 1  # Flower's run config carries 64-bit integers
MAX_COMPLETIONS_PER_BATCH = 65536  # completions sampled at once (a GRPO step, a public step, a SAPO round)


def _number(x: float) -> str:
    if x == INT64_MAX:
        return "2**63 - 1"
    return str(int(x)) if float(x).is_integer() else repr(x)


def between(low: float, high: float, *, above: bool = False, why: str = "") -> Check:
    """low <= v <= high (low < v <= high with `above`). Upper bounds are generous: no real run gets near them,
    they stop a typo or a hostile config from exhausting memory or time. The key's doc names the bound."""
    low_text = f"{'>' if above else '>='} {_number(low)}"
    check = _check(lambda v: (v > low if above else v >= low) and v <= high, f"{low_text} and <= {_number(high)}")
    check.limit_doc = f"at most {_number(high)}" + (f": {why}" if why else "")  # type: ignore[attr-defined]
    return check


def off_or_between(low: float, high: float) -> Check:
    """0 (off), or low <= v <= high."""
    check = _check(lambda v: v == 0 or low <= v <= high, f"0 (off) or >= {_number(low)} and <= {_number(high)}")
    check.limit_doc = f"at most {_number(high)}"  # type: ignore[attr-defined]
    return check


def is_plain_component(name: Any) -> bool:
    """One plain path component: not empty, '.' or '..', no '/', '\\' or control characters (NUL included), no
    surrounding spaces, at most 255 bytes in UTF-8 (a file name's limit)."""
    if not isinstance(name, str) or name in ("", ".", "..") or name != name.strip():
        return False
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return size <= 255 and not any(c in name for c in "/\\") and name.isprintable()


PLAIN_COMPONENT = ("one plain path component (no '/', '\\', '..', NUL or other control characters, no surrounding "
                   "spaces, at most 255 bytes)")


def number_list(low: float, high: float) -> Check:
    """'' or comma-separated numbers, each low < v <= high (a per-partition list such as train.node-learning-rates)."""
    def entry_ok(text: str) -> bool:
        try:
            return low < float(text) <= high
        except ValueError:
            return False

    return _check(lambda v: isinstance(v, str) and (not v.strip() or all(entry_ok(x) for x in v.split(","))),
                  f"empty or comma-separated numbers, each > {_number(low)} and <= {_number(high)}")


def one_of(*choices: str) -> Check:
    check = _check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))
    check.choices = choices  # type: ignore[attr-defined]  # listed by `pubswap keys` (key_choices)
    return check


def opt(default: Any, check: Check | None = None, doc: str = "", key: str | None = None) -> Any:
    limit = getattr(check, "limit_doc", "")
    if limit:
        doc = f"{doc} ({limit})" if doc else limit
    return field(default=default, metadata={"check": check, "doc": doc, "key": key})


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"local-steps": 5}} -> {"train.local-steps": 5} (TOML tables to Flower's flat keys)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """Flat overrides from a TOML file (nested tables or dotted keys)."""
    try:
        with open(path, "rb") as handle:
            return flatten(tomllib.load(handle))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from err


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Flat overrides from "key=value" strings; values are read as TOML (`train.local-steps=2`, `tasks.mix="gcd:1"`),
    and a value that is not valid TOML is taken as a plain string (`tasks.mix=gcd:1`)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {pair!r} is not key=value")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value.strip()
    return out
