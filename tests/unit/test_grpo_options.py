"""TRL's scale_rewards and mask_truncated_completions in our GRPO update, on hand-computed cases."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.policy.grpo import GRPOLearner, GRPOSettings, build_batch, group_advantages, micro_batch_loss
from pubswap_flwr.policy.sampling import GenerationSettings
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.shared import policy_spec

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0])
SIZES = [4, 4]
CENTRED = [0.75, -0.25, -0.25, -0.25, 0.375, 0.375, -0.125, -0.625]  # r - group mean (0.25 and 0.625)


def test_group_scaling_is_the_default_and_divides_by_each_groups_std():
    first = 0.5  # sqrt((0.75² + 3 x 0.25²) / 3)
    second = math.sqrt((2 * 0.375 ** 2 + 0.125 ** 2 + 0.625 ** 2) / 3)
    expected = [c / (first + 1e-4) for c in CENTRED[:4]] + [c / (second + 1e-4) for c in CENTRED[4:]]
    assert group_advantages(REWARDS, SIZES).tolist() == pytest.approx(expected, abs=1e-6)
    assert group_advantages(REWARDS, SIZES, scale="group").tolist() == pytest.approx(expected, abs=1e-6)


def test_batch_scaling_divides_by_the_std_of_every_reward():
    mean = 3.5 / 8
    std = math.sqrt(sum((r - mean) ** 2 for r in REWARDS.tolist()) / 7)  # 1.71875 / 7
    assert std == pytest.approx(math.sqrt(1.71875 / 7))
    assert group_advantages(REWARDS, SIZES, scale="batch").tolist() == \
        pytest.approx([c / (std + 1e-4) for c in CENTRED], abs=1e-6)


def test_no_scaling_leaves_reward_minus_group_mean():
    assert group_advantages(REWARDS, SIZES, scale="none").tolist() == pytest.approx(CENTRED, abs=1e-7)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_groups_without_signal_and_groups_of_one_get_zero_in_every_scaling(scale):
    rewards = torch.tensor([0.5, 0.5, 0.5, 1.0, 0.0, 1.0])
    out = group_advantages(rewards, [3, 1, 2], scale=scale)
    assert out[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert out[4] < 0 < out[5]


def test_an_unknown_scaling_is_refused():
    with pytest.raises(ValueError, match="unknown reward scaling 'mean'"):
        group_advantages(REWARDS, SIZES, scale="mean")
    with pytest.raises(ValueError, match="^train.scale-rewards = 'mean': must be one of 'group', 'batch', 'none'"):
        ExperimentConfig.from_flat({"train.scale-rewards": "mean"})


def test_the_config_reaches_the_update_settings_and_defaults_change_nothing():
    assert policy_spec(ExperimentConfig()).grpo == GRPOSettings(
        learning_rate=2e-3, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, kl_beta=0.0, inner_iterations=1,
        micro_batch_size=64, max_grad_norm=1.0, weight_decay=0.0)
    cfg = ExperimentConfig.from_flat({"train.scale-rewards": "none", "train.mask-truncated-completions": True})
    grpo = policy_spec(cfg).grpo
    assert grpo.scale_rewards == "none" and grpo.mask_truncated_completions is True


PROMPT = "<|im_start|>user\nCalculate 4 + 7.\nReply with only the final answer as <answer>X</answer>.<|im_end|>\n" \
         "<|im_start|>assistant\n"


def _groups(tokenizer):
    """Limit 6 tokens: an own sample ending in EOS, an own one cut at the limit, foreign text that fits (EOS
    appended) and foreign text cut at the limit."""
    eos = tokenizer.eos_token_id
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    short = ids("11")[:3] + [eos]
    cut = (ids("<answer>11</answer> and more words here") * 2)[:6]
    assert eos not in cut and len(short) <= 6
    return [RolloutGroup(PROMPT, [Completion("11", tuple(short)), Completion("cut", tuple(cut)),
                                  Completion("1"), Completion("<answer>12</answer> and then a very long tail " * 3)],
                         [1.0, 0.0, 1.0, 0.0])]


def test_truncated_completions_are_those_ending_in_neither_eos_nor_pad(tiny_policy):
    tokenizer = tiny_policy.tokenizer
    batch = build_batch(tokenizer, _groups(tokenizer), GenerationSettings(max_new_tokens=6))
    assert batch.truncated.tolist() == [False, True, False, True]
    masked = batch.without_truncated()
    assert masked.completion_mask[[1, 3]].sum() == 0
    assert torch.equal(masked.completion_mask[[0, 2]], batch.completion_mask[[0, 2]])
    assert masked.rewards.tolist() == batch.rewards.tolist()  # rewards still shape the group's advantages


def test_masked_truncated_completions_leave_the_dapo_loss_and_its_token_count(tiny_policy):
    """With one inner iteration the ratio is 1, so each active token's loss is -A: the DAPO loss is
    -sum(A_i x len_i) / sum(len_i) over the completions left in, whatever the model."""
    tokenizer = tiny_policy.tokenizer
    batch = build_batch(tokenizer, _groups(tokenizer), GenerationSettings(max_new_tokens=6))
    advantages = group_advantages(batch.rewards, batch.group_sizes)
    lengths = batch.completion_mask.sum(-1).tolist()
    settings = GRPOSettings()
    with torch.no_grad():
        full = micro_batch_loss(tiny_policy.model, batch, slice(0, 4), advantages, None, None, settings,
                                float(sum(lengths)))
        kept = batch.without_truncated()
        masked = micro_batch_loss(tiny_policy.model, kept, slice(0, 4), advantages, None, None, settings,
                                  float(lengths[0] + lengths[2]))
    a = advantages.tolist()
    assert float(full.loss) == pytest.approx(-sum(x * n for x, n in zip(a, lengths)) / sum(lengths), abs=1e-6)
    assert float(masked.loss) == pytest.approx(-(a[0] * lengths[0] + a[2] * lengths[2]) / (lengths[0] + lengths[2]),
                                               abs=1e-6)


def test_the_update_counts_only_the_tokens_left_in(tiny_policy):
    policy = tiny_policy
    generation = GenerationSettings(max_new_tokens=6)
    batch = build_batch(policy.tokenizer, _groups(policy.tokenizer), generation)
    kept = int(batch.completion_mask[[0, 2]].sum())
    plain = GRPOLearner(policy.model, policy.tokenizer, GRPOSettings(), generation).update(_groups(policy.tokenizer))
    assert plain.tokens == int(batch.completion_mask.sum()) and "truncated_masked" not in plain.extra
    learner = GRPOLearner(policy.model, policy.tokenizer, GRPOSettings(mask_truncated_completions=True), generation)
    stats = learner.update(_groups(policy.tokenizer))
    assert stats.tokens == kept and stats.extra["truncated_masked"] == 2


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_zero_advantage_rows_are_skipped_without_changing_the_step(tiny_location, loss_type):
    """Rows whose advantage is 0 leave the forward and backward; loss, gradients and the adapter after the step equal
    those of a pass over every row of the groups trained (KL off; the all-equal group is not trained and, since #53,
    not counted either: tests/unit/test_loss_normaliser.py). A batch whose every group agrees still takes Adam's
    momentum step."""
    import copy

    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
    torch.manual_seed(0)
    policy = Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16), generation=GenerationSettings(max_new_tokens=6),
                               grpo=GRPOSettings(loss_type=loss_type, learning_rate=1e-2)))
    first = _groups(policy.tokenizer)[0]
    groups = [first, RolloutGroup(first.prompt, first.completions[::-1], [1.0, 0.0, 0.0, 1.0]),
              RolloutGroup(first.prompt, first.completions, [1.0, 1.0, 1.0, 1.0])]
    skipped = policy.learner
    whole = copy.deepcopy(skipped)
    whole.settings = dataclasses.replace(whole.settings, kl_beta=1e-30)  # a KL term keeps every row in the pass
    ours = skipped.update(groups)
    full = whole.update(groups[:2])
    assert ours.extra["rows_trained"] == 12 - 4 and full.extra["rows_trained"] == 8
    assert ours.loss == pytest.approx(full.loss, abs=1e-6)
    assert ours.zero_advantage_groups == 1 and full.zero_advantage_groups == 0
    for name, param in skipped.params.items():
        assert torch.allclose(param, whole.params[name], atol=1e-6), name
    flat = [RolloutGroup(g.prompt, g.completions, [0.0] * len(g.completions)) for g in groups]
    before = {n: p.detach().clone() for n, p in skipped.params.items()}
    stats = skipped.update(flat)
    assert stats.extra["rows_trained"] == 0 and stats.loss == 0.0
    moved = [n for n, p in skipped.params.items() if not torch.equal(p, before[n])]
    assert moved  # Adam's moments from the step before still move the adapter, as an all-zero backward would
