"""One typed experiment config, built from Flower's flat dotted run-config keys; errors name the offending key.

Every key has a default: the top-level ones here, a core section's in config/sections.py, a protocol's own section's
(pubswap, sapo) in config/catalog.py, where each mode's cross-key checks live too; config/keys.py has the field
and check helpers. pyproject.toml's
[tool.flwr.app.config] lists every key, and `flwr run . -c FILE.toml` or `-c "key=value"` override them. Keys are
`<section>.<field-with-dashes>` (e.g. `train.local-steps`) plus the top-level `num-server-rounds`, `seed` and
`run-name`. Lists are comma-separated strings (Flower's run config holds no lists).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..model_packages import PACKAGED, same_shapes, shape_family
from ..places import resolve_output
from . import catalog
from .keys import (
    INT64_MAX,
    MAX_COMPLETIONS_PER_BATCH,
    PLAIN_COMPONENT,
    ConfigError,
    between,
    is_plain_component,
    opt,
)

# re-exported for modules that import them from config
from .keys import flatten as flatten
from .keys import load_toml as load_toml
from .keys import parse_overrides as parse_overrides
from .sections import MODES as MODES
from .sections import (
    DeployConfig,
    EvalConfig,
    GenerationConfig,
    ModelConfig,
    OutputConfig,
    StrategyConfig,
    TasksConfig,
    TrainConfig,
)


def _run_name(key: str, value: Any) -> None:
    """The server's run name names each node's state folder too: every node refuses one that is not a plain path
    component (node_runtime/state.py:safe_component), so the server refuses it first."""
    if value != "" and not is_plain_component(value):
        raise ConfigError(f"{key} {value!r} is not {PLAIN_COMPONENT}")


def _with_protocol_sections(cls: type) -> type:
    """Each protocol's own section (config/catalog.py: pubswap, sapo) becomes a field of `cls` after `strategy`,
    like the core sections declared on it (the dataclass decorator above it then makes them fields)."""
    annotations = dict(cls.__dict__["__annotations__"])
    added = catalog.sections()
    clash = sorted(set(added) & set(annotations))
    if clash:
        raise ValueError(f"protocol config sections {clash} clash with ExperimentConfig's own fields")
    names = list(annotations)
    at = names.index("strategy") + 1
    cls.__annotations__ = {**{n: annotations[n] for n in names[:at]}, **added,
                           **{n: annotations[n] for n in names[at:]}}
    for name, section in added.items():
        setattr(cls, name, field(default_factory=section))
    return cls


@dataclass(frozen=True)
@_with_protocol_sections
class ExperimentConfig:
    """The run config: the top-level keys, the core sections, and (added by the decorator) each protocol's own
    section, e.g. `cfg.pubswap.tau_swap`; SECTIONS lists them all in order."""

    num_server_rounds: int = opt(10, between(1, 1_000_000))
    seed: int = opt(0, between(0, INT64_MAX))
    run_name: str = opt("", _run_name, "run directory name (default <mode>-s<seed>-<run id>); also names each "
                                       "node's state folder, so one plain path component")
    resume: bool = opt(False, doc="continue the run in output.dir/run-name from its last checkpoint")
    run_claim: str = opt("", doc="set by pubswap run | simulate (leave it empty): the token of their claim on "
                                 "output.dir/run-name, by which the run knows the claim is its own")
    model: ModelConfig = field(default_factory=ModelConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    deploy: DeployConfig = field(default_factory=DeployConfig)
    if TYPE_CHECKING:  # at run time the decorator adds these from catalog.sections(), after `strategy`
        pubswap: catalog.PubSwapConfig = field(default_factory=catalog.PubSwapConfig)
        sapo: catalog.SapoConfig = field(default_factory=catalog.SapoConfig)

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
        """Checks that involve more than one key; those of the run's protocol are its own (config/catalog.py)."""
        if self.resume and not self.run_name:
            raise ConfigError("resume = true needs run-name: the run to continue is output.dir/run-name")
        catalog.validate(self)
        s = self.strategy
        if s.dp_noise_multiplier > 0 and (s.clip_norm <= 0 or s.aggregation != "mean"):
            raise ConfigError("strategy.dp-noise-multiplier > 0 needs strategy.clip-norm > 0 and "
                              "strategy.aggregation = 'mean'")
        if s.aggregation == "trimmed-mean":
            self._check_trim()
        if self.tasks.curriculum:
            self._check_curriculum()
        if self.eval.harder_tier:
            self._check_harder_tier()
        self._check_node_models()
        t = self.train
        if t.prompts_per_step * t.completions_per_prompt > MAX_COMPLETIONS_PER_BATCH:
            raise ConfigError(f"train.prompts-per-step x train.completions-per-prompt = {t.prompts_per_step} x "
                              f"{t.completions_per_prompt}: more than {MAX_COMPLETIONS_PER_BATCH} completions per step")
        dynamic_cap = math.floor(t.prompts_per_step * t.dynamic_sampling_max_factor + 1e-9)
        if t.dynamic_sampling and dynamic_cap * t.completions_per_prompt > MAX_COMPLETIONS_PER_BATCH:
            raise ConfigError(f"train.dynamic-sampling-max-factor = {t.dynamic_sampling_max_factor:g}: up to "
                              f"{dynamic_cap} prompts x train.completions-per-prompt = {t.completions_per_prompt} is "
                              f"more than {MAX_COMPLETIONS_PER_BATCH} completions per step")

    def _check_curriculum(self) -> None:
        """tasks.curriculum: a band low < high, generated tasks that all have a curriculum, a start level in range."""
        from ..tasks import TaskError, parse_custom_tasks, parse_mix
        from ..tasks.curriculum import check_levels

        t = self.tasks
        if t.curriculum_low >= t.curriculum_high:
            raise ConfigError(f"tasks.curriculum-low = {t.curriculum_low} must be below tasks.curriculum-high = "
                              f"{t.curriculum_high}")
        if t.data_paths.strip():
            raise ConfigError("tasks.curriculum = true needs generated tasks: nodes with tasks.data-paths train on "
                              "their files, which have no curriculum levels")
        try:
            check_levels(parse_mix(t.mix, parse_custom_tasks(t.custom)), t.curriculum_start)
        except TaskError as err:
            raise ConfigError(str(err)) from None

    def _check_harder_tier(self) -> None:
        """eval.harder-tier: a server that evaluates a global adapter, generated tasks with a level above the start."""
        from ..tasks import TaskError, parse_custom_tasks, parse_mix
        from ..tasks.curriculum import check_levels

        if not catalog.protocol(self.strategy.mode).averages_adapters:
            raise ConfigError(f"eval.harder-tier = true: {self.strategy.mode} mode has no global adapter for the "
                              f"server to evaluate ({', '.join(catalog.averaging_modes())} have one)")
        if self.eval.data_path:
            raise ConfigError("eval.harder-tier = true needs generated held-out items, not eval.data-path")
        try:
            check_levels(parse_mix(self.tasks.mix, parse_custom_tasks(self.tasks.custom)),
                         self.tasks.curriculum_start + 1, key="eval.harder-tier")
        except TaskError as err:
            raise ConfigError(str(err)) from None

    def _check_node_models(self) -> None:
        """model.node-models in a mode that averages one adapter: every node's frozen base must take model.name's
        adapter (same parameter shapes); their weights may differ (a skilled donor beside the warm model)."""
        mode = self.strategy.mode
        if not catalog.protocol(mode).averages_adapters:
            return
        odd = [n for n in self.model.named if not same_shapes(n, self.model.name)]
        if odd:
            family = [n for n in PACKAGED if same_shapes(n, self.model.name)] or [self.model.name]
            raise ConfigError(f"model.node-models names {', '.join(map(repr, odd))}: strategy.mode = {mode!r} "
                              f"averages one adapter over every node, so each node's base needs the parameter shapes "
                              f"of model.name = {self.model.name!r} ({shape_family(self.model.name)}): one of "
                              f"{', '.join(family)} (sapo and local let nodes run any model)")

    def _check_trim(self) -> None:
        """A trimmed mean of n clients drops floor(trim-fraction x n) values at each end (aggregate.trimmed_mean). The
        number of clients is only known per round, but a round may proceed with strategy.min-clients: at that size
        it must trim at least one value per end, or the 'robust' aggregate is a plain mean."""
        fraction, smallest = self.strategy.trim_fraction, self.strategy.min_clients
        if int(fraction * smallest) >= 1:
            return
        if fraction <= 0:
            raise ConfigError("strategy.aggregation = 'trimmed-mean' with strategy.trim-fraction = 0 trims nothing "
                              "from any round: it is the plain mean; set a trim fraction in (0, 0.5) or use 'mean'")
        needed = max(1, math.ceil(1 / fraction))
        while int(fraction * needed) < 1:  # as aggregate.trimmed_mean rounds
            needed += 1
        raise ConfigError(
            f"strategy.aggregation = 'trimmed-mean' with strategy.trim-fraction = {fraction} trims nothing from a "
            f"round of strategy.min-clients = {smallest} clients: n clients lose floor({fraction} x n) at each end, "
            f"which is 0 for n < {needed}. Set strategy.min-clients >= {needed}"
            + (f" or strategy.trim-fraction >= 1/{smallest}" if smallest >= 3 else "")
            + " (or aggregate with 'median', which needs 3 clients to differ from the mean)")

    # -- derived ---------------------------------------------------------------------------------------------
    def run_dir(self, run_id: int | str) -> Path:
        """Absolute run directory (Flower never changes directory, so relative paths are resolved here)."""
        name = self.run_name or f"{self.strategy.mode}-s{self.seed}-{run_id}"
        return resolve_output(self.output.dir) / name


# every section, name -> dataclass, in field order: the core ones and the protocols' own
SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(ExperimentConfig)  # type: ignore[misc]
                             if f.default_factory is not MISSING}


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
        try:
            converted = float(value)
        except OverflowError:
            converted = math.inf
        if not math.isfinite(converted):
            raise ConfigError(f"{key} = {value!r}: must be a finite number")
        return converted
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r}: must be a string")
    return value


def key_table() -> dict[str, tuple[str, str, Any]]:
    """Flat key -> (section or "", attribute, dataclass field)."""
    table: dict[str, tuple[str, str, Any]] = {}
    for spec in fields(ExperimentConfig):
        if spec.name in SECTIONS:
            for sub in fields(SECTIONS[spec.name]):
                key = f"{spec.name}.{sub.metadata.get('key') or sub.name.replace('_', '-')}"
                table[key] = (spec.name, sub.name, sub)
        else:
            table[spec.name.replace("_", "-")] = ("", spec.name, spec)
    return table


def describe() -> list[tuple[str, Any, str]]:
    """(key, default, doc) for every key, in declaration order (docs/pyproject generation and `pubswap keys`)."""
    defaults = ExperimentConfig().to_flat()
    return [(key, defaults[key], spec.metadata.get("doc", "")) for key, (_s, _a, spec) in key_table().items()]


def key_choices() -> dict[str, tuple[str, ...]]:
    """The allowed values of every choice key (those checked with one_of), e.g. strategy.mode -> (fedavg, ...)."""
    return {key: spec.metadata["check"].choices for key, (_s, _a, spec) in key_table().items()
            if hasattr(spec.metadata.get("check"), "choices")}


def replace_section(config: ExperimentConfig, section: str, **changes: Any) -> ExperimentConfig:
    return replace(config, **{section: replace(getattr(config, section), **changes)})
