"""The IS correction's weights on answer-tag tokens apart from the rest (#35: a receiver that has never written
the tags finds them unlikely, so truncated IS may mute exactly the tokens that carry a peer's discovery)."""

from __future__ import annotations

import torch

from pubswap_flwr.policy.grpo_batch import tag_token_mask
from pubswap_flwr.wire.counters import ForeignCounts


def test_tag_tokens_are_found_however_the_tokenizer_splits_them(tiny_policy):
    tokenizer = tiny_policy.tokenizer
    ids = tokenizer("5 + 6 = 11 <answer>11</answer>", add_special_tokens=False)["input_ids"]
    completion_ids = torch.tensor([ids, ids])
    mask = tag_token_mask(tokenizer, completion_ids, torch.ones_like(completion_ids), torch.tensor([True, False]))
    assert not mask[1].any()  # only the rows asked for
    decoded = "".join(tokenizer.decode([i]) for i, m in zip(ids, mask[0].tolist()) if m)
    assert "<answer>" in decoded and "</answer>" in decoded and "11" not in decoded.replace("<answer>", "").replace(
        "</answer>", "")
    untagged = "".join(tokenizer.decode([i]) for i, m in zip(ids, mask[0].tolist()) if not m)
    assert "answer" not in untagged


def test_tag_weights_travel_apart_from_the_rest_and_add_up():
    first = ForeignCounts(tokens=10, weight_sum=8.0, capped=1, tag_tokens=4, tag_weight_sum=2.0)
    total = first + ForeignCounts(tokens=5, weight_sum=5.0, tag_tokens=1, tag_weight_sum=1.0)
    assert (total.tag_tokens, total.tag_weight_sum) == (5, 3.0)
    assert ForeignCounts.from_metrics(total.to_metrics()) == total
    row = total.row()
    assert row["foreign_weight_mean_tags"] == 3.0 / 5 and row["foreign_weight_mean_other"] == (13.0 - 3.0) / 10
    assert "foreign_weight_mean_tags" not in ForeignCounts(tokens=3, weight_sum=3.0).row()


def test_an_is_update_on_foreign_text_counts_its_tag_tokens(tiny_policy):
    from pubswap_flwr.policy.grpo import GRPOLearner, GRPOSettings
    from pubswap_flwr.rollouts import Behaviour, Completion, RolloutGroup

    policy = tiny_policy
    tokenizer = policy.tokenizer
    from pubswap_flwr.tasks import TaskItem

    prompt = policy.formatter(TaskItem("q", "basic_arithmetic", "Calculate 4 + 7.", "11", "exact"))
    foreign_ids = tuple(tokenizer("<answer>11</answer>", add_special_tokens=False)["input_ids"]
                        + [tokenizer.eos_token_id])
    behaviour = Behaviour(foreign_ids, tuple(-1.0 for _ in foreign_ids))
    own = tuple(tokenizer("<answer>12</answer>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    group = RolloutGroup(prompt, [Completion("<answer>11</answer>", source="peer-1", behaviour=behaviour),
                                  Completion("<answer>12</answer>", own)], [1.0, 0.0])
    learner = GRPOLearner(policy.model, tokenizer, GRPOSettings(foreign_correction="is", is_cap=2.0),
                          policy.spec.generation)
    stats = learner.update([group])
    assert 0 < stats.extra["foreign_tag_tokens"] < stats.extra["foreign_tokens"]
    assert 0 < stats.extra["foreign_tag_weight_sum"] <= 2.0 * stats.extra["foreign_tag_tokens"]
