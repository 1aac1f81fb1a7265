"""One typed experiment config, built from Flower's flat dotted run-config keys; errors name the offending key.

Every key has a default here; pyproject.toml's [tool.flwr.app.config] lists them all, and `flwr run . -c FILE.toml`
or `-c "key=value"` override them. Keys are `<section>.<field-with-dashes>` (e.g. `train.local-steps`) plus the
top-level `num-server-rounds`, `seed` and `run-name`. Lists are comma-separated strings (Flower's run config holds
no lists).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

MODES = ("fedavg", "fedprox", "pubswap", "sapo")
SWAP_RULES = ("balanced", "random", "none")
AGGREGATORS = ("mean", "median", "trimmed-mean")
OUTPUT_ROOT_ENV = "PUBSWAP_OUTPUT_ROOT"


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


device_name = _check(lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
                     "auto, cpu, cuda, cuda:N or mps")


def one_of(*choices: str) -> Check:
    return _check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


def opt(default: Any, check: Check | None = None, doc: str = "", key: str | None = None) -> Any:
    return field(default=default, metadata={"check": check, "doc": doc, "key": key})


@dataclass(frozen=True)
class ModelConfig:
    name: str = opt("embedded:tiny", doc="embedded:<name> (data/models), a local HF model directory, or a Hub id")
    dtype: str = opt("float32", one_of("float32", "bfloat16", "float16"))
    device: str = opt("auto", device_name, "auto (cuda when torch sees a GPU, else cpu), cpu, cuda, cuda:N or mps")
    lora_r: int = opt(16, positive)
    lora_alpha: int = opt(32, positive)
    lora_dropout: float = opt(0.0, below_half)
    lora_targets: str = opt("all-linear", doc="all-linear, or comma-separated module names")
    node_models: str = opt("", doc="simulation: comma-separated model names assigned to partitions round robin")


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = opt(16, positive)
    temperature: float = opt(1.0, positive)
    top_k: int = opt(0, non_negative, "0 = no top-k filter")
    top_p: float = opt(1.0, fraction)
    max_prompt_tokens: int = opt(256, positive)
    max_completion_chars: int = opt(4096, positive, "longer completions get reward 0")


@dataclass(frozen=True)
class TrainConfig:
    learning_rate: float = opt(2e-3, positive)
    local_steps: int = opt(15, at_least_one, "tau: GRPO steps per client per round")
    prompts_per_step: int = opt(8, at_least_one)
    completions_per_prompt: int = opt(8, at_least_two, "K (GRPO group size)")
    loss_type: str = opt("dapo", one_of("dapo", "grpo"))
    epsilon_low: float = opt(0.2, below_one)
    epsilon_high: float = opt(0.28, non_negative)
    kl_beta: float = opt(0.0, non_negative)
    inner_iterations: int = opt(1, at_least_one, "mu: optimizer steps per rollout batch")
    micro_batch_size: int = opt(64, at_least_one)
    max_grad_norm: float = opt(1.0, non_negative, "0 = no clipping")
    weight_decay: float = opt(0.0, non_negative)
    reset_optimizer: bool = opt(False, doc="reset Adam moments when a new global adapter arrives")


@dataclass(frozen=True)
class TasksConfig:
    mix: str = opt("basic_arithmetic:1,gcd:1,count_bits:1,fraction_simplification:1,spell_backward:2",
                   doc="name:weight,... over presets, tasks.custom entries or rg:<generator>")
    per_node: int = opt(2, non_negative, "non-IID: tasks per node (consecutive, round robin); 0 = every task")
    node_mixes: str = opt("", doc="explicit per-partition mixes separated by ';' (overrides per-node)")
    custom: str = opt("", doc='JSON {"name": {"generator": ..., "config": {...}}}')
    data_seed: int = opt(0, non_negative)
    template: str = opt("auto", one_of("auto", "plain", "math", "mc"))
    data_paths: str = opt("", doc="simulation: comma-separated JSONL/parquet files assigned to partitions round "
                               "robin (deployment: node-config data-path)")
    data_format: str = opt("generic", doc="row format of node data files")


@dataclass(frozen=True)
class EvalConfig:
    every: int = opt(1, non_negative, "evaluate the global adapter every N rounds (0 = only round 0 and last)")
    items_per_task: int = opt(100, at_least_one)
    sampled: bool = opt(True, doc="also report sampled (T=1) accuracy/reward, which RL moves first")
    samples: int = opt(4, at_least_one, "T=1 samples per held-out item: sampled pass@1 and reward average them "
                                        "(standard errors over items are reported)")
    batch_size: int = opt(256, at_least_one)
    data_path: str = opt("", doc="JSONL/parquet file used as the held-out set instead of generated task items")
    data_format: str = opt("", doc="row format of eval.data-path (empty = tasks.data-format)")


@dataclass(frozen=True)
class StrategyConfig:
    mode: str = opt("fedavg", one_of(*MODES))
    proximal_mu: float = opt(0.01, non_negative, "FedProx mu (used by fedprox, and pubswap with base fedprox)")
    fraction_train: float = opt(1.0, fraction)
    min_clients: int = opt(2, at_least_one, "a round proceeds when at least this many clients replied")
    timeout: float = opt(3600.0, positive, "seconds to wait for replies on every exchange")
    aggregation: str = opt("mean", one_of(*AGGREGATORS))
    trim_fraction: float = opt(0.2, below_half, "trimmed-mean: fraction cut at each end")
    clip_norm: float = opt(0.0, non_negative, "clip each client's update norm before aggregating (0 = off)")
    dp_noise_multiplier: float = opt(0.0, non_negative, "central DP: Gaussian noise std = this x clip-norm / clients "
                                                        "(0 = off; needs clip-norm > 0 and aggregation mean)")


@dataclass(frozen=True)
class PubSwapConfig:
    swap: str = opt("balanced", one_of(*SWAP_RULES), "balanced or random (the paper's rules); none: public steps on "
                                                     "the client's own responses only (an ablation)")
    tau_swap: int = opt(5, at_least_one, "every tau_swap-th local step is a public step")
    public_prompts: int = opt(4, at_least_one, "public prompts per public step")
    public_size: int = opt(200, at_least_one)
    public_mix: str = opt("", doc="task mix of the public set (empty = tasks.mix)")
    correct_threshold: float = opt(1.0, fraction, "a response is correct when its reward >= this")
    base: str = opt("fedavg", one_of("fedavg", "fedprox"))


@dataclass(frozen=True)
class SapoConfig:
    local: int = opt(4, non_negative, "I: local rollout groups trained per round")
    external: int = opt(4, non_negative, "J: external rollout groups trained per round")
    sharing: str = opt("local", one_of("local", "fixed"), "local: a node samples B = I questions per round and shares "
                                                          "those I groups (the paper); fixed: it samples sapo.questions "
                                                          "and shares sapo.share of them whatever I is")
    questions: int = opt(8, at_least_one, "B with sapo.sharing = fixed: questions sampled per node per round")
    completions: int = opt(8, at_least_two, "L: completions per question")
    share: int = opt(8, non_negative, "with sapo.sharing = fixed: groups each node shares per round")
    async_mode: bool = opt(False, doc="one message per round, training on the previous round's pool", key="async")
    verify_provenance: bool = opt(True, doc="regenerate reasoning-gym packets from their provenance and drop "
                                            "forged ones")
    reputation: bool = opt(False, doc="sample external groups in proportion to each sender's verification record")


@dataclass(frozen=True)
class OutputConfig:
    dir: str = opt("runs", doc=f"run outputs root; relative paths resolve against ${OUTPUT_ROOT_ENV} or the cwd")
    save_every: int = opt(1, non_negative, "save the global adapter every N rounds (the final one always)")


SECTIONS = {
    "model": ModelConfig,
    "generation": GenerationConfig,
    "train": TrainConfig,
    "tasks": TasksConfig,
    "eval": EvalConfig,
    "strategy": StrategyConfig,
    "pubswap": PubSwapConfig,
    "sapo": SapoConfig,
    "output": OutputConfig,
}


@dataclass(frozen=True)
class ExperimentConfig:
    num_server_rounds: int = opt(10, at_least_one)
    seed: int = opt(0, non_negative)
    run_name: str = opt("", doc="run directory name (default <mode>-s<seed>-<run id>)")
    resume: bool = opt(False, doc="continue the run in output.dir/run-name from its last checkpoint")
    model: ModelConfig = field(default_factory=ModelConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    pubswap: PubSwapConfig = field(default_factory=PubSwapConfig)
    sapo: SapoConfig = field(default_factory=SapoConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    # -- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_flat(cls, flat: Mapping[str, Any]) -> "ExperimentConfig":
        """Build from Flower's flat run config; unknown keys and bad values raise ConfigError naming the key."""
        known = key_table()
        values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        top: dict[str, Any] = {}
        for key, value in flat.items():
            if key not in known:
                close = difflib.get_close_matches(key, list(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown config key {key!r}{hint}")
            section, attr, spec = known[key]
            converted = _convert(key, value, spec.type if isinstance(spec.type, type) else _TYPES[spec.type])
            check = spec.metadata.get("check")
            if check is not None:
                check(key, converted)
            (values[section] if section else top)[attr] = converted
        config = cls(**top, **{name: SECTIONS[name](**values[name]) for name in SECTIONS})
        config.validate()
        return config

    def with_overrides(self, flat: Mapping[str, Any]) -> "ExperimentConfig":
        return ExperimentConfig.from_flat({**self.to_flat(), **flat})

    def to_flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, (section, attr, _spec) in key_table().items():
            out[key] = getattr(getattr(self, section), attr) if section else getattr(self, attr)
        return out

    def validate(self) -> None:
        """Checks that involve more than one key."""
        if self.resume and not self.run_name:
            raise ConfigError("resume = true needs run-name: the run to continue is output.dir/run-name")
        if self.strategy.mode == "pubswap" and self.pubswap.tau_swap > self.train.local_steps:
            raise ConfigError(f"pubswap.tau-swap = {self.pubswap.tau_swap} exceeds train.local-steps = "
                              f"{self.train.local_steps}: no public step would run")
        if self.strategy.mode == "sapo":
            if self.sapo.local + self.sapo.external == 0:
                raise ConfigError("sapo.local + sapo.external must be >= 1")
            if self.sapo.sharing == "fixed" and self.sapo.local > self.sapo.questions:
                raise ConfigError(f"sapo.local = {self.sapo.local} exceeds sapo.questions = {self.sapo.questions}")
            if self.sapo.sharing == "fixed" and self.sapo.share > self.sapo.questions:
                raise ConfigError(f"sapo.share = {self.sapo.share} exceeds sapo.questions = {self.sapo.questions}")
        if self.strategy.dp_noise_multiplier > 0 and (self.strategy.clip_norm <= 0 or self.strategy.aggregation != "mean"):
            raise ConfigError("strategy.dp-noise-multiplier > 0 needs strategy.clip-norm > 0 and "
                              "strategy.aggregation = 'mean'")
        if self.strategy.aggregation != "mean" and self.strategy.mode == "sapo":
            raise ConfigError("strategy.aggregation applies to adapter averaging; sapo mode averages nothing")

    # -- derived ---------------------------------------------------------------------------------------------
    def run_dir(self, run_id: int | str) -> Path:
        """Absolute run directory (Flower never changes directory, so relative paths are resolved here)."""
        root = Path(self.output.dir).expanduser()
        if not root.is_absolute():
            root = Path(os.environ.get(OUTPUT_ROOT_ENV) or os.getcwd()) / root
        name = self.run_name or f"{self.strategy.mode}-s{self.seed}-{run_id}"
        return root.resolve() / name


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _convert(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} = {value!r}: must be true or false")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key} = {value!r}: must be an integer")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} = {value!r}: must be a number")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r}: must be a string")
    return value


def key_table() -> dict[str, tuple[str, str, Any]]:
    """Flat key -> (section or "", attribute, dataclass field)."""
    table: dict[str, tuple[str, str, Any]] = {}
    for spec in fields(ExperimentConfig):
        if spec.name in SECTIONS:
            for sub in fields(SECTIONS[spec.name]):
                table[f"{spec.name}.{sub.metadata.get('key') or sub.name.replace('_', '-')}"] = (spec.name, sub.name, sub)
        else:
            table[spec.name.replace("_", "-")] = ("", spec.name, spec)
    return table


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


def describe() -> list[tuple[str, Any, str]]:
    """(key, default, doc) for every key, in declaration order (README/pyproject generation and `pubswap keys`)."""
    defaults = ExperimentConfig().to_flat()
    return [(key, defaults[key], spec.metadata.get("doc", "")) for key, (_s, _a, spec) in key_table().items()]


def replace_section(config: ExperimentConfig, section: str, **changes: Any) -> ExperimentConfig:
    return replace(config, **{section: replace(getattr(config, section), **changes)})
