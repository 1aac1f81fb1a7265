"""GRPO/DAPO update on rollout groups from any source, over the LoRA parameters.

Semantics follow TRL 1.16 `GRPOTrainer._compute_loss` (tests/unit/test_grpo_oracle.py checks loss and gradients
against it): group advantages (r - mean) / (std + 1e-4) with the unbiased std over own + foreign members;
per-token ratio clipped to [1 - eps_low, 1 + eps_high]; "dapo" normalises the token sum by the number of active
tokens in the whole batch, "grpo" averages per sequence then over sequences; optional k3 KL to the base model
(adapter disabled) with TRL's importance-sampling correction. Own samples keep their sampled ids; foreign text is
re-tokenized locally with EOS appended, then truncated. With one inner iteration the old policy is the current one
(ratio 1, as in TRL); with more, a no-grad pass scores the old log-probs first. Foreign completions are treated as
on-policy samples of the local model, as TRL does without vLLM (its old log-probs are the current model's, so
the ratio starts at 1 whoever sampled the text). TRL's `scale_rewards` ("group": the above; "batch": the batch's
std instead of the group's; "none": r - mean alone) and `mask_truncated_completions` (completions that end in neither
EOS nor pad, i.e. cut at the token limit, leave the loss and its token count, but their rewards still shape their
groups' advantages) are settings.

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

import copy
import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..rollouts import RolloutGroup
from .grpo_batch import Batch, build_batch, encode_completion
from .sampling import GenerationSettings

LOSS_TYPES = ("dapo", "grpo")
SCALE_REWARDS = ("group", "batch", "none")
FOREIGN_CORRECTIONS = ("none", "weight", "is")


@dataclass(frozen=True)
class GRPOSettings:
    learning_rate: float = 1e-3
    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    kl_beta: float = 0.0
    inner_iterations: int = 1
    micro_batch_size: int = 64
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    proximal_mu: float = 0.0
    scale_rewards: str = "group"
    mask_truncated_completions: bool = False
    foreign_correction: str = "none"
    foreign_weight: float = 0.5
    is_cap: float = 2.0


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
            elif scale == "batch":
                centred = centred / (batch_std + eps)
            out[start:start + size] = centred
        start += size
    return out


def logprob_gap(training: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, int]:
    """How far the sampler's log-probs are from the training pass's on the same tokens: (sum and max of
    |training - sampled| over the tokens in `mask`, token count). A lower-precision sampling copy (generation.dtype)
    makes them differ; the loss always uses the training pass's."""
    mask = mask.bool()
    if not bool(mask.any()):
        return 0.0, 0.0, 0
    diff = (training.detach().float() - sampled.float()).abs()[mask]
    return float(diff.sum()), float(diff.max()), int(mask.sum())


def per_token_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                    temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each of the last `logits_to_keep` tokens under `model` (B, logits_to_keep)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1).logits
    logits = logits[:, :-1, :].float() / temperature
    targets = input_ids[:, -logits_to_keep:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def completion_logps(model, batch: Batch, rows: slice, temperature: float = 1.0) -> torch.Tensor:
    """`per_token_logps` of rows `rows`' completions, each distinct prompt run once (B, C).

    A group's K completions share one prompt; running it once and letting the K completions attend to its keys and
    values (copied per row, so gradients from every completion flow back through the one prompt pass) leaves out
    (K - 1) / K of the prompt tokens' forward and backward, which are most of the tokens when prompts are longer than
    completions. Positions count from each row's first real token, as in sampling."""
    from transformers import DynamicCache

    prompt_ids, prompt_mask = batch.prompt_ids[rows], batch.prompt_mask[rows]
    completion_ids, completion_mask = batch.completion_ids[rows], batch.completion_mask[rows]
    same = torch.ones(len(prompt_ids), dtype=torch.bool, device=prompt_ids.device)  # row repeats the row before
    same[0] = False
    same[1:] = (prompt_ids[1:] == prompt_ids[:-1]).all(-1) & (prompt_mask[1:] == prompt_mask[:-1]).all(-1)
    first = (~same).nonzero().squeeze(1)
    owner = torch.cumsum((~same).long(), 0) - 1  # row -> its prompt among the distinct ones
    unique_mask = prompt_mask[first]
    positions = (unique_mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    head = model(input_ids=prompt_ids[first], attention_mask=unique_mask, position_ids=positions, cache=cache,
                 use_cache=True, logits_to_keep=1).logits[:, -1:, :]
    if len(first) < len(prompt_ids):
        cache.batch_select_indices(owner)
    width = completion_ids.shape[1]
    tail_positions = positions[owner, -1:] + 1 + torch.arange(width, device=positions.device)
    body = model(input_ids=completion_ids, attention_mask=torch.cat([prompt_mask, completion_mask], dim=1),
                 position_ids=tail_positions, cache=cache, use_cache=True, logits_to_keep=width).logits
    logits = torch.cat([head[owner], body[:, :-1, :]], dim=1).float() / temperature
    # log-softmax at the target only: logit - logsumexp, without materialising the whole (B, C, V) log-softmax
    return logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def clipped_token_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                       eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(r·A, clip(r)·A) and the ratio r = exp(logp - old)."""
    ratio = torch.exp(logps - old_logps)
    adv = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    return -torch.min(ratio * adv, clipped * adv), ratio


def foreign_token_weights(receiver_logps: torch.Tensor, foreign: torch.Tensor, mode: str, weight: float,
                          cap: float, donor_logps: torch.Tensor | None = None,
                          has_behaviour: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token loss weights (B, C) for `train.foreign-correction`: 1 for own rows; foreign rows get `weight`
    ("weight"), or min(exp(receiver - donor), cap) per token where the row has the donor's log-probs and `weight`
    where it has not ("is"). `receiver_logps` are the receiver's (detached) log-probs of the row's tokens."""
    if mode not in FOREIGN_CORRECTIONS:
        raise ValueError(f"unknown foreign correction {mode!r}; expected one of {FOREIGN_CORRECTIONS}")
    weights = torch.ones_like(receiver_logps)
    if mode == "none":
        return weights
    rows = foreign.unsqueeze(1)
    weights = torch.where(rows, torch.full_like(weights, weight), weights)
    if mode == "is" and donor_logps is not None and has_behaviour is not None:
        ratio = torch.exp(receiver_logps.detach() - donor_logps).clamp(max=cap)
        weights = torch.where((foreign & has_behaviour).unsqueeze(1), ratio, weights)
    return weights


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, total_tokens: float,
                   total_sequences: int) -> torch.Tensor:
    """Reduce a micro-batch's per-token loss so that summing micro-batches gives the full-batch loss."""
    mask = mask.to(per_token.dtype)
    if loss_type == "dapo":
        return (per_token * mask).sum() / max(total_tokens, 1.0)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / total_sequences
    raise ValueError(f"unknown loss type {loss_type!r}; expected one of {LOSS_TYPES}")


def proximal_term(params: dict[str, torch.nn.Parameter], reference: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx: mu/2 · ||w - w_ref||² over the trainable (LoRA) parameters."""
    total = torch.zeros(())  # a 0-dim CPU tensor adds to tensors on any device
    for name, param in params.items():
        total = total + (param - reference[name].to(param.device, param.dtype)).pow(2).sum()
    return 0.5 * mu * total


@dataclass
class MicroBatchLoss:
    loss: torch.Tensor
    clip_low: float  # active tokens whose negative-advantage ratio fell below 1 - eps_low
    clip_high: float  # active tokens whose positive-advantage ratio rose above 1 + eps_high
    kl: float  # summed per-token KL over active tokens (0 without a reference)
    foreign_weight: float = 0.0  # summed loss weight over active foreign tokens (train.foreign-correction)
    capped: float = 0.0  # active foreign tokens whose importance ratio was truncated at the cap
    gap: tuple[float, float, int] = (0.0, 0.0, 0)  # logprob_gap of own tokens: sampler vs this pass


def micro_batch_loss(model, batch: Batch, rows: slice, advantages: torch.Tensor, old_logps: torch.Tensor | None,
                     ref_logps: torch.Tensor | None, settings: GRPOSettings, total_tokens: float,
                     temperature: float = 1.0, total_sequences: int | None = None) -> MicroBatchLoss:
    """The loss of rows `rows`, scaled so that the micro-batch losses of a batch sum to the batch loss (of
    `total_sequences` rows, default this batch's: the update leaves out rows that cannot contribute)."""
    s = settings
    logps = completion_logps(model, batch, rows, temperature)
    old = logps.detach() if old_logps is None else old_logps
    per_token, ratio = clipped_token_loss(logps, old, advantages[rows], s.epsilon_low, s.epsilon_high)
    mask = batch.completion_mask[rows].float()
    foreign_weight = capped = 0.0
    if s.foreign_correction != "none":
        donor = None if batch.donor_logps is None else batch.donor_logps[rows]
        behaviour = None if batch.has_behaviour is None else batch.has_behaviour[rows]
        weights = foreign_token_weights(old, batch.foreign[rows], s.foreign_correction, s.foreign_weight, s.is_cap,
                                        donor, behaviour)
        per_token = per_token * weights
        foreign_mask = mask * batch.foreign[rows].unsqueeze(1).float()
        foreign_weight = float((weights * foreign_mask).sum())
        if donor is not None and behaviour is not None:
            raw = torch.exp(old - donor)
            capped = float(((raw > s.is_cap) & behaviour.unsqueeze(1)).float().mul(foreign_mask).sum())
    kl_total = 0.0
    if ref_logps is not None and s.kl_beta > 0:
        diff = ref_logps - logps
        kl = (torch.exp(diff) - diff - 1) * ratio  # k3 estimator with TRL's importance-sampling correction
        per_token = per_token + s.kl_beta * kl
        kl_total = float((kl.detach() * mask).sum())
    loss = aggregate_loss(per_token, mask, s.loss_type, total_tokens,
                          batch.rewards.shape[0] if total_sequences is None else total_sequences)
    adv = advantages[rows].unsqueeze(1)
    clip_low = float((((ratio < 1 - s.epsilon_low) & (adv < 0)).float() * mask).sum())
    clip_high = float((((ratio > 1 + s.epsilon_high) & (adv > 0)).float() * mask).sum())
    gap = (0.0, 0.0, 0)
    if batch.sampled_logps is not None and batch.has_sampled is not None:
        gap = logprob_gap(logps, batch.sampled_logps[rows], mask.bool() & batch.has_sampled[rows].unsqueeze(1))
    return MicroBatchLoss(loss, clip_low, clip_high, kl_total, foreign_weight, capped, gap)


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
        self.settings = settings
        self.generation = generation  # sampling temperature and token limits: one source for sampling and update
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise RuntimeError("model has no trainable parameters (a frozen adapter would train nothing)")
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=settings.learning_rate,
                                           betas=(settings.adam_beta1, settings.adam_beta2),
                                           weight_decay=settings.weight_decay)

    # -- optimizer state -------------------------------------------------------------------------------------
    def optimizer_state(self) -> dict:
        """A copy of the optimizer state (state_dict() alone aliases the live moment tensors)."""
        return copy.deepcopy(self.optimizer.state_dict())

    def load_optimizer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(copy.deepcopy(state))  # load_state_dict may alias the given tensors

    def reset_optimizer(self) -> None:
        self.optimizer.state.clear()

    # -- update ----------------------------------------------------------------------------------------------
    def _logps(self, batch: Batch, rows: slice) -> torch.Tensor:
        return completion_logps(self.model, batch, rows, self.generation.temperature)

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
        mask = batch.completion_mask.float()
        total_tokens = float(mask.sum())
        stats.completions = n
        stats.foreign_completions = int(batch.foreign.sum())
        stats.tokens = int(total_tokens)
        stats.mean_reward = float(batch.rewards.mean())
        start = 0
        for size in batch.group_sizes:
            group = batch.rewards[start:start + size]
            stats.zero_advantage_groups += int(bool((group.max() - group.min()).abs() < 1e-12))
            start += size
        # Rows with advantage 0 add exactly 0 to the clipped surrogate and its gradient (and to the foreign-token
        # weights, which multiply it): without a KL term they need no forward or backward. They still count in the
        # DAPO token total and the GRPO sequence count above, so the loss and gradients equal the whole batch's.
        # With 0/1 rewards a group whose members all agree is common (stats.zero_advantage_groups).
        if s.kl_beta == 0:
            active = (advantages != 0).nonzero().squeeze(1)
            if len(active) < n:
                batch, advantages = batch.rows(active), advantages[active]
        rows_left = batch.rewards.shape[0]
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
        clip_low = clip_high = kl_sum = loss_sum = foreign_weight = capped = gap_sum = gap_max = 0.0
        gap_tokens = 0
        for iteration in range(s.inner_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for rows in chunks:
                part = micro_batch_loss(self.model, batch, rows, advantages, None if old is None else old[rows],
                                        None if ref is None else ref[rows], s, total_tokens,
                                        self.generation.temperature, n)
                part.loss.backward()
                loss_sum += float(part.loss.detach())
                clip_low += part.clip_low
                clip_high += part.clip_high
                kl_sum += part.kl
                foreign_weight += part.foreign_weight
                capped += part.capped
                if iteration == 0:  # the weights the samples were drawn with
                    gap_sum, gap_max, gap_tokens = (gap_sum + part.gap[0], max(gap_max, part.gap[1]),
                                                    gap_tokens + part.gap[2])
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
        self.model.eval()
        denom = max(total_tokens * s.inner_iterations, 1.0)
        stats.loss = loss_sum / s.inner_iterations
        stats.clip_low_fraction = clip_low / denom
        stats.clip_high_fraction = clip_high / denom
        stats.kl = kl_sum / denom
        if gap_tokens:
            stats.extra.update(sampling_gap_sum=gap_sum, sampling_gap_max=gap_max, sampling_gap_tokens=gap_tokens)
        if s.foreign_correction != "none":  # sums over inner iterations and the rows trained: mean = sum / tokens
            trained = batch.completion_mask.float() * batch.foreign.unsqueeze(1).float()
            stats.extra["foreign_tokens"] = int(trained.sum()) * s.inner_iterations
            stats.extra["foreign_weight_sum"] = foreign_weight
            stats.extra["is_capped_tokens"] = int(capped)
        return stats

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
