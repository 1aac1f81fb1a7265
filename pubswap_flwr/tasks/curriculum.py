"""The frontier controller (tasks.curriculum, issue #53): a node's reasoning-gym curriculum level per task, moved by
its recent success rate, and the generator config a level stands for."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Mapping, Sequence

from msgspec import Meta

from .specs import TaskError, TaskSpec

MAX_LEVEL = 1000  # far above any reasoning-gym 0.1.25 curriculum (chain_sum's 11 levels are the most)
MAX_WINDOW = 10_000  # tasks.curriculum-window's bound, and so of the successes a saved state may hold

Level = Annotated[int, Meta(ge=0, le=MAX_LEVEL)]
Success = Annotated[float, Meta(ge=0, le=1)]


@dataclass(frozen=True)
class Band:
    """tasks.curriculum-low/-high/-window: the target success band and how many recent groups it is measured over."""

    low: float = 0.3
    high: float = 0.7
    window: int = 16


@dataclass(frozen=True)
class TaskLevel:
    """One node's curriculum state for one task: its level, and the success rates of its latest groups at that level
    (oldest first, at most the band's window). Saved in the node's state (node.json, `curriculum`)."""

    level: Level = 0
    recent: Annotated[tuple[Success, ...], Meta(max_length=MAX_WINDOW)] = ()


def observe(state: TaskLevel, successes: Sequence[float], band: Band) -> TaskLevel:
    """`state` with the success rates of newly trained groups (each in [0, 1]) appended, the window's newest kept."""
    recent = (state.recent + tuple(float(s) for s in successes))[-band.window:]
    return TaskLevel(state.level, recent)


def next_level(state: TaskLevel, band: Band, top: int) -> TaskLevel:
    """The frontier rule, applied once at the start of each round (so a round's private items share one level).

    With a full window of groups at the current level, their mean success rate r moves the level one step: up when
    r > band.high (and the level is below `top`), down when r < band.low (and the level is above 0), else it holds.
    A change empties the window, so the next change waits for a full window of groups at the new level: the
    hysteresis that keeps a level from flickering on one lucky or unlucky round. Deterministic: the same history
    gives the same levels. reasoning-gym 0.1.25's reference trainer moves its global level the same way with fixed
    thresholds (up above 0.70 accuracy, down below 0.10); issue #53 asks for a band that keeps a node's groups
    mixed, e.g. 0.3-0.7, where GRPO's advantages are non-zero.
    """
    if len(state.recent) < band.window:
        return state
    rate = sum(state.recent[-band.window:]) / band.window
    if rate > band.high and state.level < top:
        return TaskLevel(state.level + 1)
    if rate < band.low and state.level > 0:
        return TaskLevel(state.level - 1)
    return state


def group_success(rewards: Sequence[float]) -> float:
    """A group's success rate: the share of its completions whose reward is 1 (a correct answer)."""
    return sum(r >= 1.0 for r in rewards) / len(rewards)


# -- levels of reasoning-gym curricula ---------------------------------------------------------------------------------
def has_curriculum(spec: TaskSpec) -> bool:
    from reasoning_gym.factory import has_curriculum as registered

    return registered(spec.generator)


def top_level(spec: TaskSpec) -> int:
    """The task's highest curriculum level: its longest attribute's last level (reasoning-gym's set_global_level
    holds a shorter attribute at its own last level)."""
    return _levels(spec.generator)[0]


def level_config(spec: TaskSpec, level: int) -> dict[str, Any]:
    """The generator config of `spec` at curriculum `level`: the task's own config with every curriculum attribute's
    fields set as reasoning-gym sets them at that global level (its default context, INCLUSIVE: a range attribute
    spans its level-0 value up to its value at the level, one level further for attributes that must be an interval).
    Fields no attribute names (basic_arithmetic's operators, say) keep the task's values."""
    if not 0 <= level <= top_level(spec):
        raise TaskError(f"task {spec.name!r}: curriculum level {level} is outside its range 0..{top_level(spec)}")
    return {**dict(spec.config), **json.loads(_attribute_values(spec.generator, json.dumps(dict(spec.config),
                                                                                          sort_keys=True), level))}


def at_level(spec: TaskSpec, level: int) -> TaskSpec:
    """`spec` with its generator config at curriculum `level` (same name and weight)."""
    return TaskSpec(spec.name, spec.generator, level_config(spec, level), spec.weight)


@lru_cache(maxsize=64)
def _levels(generator: str) -> tuple[int, tuple[str, ...]]:
    """(top level, the config fields the curriculum sets) of a generator's curriculum; TaskError when it has none."""
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition
    from reasoning_gym.factory import create_curriculum
    from reasoning_gym.factory import has_curriculum as registered

    if not registered(generator):
        raise TaskError(f"reasoning-gym has no curriculum for {generator!r}")
    curriculum = create_curriculum(generator)
    fields: list[str] = []
    for attr in curriculum.attributes.values():
        fields += ([attr.lower_field_name, attr.upper_field_name] if isinstance(attr, RangeAttributeDefinition)
                   else [attr.field_name])
    return max(len(attr.levels) - 1 for attr in curriculum.attributes.values()), tuple(fields)


@lru_cache(maxsize=256)
def _attribute_values(generator: str, config_json: str, level: int) -> str:
    from reasoning_gym.factory import create_curriculum

    curriculum = create_curriculum(generator)
    curriculum.set_global_level(level)
    try:
        config = curriculum.generate_configuration(defaults=json.loads(config_json))
    except (TypeError, ValueError) as err:
        raise TaskError(f"reasoning-gym rejected the config of {generator!r} at curriculum level {level}: {err}") \
            from err
    return json.dumps({name: _plain(getattr(config, name)) for name in _levels(generator)[1]}, sort_keys=True)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def check_levels(specs: Sequence[TaskSpec], start: int, key: str = "tasks.curriculum") -> None:
    """Every task has a curriculum and `start` is within each one's range; TaskError naming the key otherwise."""
    missing = [spec.name for spec in specs if not has_curriculum(spec)]
    if missing:
        raise TaskError(f"{key} = true: reasoning-gym 0.1.25 has no curriculum for {', '.join(missing)}; take them "
                        "out of the task mix or leave the controller off")
    for spec in specs:
        if start > top_level(spec):
            where = "tasks.curriculum-start" if key == "tasks.curriculum" else f"{key} at tasks.curriculum-start + 1"
            raise TaskError(f"{where} = {start}: above the top curriculum level {top_level(spec)} of task "
                            f"{spec.name!r}")


def levels_of(states: Mapping[str, TaskLevel]) -> dict[str, int]:
    """Task -> level, as a node reports it."""
    return {name: state.level for name, state in sorted(states.items())}
