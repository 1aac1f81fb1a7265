"""The policy: a causal LM with a LoRA adapter that samples completions and learns from rollout groups."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import torch

from ..rollouts import RolloutGroup
from ..tasks import PromptFormatter, TaskItem
from . import memory
from .grpo import GRPOLearner, GRPOSettings, UpdateStats
from .lora import (
    LoraSettings,
    LowPrecisionSampling,
    MergedSampling,
    adapter_state,
    attach_lora,
    from_wire,
    load_adapter_state,
    to_wire,
)
from .model import _DTYPES, ModelError, load_causal_lm, load_tokenizer, resolve_device, resolve_model
from .sampling import GenerationSettings, Sample, generate

__all__ = [
    "GRPOSettings",
    "GenerationSettings",
    "LoraSettings",
    "ModelError",
    "Policy",
    "PolicySpec",
    "Sample",
    "UpdateStats",
    "from_wire",
    "to_wire",
]


@dataclass(frozen=True)
class PolicySpec:
    model_name: str = "embedded:tiny"
    dtype: str = "float32"
    device: str = "cpu"  # a model.device value; "auto" resolves where the policy is built
    lora: LoraSettings = LoraSettings()
    generation: GenerationSettings = GenerationSettings()
    grpo: GRPOSettings = GRPOSettings()
    template: str = "auto"


class Policy:
    """Base model + LoRA adapter + optimizer; samples with the adapter merged and updates with GRPO."""

    def __init__(self, spec: PolicySpec):
        self.spec = spec
        memory.limit_retention()  # before the model's tensors are allocated
        self.location = resolve_model(spec.model_name)
        self.device = resolve_device(spec.device)
        self.tokenizer = load_tokenizer(self.location)
        # peft creates the LoRA layers on the device of the layer they wrap, so the base model moves first
        self.model = attach_lora(load_causal_lm(self.location, spec.dtype, self.device), spec.lora)
        # peft draws LoRA A from the global generator: the same adapter in every process until reset() (a benchmark
        # that never resets saw different gradient norms from identical tokens)
        initial_adapter(self.model, LORA_INIT_SEED)
        self.model.eval()
        self.sampling_dtype = sampling_precision(spec.generation.dtype, spec.dtype, self.model, self.device)
        self.sampler: MergedSampling | LowPrecisionSampling
        if self.sampling_dtype == _DTYPES[spec.dtype]:
            self.sampler = MergedSampling(self.model)
            self.sampling_model = self.model
        else:
            self.sampler = LowPrecisionSampling(self.model, self.sampling_dtype)
            self.sampling_model = self.sampler.copy
        self.update_dtype = update_precision(spec.grpo.update_dtype, spec.dtype, self.model, self.device)
        grpo = spec.grpo if spec.grpo.update_dtype == self.update_dtype else replace(spec.grpo,
                                                                                     update_dtype=self.update_dtype)
        self.learner = GRPOLearner(self.model, self.tokenizer, grpo, spec.generation)
        memory.release()  # loading's temporaries (GGUF de-quantization, state dicts) back to the system
        self.formatter = PromptFormatter(self.tokenizer, spec.template)

    # -- adapter ---------------------------------------------------------------------------------------------
    def adapter(self) -> dict[str, torch.Tensor]:
        return adapter_state(self.model)

    def load_adapter(self, state: dict[str, torch.Tensor]) -> None:
        load_adapter_state(self.model, state)

    def reset(self, seed: int = 0) -> None:
        """A freshly initialised adapter (LoRA A random from `seed`, B zero) and an empty optimizer."""
        initial_adapter(self.model, seed)
        self.learner.reset_optimizer()

    # -- sampling --------------------------------------------------------------------------------------------
    def prompts(self, items: Sequence[TaskItem]) -> list[str]:
        return [self.formatter(item) for item in items]

    @property
    def can_mix_greedy(self) -> bool:
        """Whether `sample(..., greedy_first=n)` can decode greedy and sampled completions of a prompt together."""
        return self.spec.generation.sampler == "cached"

    def sample(self, items: Sequence[TaskItem], k: int, *, greedy: bool = False, with_logprobs: bool = True,
               greedy_first: int = 0, item_seeds: Sequence[int] | None = None) -> list[list[Sample]]:
        """k completions of each item (sampling.generate; `item_seeds`: its prompt_seeds, one per item)."""
        with self.sampler.merged():
            return self._sample_merged(items, k, greedy=greedy, with_logprobs=with_logprobs,
                                       greedy_first=greedy_first, item_seeds=item_seeds)

    def _sample_merged(self, items: Sequence[TaskItem], k: int, **options) -> list[list[Sample]]:
        return generate(self.sampling_model, self.tokenizer, self.prompts(items), num_return=k,
                        settings=self.spec.generation, greedy=options.get("greedy", False),
                        with_logprobs=options.get("with_logprobs", True),
                        greedy_first=options.get("greedy_first", 0), prompt_seeds=options.get("item_seeds"))

    @contextlib.contextmanager
    def concurrent_sampling(self) -> Iterator[Callable[..., list[list[Sample]]]]:
        """`sample` for calls from several threads at once: the adapter merged once around them all (merging per
        call would race), each call as `sample(items, k, **options)`. The caller runs the threads and sizes their
        torch threads."""
        with self.sampler.merged():
            yield self._sample_merged

    @property
    def has_item_streams(self) -> bool:
        """Whether `sample(..., item_seeds=...)` can draw each item's samples from streams of its own."""
        return self.spec.generation.sampler == "cached"

    # -- learning --------------------------------------------------------------------------------------------
    def update(self, groups: Sequence[RolloutGroup], proximal_reference: dict[str, torch.Tensor] | None = None,
               proximal_mu: float | None = None) -> UpdateStats:
        stats = self.learner.update(groups, proximal_reference, proximal_mu)
        memory.release()  # the update's activations, freed, would otherwise stay with the process until the next one
        return stats


LORA_INIT_SEED = 0  # the adapter a Policy starts with, before any reset(seed)
AUTO_LOW_PRECISION_PARAMETERS = 50_000_000  # below this, sampling is bound by per-step overheads, not weight reads


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matrix products natively (CPU: AVX512-BF16 or AMX; CUDA: Ampere or newer)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def sampling_precision(setting: str, model_dtype: str, model, device: torch.device) -> torch.dtype:
    """`generation.dtype`: an explicit dtype, or for "auto" bfloat16 when the model has at least 50M parameters, is
    trained in float32 and the device has native bf16; else the model's own dtype. Measured on SmolLM2-135M (2-core
    CPU with AVX512-BF16): a decode step takes 0.041 s in bf16 against 0.069 s in fp32 (benchmarks/real_model.py);
    the embedded 0.85M model's steps are overhead-bound and gain nothing."""
    if setting != "auto":
        if setting not in _DTYPES:
            raise ValueError(f"generation.dtype must be auto or one of {', '.join(_DTYPES)}, got {setting!r}")
        return _DTYPES[setting]
    own = _DTYPES[model_dtype]
    if own != torch.float32 or not native_bf16(device):
        return own
    size = sum(p.numel() for p in model.parameters())
    return torch.bfloat16 if size >= AUTO_LOW_PRECISION_PARAMETERS else own


def update_precision(setting: str, model_dtype: str, model, device: torch.device) -> str:
    """`train.update-dtype`: "float32" or "bfloat16" as given, or for "auto" bfloat16 where `sampling_precision`'s
    auto picks it (a float32 model of 50M parameters or more on a device with native bf16), else float32. Chosen by
    benchmarks/real_model.py part 8 (SmolLM2, one client's update at configs/real.toml's micro-batch, layers
    recomputed): bfloat16 1.31-1.41x float32 at a peak of 2231 against 2011 MiB."""
    if setting != "auto":
        return setting
    return "bfloat16" if sampling_precision("auto", model_dtype, model, device) == torch.bfloat16 else "float32"


def initial_adapter(model, seed: int) -> None:
    """Re-initialise every LoRA layer deterministically: the same seed gives the same adapter in any process and on
    any device (the random draws are always made on the CPU, so a GPU client and a CPU server agree)."""
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        for module in model.modules():
            if hasattr(module, "reset_lora_parameters") and hasattr(module, "lora_A"):
                for name in module.lora_A.keys():
                    lora_a, lora_b = module.lora_A[name].weight, module.lora_B[name].weight
                    if lora_a.device.type == "cpu":
                        module.reset_lora_parameters(name, True)
                        continue
                    # peft's default init (kaiming-uniform A, zero B), drawn from the CPU generator
                    draw = torch.empty(lora_a.shape, dtype=torch.float32)
                    torch.nn.init.kaiming_uniform_(draw, a=math.sqrt(5))
                    with torch.no_grad():
                        lora_a.copy_(draw)
                        lora_b.zero_()
    finally:
        torch.set_rng_state(state)


_CACHE: dict[PolicySpec, Policy] = {}
_CACHE_SIZE = 3  # a simulation actor may serve nodes with different models (heterogeneous SAPO swarms)


def cached_policy(spec: PolicySpec) -> Policy:
    """One Policy per spec per process (Flower simulation reuses actors across nodes); load node state on it."""
    policy = _CACHE.pop(spec, None) or Policy(spec)
    _CACHE[spec] = policy  # most recently used last
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    return policy
