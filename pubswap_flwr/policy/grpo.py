"""GRPO/DAPO update on rollout groups from any source, over the LoRA parameters.

Semantics follow TRL 1.16 `GRPOTrainer._compute_loss` (tests/unit/test_grpo_oracle.py checks loss and gradients against
it): group advantages (r - mean) / (std + 1e-4) with the unbiased std over own + foreign members; per-token ratio
clipped to [1 - eps_low, 1 + eps_high]; "dapo" normalises the token sum by the number of active tokens in the groups
trained, "grpo" averages per sequence then over the groups' sequences (without a KL term a group whose rewards all agree
is not trained, and counts in neither: TRL counts it, so it dilutes the others); optional k3 KL to the base model
(adapter disabled) with TRL's importance-sampling correction. Own samples keep their sampled ids; foreign text is
re-tokenized locally with EOS appended, then truncated. With one inner iteration the old policy is the current one
(ratio 1, as in TRL); with more, a no-grad pass scores the old log-probs first. Foreign completions are treated as
on-policy samples of the local model, as TRL does without vLLM (its old log-probs are the current model's, so the ratio
starts at 1 whoever sampled the text). TRL's `scale_rewards` ("group": the above; "batch": the batch's std instead of
the group's; "none": r - mean alone) and `mask_truncated_completions` (completions that end in neither EOS nor pad, i.e.
cut at the token limit, leave the loss and its token count, but their rewards still shape their groups' advantages) are
settings.

`foreign_correction` (an extension beyond both papers, which train on foreign text at ratio 1): "weight" scales the
loss of every foreign token by `foreign_weight`; "is" weights each foreign token by the truncated importance ratio
min(pi_receiver(t) / mu_donor(t), C) from the donor's sampling log-probs (a `Behaviour` the receiver accepted: same
tokenizer, ids that decode to the verified text), and falls back to `foreign_weight` for foreign completions without
one. Per token, not per sequence: a sequence ratio is a product over every token and is 0 or huge for any
non-trivial drift, while per-token truncation keeps each factor in [0, C] (truncated IS as used to correct
sampler/trainer mismatch in RL post-training). The weight is detached and multiplies the clipped surrogate, so the
DAPO token count is unchanged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from ..rollouts import RolloutGroup
from ..settings import GenerationSettings
from ..settings import GRPOSettings as GRPOSettings  # declared there, light; re-exported
from .grpo_batch import Batch, build_batch, tag_token_mask
from .grpo_loss import (
    FOREIGN_CORRECTIONS,
    LOSS_TYPES,
    MicroBatchLoss,
    completion_logps,
    micro_batch_loss,
    proximal_term,
    resolved_update_dtype,
)

# re-exported for tests and benchmarks that import them from grpo
from .grpo_loss import foreign_token_weights as foreign_token_weights
from .grpo_loss import logprob_gap as logprob_gap
from .grpo_loss import per_token_logps as per_token_logps

SCALE_REWARDS = ("group", "batch", "none")


ADAM_MOMENTS = frozenset({"step", "exp_avg", "exp_avg_sq"})  # what AdamW keeps per parameter


@dataclass
class UpdateStats:
    loss: float = 0.0
    groups: int = 0
    completions: int = 0
    foreign_completions: int = 0
    tokens: int = 0
    mean_reward: float = 0.0
    zero_advantage_groups: int = 0
    clip_low_fraction: float = 0.0
    clip_high_fraction: float = 0.0
    kl: float = 0.0
    proximal: float = 0.0
    grad_norm: float = 0.0
    extra: dict = field(default_factory=dict)


def group_advantages(rewards: torch.Tensor, group_sizes: Sequence[int], eps: float = 1e-4,
                     scale: str = "group") -> torch.Tensor:
    """(r - group mean) / (std + eps), as TRL's scale_rewards: "group" divides by the group's unbiased std, "batch"
    by the whole batch's, "none" not at all. A group of one gets advantage 0."""
    if scale not in SCALE_REWARDS:
        raise ValueError(f"unknown reward scaling {scale!r}; expected one of {SCALE_REWARDS}")
    out = torch.zeros_like(rewards, dtype=torch.float32)
    batch_std = rewards.float().std(unbiased=True) if scale == "batch" and rewards.numel() > 1 else None
    start = 0
    for size in group_sizes:
        group = rewards[start:start + size].float()
        if size > 1:
            centred = group - group.mean()
            if scale == "group":
                centred = centred / (group.std(unbiased=True) + eps)
            elif batch_std is not None:  # scale "batch" (no std for a batch of one, which has no group of two)
                centred = centred / (batch_std + eps)
            out[start:start + size] = centred
        start += size
    return out


def trained_group_rows(advantages: torch.Tensor, group_sizes: Sequence[int]) -> torch.Tensor:
    """(B,) bool: the rows of groups with a non-zero advantage (a group whose rewards all agree, or a group of one,
    has none and teaches nothing without a KL term). A row of 0 in such a group still counts: it is a sample of a
    group that is trained."""
    rows = torch.zeros(advantages.shape[0], dtype=torch.bool, device=advantages.device)
    start = 0
    for size in group_sizes:
        rows[start:start + size] = bool((advantages[start:start + size] != 0).any())
        start += size
    return rows


def _count_batch(batch: Batch, stats: UpdateStats) -> float:
    """Fill the batch's counts into `stats` (completions, foreign ones, tokens, mean reward, groups whose rewards
    all agree); returns the number of completion tokens (the DAPO denominator when every group is trained)."""
    mask = batch.completion_mask.float()
    total_tokens = float(mask.sum())
    stats.completions = batch.rewards.shape[0]
    stats.foreign_completions = int(batch.foreign.sum())
    stats.tokens = int(total_tokens)
    stats.mean_reward = float(batch.rewards.mean())
    start = 0
    for size in batch.group_sizes:
        group = batch.rewards[start:start + size]
        stats.zero_advantage_groups += int(bool((group.max() - group.min()).abs() < 1e-12))
        start += size
    return total_tokens


@dataclass
class _LossSums:
    """What the micro-batches of one update add up, in the order they ran."""

    clip_low: float = 0.0
    clip_high: float = 0.0
    kl: float = 0.0
    loss: float = 0.0
    foreign_weight: float = 0.0
    capped: float = 0.0
    tag_weight: float = 0.0
    tag_tokens: int = 0
    gap_sum: float = 0.0
    gap_max: float = 0.0
    gap_tokens: int = 0

    def add(self, part: MicroBatchLoss, first_iteration: bool) -> None:
        self.loss += float(part.loss.detach())
        self.clip_low += part.clip_low
        self.clip_high += part.clip_high
        self.kl += part.kl
        self.foreign_weight += part.foreign_weight
        self.capped += part.capped
        self.tag_weight += part.tag_weight
        self.tag_tokens += part.tag_tokens
        if first_iteration:  # the weights the samples were drawn with
            self.gap_sum, self.gap_max, self.gap_tokens = (self.gap_sum + part.gap[0], max(self.gap_max, part.gap[1]),
                                                           self.gap_tokens + part.gap[2])

    def finish(self, stats: UpdateStats, batch: Batch, total_tokens: float, s: GRPOSettings) -> None:
        """The update's statistics from the sums: fractions and KL per token, loss per inner iteration."""
        denom = max(total_tokens * s.inner_iterations, 1.0)
        stats.loss = self.loss / s.inner_iterations
        stats.clip_low_fraction = self.clip_low / denom
        stats.clip_high_fraction = self.clip_high / denom
        stats.kl = self.kl / denom
        if self.gap_tokens:
            stats.extra.update(sampling_gap_sum=self.gap_sum, sampling_gap_max=self.gap_max,
                               sampling_gap_tokens=self.gap_tokens)
        if s.foreign_correction != "none":  # sums over inner iterations and the rows trained: mean = sum / tokens
            trained = batch.completion_mask.float() * batch.foreign.unsqueeze(1).float()
            stats.extra["foreign_tokens"] = int(trained.sum()) * s.inner_iterations
            stats.extra["foreign_weight_sum"] = self.foreign_weight
            stats.extra["is_capped_tokens"] = int(self.capped)
            stats.extra["foreign_tag_tokens"] = self.tag_tokens
            stats.extra["foreign_tag_weight_sum"] = self.tag_weight


class GRPOLearner:
    """Holds the optimizer over a PeftModel's trainable parameters and applies GRPO updates on rollout groups."""

    def __init__(self, model, tokenizer, settings: GRPOSettings, generation: GenerationSettings = GenerationSettings()):
        if settings.loss_type not in LOSS_TYPES:
            raise ValueError(f"train.loss-type must be one of {LOSS_TYPES}, got {settings.loss_type!r}")
        if settings.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"train.scale-rewards must be one of {SCALE_REWARDS}, got {settings.scale_rewards!r}")
        if settings.foreign_correction not in FOREIGN_CORRECTIONS:
            raise ValueError(f"train.foreign-correction must be one of {FOREIGN_CORRECTIONS}, got "
                             f"{settings.foreign_correction!r}")
        self.model = model
        self.tokenizer = tokenizer
        if settings.update_dtype == "auto":
            settings = replace(settings, update_dtype=resolved_update_dtype(model))
        self.settings = settings
        self.generation = generation  # sampling temperature and token limits: one source for sampling and update
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise RuntimeError("model has no trainable parameters (a frozen adapter would train nothing)")
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=settings.learning_rate,
                                           betas=(settings.adam_beta1, settings.adam_beta2),
                                           weight_decay=settings.weight_decay)

    # -- optimizer state -------------------------------------------------------------------------------------
    def optimizer_tensors(self) -> tuple[dict[str, torch.Tensor], str]:
        """The optimizer state as flat tensors named "<parameter index>.<moment>" and its parameter groups as JSON
        (a safetensors file and its metadata hold them without pickle). The tensors alias the live moments: write or
        clone them before the next update."""
        saved = self.optimizer.state_dict()
        tensors = {}
        for index, moments in saved["state"].items():
            for name, value in moments.items():
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"optimizer state {index}.{name} is a {type(value).__name__}, not a tensor")
                tensors[f"{index}.{name}"] = value.contiguous()  # safetensors writes contiguous tensors only
        return tensors, json.dumps(saved["param_groups"])

    def load_optimizer_tensors(self, tensors: dict[str, torch.Tensor], groups_json: str) -> None:
        """Restore what optimizer_tensors returned; the tensors are taken over (load_state_dict may alias them)."""
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            index, _, name = key.partition(".")
            if not index.isdigit() or not name or int(index) >= len(self.params):
                raise ValueError(f"optimizer state {key!r} is not <parameter index>.<moment> for this model's "
                                 f"{len(self.params)} trainable tensors")
            state.setdefault(int(index), {})[name] = value
        parameters = list(self.params.values())
        for position, moments in state.items():
            if not ADAM_MOMENTS <= set(moments) <= ADAM_MOMENTS | {"max_exp_avg_sq"}:
                raise ValueError(f"optimizer state {position} holds {sorted(moments)}, not AdamW's "
                                 f"{sorted(ADAM_MOMENTS)}")
            for name, value in moments.items():
                shape = () if name == "step" else parameters[position].shape
                if value.shape != shape:
                    raise ValueError(f"optimizer state {position}.{name} has shape {tuple(value.shape)}, not "
                                     f"{tuple(shape)}")
        groups = json.loads(groups_json)
        if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
            raise ValueError("optimizer parameter groups must be a list of objects")
        for group in groups:
            if isinstance(group.get("betas"), list):
                group["betas"] = tuple(group["betas"])  # JSON has no tuples; AdamW's state_dict keeps one
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})

    def reset_optimizer(self) -> None:
        self.optimizer.state.clear()

    # -- update ----------------------------------------------------------------------------------------------
    def _logps(self, batch: Batch, rows: slice) -> torch.Tensor:
        return completion_logps(self.model, batch, rows, self.generation.temperature,
                                update_dtype=self.settings.update_dtype)

    def update(self, groups: Sequence[RolloutGroup], proximal_reference: dict[str, torch.Tensor] | None = None,
               proximal_mu: float | None = None) -> UpdateStats:
        """One GRPO update (inner_iterations optimizer steps) on `groups`; returns its statistics."""
        s = self.settings
        mu = s.proximal_mu if proximal_mu is None else proximal_mu
        stats = UpdateStats(groups=len(groups))
        if not groups:
            return stats
        batch = build_batch(self.tokenizer, groups, self.generation).to(next(iter(self.params.values())).device)
        if s.mask_truncated_completions:
            batch = batch.without_truncated()
            stats.extra["truncated_masked"] = int(batch.truncated.sum())
        n = batch.rewards.shape[0]
        advantages = group_advantages(batch.rewards, batch.group_sizes, scale=s.scale_rewards)
        total_tokens = _count_batch(batch, stats)
        sequences = n
        # Rows with advantage 0 add exactly 0 to the clipped surrogate and its gradient (and to the foreign-token
        # weights, which multiply it): without a KL term they need no forward or backward. Groups whose rewards all
        # agree (common with 0/1 rewards: stats.zero_advantage_groups) are then not trained, and leave the DAPO
        # token total and the GRPO sequence count too, so they do not dilute the groups that are (#53); a row of 0
        # in a group that is trained still counts there.
        if s.kl_beta == 0:
            trained = trained_group_rows(advantages, batch.group_sizes)
            total_tokens, sequences = float(batch.completion_mask[trained].sum()), int(trained.sum())
            active = (advantages != 0).nonzero().squeeze(1)
            if len(active) < n:
                batch, advantages = batch.rows(active), advantages[active]
        rows_left = batch.rewards.shape[0]
        tags = (tag_token_mask(self.tokenizer, batch.completion_ids, batch.completion_mask, batch.foreign)
                if s.foreign_correction != "none" and bool(batch.foreign.any()) else None)
        chunks = [slice(i, min(i + s.micro_batch_size, rows_left)) for i in range(0, rows_left, s.micro_batch_size)]
        stats.extra["rows_trained"] = rows_left
        self.model.train()
        old = None
        if s.inner_iterations > 1:
            with torch.no_grad():
                old = torch.cat([self._logps(batch, c) for c in chunks])
        ref = None
        if s.kl_beta > 0:
            with torch.no_grad(), self.model.disable_adapter():
                ref = torch.cat([self._logps(batch, c) for c in chunks])
        sums = _LossSums()
        for iteration in range(s.inner_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for rows in chunks:
                part = micro_batch_loss(self.model, batch, rows, advantages, None if old is None else old[rows],
                                        None if ref is None else ref[rows], s, total_tokens,
                                        self.generation.temperature, max(sequences, 1), tags)
                part.loss.backward()
                sums.add(part, first_iteration=iteration == 0)
            self._step(stats, proximal_reference, mu)
        self.model.eval()
        sums.finish(stats, batch, total_tokens, s)
        return stats

    def _step(self, stats: UpdateStats, proximal_reference: dict[str, torch.Tensor] | None, mu: float) -> None:
        """One optimizer step on the accumulated gradients, with the proximal term and gradient clipping."""
        s = self.settings
        for param in self.params.values():  # no row trained: the step still applies Adam's momentum, as a
            if param.grad is None:  # backward of an all-zero loss would
                param.grad = torch.zeros_like(param)
        if mu > 0 and proximal_reference is not None:
            prox = proximal_term(self.params, proximal_reference, mu)
            prox.backward()
            stats.proximal = float(prox.detach())
        norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()),
                                              s.max_grad_norm if s.max_grad_norm > 0 else math.inf)
        stats.grad_norm = float(norm)
        self.optimizer.step()

    @torch.no_grad()
    def mean_logprobs(self, prompt: str, completions: Sequence) -> list[float]:
        """Each completion's mean per-token log-prob under the current policy, as an update would tokenize it
        (pubswap.donor = "likely" ranks donor responses by it; the mean, not the sum, so length does not decide)."""
        if not completions:
            return []
        group = RolloutGroup(prompt, list(completions), [0.0] * len(completions))
        batch = build_batch(self.tokenizer, [group], self.generation).to(next(iter(self.params.values())).device)
        was_training = self.model.training
        self.model.eval()
        logps = self._logps(batch, slice(0, len(completions)))
        self.model.train(was_training)
        mask = batch.completion_mask.float()
        return ((logps * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).tolist()
