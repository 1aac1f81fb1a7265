"""The policy: a causal LM with a LoRA adapter that samples completions and learns from rollout groups."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from ..model_packages import prompt_format_of
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
from .precision import AUTO_LOW_PRECISION_PARAMETERS as AUTO_LOW_PRECISION_PARAMETERS
from .precision import native_bf16 as native_bf16
from .precision import sampling_precision as sampling_precision
from .precision import update_precision as update_precision
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
            # a bfloat16 update multiplies by the LM head in bfloat16 anyway: the frozen embedding is held once
            share = self.sampling_dtype == torch.bfloat16 and update_precision(
                spec.grpo.update_dtype, spec.dtype, self.model, self.device) == "bfloat16"
            self.sampler = LowPrecisionSampling(self.model, self.sampling_dtype, share_embeddings=share)
            self.sampling_model = self.sampler.copy
        self.learner = GRPOLearner(self.model, self.tokenizer, spec.grpo, spec.generation)
        memory.release()  # loading's temporaries (GGUF de-quantization, state dicts) back to the system
        self.formatter = PromptFormatter(self.tokenizer, spec.template, prompt_format_of(spec.model_name))

    @property
    def shared_parameters(self) -> int:
        """Frozen parameters the training model reads from the sampling copy (held once, in its precision)."""
        return self.sampler.shared_parameters if isinstance(self.sampler, LowPrecisionSampling) else 0

    @property
    def update_dtype(self) -> str:
        """The update's precision, train.update-dtype resolved ("float32" or "bfloat16")."""
        return self.learner.settings.update_dtype

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
    def prompts(self, items: Sequence[TaskItem], examples: Sequence[TaskItem] = ()) -> list[str]:
        return [self.formatter(item, examples) for item in items]

    @property
    def can_mix_greedy(self) -> bool:
        """Whether `sample(..., greedy_first=n)` can decode greedy and sampled completions of a prompt together."""
        return self.spec.generation.sampler == "cached"

    def sample(self, items: Sequence[TaskItem], k: int, *, greedy: bool = False, with_logprobs: bool = True,
               greedy_first: int = 0, item_seeds: Sequence[int] | None = None,
               examples: Sequence[TaskItem] = ()) -> list[list[Sample]]:
        """k completions of each item (sampling.generate; `item_seeds`: its prompt_seeds, one per item; `examples`:
        solved items shown before each prompt, plain-format models only: PromptFormatter)."""
        with self.sampler.merged():
            return self._sample_merged(items, k, greedy=greedy, with_logprobs=with_logprobs,
                                       greedy_first=greedy_first, item_seeds=item_seeds, examples=examples)

    def _sample_merged(self, items: Sequence[TaskItem], k: int, *, greedy: bool = False, with_logprobs: bool = True,
                       greedy_first: int = 0, item_seeds: Sequence[int] | None = None,
                       examples: Sequence[TaskItem] = ()) -> list[list[Sample]]:
        return generate(self.sampling_model, self.tokenizer, self.prompts(items, examples), num_return=k,
                        settings=self.spec.generation, greedy=greedy, with_logprobs=with_logprobs,
                        greedy_first=greedy_first, prompt_seeds=item_seeds,
                        stop_text=self.formatter.next_question)

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
