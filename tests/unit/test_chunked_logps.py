"""The chunked log-prob path (a real vocabulary's logits through the frozen LM head a few positions at a time, each
chunk recomputed in the backward pass) gives the plain path's values and LoRA gradients."""

from __future__ import annotations

import torch

from pubswap_flwr.policy.grpo import build_batch
from pubswap_flwr.policy.grpo_loss import _plain_lm_head, chunked_target_logps, completion_logps
from pubswap_flwr.policy.sampling import GenerationSettings
from tests.unit.test_grpo_oracle import _groups


def _logps_and_grads(policy, batch, chunk_above: int, weights: torch.Tensor, recompute_layers: bool = True):
    model = policy.model
    model.zero_grad(set_to_none=True)
    logps = completion_logps(model, batch, slice(0, batch.rewards.shape[0]), temperature=0.7,
                             chunk_above=chunk_above, recompute_layers=recompute_layers)
    (logps * weights * batch.completion_mask).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}
    return logps.detach(), grads


def test_chunked_log_probs_and_gradients_equal_the_plain_ones(tiny_policy):
    model = tiny_policy.model
    with torch.no_grad():  # a non-trivial adapter, so gradients reach both A and B
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    assert _plain_lm_head(model) is not None  # the embedded model's head is plain and frozen
    batch = build_batch(tiny_policy.tokenizer, _groups(tiny_policy.tokenizer), GenerationSettings(max_new_tokens=16))
    weights = torch.randn(batch.completion_ids.shape, generator=torch.Generator().manual_seed(3))
    model.train()
    plain, plain_grads = _logps_and_grads(tiny_policy, batch, chunk_above=1 << 62, weights=weights)
    chunked, chunked_grads = _logps_and_grads(tiny_policy, batch, chunk_above=0, weights=weights)
    mask = batch.completion_mask.bool()
    assert torch.allclose(chunked[mask], plain[mask], atol=1e-5, rtol=0)
    assert plain_grads.keys() == chunked_grads.keys() and len(plain_grads) > 0
    for key in plain_grads:
        assert torch.allclose(chunked_grads[key], plain_grads[key], atol=1e-5, rtol=1e-4), key


def test_chunks_cover_every_position_once_whatever_the_chunk_size():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False).requires_grad_(False)
    hidden = torch.randn(3, 7, 8)
    targets = torch.randint(0, 50, (3, 7))
    reference = torch.log_softmax(head(hidden) / 0.5, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    for elements in (1, 150, 151, 10_000):  # one position a chunk, exactly one row-set, uneven, all at once
        got = chunked_target_logps(hidden, head, targets, 0.5, chunk_elements=elements)
        assert got.shape == (3, 7) and torch.allclose(got, reference, atol=1e-6)


def test_a_trainable_or_biased_head_keeps_the_plain_path():
    class Wrapper(torch.nn.Module):
        def __init__(self, head):
            super().__init__()
            self.head = head
            self.config = type("Config", (), {})()

        def get_base_model(self):
            return self

        def get_output_embeddings(self):
            return self.head

        def get_decoder(self):
            return None

    assert _plain_lm_head(Wrapper(torch.nn.Linear(4, 9, bias=False).requires_grad_(False))) is not None
    assert _plain_lm_head(Wrapper(torch.nn.Linear(4, 9, bias=False))) is None  # trainable
    assert _plain_lm_head(Wrapper(torch.nn.Linear(4, 9, bias=True).requires_grad_(False))) is None
    assert _plain_lm_head(torch.nn.Linear(4, 9)) is None  # not a PEFT model


def _saved_bytes(fn) -> int:
    """Bytes autograd keeps for the backward pass while `fn` runs (each saved tensor counted once)."""
    seen: dict[int, int] = {}

    def pack(tensor):
        seen.setdefault(id(tensor), tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn()
    return sum(seen.values()), out


def test_recomputed_completion_layers_give_the_same_values_and_gradients_and_keep_less(tiny_policy):
    model = tiny_policy.model
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    batch = build_batch(tiny_policy.tokenizer, _groups(tiny_policy.tokenizer), GenerationSettings(max_new_tokens=16))
    weights = torch.randn(batch.completion_ids.shape, generator=torch.Generator().manual_seed(3))
    model.train()
    results = {}
    for recompute in (False, True):
        saved, _ = _saved_bytes(lambda: completion_logps(model, batch, slice(0, batch.rewards.shape[0]), 0.7,
                                                         chunk_above=0, recompute_layers=recompute))
        results[recompute] = (saved, *_logps_and_grads(tiny_policy, batch, chunk_above=0, weights=weights,
                                                        recompute_layers=recompute))
    (kept_bytes, kept, kept_grads), (ckpt_bytes, ckpt, ckpt_grads) = results[False], results[True]
    assert torch.equal(ckpt, kept)  # the forward is the same computation
    assert kept_grads.keys() == ckpt_grads.keys() and len(kept_grads) > 0
    for key in kept_grads:  # the recompute sees the prompt's keys once, not the completion appended twice
        assert torch.allclose(ckpt_grads[key], kept_grads[key], atol=1e-6, rtol=1e-5), key
    assert ckpt_bytes < 0.6 * kept_bytes, (ckpt_bytes, kept_bytes)
    decoder = model.get_base_model().get_decoder()
    assert all("forward" not in vars(layer) for layer in decoder.layers)  # the layers are plain again afterwards


def test_train_recompute_layers_reaches_the_update(tiny_policy, monkeypatch):
    import contextlib
    import dataclasses

    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.policy import grpo_loss
    from pubswap_flwr.shared import policy_spec

    assert policy_spec(ExperimentConfig()).grpo.recompute_layers is True
    assert policy_spec(ExperimentConfig.from_flat({"train.recompute-layers": False})).grpo.recompute_layers is False
    entered = []

    @contextlib.contextmanager
    def recording(layers):
        entered.append(len(layers))
        yield

    monkeypatch.setattr(grpo_loss, "checkpointed_layers", recording)
    monkeypatch.setattr(grpo_loss, "CHUNK_ABOVE", 0)  # the chunked path, as a real vocabulary takes
    groups = _groups(tiny_policy.tokenizer)
    learner = tiny_policy.learner
    for recompute in (False, True):
        learner.settings = dataclasses.replace(learner.settings, recompute_layers=recompute)
        entered.clear()
        tiny_policy.update(groups)
        layers = len(tiny_policy.model.get_base_model().get_decoder().layers)
        assert entered == ([layers] * len(entered) if recompute else []) and (len(entered) > 0) == recompute


def test_a_decoder_without_a_layers_list_takes_the_chunked_path_without_recompute():
    """GPT-2 and its kin keep their blocks in `.h`: the chunked path runs there, recompute or not, with the same
    values and gradients (the layers are kept, not recomputed)."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    from pubswap_flwr.policy.grpo_batch import Batch

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    assert _plain_lm_head(model) is not None and not hasattr(model.get_base_model().get_decoder(), "layers")
    prompts = torch.randint(1, 97, (2, 5)).repeat_interleave(2, dim=0)  # two groups of two completions
    completions = torch.randint(1, 97, (4, 6))
    batch = Batch(prompts, torch.ones_like(prompts), completions, torch.ones_like(completions), torch.zeros(4), [2, 2],
                  torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool))
    model.train()
    results = []
    for recompute in (False, True):
        model.zero_grad(set_to_none=True)
        logps = completion_logps(model, batch, slice(0, 4), chunk_above=0, recompute_layers=recompute)
        logps.sum().backward()
        results.append((logps.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(results[0][1][k], results[1][1][k]) for k in results[0][1])
