"""Typed experiment config from Flower's flat dotted keys: defaults, conversion, checks and cross-key validation."""

from __future__ import annotations

import re
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


@pytest.mark.parametrize("value, ok", [(0.0, True), (1.0, True), (3.0, True), (0.5, False), (-1.0, False),
                                       (2e6, False)])
def test_median_clip_is_off_or_at_least_one(value, ok):
    if ok:
        assert build(**{"strategy.median-clip": value}).strategy.median_clip == value
    else:
        with pytest.raises(ConfigError, match=r"strategy.median-clip = .*: must be 0 \(off\) or >= 1 and <= 1000000"):
            build(**{"strategy.median-clip": value})


def test_idle_clients_keys_have_their_defaults_bounds_and_docs():
    s = ExperimentConfig().strategy
    assert s.idle_floor == 0.1 and s.apply_below_robust is False
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match=rf"^strategy.idle-floor = {bad}: must be in \[0, 1\)$"):
            build(**{"strategy.idle-floor": bad})
    assert build(**{"strategy.idle-floor": 0.0, "strategy.apply-below-robust": True}).strategy.apply_below_robust
    docs = {key: doc for key, _default, doc in describe()}
    assert "one vote" in docs["strategy.idle-floor"] and "0 = off" in docs["strategy.idle-floor"]
    assert "global adapter is kept" in docs["strategy.apply-below-robust"]


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
    ("strategy.server-optimizer", "adam"),
    ("strategy.server-momentum", 1.0),
    ("strategy.server-tau", 0.0),
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
    ("deploy.warm-worker", "yes"),
    ("deploy.worker-idle-timeout", 0),
]


@pytest.mark.parametrize("key,value", BAD_VALUES, ids=[f"{k}={v!r}" for k, v in BAD_VALUES])
def test_bad_value_raises_config_error_naming_the_key(key, value):
    with pytest.raises(ConfigError) as info:
        build(**{key: value})
    assert str(info.value).startswith(f"{key} = ")


FLOAT_KEYS = [key for key, (_s, _a, spec) in key_table().items() if spec.type in (float, "float")]
INT_KEYS = [key for key, (_s, _a, spec) in key_table().items() if spec.type in (int, "int")]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 10**400])
def test_every_float_key_refuses_non_finite_values(key, value):
    with pytest.raises(ConfigError) as info:
        build(**{key: value})
    assert str(info.value) == f"{key} = {value!r}: must be a finite number"


def test_an_infinite_dp_noise_multiplier_is_refused_before_it_can_make_an_all_inf_adapter():
    with pytest.raises(ConfigError, match=r"^strategy.dp-noise-multiplier = inf: must be a finite number$"):
        build(**{"strategy.dp-noise-multiplier": float("inf"), "strategy.clip-norm": 1.0})


def test_every_number_key_has_an_upper_bound_named_in_its_doc():
    docs = {key: doc for key, _default, doc in describe()}
    unbounded = {"model.lora-dropout", "generation.top-p", "train.epsilon-low", "strategy.fraction-train",
                 "strategy.trim-fraction", "pubswap.correct-threshold", "strategy.server-momentum",
                 "strategy.server-beta1", "strategy.server-beta2", "strategy.idle-floor"}  # already bounded by 1 or 0.5
    for key in INT_KEYS + FLOAT_KEYS:
        if key in unbounded:
            continue
        assert "at most " in docs[key], key
        bound = docs[key].rsplit("at most ", 1)[1].split()[0].rstrip(":)")  # the key's own bound comes last
        too_big = 2**63 if bound == "2**63" else float(bound) * 1.5 + 1
        with pytest.raises(ConfigError, match=rf"^{key} = .*: must be .*<= {re.escape(bound)}"):
            build(**{key: too_big if key in FLOAT_KEYS else int(too_big)})


@pytest.mark.parametrize("key,value,message", [
    ("train.completions-per-prompt", 10**9, "must be >= 2 and <= 1024"),
    ("train.prompts-per-step", 4097, "must be >= 1 and <= 4096"),
    ("train.local-steps", 10_001, "must be >= 1 and <= 10000"),
    ("generation.max-new-tokens", 10**6, "must be >= 1 and <= 32768"),
    ("eval.items-per-task", 100_001, "must be >= 1 and <= 100000"),
    ("pubswap.public-prompts", 5000, "must be >= 1 and <= 4096"),
    ("pubswap.public-size", 10**7, "must be >= 1 and <= 100000"),
    ("sapo.questions", 5000, "must be >= 1 and <= 4096"),
    ("sapo.completions", 2000, "must be >= 2 and <= 1024"),
    ("sapo.share", 257, "must be >= 0 and <= 256"),
    ("sapo.local", 257, "must be >= 0 and <= 256"),
    ("model.lora-r", 1025, "must be >= 1 and <= 1024"),
    ("strategy.timeout", 1e9, "must be > 0 and <= 604800"),
    ("num-server-rounds", 10**12, "must be >= 1 and <= 1000000"),
    ("seed", 2**63, "must be >= 0 and <= 2\\*\\*63 - 1"),
])
def test_absurd_sizes_are_refused_naming_the_key_and_the_bound(key, value, message):
    with pytest.raises(ConfigError, match=rf"^{key} = {value!r}: {message}$"):
        build(**{key: value})


def test_the_bounds_are_in_the_keys_docs():
    docs = {key: doc for key, _default, doc in describe()}
    assert docs["train.local-steps"] == "tau: GRPO steps per client per round (at most 10000)"
    assert docs["strategy.timeout"] == "seconds to wait for replies on every exchange (at most 604800: 7 days)"
    assert docs["model.lora-r"] == "at most 1024"
    assert "floor(trim-fraction x n)" in docs["strategy.aggregation"] and "n <= 4" in docs["strategy.aggregation"]
    assert "of 2 clients it is their mean" in docs["strategy.aggregation"]


def test_pubswap_keys_lists_every_key_with_its_doc(capsys):
    from pubswap_flwr.cli import main

    assert main(["keys"]) == 0
    out = capsys.readouterr().out
    assert "train.local-steps" in out and "at most 10000" in out and "strategy.aggregation" in out


@pytest.mark.parametrize("flat,message", [
    ({"train.prompts-per-step": 256, "train.completions-per-prompt": 512},
     "train.prompts-per-step x train.completions-per-prompt = 256 x 512: more than 65536 completions per step"),
    ({"strategy.mode": "pubswap", "pubswap.public-prompts": 1024, "train.completions-per-prompt": 128,
      "train.prompts-per-step": 1},
     "pubswap.public-prompts x train.completions-per-prompt = 1024 x 128: more than 65536 completions per public "
     "step"),
    ({"strategy.mode": "sapo", "sapo.sharing": "fixed", "sapo.questions": 4096, "sapo.completions": 17,
      "sapo.local": 4, "sapo.share": 4},
     "sapo.questions x sapo.completions = 4096 x 17: more than 65536 completions per round"),
    ({"strategy.mode": "sapo", "sapo.local": 256, "sapo.completions": 257},
     "sapo.local x sapo.completions = 256 x 257: more than 65536 completions per round"),
])
def test_completions_sampled_at_once_are_bounded(flat, message):
    with pytest.raises(ConfigError) as info:
        build(**flat)
    assert str(info.value) == message


@pytest.mark.parametrize("min_clients,fraction,needed,hint", [
    (2, 0.2, 5, ""),
    (4, 0.2, 5, " or strategy.trim-fraction >= 1/4"),
    (3, 0.3, 4, " or strategy.trim-fraction >= 1/3"),
    (2, 0.49, 3, ""),
])
def test_a_trimmed_mean_that_would_trim_nothing_from_the_smallest_round_is_refused(min_clients, fraction, needed,
                                                                                   hint):
    flat = {"strategy.aggregation": "trimmed-mean", "strategy.min-clients": min_clients,
            "strategy.trim-fraction": fraction}
    with pytest.raises(ConfigError) as info:
        build(**flat)
    assert str(info.value) == (
        f"strategy.aggregation = 'trimmed-mean' with strategy.trim-fraction = {fraction} trims nothing from a round "
        f"of strategy.min-clients = {min_clients} clients: n clients lose floor({fraction} x n) at each end, which "
        f"is 0 for n < {needed}. Set strategy.min-clients >= {needed}{hint} (or aggregate with 'median', which "
        "needs 3 clients to differ from the mean)")
    ok = build(**{**flat, "strategy.min-clients": needed})
    assert int(ok.strategy.trim_fraction * ok.strategy.min_clients) >= 1


def test_a_trimmed_mean_with_trim_fraction_zero_is_refused_and_one_that_trims_is_accepted():
    with pytest.raises(ConfigError, match=r"strategy.trim-fraction = 0 trims nothing from any round"):
        build(**{"strategy.aggregation": "trimmed-mean", "strategy.trim-fraction": 0.0, "strategy.min-clients": 10})
    config = build(**{"strategy.aggregation": "trimmed-mean", "strategy.trim-fraction": 0.25,
                      "strategy.min-clients": 4})
    assert config.strategy.aggregation == "trimmed-mean"
    assert build(**{"strategy.trim-fraction": 0.0}).strategy.trim_fraction == 0.0  # unused by 'mean'


def test_bad_values_cover_every_section():
    from pubswap_flwr.config import SECTIONS

    sections = {key.partition(".")[0] for key, _ in BAD_VALUES if "." in key}
    assert sections == set(SECTIONS)


def test_local_steps_message_says_what_is_allowed():
    with pytest.raises(ConfigError, match=r"train.local-steps = 0: must be >= 1"):
        build(**{"train.local-steps": 0})


def test_mode_message_lists_modes():
    from pubswap_flwr.config import catalog

    with pytest.raises(ConfigError) as info:
        build(**{"strategy.mode": "fedsgd"})
    assert str(info.value) == "strategy.mode = 'fedsgd': must be one of " + ", ".join(map(repr, catalog.modes()))


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
    with pytest.raises(ConfigError,
                       match=r"unknown config key 'train.local_steps' \(did you mean 'train.local-steps'\?\)"):
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
    ({"strategy.compression": "int8"}, r"strategy.compression = 'int8' compresses adapters; sapo mode sends none"),
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
    assert run_protocol(cfg).from_config(cfg).proximal_mu == (0.05 if expected else 0.0)


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


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _is_sweep(path: Path) -> bool:
    """Sweep files (compare-*.toml, control-*.toml, ...: `pubswap compare`) have [arms.<name>] tables."""
    return "arms" in tomllib.loads(path.read_text())


PRESETS = sorted(p for p in CONFIGS.glob("*.toml") if not _is_sweep(p))
SWEEPS = sorted(p for p in CONFIGS.glob("*.toml") if _is_sweep(p))


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_every_arm_of_every_sweep_file_validates(sweep):
    from pubswap_flwr.compare import load_sweep

    loaded = load_sweep(sweep)
    assert loaded.arms and all(arm.error is None for arm in loaded.arms)
    for arm in loaded.arms:
        for seed in loaded.seeds:
            ExperimentConfig.from_flat(loaded.config_for(arm, seed, Path("/tmp/out")))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_loads_with_ours_and_flowers_parser(preset):
    from flwr.common.config import flatten_dict, parse_config_args

    ours = load_toml(preset)
    config = ExperimentConfig.from_flat(ours)  # valid keys and values
    assert ours and all(key in config.to_flat() for key in ours)
    flowers = parse_config_args([str(preset)])
    assert flatten_dict(flowers) == ours


def test_every_mode_has_a_protocol_and_every_protocol_a_mode():
    from pubswap_flwr.config import MODES
    from pubswap_flwr.protocols import CLIENT_HANDLERS, PROTOCOLS, catalog

    assert set(MODES) == set(PROTOCOLS) == set(catalog.modes())
    assert set(CLIENT_HANDLERS) == set(catalog.message_types())


def test_policy_settings_take_every_config_field_of_the_same_name():
    from dataclasses import fields

    from pubswap_flwr.shared import policy_spec

    cfg = ExperimentConfig.from_flat({"train.micro-batch-size": 7, "train.recompute-layers": False,
                                      "train.is-cap": 3.0, "generation.temperature": 0.3,
                                      "generation.stop-at-answer": True})
    spec = policy_spec(cfg, proximal_mu=0.25, learning_rate=0.005)
    grpo_names = {f.name for f in fields(spec.grpo)} & {f.name for f in fields(cfg.train)}
    assert {"micro_batch_size", "recompute_layers", "is_cap", "loss_type", "foreign_correction"} <= grpo_names
    for name in grpo_names - {"learning_rate"}:
        assert getattr(spec.grpo, name) == getattr(cfg.train, name), name
    assert (spec.grpo.learning_rate, spec.grpo.proximal_mu) == (0.005, 0.25)  # the node's own, the protocol's
    assert policy_spec(cfg).grpo.learning_rate == cfg.train.learning_rate
    generation = {f.name for f in fields(spec.generation)}
    assert generation <= {f.name for f in fields(cfg.generation)}  # every sampling setting comes from the config
    assert all(getattr(spec.generation, name) == getattr(cfg.generation, name) for name in generation)
    assert (spec.generation.temperature, spec.generation.stop_at_answer) == (0.3, True)
