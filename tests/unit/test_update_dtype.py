"""train.update-dtype = "bfloat16" (#55 item 2): the update's passes under bfloat16 autocast against float32 on a fixed
batch. The bound: the completion tokens' log-probs within 0.01 nats of float32 on average (measured 0.0027, at most
0.06), so a probability ratio moves by about 1%, far inside the clip range (0.2); the gradient within 5% in norm and
at cosine >= 0.99, its direction within about 8 degrees (measured 0.5% and 0.99988). Enough because Adam divides
each step by the gradient's running scale, so what a step does is set by the gradient's direction and per-parameter
signs; bfloat16 keeps 8 bits of mantissa (0.4% relative rounding per product), and the weights, their gradients,
Adam's moments and the loss stay float32. (With one inner iteration the loss's value is the advantages' weighted
count whatever the log-probs are, so it is checked for equality, not bounded.)"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
from pubswap_flwr.policy.grpo import GRPOSettings, build_batch, group_advantages, micro_batch_loss
from pubswap_flwr.policy.grpo_loss import completion_logps
from pubswap_flwr.policy.sampling import GenerationSettings
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.tasks import HeldOutSet, parse_mix

GENERATION = GenerationSettings(max_new_tokens=24, temperature=1.0)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    policy = Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16), generation=GENERATION,
                               grpo=GRPOSettings(learning_rate=1e-2)))
    with torch.no_grad():  # a trained adapter: B not zero, so LoRA's path carries the gradient too
        for param in policy.learner.params.values():
            param.add_(0.05 * torch.randn_like(param))
    items = HeldOutSet.build(parse_mix("basic_arithmetic:1,gcd:1"), per_task=3).items
    torch.manual_seed(1)
    rows = policy.sample(items, 4)
    groups = [RolloutGroup(policy.prompts([item])[0], [Completion(s.text, tuple(s.token_ids)) for s in row],
                           [1.0, 0.0, 0.0, 1.0]) for item, row in zip(items, rows)]
    return policy, groups


def _loss_and_grads(policy, groups, dtype: str):
    learner = copy.deepcopy(policy.learner)
    settings = dataclasses.replace(learner.settings, update_dtype=dtype)
    batch = build_batch(learner.tokenizer, groups, GENERATION)
    advantages = group_advantages(batch.rewards, batch.group_sizes)
    tokens = float(batch.completion_mask.sum())
    learner.model.train()
    part = micro_batch_loss(learner.model, batch, slice(0, len(batch.rewards)), advantages, None, None, settings,
                            tokens, GENERATION.temperature)
    part.loss.backward()
    grads = torch.cat([p.grad.flatten() for p in learner.params.values()])
    return part.loss.detach(), grads, learner


def test_the_bfloat16_update_stays_within_its_bound_of_float32(setup):
    policy, groups = setup
    loss32, grad32, _ = _loss_and_grads(policy, groups, "float32")
    loss16, grad16, learner = _loss_and_grads(policy, groups, "bfloat16")
    assert loss16.dtype == torch.float32 and grad16.dtype == torch.float32
    assert float(loss16) == pytest.approx(float(loss32), rel=1e-6)
    batch = build_batch(policy.tokenizer, groups, GENERATION)
    with torch.no_grad():
        exact = completion_logps(policy.model, batch, slice(0, len(batch.rewards)), GENERATION.temperature)
        low = completion_logps(policy.model, batch, slice(0, len(batch.rewards)), GENERATION.temperature,
                               update_dtype="bfloat16")
    mask = batch.completion_mask.bool()
    assert low.dtype == torch.float32 and 0 < float((low - exact)[mask].abs().mean()) <= 0.01
    assert abs(float(grad16.norm() - grad32.norm())) <= 0.05 * float(grad32.norm())
    assert float(torch.nn.functional.cosine_similarity(grad16, grad32, dim=0)) >= 0.99
    assert not torch.equal(grad16, grad32)  # the products did run in bfloat16
    assert all(p.dtype == torch.float32 for p in learner.params.values())


def test_a_bfloat16_update_keeps_float32_weights_and_moments(setup):
    policy, groups = setup
    learner = copy.deepcopy(policy.learner)
    learner.settings = dataclasses.replace(learner.settings, update_dtype="bfloat16")
    before = {n: p.detach().clone() for n, p in learner.params.items()}
    stats = learner.update(groups)
    assert stats.extra["rows_trained"] == 24
    assert all(p.dtype == torch.float32 and not torch.equal(p, before[n]) for n, p in learner.params.items())
    moments = [v for state in learner.optimizer.state.values() for k, v in state.items() if k != "step"]
    assert moments and all(m.dtype == torch.float32 for m in moments)


def test_the_update_dtype_is_a_checked_config_key():
    assert ExperimentConfig.from_flat({"train.update-dtype": "bfloat16"}).train.update_dtype == "bfloat16"
    assert ExperimentConfig.from_flat({}).train.update_dtype == "auto"
    with pytest.raises(ConfigError, match="train.update-dtype"):
        ExperimentConfig.from_flat({"train.update-dtype": "float16"})
    with pytest.raises(ValueError, match="train.update-dtype must be auto or one of"):
        completion_logps(None, None, slice(0, 1), update_dtype="int8")


def test_auto_takes_bfloat16_where_sampling_would(monkeypatch):
    """train.update-dtype = "auto" (the default): bfloat16 for a float32 model of 50M parameters or more on a device
    with native bf16 (benchmarks/real_model.py part 8), else float32; the embedded models update in float32, so the
    goldens keep their numbers."""
    import pubswap_flwr.policy.precision as policy_module
    from pubswap_flwr.policy import update_precision

    cpu = torch.device("cpu")
    small = torch.nn.Linear(10, 10)
    assert update_precision("auto", "float32", small, cpu) == "float32"
    assert update_precision("bfloat16", "float32", small, cpu) == "bfloat16"
    assert update_precision("float32", "float32", small, cpu) == "float32"
    monkeypatch.setattr(policy_module, "AUTO_LOW_PRECISION_PARAMETERS", 100)
    monkeypatch.setattr(policy_module, "native_bf16", lambda device: True)
    assert update_precision("auto", "float32", small, cpu) == "bfloat16"  # 110 parameters: large enough now
    assert update_precision("auto", "bfloat16", small, cpu) == "bfloat16"  # a bf16 model computes in it anyway
    monkeypatch.setattr(policy_module, "native_bf16", lambda device: False)
    assert update_precision("auto", "float32", small, cpu) == "float32"
    policy = Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16), grpo=GRPOSettings(update_dtype="auto")))
    assert policy.update_dtype == "float32" and policy.learner.settings.update_dtype == "float32"
