"""The GRPO update's normaliser (DAPO's token count, GRPO's sequence count) counts only the groups it trains: a group
whose rewards all agree has advantage 0 everywhere and, without a KL term, neither adds to the loss nor dilutes it."""

from __future__ import annotations

import copy

import pytest
import torch

from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
from pubswap_flwr.policy.grpo import GRPOSettings, build_batch, group_advantages
from pubswap_flwr.policy.sampling import GenerationSettings
from pubswap_flwr.rollouts import Completion, RolloutGroup

PROMPT = "<|im_start|>user\nCalculate 4 + 7.\nReply with only the final answer as <answer>X</answer>.<|im_end|>\n" \
         "<|im_start|>assistant\n"
GENERATION = GenerationSettings(max_new_tokens=8)


def _policy(loss_type: str, kl_beta: float = 0.0) -> Policy:
    torch.manual_seed(0)
    return Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16), generation=GENERATION,
                             grpo=GRPOSettings(loss_type=loss_type, learning_rate=1e-2, kl_beta=kl_beta)))


def _groups(tokenizer) -> tuple[list[RolloutGroup], RolloutGroup]:
    """Two groups whose rewards differ (completions of different lengths) and one whose rewards all agree, with
    longer completions than the others (so its tokens would move a token count a lot)."""
    eos = tokenizer.eos_token_id
    own = lambda text: Completion(text, tuple(tokenizer(text, add_special_tokens=False)["input_ids"][:7] + [eos]))
    short = [own("11"), own("<answer>12</answer>"), own("1"), own("<answer>11</answer>")]
    long = [own("<answer>eleven or twelve</answer>")] * 4
    mixed = [RolloutGroup(PROMPT, short, [1.0, 0.0, 0.0, 1.0]),
             RolloutGroup(PROMPT, short[::-1], [0.0, 0.0, 1.0, 0.5])]
    return mixed, RolloutGroup(PROMPT, long, [1.0, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_zero_advantage_groups_do_not_enlarge_the_normaliser(loss_type):
    """One step on the mixed groups plus an all-equal group is the step on the mixed groups alone: the same loss,
    gradient norm and adapter; the batch's statistics still count every group."""
    policy = _policy(loss_type)
    mixed, flat = _groups(policy.tokenizer)
    alone = copy.deepcopy(policy.learner)
    with_flat = policy.learner.update(mixed + [flat])
    without = alone.update(mixed)
    assert with_flat.zero_advantage_groups == 1 and without.zero_advantage_groups == 0
    assert with_flat.completions == 12 and without.completions == 8
    assert with_flat.loss == pytest.approx(without.loss, rel=1e-6, abs=1e-7)  # GRPO: 0 at ratio 1
    assert with_flat.grad_norm == pytest.approx(without.grad_norm, rel=1e-5)
    for name, param in policy.learner.params.items():
        assert torch.allclose(param, alone.params[name], atol=1e-7), name


def test_the_dapo_normaliser_is_the_trained_groups_tokens():
    """At ratio 1 each trained token's loss is -A, so DAPO's loss is -sum(A_i x len_i) / sum(len_i) over the mixed
    groups' completions; the all-equal group's 4 long completions are not in the count. (GRPO's loss at ratio 1 is
    0 whatever it divides by: each group's advantages sum to 0; the test above compares its gradients.)"""
    policy = _policy("dapo")
    mixed, flat = _groups(policy.tokenizer)
    batch = build_batch(policy.tokenizer, mixed, GENERATION)
    advantages = group_advantages(batch.rewards, batch.group_sizes).tolist()
    lengths = batch.completion_mask.sum(-1).tolist()
    stats = policy.learner.update(mixed + [flat])
    assert stats.loss == pytest.approx(-sum(a * n for a, n in zip(advantages, lengths)) / sum(lengths), abs=1e-6)
    assert stats.tokens == sum(lengths) + 4 * 8  # the batch's tokens, the all-equal group's included


def test_with_a_kl_term_every_group_is_trained_and_counted():
    """A KL term trains the all-equal group's rows too (towards the base model), so they stay in the normaliser:
    the step differs from the step on the mixed groups alone."""
    policy = _policy("dapo", kl_beta=0.5)
    mixed, flat = _groups(policy.tokenizer)
    alone = copy.deepcopy(policy.learner)
    with_flat = policy.learner.update(mixed + [flat])
    without = alone.update(mixed)
    assert with_flat.extra["rows_trained"] == 12 and without.extra["rows_trained"] == 8
    assert with_flat.grad_norm != pytest.approx(without.grad_norm, rel=1e-3)
