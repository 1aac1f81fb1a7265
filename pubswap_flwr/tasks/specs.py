"""Task specs over reasoning-gym generators: named presets, mixtures, and parsing of `name:weight,...` strings."""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping


class TaskError(ValueError):
    """A task, mixture or dataset description is invalid."""


@dataclass(frozen=True)
class TaskSpec:
    """A named reasoning-gym generator with a fixed config and a mixture weight."""

    name: str
    generator: str
    config: Mapping[str, Any] = field(default_factory=dict)
    weight: float = 1.0

    def config_json(self) -> str:
        return json.dumps(dict(self.config), sort_keys=True)

    def with_weight(self, weight: float) -> "TaskSpec":
        return TaskSpec(self.name, self.generator, dict(self.config), float(weight))


# Easy configs a ~1M-parameter model can partly learn (the embedded models' held-out accuracy per task is in
# data/models/*/build.json).
PRESETS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec(
            "basic_arithmetic",
            "basic_arithmetic",
            {
                "min_terms": 2,
                "max_terms": 2,
                "min_digits": 1,
                "max_digits": 2,
                "operators": ["+", "-"],
                "allow_parentheses": False,
                "allow_negation": False,
                "format_style": "simple",
            },
        ),
        TaskSpec("gcd", "gcd", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 100}),
        TaskSpec("count_bits", "count_bits", {"max_n": 1023}),
        TaskSpec(
            "fraction_simplification",
            "fraction_simplification",
            {"min_value": 1, "max_value": 20, "min_factor": 2, "max_factor": 9, "styles": ["plain"]},
        ),
        TaskSpec("spell_backward", "spell_backward", {"min_word_len": 3, "max_word_len": 5}),
        TaskSpec("chain_sum", "chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
        TaskSpec(
            "base_conversion", "base_conversion", {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 255}
        ),
        TaskSpec("products", "products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    ]
}

DEFAULT_MIX = "basic_arithmetic:1,gcd:1,count_bits:1,fraction_simplification:1,spell_backward:2"


def known_task_names(custom: Mapping[str, TaskSpec] | None = None) -> list[str]:
    return sorted(set(PRESETS) | set(custom or {}))


def parse_custom_tasks(text: str) -> dict[str, TaskSpec]:
    """Parse `tasks.custom`: a JSON object {name: {"generator": str, "config": {...}}}."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise TaskError(f"tasks.custom is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise TaskError("tasks.custom must be a JSON object mapping task names to {generator, config}")
    out = {}
    for name, body in raw.items():
        if not isinstance(body, dict) or not isinstance(body.get("generator"), str):
            raise TaskError(f"tasks.custom[{name!r}] needs a string 'generator' (a reasoning-gym dataset name)")
        config = body.get("config", {})
        if not isinstance(config, dict):
            raise TaskError(f"tasks.custom[{name!r}].config must be an object")
        _check_generator(body["generator"], where=f"tasks.custom[{name!r}]")
        out[name] = TaskSpec(name, body["generator"], config)
    return out


def parse_mix(text: str, custom: Mapping[str, TaskSpec] | None = None, *, key: str = "tasks.mix") -> list[TaskSpec]:
    """Parse "name:weight,name:weight" (weight optional, default 1) into task specs.

    A name is a preset, a `tasks.custom` entry, or `rg:<generator>` for any reasoning-gym generator with its
    default config.
    """
    specs: list[TaskSpec] = []
    seen: set[str] = set()
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, _, weight_text = part.partition(":") if not part.startswith("rg:") else _split_rg(part)
        name = name.strip()
        try:
            weight = float(weight_text) if weight_text.strip() else 1.0
        except ValueError as err:
            raise TaskError(f"{key}: weight of {name!r} is not a number: {weight_text!r}") from err
        if not math.isfinite(weight) or weight <= 0:
            raise TaskError(f"{key}: weight of {name!r} must be a finite number > 0, got {weight}")
        if name in seen:
            raise TaskError(f"{key}: task {name!r} is listed twice")
        seen.add(name)
        specs.append(resolve_task(name, custom, key=key).with_weight(weight))
    if not specs:
        raise TaskError(f"{key} names no tasks")
    return specs


def mix_task_names(text: str) -> list[str]:
    """The task names a "name:weight,..." mix lists, unchecked ("rg:countdown:2" -> "rg:countdown")."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    return [(_split_rg(p) if p.startswith("rg:") else p.partition(":"))[0].strip() for p in parts]


def _split_rg(part: str) -> tuple[str, str, str]:
    body = part[3:]
    generator, sep, weight = body.partition(":")
    return "rg:" + generator, sep, weight


def resolve_task(name: str, custom: Mapping[str, TaskSpec] | None = None, *, key: str = "tasks.mix") -> TaskSpec:
    if custom and name in custom:
        return custom[name]
    if name in PRESETS:
        return PRESETS[name]
    if name.startswith("rg:"):
        generator = name[3:]
        _check_generator(generator, where=key)
        return TaskSpec(name, generator, {})
    raise TaskError(
        f"{key}: unknown task {name!r}; known tasks: {', '.join(known_task_names(custom))} "
        "(or rg:<reasoning-gym dataset name>, or define it in tasks.custom)"
    )


def _check_generator(generator: str, where: str) -> None:
    from reasoning_gym.factory import DATASETS

    if generator not in DATASETS or generator == "composite":
        raise TaskError(f"{where}: {generator!r} is not a reasoning-gym dataset")


@lru_cache(maxsize=256)
def _dataset(generator: str, config_json: str, seed: int):
    import reasoning_gym

    config = json.loads(config_json)
    try:
        return reasoning_gym.create_dataset(generator, size=10**9, seed=seed, **config)
    except (TypeError, ValueError, AssertionError) as err:
        raise TaskError(f"reasoning-gym rejected config for {generator!r}: {config} ({err})") from err


def generator_dataset(generator: str, config: Mapping[str, Any], seed: int):
    """The reasoning-gym dataset instance for (generator, config, seed); cached per process."""
    return _dataset(generator, json.dumps(dict(config), sort_keys=True), int(seed))


def generate_entry(generator: str, config: Mapping[str, Any], seed: int, index: int) -> dict[str, Any]:
    """Item `index` of the generator at `seed` (items depend on seed+index only)."""
    dataset = generator_dataset(generator, config, seed)
    with contextlib.redirect_stdout(io.StringIO()):  # the bf generator prints one dot per item
        return dataset[index]
