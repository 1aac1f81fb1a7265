"""The frontier controller (tasks.curriculum): its rule on scripted success histories, the level -> generator config
mapping of real reasoning-gym curricula, and the checks on levels."""

from __future__ import annotations

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.config.keys import ConfigError
from pubswap_flwr.tasks import PRESETS, TaskError, TaskSpec
from pubswap_flwr.tasks.curriculum import (
    Band,
    TaskLevel,
    at_level,
    check_levels,
    group_success,
    level_config,
    next_level,
    observe,
    top_level,
)
from pubswap_flwr.tasks.specs import generate_entry

BAND = Band(low=0.3, high=0.7, window=4)


def run(history: list[list[float]], band: Band = BAND, top: int = 3, start: int = 0) -> list[int]:
    """The level in force in each round: the rule at the round's start, then that round's group successes."""
    state, levels = TaskLevel(start), []
    for successes in history:
        state = next_level(state, band, top)
        levels.append(state.level)
        state = observe(state, successes, band)
    return levels


def test_raises_a_level_after_a_full_window_above_the_band():
    assert run([[1.0, 0.9], [0.8, 1.0], [0.5, 0.5]]) == [0, 0, 1]


def test_lowers_a_level_below_the_band():
    assert run([[0.0, 0.1, 0.2, 0.0], [0.5]], start=2) == [2, 1]


def test_holds_inside_the_band_and_on_the_band_edges():
    assert run([[0.3, 0.7, 0.5, 0.5]] * 4, start=1) == [1, 1, 1, 1]
    assert run([[0.7] * 4, [0.3] * 4, [0.7] * 4], start=1) == [1, 1, 1]  # the edges are inside


def test_holds_until_the_window_is_full():
    assert run([[1.0], [1.0], [1.0], [1.0], [1.0]]) == [0, 0, 0, 0, 1]


def test_hysteresis_a_change_waits_for_a_full_window_at_the_new_level():
    # after the raise the window restarts: three more perfect groups are not enough, the fourth is
    history = [[1.0] * 4, [1.0] * 3, [1.0], [0.5]]
    assert run(history) == [0, 1, 1, 2]
    # a raise is not undone by the old level's low rates, only by a full window of low rates at the new level
    assert run([[1.0] * 4, [0.0] * 2, [0.0] * 2, [0.5]]) == [0, 1, 1, 0]


def test_the_window_is_the_newest_groups():
    # eight bad groups, then four good ones: the last four decide
    assert run([[0.0] * 8 + [1.0] * 4, []], start=1) == [1, 2]


def test_never_leaves_the_range():
    assert run([[1.0] * 4] * 5, top=2) == [0, 1, 2, 2, 2]
    assert run([[0.0] * 4] * 3) == [0, 0, 0]


def test_deterministic():
    history = [[(i * 7 % 10) / 10 for i in range(r, r + 3)] for r in range(20)]
    assert run(history) == run(history)


def test_group_success_counts_correct_completions():
    assert group_success([1.0, 0.0, 1.0, 0.5]) == 0.5
    assert group_success([0.0, 0.0]) == 0.0


def test_level_configs_of_basic_arithmetic_keep_the_tasks_own_operators():
    spec = PRESETS["basic_arithmetic"]
    assert top_level(spec) == 4  # num_terms [2, 3, 4, 5, 6]
    assert level_config(spec, 0) == {**spec.config, "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    assert level_config(spec, 2) == {**spec.config, "min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 3}
    # num_digits has 4 levels: at level 4 it stays at its last one
    assert level_config(spec, 4)["max_digits"] == 4 and level_config(spec, 4)["max_terms"] == 6
    assert level_config(spec, 3)["operators"] == ["+", "-"]


def test_level_configs_of_gcd_widen_with_the_level():
    spec = PRESETS["gcd"]
    assert top_level(spec) == 3
    assert level_config(spec, 0) == {"min_numbers": 2, "max_numbers": 2, "min_value": 100, "max_value": 1000}
    assert level_config(spec, 1) == {"min_numbers": 2, "max_numbers": 3, "min_value": 100, "max_value": 10000}


def test_a_level_spec_generates_items_of_that_level():
    spec = at_level(PRESETS["spell_backward"], 4)
    assert (spec.name, spec.weight) == ("spell_backward", PRESETS["spell_backward"].weight)
    lengths = {len(generate_entry(spec.generator, spec.config, 7, i)["answer"]) for i in range(40)}
    assert max(lengths) > 5  # the preset's words have at most 5 letters
    lengths0 = {len(generate_entry(spec.generator, level_config(PRESETS["spell_backward"], 0), 7, i)["answer"])
                for i in range(40)}
    assert lengths0 == {3}


def test_a_level_outside_the_range_is_refused():
    with pytest.raises(TaskError, match=r"'gcd': curriculum level 4 is outside its range 0..3"):
        level_config(PRESETS["gcd"], 4)
    with pytest.raises(TaskError, match=r"tasks.curriculum-start = 4: above the top curriculum level 3 of task 'gcd'"):
        check_levels([PRESETS["spell_backward"], PRESETS["gcd"]], 4)


def test_a_task_without_a_curriculum_is_refused():
    spec = TaskSpec("rg:list_functions", "list_functions", {})
    expected = r"^tasks.curriculum = true: reasoning-gym 0.1.25 has no curriculum for rg:list_functions;"
    with pytest.raises(TaskError, match=expected):
        check_levels([PRESETS["gcd"], spec], 0)


# -- config --------------------------------------------------------------------------------------------------------
def config(**flat):
    return ExperimentConfig.from_flat({"tasks.curriculum": True, "tasks.mix": "gcd:1,spell_backward:1", **flat})


def test_curriculum_keys_parse_and_default_off():
    assert ExperimentConfig().tasks.curriculum is False
    cfg = config(**{"tasks.curriculum-low": 0.2, "tasks.curriculum-high": 0.8, "tasks.curriculum-window": 8,
                    "tasks.curriculum-start": 3})
    assert (cfg.tasks.curriculum_low, cfg.tasks.curriculum_high, cfg.tasks.curriculum_window,
            cfg.tasks.curriculum_start) == (0.2, 0.8, 8, 3)


@pytest.mark.parametrize(("flat", "message"), [
    ({"tasks.curriculum-low": 0.7, "tasks.curriculum-high": 0.7},
     r"^tasks.curriculum-low = 0.7 must be below tasks.curriculum-high = 0.7$"),
    ({"tasks.curriculum-low": 0.8}, r"^tasks.curriculum-low = 0.8 must be below tasks.curriculum-high = 0.7$"),
    ({"tasks.curriculum-high": 1.5}, r"^tasks.curriculum-high = 1.5: must be >= 0 and <= 1$"),
    ({"tasks.curriculum-low": -0.1}, r"^tasks.curriculum-low = -0.1: must be >= 0 and <= 1$"),
    ({"tasks.curriculum-window": 0}, r"^tasks.curriculum-window = 0: must be >= 1"),
    ({"tasks.curriculum-start": 4}, r"^tasks.curriculum-start = 4: above the top curriculum level 3 of task 'gcd'$"),
    ({"tasks.curriculum-start": -1}, r"^tasks.curriculum-start = -1: must be >= 0"),
    ({"tasks.mix": "gcd:1,rg:list_functions:1"}, r"^tasks.curriculum = true: .* no curriculum for rg:list_functions"),
    ({"tasks.data-paths": "a.jsonl"}, r"^tasks.curriculum = true needs generated tasks"),
])
def test_bad_curriculum_settings_are_config_errors_naming_the_key(flat, message):
    with pytest.raises(ConfigError, match=message):
        config(**flat)


def test_curriculum_settings_are_not_checked_with_the_controller_off():
    cfg = ExperimentConfig.from_flat({"tasks.curriculum-start": 9, "tasks.mix": "gcd:1,rg:list_functions:1"})
    assert cfg.tasks.curriculum_start == 9
