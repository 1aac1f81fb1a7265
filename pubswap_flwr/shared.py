"""What the server and every node derive identically from the run config alone: the task universe (held-out set,
public set, every task spec), the policy spec, and seeds."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .config import ExperimentConfig
from .config.sections import EvalConfig, GenerationConfig, ModelConfig, TasksConfig, TrainConfig
from .policy import GenerationSettings, GRPOSettings, LoraSettings, PolicySpec
from .policy.data import ModelError, data_dir
from .policy.sampling import stream_seed
from .settings import EvalSettings
from .tasks import HeldOutSet, PublicSet, load_items, parse_custom_tasks, parse_mix
from .tasks.curriculum import at_level
from .tasks.items import max_question_chars
from .tasks.splits import question_key

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


@dataclass
class TaskUniverse:
    tasks: list  # every TaskSpec named anywhere in the run (index = seed-range slot)
    held_out: HeldOutSet
    public: PublicSet
    harder: HeldOutSet | None = None  # eval.harder-tier: tasks.mix's tasks one curriculum level above the start

    @property
    def training_exclude(self) -> set[str]:
        """Question keys (tasks.splits.question_key) no private stream may contain: held-out (both tiers) and public
        ones."""
        harder = self.harder.questions if self.harder is not None else set()
        return self.held_out.questions | harder | {question_key(item.question) for item in self.public.items}


def resolve_data_path(path: str) -> Path:
    """A data file path: absolute, or relative to the working directory or to the project (data/samples/...)."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        tried = [candidate]
    else:
        tried = [Path.cwd() / candidate]
        try:
            tried.append(data_dir().parent / candidate)
        except ModelError:
            pass
    for option in tried:
        if option.is_file():
            return option.resolve()
    raise FileNotFoundError(f"data file {path!r} not found (looked in: {', '.join(str(t) for t in tried)})")


# parameters: the hashable config values a task universe depends on (its lru_cache key)
@lru_cache(maxsize=4)
def _universe(mix: str, public_mix: str, custom: str, per_task: int, public_size: int, data_seed: int,
              node_mixes_text: str, eval_path: str, data_format: str, max_prompt_tokens: int = 256,
              supervised: frozenset[str] = frozenset(), harder_level: int | None = None) -> TaskUniverse:
    """`supervised`: question keys the run's models were fine-tuned on before any run (warm-ups), never held out.
    `harder_level`: eval.harder-tier's curriculum level, None without it."""
    custom_specs = parse_custom_tasks(custom)
    tasks = parse_mix(mix, custom_specs)
    mixed = list(tasks)
    names = [t.name for t in tasks]
    extra = []
    for text, key in [(public_mix, "pubswap.public-mix")] + [(m, "tasks.node-mixes") for m in
                                                             node_mixes_text.split(";")]:
        if text.strip():
            for spec in parse_mix(text, custom_specs, key=key):
                if spec.name not in names:
                    names.append(spec.name)
                    extra.append(spec)
    tasks = tasks + extra
    if eval_path:
        held_out = HeldOutSet(load_items(resolve_data_path(eval_path), fmt=data_format, uid_prefix="eval",
                                         max_question=max_question_chars(max_prompt_tokens)))
    else:
        held_out = HeldOutSet.build(tasks, per_task, data_seed, exclude=supervised)
    public_tasks = parse_mix(public_mix, custom_specs, key="pubswap.public-mix") if public_mix.strip() else tasks[
        : len(tasks) - len(extra)]
    harder = None
    if harder_level is not None:  # disjoint from the held-out tier: its own seed ranges, its questions left out
        harder = HeldOutSet.build([at_level(spec, harder_level) for spec in mixed], per_task, data_seed,
                                  exclude=supervised | held_out.questions, split="harder",
                                  indices=[names.index(spec.name) for spec in mixed])
    held = held_out.questions | (harder.questions if harder is not None else set())
    public = PublicSet.build(public_tasks, tasks, public_size, held, data_seed, seed=data_seed)
    return TaskUniverse(tasks, held_out, public, harder)


def task_universe(cfg: ExperimentConfig) -> TaskUniverse:
    names = cfg.model.named
    return _universe(cfg.tasks.mix, cfg.pubswap.public_mix, cfg.tasks.custom, cfg.eval.items_per_task,
                     cfg.pubswap.public_size, cfg.tasks.data_seed, cfg.tasks.node_mixes, cfg.eval.data_path,
                     cfg.eval.data_format or cfg.tasks.data_format, cfg.generation.max_prompt_tokens,
                     supervised_questions(tuple(sorted(set(names)))),
                     cfg.tasks.curriculum_start + 1 if cfg.eval.harder_tier else None)


@lru_cache(maxsize=8)
def supervised_questions(model_names: tuple[str, ...]) -> frozenset[str]:
    """The question keys any of these models was fine-tuned on before RL: the source items of a packaged model's
    adapter and of every base below it (a warm-up's: warmup.supervised_questions; a donor's, on the warm model:
    donor.supervised_questions). The embedded models' supervised pool left out tasks.data-seed 0's held-out and
    public questions when it was built (tiny.py), so their runs are clean at data seed 0 only (docs/guide.md,
    Models)."""
    from .donor import supervised_questions as donor_questions
    from .policy.packaged import PACKAGED
    from .warmup import supervised_questions as warmup_questions

    readers = {"warmup": warmup_questions, "donor": donor_questions}
    keys: set[str] = set()
    for name in model_names:
        packaged = PACKAGED.get(name)
        while packaged is not None and packaged.adapter:
            keys |= readers[packaged.builder](data_dir() / "models" / packaged.adapter / "build.json")
            packaged = PACKAGED.get(packaged.base or "")
    return frozenset(keys)


def settings_from(section: Any, settings: type[T], **overrides: Any) -> T:
    """A `settings` dataclass (GRPOSettings, GenerationSettings) with every field the config `section` has by the
    same name, then `overrides`: each setting is declared once, in the config, and a field of neither keeps the
    dataclass's own default (adam_beta1, ...)."""
    names = {f.name for f in fields(settings)}
    values = {f.name: getattr(section, f.name) for f in fields(section) if f.name in names}
    return settings(**{**values, **overrides})


class PolicySections(Protocol):
    """The config sections a policy is built from: a run's ExperimentConfig, or a node's NodeSettings."""

    @property
    def model(self) -> ModelConfig: ...

    @property
    def generation(self) -> GenerationConfig: ...

    @property
    def train(self) -> TrainConfig: ...

    @property
    def tasks(self) -> TasksConfig: ...


def policy_spec(cfg: PolicySections, model_name: str | None = None, proximal_mu: float = 0.0,
                learning_rate: float | None = None) -> PolicySpec:
    """The policy a node (or the server's evaluator) builds; `proximal_mu` is the protocol's FedProx term,
    `learning_rate` the node's own (train.node-learning-rates, node-config learning-rate) over train.learning-rate."""
    t = cfg.train
    return PolicySpec(
        model_name=model_name or cfg.model.name,
        dtype=cfg.model.dtype,
        device=cfg.model.device,
        lora=LoraSettings(cfg.model.lora_r, cfg.model.lora_alpha, cfg.model.lora_dropout, cfg.model.lora_targets),
        generation=settings_from(cfg.generation, GenerationSettings),
        grpo=settings_from(t, GRPOSettings, learning_rate=learning_rate or t.learning_rate, proximal_mu=proximal_mu),
        template=cfg.tasks.template,
    )


def eval_settings(evaluation: EvalConfig, generation: GenerationConfig, seed: int, **overrides: Any) -> EvalSettings:
    """How a held-out evaluation of this run samples: its eval.* keys, the run's seed and the completion cap
    (`overrides`: a caller's own, e.g. verify's samples and batch size)."""
    return EvalSettings(**{"sampled": evaluation.sampled, "samples": evaluation.samples, "batch_size":
                           evaluation.batch_size, "seed": seed, "max_chars": generation.max_completion_chars,
                           "lenient": evaluation.lenient, "workers": evaluation.workers, **overrides})


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from `parts`, the same on every machine (policy.sampling.stream_seed)."""
    return stream_seed(*parts)
