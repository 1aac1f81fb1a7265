"""Policy: model resolution, tokenizer consistency, LoRA state io, merged sampling, and the GRPO update's direction."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pubswap_flwr.policy import from_wire, initial_adapter, to_wire
from pubswap_flwr.policy.grpo import build_batch, group_advantages, per_token_logps
from pubswap_flwr.policy.model import ModelError, resolve_device, resolve_model
from pubswap_flwr.policy.sampling import GenerationSettings
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.tasks import TaskItem


def test_resolve_model_embedded_and_errors(tmp_path):
    path = resolve_model("embedded:tiny")
    assert path.endswith("data/models/tiny")
    with pytest.raises(ModelError, match="no embedded model 'nope'; available: tiny, tiny-b"):
        resolve_model("embedded:nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"))
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # hub ids pass through


def test_tokenizer_ids_agree_across_loaders(tiny_location):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    auto = AutoTokenizer.from_pretrained(tiny_location)
    fast = PreTrainedTokenizerFast.from_pretrained(tiny_location)
    text = "<|im_start|>user\nCalculate 51 + 20.\n<answer>71</answer><|im_end|> naïve ünïcode 0x3f 12345"
    assert auto(text)["input_ids"] == fast(text)["input_ids"]
    assert auto.eos_token == "<|im_end|>" and auto.pad_token == "<|endoftext|>"
    rendered = auto.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_adapter_wire_round_trip_is_fp16_and_loads_back(tiny_policy):
    state = tiny_policy.adapter()
    assert all(v.dtype == torch.float32 for v in state.values())
    wire = to_wire(state)
    assert all(a.dtype == np.float16 for a in wire.values())
    back = from_wire(wire)
    worst = max(float((back[k] - state[k]).abs().max()) for k in state)
    assert 0 < worst < 1e-3  # fp16 rounding, nothing else
    tiny_policy.load_adapter(back)
    assert all(torch.equal(tiny_policy.adapter()[k], back[k]) for k in state)
    with pytest.raises(ValueError, match="adapter keys do not match"):
        tiny_policy.load_adapter({"nope": torch.zeros(1)})
    key = next(iter(state))
    with pytest.raises(ValueError, match="has shape"):
        tiny_policy.load_adapter({**state, key: torch.zeros(3, 3)})


def test_merged_sampling_restores_base_weights_exactly(tiny_policy):
    with torch.no_grad():
        for p in tiny_policy.model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    before = {n: p.detach().clone() for n, p in tiny_policy.model.named_parameters()}
    item = TaskItem("u", "gcd", "What is 2+2?", "4", "exact")
    for _ in range(3):
        out = tiny_policy.sample([item], 4)
    assert len(out) == 1 and len(out[0]) == 4
    after = dict(tiny_policy.model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_merged_sampling_computes_with_w_plus_delta_and_puts_the_frozen_tensor_back(tiny_policy):
    from pubswap_flwr.policy.lora import MergedSampling

    with torch.no_grad():
        for p in tiny_policy.model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    sampler = MergedSampling(tiny_policy.model)
    layers = sampler._layers
    frozen = [layer.base_layer.weight.detach().clone() for layer in layers]
    where = [layer.base_layer.weight.data_ptr() for layer in layers]
    deltas = [layer.get_delta_weight("default").detach() for layer in layers]
    with sampler.merged():
        for layer, weight, delta in zip(layers, frozen, deltas):
            assert torch.equal(layer.base_layer.weight, weight + delta) and layer.merged_adapters == ["default"]
    # the very tensors come back, unchanged (nothing was written into them; no copy of them is kept between calls)
    assert [layer.base_layer.weight.data_ptr() for layer in layers] == where
    assert all(torch.equal(layer.base_layer.weight, weight) for layer, weight in zip(layers, frozen))
    assert all(layer.merged_adapters == [] for layer in layers) and not hasattr(sampler, "_snapshot")


def test_sampling_returns_ids_text_and_logprobs_consistent_with_scoring(tiny_policy):
    items = [TaskItem("a", "t", "Calculate 4 + 7.", "11", "exact"),
             TaskItem("b", "t", "Spell lamp backward", "pmal", "exact")]
    torch.manual_seed(3)
    out = tiny_policy.sample(items, 3)
    tok = tiny_policy.tokenizer
    sample = out[1][0]
    assert sample.prompt_index == 1
    assert len(sample.logprobs) == len(sample.token_ids)
    assert all(lp <= 0 for lp in sample.logprobs)
    if sample.finished:
        assert sample.token_ids[-1] == tok.eos_token_id
    assert sample.text == tok.decode(sample.token_ids, skip_special_tokens=True)
    # The behaviour log-probs equal the training-time log-probs of the same ids under the (unmerged) policy.
    group = RolloutGroup(tiny_policy.prompts([items[1]])[0], [Completion(sample.text, tuple(sample.token_ids))], [1.0])
    batch = build_batch(tok, [group], GenerationSettings(max_new_tokens=64))
    with torch.no_grad():
        lp = per_token_logps(tiny_policy.model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1])
    n = len(sample.token_ids)
    assert np.allclose(lp[0, :n].numpy(), np.array(sample.logprobs), atol=1e-4)


def test_foreign_text_is_retokenized_with_eos_and_truncated(tiny_policy):
    tok = tiny_policy.tokenizer
    long_text = "<answer>" + "x" * 200 + "</answer>"
    group = RolloutGroup("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
                         [Completion("<answer>5</answer>", source="peer"), Completion(long_text, source="peer")],
                         [1, 0])
    batch = build_batch(tok, [group], GenerationSettings(max_new_tokens=8))
    ids = tok("<answer>5</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert batch.completion_ids[0, : len(ids)].tolist() == ids[:8]
    assert int(batch.completion_mask[1].sum()) == 8  # truncated to the limit
    assert batch.foreign.tolist() == [True, True]


def test_group_advantages_match_grpo_definition():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5])
    adv = group_advantages(rewards, [4, 3])
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std(unbiased=True)
    assert torch.allclose(adv[:4], (torch.tensor([1.0, 0, 0, 1]) - 0.5) / (std + 1e-4))
    assert torch.equal(adv[4:], torch.zeros(3))  # equal rewards: no signal
    assert group_advantages(torch.tensor([1.0]), [1]).item() == 0.0


def _sum_logp(policy, group: RolloutGroup) -> list[float]:
    batch = build_batch(policy.tokenizer, [group], policy.learner.generation)
    with torch.no_grad():
        lp = per_token_logps(policy.model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1])
    return (lp * batch.completion_mask).sum(-1).tolist()


def test_update_direction_rewarded_completions_rise_penalised_fall(tiny_policy):
    """After a few updates, log-probs of reward-1 completions (one of them foreign text) rise, reward-0 ones fall."""
    policy = tiny_policy
    item = TaskItem("u", "basic_arithmetic", "Calculate 4 + 7.", "11", "exact")
    prompt = policy.prompts([item])[0]
    eos = policy.tokenizer.eos_token_id
    own = lambda t: Completion(t, tuple(policy.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]))
    group = RolloutGroup(prompt, [own("<answer>11</answer>"), own("<answer>9</answer>"),
                                  Completion("<answer>11</answer>!", source="peer"), own("<answer>7</answer>")],
                         [1.0, 0.0, 1.0, 0.0])
    before = _sum_logp(policy, group)
    for _ in range(3):
        stats = policy.update([group])
    after = _sum_logp(policy, group)
    assert stats.foreign_completions == 1 and stats.completions == 4
    assert after[0] > before[0] and after[2] > before[2]
    assert after[1] < before[1] and after[3] < before[3]


def test_proximal_term_changes_the_update_and_vanishes_at_mu_zero(tiny_policy):
    policy = tiny_policy
    item = TaskItem("u", "t", "Calculate 1 + 1.", "2", "exact")
    prompt = policy.prompts([item])[0]
    group = RolloutGroup(prompt, [Completion("<answer>2</answer>"), Completion("<answer>3</answer>")], [1.0, 0.0])
    start = {k: v.clone() for k, v in policy.adapter().items()}
    # Move away from the reference first so the proximal gradient is non-zero.
    policy.update([group])
    moved = policy.adapter()
    reference = {n: start_tensor for n, start_tensor in zip(policy.learner.params, start.values())}
    moments, groups = policy.learner.optimizer_tensors()
    moments = {k: v.clone() for k, v in moments.items()}

    def step(mu: float | None) -> dict:
        policy.load_adapter(moved)
        policy.learner.load_optimizer_tensors({k: v.clone() for k, v in moments.items()}, groups)
        torch.manual_seed(0)
        stats = policy.update([group], proximal_reference=reference if mu is not None else None,
                              proximal_mu=mu if mu is not None else 0.0)
        return policy.adapter(), stats

    plain, _ = step(None)
    zero, zero_stats = step(0.0)
    prox, prox_stats = step(10.0)
    assert zero_stats.proximal == 0.0
    assert all(torch.equal(plain[k], zero[k]) for k in plain)  # mu = 0: identical update
    assert prox_stats.proximal > 0
    assert max(float((plain[k] - prox[k]).abs().max()) for k in plain) > 1e-6
    # The proximal pull brings the adapter closer to the reference.
    dist = lambda s: sum(float((s[k] - start[k]).pow(2).sum()) for k in s)
    assert dist(prox) < dist(plain)


def test_optimizer_state_survives_save_and_restore(tiny_policy, tmp_path):
    policy = tiny_policy
    group = RolloutGroup(policy.prompts([TaskItem("u", "t", "q", "2", "exact")])[0],
                         [Completion("<answer>2</answer>"), Completion("<answer>3</answer>")], [1.0, 0.0])
    policy.update([group])
    moments, groups = policy.learner.optimizer_tensors()
    save_file(moments, str(tmp_path / "opt.safetensors"), metadata={"param_groups": groups})
    before = {k: v.clone() for k, v in moments.items()}
    steps_before = [s["step"] for s in policy.learner.optimizer.state.values()]
    policy.learner.reset_optimizer()
    assert not policy.learner.optimizer.state
    with safe_open(str(tmp_path / "opt.safetensors"), framework="pt") as file:
        loaded = {k: file.get_tensor(k) for k in file.keys()}
        policy.learner.load_optimizer_tensors(loaded, file.metadata()["param_groups"])
    restored, restored_groups = policy.learner.optimizer_tensors()
    assert restored.keys() == before.keys() and all(torch.equal(restored[k], before[k]) for k in before)
    assert json.loads(restored_groups) == json.loads(groups)
    assert isinstance(policy.learner.optimizer.param_groups[0]["betas"], tuple)
    policy.update([group])
    assert all(float(s["step"]) == float(b) + 1 for s, b in zip(policy.learner.optimizer.state.values(), steps_before))


def test_optimizer_state_of_another_shape_or_key_is_refused_by_name(tiny_policy):
    policy = tiny_policy
    group = RolloutGroup(policy.prompts([TaskItem("u", "t", "q", "2", "exact")])[0],
                         [Completion("<answer>2</answer>"), Completion("<answer>3</answer>")], [1.0, 0.0])
    policy.update([group])
    moments, groups = policy.learner.optimizer_tensors()
    moments = {k: v.clone() for k, v in moments.items()}
    wrong_shape = dict(moments, **{"0.exp_avg": torch.zeros(3, 5)})
    with pytest.raises(ValueError, match=r"optimizer state 0.exp_avg has shape \(3, 5\)"):
        policy.learner.load_optimizer_tensors(wrong_shape, groups)
    with pytest.raises(ValueError, match="'99999.exp_avg' is not <parameter index>.<moment>"):
        policy.learner.load_optimizer_tensors(dict(moments, **{"99999.exp_avg": torch.zeros(1)}), groups)


def test_resolve_device_auto_cpu_and_clear_errors(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ModelError, match=r"model.device = 'cuda' but torch sees no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ModelError, match=r"model.device = 'cuda:2' but torch sees only 2 CUDA device\(s\)"):
        resolve_device("cuda:2")


def test_policy_on_the_cpu_device_keeps_adapter_and_batches_on_cpu(tiny_policy):
    assert tiny_policy.device == torch.device("cpu")
    assert all(v.device.type == "cpu" and v.dtype == torch.float32 for v in tiny_policy.adapter().values())


def test_initial_adapter_draws_on_the_cpu_generator_for_any_device(tiny_policy):
    """A non-CPU LoRA layer gets exactly the values peft's own init gives on the CPU for the same seed."""
    initial_adapter(tiny_policy.model, 7)
    reference = tiny_policy.adapter()
    layer = next(m for m in tiny_policy.model.modules() if hasattr(m, "reset_lora_parameters") and hasattr(m, "lora_A"))
    name = next(iter(layer.lora_A.keys()))

    class _FakeDevice:  # what the init code reads of a parameter on another device
        type = "meta"

    class _Weight:
        def __init__(self, tensor):
            self.tensor, self.shape, self.device = tensor, tensor.shape, _FakeDevice()

        def copy_(self, value):
            self.tensor.copy_(value)

        def zero_(self):
            self.tensor.zero_()

    class _Holder:
        def __init__(self, tensor):
            self.weight = _Weight(tensor)

    class _Layer:
        def __init__(self, src):
            self.lora_A = {name: _Holder(src.lora_A[name].weight.data)}
            self.lora_B = {name: _Holder(src.lora_B[name].weight.data)}

        def reset_lora_parameters(self, *_):
            raise AssertionError("a non-CPU layer must not be re-initialised by peft on its own device")

    class _Model:
        def modules(self):
            return [_Layer(m) for m in tiny_policy.model.modules()
                    if hasattr(m, "reset_lora_parameters") and hasattr(m, "lora_A")]

    initial_adapter(tiny_policy.model, 3)  # scramble
    initial_adapter(_Model(), 7)
    assert all(torch.equal(reference[k], v) for k, v in tiny_policy.adapter().items())
    assert float(layer.lora_B[name].weight.abs().sum()) == 0.0


def test_adapter_reads_and_loads_equal_peft_state_dicts_after_training_and_replacement(tiny_policy):
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    from pubswap_flwr.policy.lora import adapter_state, load_adapter_state

    model = tiny_policy.model
    first = adapter_state(model)  # finds the adapter's slots
    with torch.no_grad():  # an optimizer-like in-place change
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.01 * torch.randn_like(param))
    theirs = get_peft_model_state_dict(model)
    ours = adapter_state(model)
    assert list(ours) == list(theirs) and len(ours) > 0
    assert all(torch.equal(ours[k], theirs[k].float()) for k in ours)
    assert all(not torch.equal(ours[k], first[k]) for k in ours)  # the reads follow the in-place change
    target = {k: v + 0.5 for k, v in ours.items()}
    load_adapter_state(model, target)
    assert all(torch.equal(v, target[k]) for k, v in get_peft_model_state_dict(model).items())
    set_peft_model_state_dict(model, first)  # peft's own load, read back through the slots
    assert all(torch.equal(adapter_state(model)[k], first[k]) for k in first)
    module = next(m for name, m in model.named_modules() if name.endswith("lora_A.default"))
    module.weight = torch.nn.Parameter(torch.full_like(module.weight, 3.0))  # a parameter replaced on its module
    assert any(torch.equal(v, torch.full_like(v, 3.0)) for v in adapter_state(model).values())
    with pytest.raises(ValueError, match="has shape"):
        load_adapter_state(model, {k: v[:1] for k, v in first.items()})
    with pytest.raises(ValueError, match="adapter keys do not match the model: missing"):
        load_adapter_state(model, dict(list(first.items())[1:]))
