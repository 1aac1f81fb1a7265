"""GRPO's loss pieces over one micro-batch: completion log-probs, the clipped surrogate per token, foreign-token
weights (train.foreign-correction), the DAPO / GRPO aggregation, the FedProx proximal term, and the loss of one
micro-batch scaled so a batch's micro-batch losses sum to its loss (grpo.py's docstring gives the semantics)."""

from __future__ import annotations

import functools
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..settings import GRPOSettings
from .grpo_batch import Batch
from .precision import update_precision

LOSS_TYPES = ("dapo", "grpo")
FOREIGN_CORRECTIONS = ("none", "weight", "is")


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


CHUNK_ELEMENTS = 1 << 24  # logits (rows x positions x vocabulary) computed at once in the chunked path: 64 MB fp32
CHUNKED_ABOVE = 1 << 24  # completions whose logits would hold more elements (64 MB fp32) take the chunked path
# on: measured on SmolLM2 it cuts a client's peak by 0.5 GB (3756 -> 3246 MiB) at 1.05x the update time, loss and
# gradient norm equal to every printed digit (docs/results/client-memory/smollm2-2026-12-03.txt)
CHUNK_ABOVE = CHUNKED_ABOVE


UPDATE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


def resolved_update_dtype(model) -> str:
    """train.update-dtype = "auto" for `model` (precision.update_precision, from its trained weights' dtype and
    device: a frozen embedding may be held in the sampler's precision, lora.LowPrecisionSampling)."""
    weight = next((p for p in model.parameters() if p.requires_grad), None)
    if weight is None:
        weight = next(model.parameters())
    return update_precision("auto", str(weight.dtype).removeprefix("torch."), model, weight.device)


def completion_logps(model, batch: Batch, rows: slice, temperature: float = 1.0,
                     chunk_above: int | None = None, recompute_layers: bool = True,
                     update_dtype: str = "float32") -> torch.Tensor:
    """`per_token_logps` of rows `rows`' completions, each distinct prompt run once (B, C), in float32.
    `update_dtype` "bfloat16" (train.update-dtype) runs the model's passes under bfloat16 autocast: the products in
    bfloat16, the weights (LoRA's float32 masters) untouched, the log-softmax and everything after it in float32.

    A group's K completions share one prompt; running it once and letting the K completions attend to its keys and
    values (copied per row, so gradients from every completion flow back through the one prompt pass) leaves out
    (K - 1) / K of the prompt tokens' forward and backward, which are most of the tokens when prompts are longer than
    completions. Positions count from each row's first real token, as in sampling.

    When the completions' logits would hold more than `chunk_above` elements (a real vocabulary: SmolLM2's 49,152 x
    16 rows x 64 tokens is 50M, 200 MB in fp32 and several live copies through log-softmax and autograd), the
    decoder's hidden states go through the (frozen) LM head a few positions at a time, each chunk recomputed in the
    backward pass instead of kept (`chunked_target_logps`): the same values, without the full-vocabulary tensors.
    There, with `recompute_layers` (train.recompute-layers), the completion pass's decoder layers also keep only
    their inputs and are recomputed in the backward pass (`checkpointed_layers`): same values and gradients, about
    half the memory an update holds (SmolLM2: client peak 3170 -> 1845 MiB at 1.37x the update time)."""
    if update_dtype == "auto":  # callers below a GRPOLearner (which resolves it once) pass the setting as given
        update_dtype = resolved_update_dtype(model)
    if update_dtype not in UPDATE_DTYPES:
        raise ValueError(f"train.update-dtype must be auto or one of {sorted(UPDATE_DTYPES)}, got {update_dtype!r}")
    low = UPDATE_DTYPES[update_dtype]
    if low is None:
        return _completion_logps(model, batch, rows, temperature, chunk_above, recompute_layers)
    device = batch.completion_ids.device.type
    with torch.autocast(device_type=device, dtype=low):
        return _completion_logps(model, batch, rows, temperature, chunk_above, recompute_layers).float()


def _completion_logps(model, batch: Batch, rows: slice, temperature: float, chunk_above: int | None,
                      recompute_layers: bool) -> torch.Tensor:
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
    width = completion_ids.shape[1]
    tail_positions = positions[owner, -1:] + 1 + torch.arange(width, device=positions.device)
    full_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    head = _plain_lm_head(model)
    limit = CHUNK_ABOVE if chunk_above is None else chunk_above
    if head is not None and len(prompt_ids) * width * head.weight.shape[0] > limit:
        decoder = model.get_base_model().get_decoder()
        last = decoder(input_ids=prompt_ids[first], attention_mask=unique_mask, position_ids=positions, cache=cache,
                       use_cache=True).last_hidden_state[:, -1:, :]
        if len(first) < len(prompt_ids):
            cache.batch_select_indices(owner)
        layers = getattr(decoder, "layers", None)  # GPT-2 and its kin keep theirs in `.h`: no recompute there
        recompute = recompute_layers and torch.is_grad_enabled() and isinstance(layers, torch.nn.ModuleList) \
            and _only_full_attention(cache)
        if recompute:
            prefix = prefix_layer_class()
            cache.layers = [prefix(layer) for layer in cache.layers]
        with checkpointed_layers(layers) if recompute else nullcontext():
            body = decoder(input_ids=completion_ids, attention_mask=full_mask, position_ids=tail_positions,
                           cache=cache, use_cache=True).last_hidden_state
        hidden = torch.cat([last[owner], body[:, :-1, :]], dim=1)
        return chunked_target_logps(hidden, head, completion_ids, temperature)
    last_logits = model(input_ids=prompt_ids[first], attention_mask=unique_mask, position_ids=positions, cache=cache,
                        use_cache=True, logits_to_keep=1).logits[:, -1:, :]
    if len(first) < len(prompt_ids):
        cache.batch_select_indices(owner)
    body = model(input_ids=completion_ids, attention_mask=full_mask, position_ids=tail_positions, cache=cache,
                 use_cache=True, logits_to_keep=width).logits
    logits = torch.cat([last_logits[owner], body[:, :-1, :]], dim=1).float() / temperature
    # log-softmax at the target only: logit - logsumexp, without materialising the whole (B, C, V) log-softmax
    return logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _only_full_attention(cache) -> bool:
    """Every layer of `cache` is a plain DynamicLayer (no sliding window), the case `PrefixLayer` reproduces."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


@functools.cache
def prefix_layer_class():
    """`PrefixLayer`, defined on first use so that importing this module does not import transformers."""
    from transformers.cache_utils import DynamicLayer

    class PrefixLayer(DynamicLayer):
        """A decoder layer's cached prompt keys and values, read but never extended: `update` returns the prompt's
        states followed by the new ones and stores nothing, so a checkpointed layer recomputed in the backward pass
        sees the same keys as its forward did (a DynamicLayer would append the completion a second time)."""

        def __init__(self, prompt):
            super().__init__()
            self.keys, self.values = prompt.keys, prompt.values
            self.device, self.is_initialized = prompt.device, True

        def update(self, key_states, value_states, *args, **kwargs):
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    return PrefixLayer


@contextmanager
def checkpointed_layers(layers):
    """Within the block each of `layers` keeps only its inputs for the backward pass and recomputes its activations
    there (torch.utils.checkpoint, non-reentrant: the prompt's cached keys and values, reached through the cache
    object, still receive their gradients). Hugging Face's own gradient checkpointing turns the cache off, which
    would lose the shared prompt pass; a PrefixLayer cache makes the recompute repeat the forward exactly."""
    from torch.utils.checkpoint import checkpoint

    saved = [(layer, vars(layer).get("forward")) for layer in dict.fromkeys(layers)]  # an instance's own forward
    try:
        for layer, _ in saved:
            layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
        yield
    finally:
        for layer, own in saved:
            if own is None:
                vars(layer).pop("forward", None)  # the class's forward shows through again
            else:
                layer.forward = own  # e.g. a hook an accelerator library installed


def _plain_lm_head(model) -> torch.nn.Linear | None:
    """The LM head when logits are exactly `head(decoder hidden states)` and the head is frozen (no LoRA, no logit
    scaling or soft-capping: Llama, Qwen2 and the embedded models), else None (the plain path)."""
    get_base = getattr(model, "get_base_model", None)
    if get_base is None:
        return None
    base = get_base()
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or head.weight.requires_grad:
        return None
    if getattr(base.config, "final_logit_softcapping", None) or hasattr(base, "logit_scale") \
            or getattr(base.config, "logit_scale", None) not in (None, 1, 1.0):
        return None
    if not hasattr(base, "get_decoder"):
        return None
    return head


def _target_logps(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    logits = head(hidden).float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def chunked_target_logps(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float,
                         chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """log softmax(head(hidden) / T)[targets] (B, C), computed a few positions at a time; under autograd each chunk
    is checkpointed, so its full-vocabulary logits live only while that chunk is computed (forward or backward)."""
    from torch.utils.checkpoint import checkpoint

    rows, width = targets.shape
    step = max(1, chunk_elements // max(1, rows * head.weight.shape[0]))
    parts = []
    for start in range(0, width, step):
        part = (hidden[:, start:start + step], head, targets[:, start:start + step], temperature)
        if torch.is_grad_enabled() and hidden.requires_grad:
            parts.append(checkpoint(_target_logps, *part, use_reentrant=False))
        else:
            parts.append(_target_logps(*part))
    return torch.cat(parts, dim=1)


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
    tag_weight: float = 0.0  # summed loss weight over active foreign tokens that spell an answer tag
    tag_tokens: int = 0  # and how many there are


# parameters: the GRPO loss's inputs for one micro-batch, as the TRL oracle test calls it
def micro_batch_loss(model, batch: Batch, rows: slice, advantages: torch.Tensor, old_logps: torch.Tensor | None,
                     ref_logps: torch.Tensor | None, settings: GRPOSettings, total_tokens: float,
                     temperature: float = 1.0, total_sequences: int | None = None,
                     tag_mask: torch.Tensor | None = None) -> MicroBatchLoss:
    """The loss of rows `rows`, scaled so that the micro-batch losses of a batch sum to the batch loss (of
    `total_sequences` rows, default this batch's: the update leaves out rows that cannot contribute)."""
    s = settings
    logps = completion_logps(model, batch, rows, temperature, recompute_layers=s.recompute_layers,
                             update_dtype=s.update_dtype)
    old = logps.detach() if old_logps is None else old_logps
    per_token, ratio = clipped_token_loss(logps, old, advantages[rows], s.epsilon_low, s.epsilon_high)
    mask = batch.completion_mask[rows].float()
    foreign_weight = capped = tag_weight = 0.0
    tag_tokens = 0
    if s.foreign_correction != "none":
        donor = None if batch.donor_logps is None else batch.donor_logps[rows]
        behaviour = None if batch.has_behaviour is None else batch.has_behaviour[rows]
        weights = foreign_token_weights(old, batch.foreign[rows], s.foreign_correction, s.foreign_weight, s.is_cap,
                                        donor, behaviour)
        per_token = per_token * weights
        foreign_mask = mask * batch.foreign[rows].unsqueeze(1).float()
        foreign_weight = float((weights * foreign_mask).sum())
        if tag_mask is not None:  # the answer tags' share of it (#35: does the correction mute a format a peer found?)
            tags = foreign_mask * tag_mask[rows].float()
            tag_weight, tag_tokens = float((weights * tags).sum()), int(tags.sum())
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
    return MicroBatchLoss(loss, clip_low, clip_high, kl_total, foreign_weight, capped, gap, tag_weight,
                          tag_tokens)
