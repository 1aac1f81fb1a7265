"""Where GRPO's gradient can carry a skill (#52 item 1): with group-centred advantages, the token-level ("dapo")
loss and one inner iteration (ratio 1), a token that every member of a group shares, in the same context, gets no
net gradient; a token the members differ in, or a shared token after divergent text, does; and the per-sequence
("grpo") loss leaves shared tokens a gradient when the members' lengths differ (each is weighted A_i / len_i)."""

from __future__ import annotations

import pytest
import torch

from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
from pubswap_flwr.policy.grpo import GRPOSettings, build_batch, group_advantages
from pubswap_flwr.policy.grpo_loss import aggregate_loss, clipped_token_loss, completion_logps
from pubswap_flwr.policy.sampling import GenerationSettings
from pubswap_flwr.rollouts import Completion, RolloutGroup

PROMPT = "<|im_start|>user\nCalculate 4 + 7.\nReply with only the final answer as <answer>X</answer>.<|im_end|>\n" \
         "<|im_start|>assistant\n"
ANSWERS = ["11", "7", "123", "4"]  # right, wrong, wrong, wrong: members of unequal length
REWARDS = [1.0, 0.0, 0.0, 0.0]
SHARED_GRADIENT_BOUND = 1e-7
TAG = "<answer>"  # the answer tag's opening, which the warm model predicts almost surely
PHRASE = "So the sum is <answer>"  # shared text it does not: its tokens' log-probs have a sizeable gradient


@pytest.fixture(scope="module")
def policy():
    """The embedded model with a LoRA adapter whose B matrices are not zero (at PEFT's init every gradient through A
    would vanish for another reason)."""
    torch.manual_seed(0)
    made = Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16), generation=GenerationSettings(max_new_tokens=16)))
    with torch.no_grad():
        for param in made.learner.params.values():
            param.normal_(0.0, 0.05)
    return made


def _group(tokenizer, shared_text: str = TAG) -> tuple[RolloutGroup, int]:
    """Each completion is SHARED<answer>DIGITS</answer><eos> as sampled ids; also how many leading ids they share
    (text the model does not predict with certainty, whose tokens' log-probs have a sizeable gradient)."""
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    opening = ids(shared_text)
    completions = [Completion(f"{shared_text}{a}</answer>", tuple(opening + ids(a) + ids("</answer>")
                                                              + [tokenizer.eos_token_id])) for a in ANSWERS]
    return RolloutGroup(PROMPT, completions, REWARDS), len(opening)


def _gradient_norm(policy: Policy, loss_type: str, keep: torch.Tensor, shared_text: str = TAG) -> float:
    """The norm of the LoRA gradient that the completion tokens in `keep` (B, C) send through the GRPO loss (the
    other tokens' log-probs are detached, so each row keeps its length in the per-sequence normalisation)."""
    tokenizer = policy.tokenizer
    group, _ = _group(tokenizer, shared_text)
    batch = build_batch(tokenizer, [group], GenerationSettings(max_new_tokens=16))
    advantages = group_advantages(batch.rewards, batch.group_sizes)
    assert abs(float(advantages.sum())) < 1e-6  # centred: the law's premise
    params = list(policy.learner.params.values())
    for param in params:
        param.grad = None
    settings = GRPOSettings(loss_type=loss_type)
    rows = slice(0, len(ANSWERS))
    logps = completion_logps(policy.model, batch, rows)
    keep = keep[:, : logps.shape[1]].bool() & batch.completion_mask.bool()
    logps = torch.where(keep, logps, logps.detach())
    per_token, _ = clipped_token_loss(logps, logps.detach(), advantages, settings.epsilon_low,  # one inner iteration
                                      settings.epsilon_high)
    mask = batch.completion_mask
    loss = aggregate_loss(per_token, mask, loss_type, float(mask.sum()), len(ANSWERS))
    loss.backward()
    return float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None)))


def _positions(policy: Policy, which: str, shared_text: str = TAG, rows: int = len(ANSWERS)) -> torch.Tensor:
    """Which completion tokens of the first `rows` members send their gradient."""
    tokenizer = policy.tokenizer
    group, shared = _group(tokenizer, shared_text)
    width = max(len(c.token_ids) for c in group.completions)
    keep = torch.zeros(len(ANSWERS), width)
    for row, completion in enumerate(group.completions[:rows]):
        if which == "shared opening":
            keep[row, :shared] = 1
        elif which == "first answer token":  # the members differ in it
            keep[row, shared] = 1
        elif which == "closing tag":  # shared text after divergent answers: a different context per member
            keep[row, len(completion.token_ids) - 4] = 1  # "</", which opens the closing tag
    return keep


def test_a_token_every_member_shares_gets_no_dapo_gradient(policy):
    assert _gradient_norm(policy, "dapo", _positions(policy, "shared opening")) <= SHARED_GRADIENT_BOUND


@pytest.mark.parametrize("which", ["first answer token", "closing tag"])
def test_tokens_the_members_differ_in_or_that_follow_divergent_text_get_a_gradient(policy, which):
    assert _gradient_norm(policy, "dapo", _positions(policy, which)) > 1e3 * SHARED_GRADIENT_BOUND


def _advantages_and_lengths(policy: Policy) -> tuple[list[float], list[int]]:
    group, _ = _group(policy.tokenizer, PHRASE)
    batch = build_batch(policy.tokenizer, [group], GenerationSettings(max_new_tokens=16))
    return group_advantages(batch.rewards, batch.group_sizes).tolist(), batch.completion_mask.sum(-1).tolist()


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_shared_tokens_net_gradient_is_their_weights_sum_times_one_members(policy, loss_type):
    """Every member's shared tokens send the same gradient g, weighted A_i (dapo) or A_i / len_i (grpo): the group
    sends (sum of weights) x g, member 0 alone w_0 x g. dapo's weights sum to 0; grpo's do not when lengths differ."""
    advantages, lengths = _advantages_and_lengths(policy)
    weights = advantages if loss_type == "dapo" else [a / n for a, n in zip(advantages, lengths)]
    group = _gradient_norm(policy, loss_type, _positions(policy, "shared opening", PHRASE), PHRASE)
    alone = _gradient_norm(policy, loss_type, _positions(policy, "shared opening", PHRASE, rows=1), PHRASE)
    assert alone > 0.1  # a sizeable gradient from one member
    if loss_type == "dapo":
        assert abs(sum(weights)) < 1e-6 and group <= 1e-5 * alone  # what is left is fp32 rounding
    else:
        assert len(set(lengths)) > 1
        assert group / alone == pytest.approx(abs(sum(weights)) / abs(weights[0]), rel=1e-3)
