"""Typed experiment config from Flower's flat dotted keys: defaults, conversion, checks and cross-key validation."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from pubswap_flwr.config import (
    ConfigError,
    ExperimentConfig,
    describe,
    flatten,
    key_table,
    load_toml,
    replace_section,
)

ROOT = Path(__file__).resolve().parents[2]


def build(**flat) -> ExperimentConfig:
    return ExperimentConfig.from_flat(flat)


def test_defaults_round_trip_through_flat():
    default = ExperimentConfig()
    flat = default.to_flat()
    assert ExperimentConfig.from_flat(flat) == default
    assert ExperimentConfig.from_flat({}) == default
    assert flat["train.local-steps"] == 15
    assert flat["sapo.async"] is False  # field async_mode is exposed under its key "async"
    assert "sapo.async-mode" not in flat


def test_non_default_values_round_trip():
    config = build(**{"strategy.mode": "sapo", "sapo.async": True, "train.learning-rate": 5e-4, "seed": 7,
                      "tasks.mix": "gcd:2", "run-name": "x"})
    assert config.strategy.mode == "sapo" and config.sapo.async_mode is True
    assert config.train.learning_rate == 5e-4 and config.seed == 7 and config.run_name == "x"
    assert ExperimentConfig.from_flat(config.to_flat()) == config


def test_pyproject_run_config_lists_every_key_with_its_default():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    flat = flatten(data["tool"]["flwr"]["app"]["config"])
    assert set(flat) == set(key_table())
    assert ExperimentConfig.from_flat(flat) == ExperimentConfig()


def test_describe_lists_every_key_in_order_with_defaults():
    rows = describe()
    assert [r[0] for r in rows] == list(key_table())
    as_dict = {key: default for key, default, _doc in rows}
    assert as_dict["train.completions-per-prompt"] == 8
    doc = {key: d for key, _v, d in rows}["train.local-steps"]
    assert "tau" in doc


# --- single-key checks, one or more per section -----------------------------------------------------------------

BAD_VALUES = [
    ("num-server-rounds", 0),
    ("seed", -1),
    ("run-name", 5),
    ("model.dtype", "int8"),
    ("model.device", "gpu"),
    ("model.device", "cuda:x"),
    ("model.lora-r", 0),
    ("model.lora-dropout", 0.5),
    ("model.name", None),
    ("generation.max-new-tokens", -3),
    ("generation.temperature", 0.0),
    ("generation.top-p", 0.0),
    ("generation.top-p", 1.01),
    ("generation.top-k", -1),
    ("train.local-steps", 0),
    ("train.local-steps", -2),
    ("train.local-steps", 2.5),
    ("train.learning-rate", 0),
    ("train.learning-rate", float("nan")),
    ("train.completions-per-prompt", 1),
    ("train.loss-type", "ppo"),
    ("train.epsilon-low", 1.0),
    ("train.reset-optimizer", "yes"),
    ("train.reset-optimizer", 1),
    ("tasks.per-node", -1),
    ("tasks.template", "fancy"),
    ("tasks.mix", 3),
    ("eval.items-per-task", 0),
    ("eval.sampled", 0),
    ("eval.every", -1),
    ("strategy.mode", "fedsgd"),
    ("strategy.fraction-train", 0.0),
    ("strategy.fraction-train", 1.5),
    ("strategy.fraction-train", -0.1),
    ("strategy.min-clients", 0),
    ("strategy.timeout", 0),
    ("strategy.aggregation", "krum"),
    ("strategy.trim-fraction", 0.5),
    ("strategy.clip-norm", -1.0),
    ("pubswap.swap", "greedy"),
    ("pubswap.tau-swap", 0),
    ("pubswap.correct-threshold", 1.5),
    ("pubswap.correct-threshold", 0),
    ("pubswap.base", "sapo"),
    ("sapo.local", -1),
    ("sapo.questions", 0),
    ("sapo.completions", 1),
    ("sapo.async", "true"),
    ("output.save-every", -1),
    ("output.dir", 3),
]


@pytest.mark.parametrize("key,value", BAD_VALUES, ids=[f"{k}={v!r}" for k, v in BAD_VALUES])
def test_bad_value_raises_config_error_naming_the_key(key, value):
    with pytest.raises(ConfigError) as info:
        build(**{key: value})
    assert str(info.value).startswith(f"{key} = ")


def test_bad_values_cover_every_section():
    sections = {key.partition(".")[0] for key, _ in BAD_VALUES if "." in key}
    assert sections == {"model", "generation", "train", "tasks", "eval", "strategy", "pubswap", "sapo", "output"}


def test_local_steps_message_says_what_is_allowed():
    with pytest.raises(ConfigError, match=r"train.local-steps = 0: must be >= 1"):
        build(**{"train.local-steps": 0})


def test_mode_message_lists_modes():
    with pytest.raises(ConfigError, match=r"strategy.mode = 'fedsgd': must be one of 'fedavg', 'fedprox', 'pubswap', "
                                          r"'sapo'"):
        build(**{"strategy.mode": "fedsgd"})


def test_fraction_message():
    with pytest.raises(ConfigError, match=r"strategy.fraction-train = 1.5: must be in \(0, 1\]"):
        build(**{"strategy.fraction-train": 1.5})


def test_bool_is_not_an_int_and_int_is_not_a_bool():
    with pytest.raises(ConfigError, match=r"train.local-steps = True: must be an integer"):
        build(**{"train.local-steps": True})
    with pytest.raises(ConfigError, match=r"train.learning-rate = False: must be a number"):
        build(**{"train.learning-rate": False})
    with pytest.raises(ConfigError, match=r"sapo.async = 1: must be true or false"):
        build(**{"sapo.async": 1})


def test_numeric_conversions():
    config = build(**{"train.local-steps": 4.0, "train.learning-rate": 1, "strategy.fraction-train": 1})
    assert config.train.local_steps == 4 and type(config.train.local_steps) is int
    assert config.train.learning_rate == 1.0 and type(config.train.learning_rate) is float
    assert type(config.strategy.fraction_train) is float
    with pytest.raises(ConfigError, match=r"train.local-steps = '5': must be an integer"):
        build(**{"train.local-steps": "5"})


# --- unknown keys -----------------------------------------------------------------------------------------------


def test_unknown_key_suggests_the_close_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'train.local_steps' \(did you mean 'train.local-steps'\?\)"):
        build(**{"train.local_steps": 3})
    with pytest.raises(ConfigError, match=r"did you mean 'strategy.mode'"):
        build(**{"strategy.mdoe": "sapo"})


def test_unknown_key_without_close_match_has_no_hint():
    with pytest.raises(ConfigError) as info:
        build(**{"zzzz.qqqq-xxxx": 1})
    assert str(info.value) == "unknown config key 'zzzz.qqqq-xxxx'"


def test_async_mode_attribute_name_is_not_a_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'sapo.async-mode'"):
        build(**{"sapo.async-mode": True})


# --- cross-key checks -------------------------------------------------------------------------------------------


def test_pubswap_tau_swap_must_not_exceed_local_steps():
    with pytest.raises(ConfigError, match=r"pubswap.tau-swap = 11 exceeds train.local-steps = 10"):
        build(**{"strategy.mode": "pubswap", "pubswap.tau-swap": 11, "train.local-steps": 10})
    ok = build(**{"strategy.mode": "pubswap", "pubswap.tau-swap": 10, "train.local-steps": 10})
    assert ok.pubswap.tau_swap == 10
    # only pubswap mode cares
    assert build(**{"strategy.mode": "fedavg", "pubswap.tau-swap": 11}).pubswap.tau_swap == 11


@pytest.mark.parametrize("flat,match", [
    ({"sapo.local": 0, "sapo.external": 0}, r"sapo.local \+ sapo.external must be >= 1"),
    ({"sapo.local": 9, "sapo.questions": 8, "sapo.sharing": "fixed"}, r"sapo.local = 9 exceeds sapo.questions = 8"),
    ({"sapo.share": 9, "sapo.questions": 8, "sapo.sharing": "fixed"}, r"sapo.share = 9 exceeds sapo.questions = 8"),
    ({"strategy.aggregation": "median"}, r"strategy.aggregation applies to adapter averaging"),
])
def test_sapo_cross_checks(flat, match):
    with pytest.raises(ConfigError, match=match):
        build(**{"strategy.mode": "sapo", **flat})
    build(**{"strategy.mode": "fedavg", **flat})  # the same values are fine outside sapo mode


def test_sapo_valid_edge_values():
    config = build(**{"strategy.mode": "sapo", "sapo.local": 0, "sapo.external": 1, "sapo.share": 8,
                      "sapo.questions": 8})
    assert (config.sapo.local, config.sapo.external) == (0, 1)


# --- derived ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flat,expected", [
    ({"strategy.mode": "fedavg"}, False),
    ({"strategy.mode": "fedprox"}, True),
    ({"strategy.mode": "pubswap"}, False),
    ({"strategy.mode": "pubswap", "pubswap.base": "fedprox"}, True),
    ({"strategy.mode": "sapo", "pubswap.base": "fedprox"}, False),
])
def test_the_runs_protocol_sets_fedprox_mu_only_where_fedprox_applies(flat, expected):
    from pubswap_flwr.protocols import run_protocol

    cfg = build(**flat, **{"strategy.proximal-mu": 0.05})
    assert run_protocol(cfg).proximal_mu(cfg) == (0.05 if expected else 0.0)


def test_with_overrides_and_replace_section():
    base = build(**{"seed": 3})
    over = base.with_overrides({"train.local-steps": 6})
    assert over.seed == 3 and over.train.local_steps == 6
    with pytest.raises(ConfigError, match="train.local-steps"):
        base.with_overrides({"train.local-steps": 0})
    replaced = replace_section(base, "sapo", share=2)
    assert replaced.sapo.share == 2 and replaced.sapo.local == base.sapo.local and replaced.seed == 3


def test_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PUBSWAP_OUTPUT_ROOT", str(tmp_path))
    config = build(**{"strategy.mode": "fedprox", "seed": 2})
    assert config.run_dir(17) == (tmp_path / "runs" / "fedprox-s2-17").resolve()
    named = build(**{"run-name": "exp", "output.dir": str(tmp_path / "abs")})
    assert named.run_dir(1) == (tmp_path / "abs" / "exp").resolve()


# --- TOML -------------------------------------------------------------------------------------------------------


def test_load_toml_flattens_nested_tables_and_dotted_keys(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(
        'seed = 4\n'
        'strategy.mode = "sapo"\n'
        '[train]\nlocal-steps = 6\n'
        '[sapo]\nasync = true\nlocal = 2\n'
    )
    flat = load_toml(path)
    assert flat == {"seed": 4, "strategy.mode": "sapo", "train.local-steps": 6, "sapo.async": True, "sapo.local": 2}
    config = ExperimentConfig().with_overrides(flat)
    assert config.train.local_steps == 6 and config.sapo.async_mode is True and config.strategy.mode == "sapo"


def test_load_toml_invalid_raises_config_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("train = [unclosed\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_toml(path)


def test_flatten_deeply_nested():
    assert flatten({"a": {"b": {"c": 1}, "d": 2}, "e": 3}) == {"a.b.c": 1, "a.d": 2, "e": 3}


PRESETS = sorted(p for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.toml")
                 if not p.name.startswith("compare-"))  # compare-*.toml are sweep files (tests/unit/test_sweeps.py)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_loads_with_ours_and_flowers_parser(preset):
    from flwr.common.config import flatten_dict, parse_config_args

    ours = load_toml(preset)
    config = ExperimentConfig.from_flat(ours)  # valid keys and values
    assert ours and all(key in config.to_flat() for key in ours)
    flowers = parse_config_args([str(preset)])
    assert flatten_dict(flowers) == ours
