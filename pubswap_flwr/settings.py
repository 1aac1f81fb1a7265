"""The policy's sampling, update and evaluation settings, as plain dataclasses light enough for the config to import:
their defaults are the run config's (config/sections.py's generation.* and train.* keys take theirs from here, and
shared.settings_from builds both from a run's config by field name), so each default is written once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_prompt_tokens: int = 256
    sampler: str = "cached"
    dtype: str = "auto"  # the sampling copy's precision (policy.sampling_precision)
    stop_at_answer: bool = False  # cached sampler: EOS right after a completion closes its </answer>
    decode_step: bool = True  # cached sampler: policy/decode_step.py's forward for Llama and Qwen2 models
    compile_step: bool = False  # that decode step's elementwise kernels through torch.compile


@dataclass(frozen=True)
class EvalSettings:
    """How a held-out evaluation samples (eval.sampled, eval.samples, eval.batch-size, eval.lenient, eval.workers; the
    run's seed; generation.max-completion-chars): shared.eval_settings builds it from a run's config."""

    sampled: bool = True
    samples: int = 1
    batch_size: int = 256
    seed: int = 0
    max_chars: int = 4096
    lenient: bool = False
    workers: int = 1  # sampling calls at once, one torch thread each: 0 = one per torch thread of the process


@dataclass(frozen=True)
class GRPOSettings:
    learning_rate: float = 2e-3
    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    kl_beta: float = 0.0
    inner_iterations: int = 1
    micro_batch_size: int = 64
    recompute_layers: bool = True  # grpo_loss.completion_logps: the chunked path's completion layers recomputed
    update_dtype: str = "auto"  # grpo_loss.completion_logps: "bfloat16" runs the update's passes under autocast;
    # "auto": GRPOLearner resolves it (policy.update_precision)
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9  # not run-config keys: TRL's defaults
    adam_beta2: float = 0.99
    proximal_mu: float = 0.0  # FedProx's term: the protocol's, not a train.* key
    scale_rewards: str = "group"
    mask_truncated_completions: bool = False
    foreign_correction: str = "none"
    foreign_weight: float = 0.5
    is_cap: float = 2.0
