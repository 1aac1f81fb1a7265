"""train.foreign-correction: the foreign tokens' loss weights (per-source weight, truncated importance sampling with
the donor's log-probs, the fallback), which donor behaviours a receiver accepts, and their validation on the wire."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest
import torch

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.policy.behaviour import accept_behaviour, tokenizer_fingerprint
from pubswap_flwr.policy.grpo import (
    GRPOLearner,
    GRPOSettings,
    build_batch,
    foreign_token_weights,
    group_advantages,
    micro_batch_loss,
    per_token_logps,
)
from pubswap_flwr.policy.sampling import GenerationSettings
from pubswap_flwr.rollouts import Behaviour, Completion, RolloutGroup
from pubswap_flwr.shared import policy_spec

RECEIVER = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5], [-0.3, -0.3, -0.3], [-0.7, -0.1, -4.0]])
DONOR = torch.tensor([[0.0, 0.0, 0.0], [-1.5, -0.5, -0.5], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
FOREIGN = torch.tensor([False, True, True, False])
HAS_BEHAVIOUR = torch.tensor([False, True, False, False])


def test_none_weighs_every_token_one():
    weights = foreign_token_weights(RECEIVER, FOREIGN, "none", 0.5, 2.0, DONOR, HAS_BEHAVIOUR)
    assert torch.equal(weights, torch.ones(4, 3))


def test_weight_scales_every_foreign_token_and_leaves_own_ones():
    weights = foreign_token_weights(RECEIVER, FOREIGN, "weight", 0.25, 2.0, DONOR, HAS_BEHAVIOUR)
    assert weights.tolist() == [[1.0] * 3, [0.25] * 3, [0.25] * 3, [1.0] * 3]


def test_is_uses_the_truncated_ratio_per_token_and_the_weight_where_no_behaviour_came():
    weights = foreign_token_weights(RECEIVER, FOREIGN, "is", 0.5, 1.5, DONOR, HAS_BEHAVIOUR)
    # row 1: exp(-1 - -1.5) = e^0.5 = 1.6487 -> capped at 1.5; exp(-2 - -0.5) = e^-1.5; exp(0) = 1
    assert weights[1].tolist() == pytest.approx([1.5, math.exp(-1.5), 1.0], abs=1e-6)
    assert weights[2].tolist() == [0.5, 0.5, 0.5]  # foreign without behaviour: the fallback weight
    assert weights[0].tolist() == [1.0] * 3 and weights[3].tolist() == [1.0] * 3  # own rows: never weighted


def test_is_without_any_behaviour_in_the_batch_is_the_fallback_everywhere():
    weights = foreign_token_weights(RECEIVER, FOREIGN, "is", 0.5, 2.0)
    assert weights[:, 0].tolist() == [1.0, 0.5, 0.5, 1.0]


def test_an_unknown_correction_is_refused_with_its_name():
    with pytest.raises(ValueError, match="unknown foreign correction 'clip'"):
        foreign_token_weights(RECEIVER, FOREIGN, "clip", 0.5, 2.0)
    with pytest.raises(ConfigError, match="^train.foreign-correction = 'clip': must be one of 'none', 'weight', 'is'"):
        ExperimentConfig.from_flat({"train.foreign-correction": "clip"})
    with pytest.raises(ConfigError, match="^train.is-cap = 0"):
        ExperimentConfig.from_flat({"train.is-cap": 0.0})


def test_the_config_reaches_the_update_settings():
    cfg = ExperimentConfig.from_flat({"train.foreign-correction": "is", "train.foreign-weight": 0.3,
                                      "train.is-cap": 5.0})
    grpo = policy_spec(cfg).grpo
    assert (grpo.foreign_correction, grpo.foreign_weight, grpo.is_cap) == ("is", 0.3, 5.0)
    assert policy_spec(ExperimentConfig()).grpo.foreign_correction == "none"


# -- behaviours on the wire ----------------------------------------------------------------------------------------
def _wire(ids, logps, width: int = 2, id_dtype: str = "<u2") -> str:
    """A behaviour's wire form built by hand, so it can hold what `to_wire` never writes."""
    return base64.b64encode(bytes([width]) + np.asarray(ids, dtype=id_dtype).tobytes()
                            + np.asarray(logps, dtype="<f2").tobytes()).decode()


def test_a_behaviour_round_trips_through_the_wire_as_fp16_log_probs():
    behaviour = Behaviour((5, 7, 2), (-0.1234567, -2.0, -0.0))
    wire = behaviour.to_wire()
    assert wire == _wire([5, 7, 2], [-0.1234567, -2.0, 0.0])  # width byte 2, uint16 ids, fp16 log-probs
    back = Behaviour.from_wire(wire)
    assert back.ids == (5, 7, 2)
    assert back.logprobs == (float(np.float16(-0.1234567)), -2.0, 0.0)
    assert back.logprobs[0] == pytest.approx(-0.1234567, abs=2**-14)
    assert Behaviour.from_wire(back.to_wire()) == back  # a relayed behaviour arrives unchanged
    assert Behaviour((5,), (-1e-9,)).to_wire() == Behaviour((5,), (0.0,)).to_wire()  # rounds to -0: sent as +0


def test_ids_past_uint16_travel_as_uint32_and_the_wire_is_under_half_of_json_numbers():
    big = Behaviour((70000, 3), (-1.5, -0.25))
    assert big.to_wire() == _wire([70000, 3], [-1.5, -0.25], 4, "<u4") and Behaviour.from_wire(big.to_wire()) == big
    rng = np.random.default_rng(0)  # a sampler's log-probs: mostly near 0, some far below
    for tokens in (8, 400):  # the tiny model's completions are about 8-11 tokens
        behaviour = Behaviour(tuple(int(i) for i in rng.integers(0, 5000, tokens)),
                              tuple(-rng.exponential(1.0, tokens)))
        as_json = json.dumps({"ids": list(behaviour.ids), "logps": [round(x, 5) for x in behaviour.logprobs]},
                             separators=(",", ":"))
        assert len(json.dumps(behaviour.to_wire())) < 0.5 * len(as_json)


@pytest.mark.parametrize("data, reason", [
    ({"ids": [1, 2], "logps": [-1.0, -1.0]}, "dict, not a base64 string"),
    ("AQ*A", "not valid base64"),
    ("", "id width must be 2 or 4 bytes, got nothing"),
    (_wire([1, 2], [-1.0, -1.0], width=3), "id width must be 2 or 4 bytes, got 3"),
    (_wire([1, 2], [-1.0]), "2 bytes are not whole tokens|6 bytes are not whole tokens"),
    (_wire([], []), "0 tokens"),
    (_wire([1, 2**31], [-1.0, -1.0], 4, "<u4"), r"ids must be integers in \[0, 2\*\*31\)"),
    (_wire([1, 2], [-1.0, float("nan")]), "finite numbers"),
    (_wire([1, 2], [-1.0, float("-inf")]), "finite numbers"),
    (_wire([1, 2], [-1.0, 0.5]), "finite numbers"),
    (_wire([1, 2], [-1.0, -3e4]), "finite numbers"),
])
def test_malformed_behaviours_are_refused_with_the_reason(data, reason):
    with pytest.raises(ValueError, match=reason):
        Behaviour.from_wire(data)


def test_a_behaviour_longer_than_the_token_limit_is_refused():
    with pytest.raises(ValueError, match=r"1\.\.3"):
        Behaviour.from_wire(_wire([1] * 4, [-1.0] * 4), max_tokens=3)
    with pytest.raises(ValueError, match="longer than 3 tokens"):  # refused before decoding
        Behaviour.from_wire(_wire([1] * 100, [-1.0] * 100), max_tokens=3)


# -- what a receiver accepts ---------------------------------------------------------------------------------------
def test_a_receiver_accepts_ids_that_decode_to_the_verified_text_only(tiny_policy):
    tokenizer = tiny_policy.tokenizer
    ids = tuple(tokenizer("<answer>11</answer>", add_special_tokens=False)["input_ids"]) + (tokenizer.eos_token_id,)
    behaviour = Behaviour(ids, (-0.5,) * len(ids))
    assert accept_behaviour(tokenizer, "<answer>11</answer>", behaviour, 64) == (behaviour, "")
    assert accept_behaviour(tokenizer, "<answer>12</answer>", behaviour, 64) == (
        None, "the ids do not decode to the verified text")
    assert accept_behaviour(tokenizer, "<answer>11</answer>", behaviour, 2)[1].startswith(f"{len(ids)} tokens, over")
    alien = Behaviour((len(tokenizer) + 5,), (-1.0,))
    assert "outside this tokenizer" in accept_behaviour(tokenizer, "x", alien, 64)[1]
    assert accept_behaviour(tokenizer, "x", None, 64) == (None, "no behaviour sent")


def test_tokenizer_fingerprints_tell_the_two_embedded_models_apart(tiny_policy):
    from pubswap_flwr.policy.model import load_tokenizer, resolve_model

    other = load_tokenizer(resolve_model("embedded:tiny-b"))
    same = load_tokenizer(resolve_model("embedded:tiny"))
    assert tokenizer_fingerprint(tiny_policy.tokenizer) == tokenizer_fingerprint(same)
    assert tokenizer_fingerprint(tiny_policy.tokenizer) != tokenizer_fingerprint(other)
    assert len(tokenizer_fingerprint(same)) == 16


# -- the loss ------------------------------------------------------------------------------------------------------
PROMPT = "<|im_start|>user\nCalculate 4 + 7.\nReply with only the final answer as <answer>X</answer>.<|im_end|>\n" \
         "<|im_start|>assistant\n"


def test_foreign_text_with_a_behaviour_trains_on_the_donors_ids(tiny_policy):
    tokenizer = tiny_policy.tokenizer
    donor_ids = (7, 8, 9)  # deliberately not what re-tokenizing "abc" gives: the batch must carry these
    group = RolloutGroup(PROMPT, [Completion("abc", None, "peer", Behaviour(donor_ids, (-1.0, -2.0, -3.0))),
                                  Completion("abc", None, "peer")], [1.0, 0.0])
    batch = build_batch(tokenizer, [group], GenerationSettings(max_new_tokens=8))
    assert batch.completion_ids[0, :3].tolist() == list(donor_ids) and batch.completion_mask[0].sum() == 3
    retokenized = tokenizer("abc", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert batch.completion_ids[1, :len(retokenized)].tolist() == retokenized
    assert batch.has_behaviour.tolist() == [True, False]
    assert batch.donor_logps[0, :3].tolist() == [-1.0, -2.0, -3.0] and batch.donor_logps[1].abs().sum() == 0


def test_the_is_loss_weighs_each_foreign_token_by_its_truncated_ratio(tiny_policy):
    """With one inner iteration the PPO ratio is 1, so a token's loss is -A x weight: the DAPO loss is
    -sum(A_i x sum_t w_it) / (all tokens). Donor log-probs are set so the ratios are 3 (capped at C = 2) and 1/2."""
    tokenizer, model = tiny_policy.tokenizer, tiny_policy.model
    generation = GenerationSettings(max_new_tokens=8)
    ids = tuple(tokenizer("<answer>11</answer>", add_special_tokens=False)["input_ids"])[:4]
    own = tuple(tokenizer("<answer>12</answer>", add_special_tokens=False)["input_ids"])[:4]
    probe = build_batch(tokenizer, [RolloutGroup(PROMPT, [Completion("x", ids)], [0.0])], generation)
    with torch.no_grad():
        receiver = per_token_logps(model, probe.input_ids, probe.attention_mask, probe.completion_ids.shape[1])[0]
    receiver = receiver[:len(ids)].tolist()
    donor = tuple(r - math.log(3) if t % 2 == 0 else r + math.log(2) for t, r in enumerate(receiver))
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    groups = [RolloutGroup(PROMPT, [Completion("own", own), Completion(text, None, "peer", Behaviour(ids, donor)),
                                    Completion("<answer>3</answer>", None, "peer")], [0.0, 1.0, 0.0])]
    batch = build_batch(tokenizer, groups, generation)
    advantages = group_advantages(batch.rewards, batch.group_sizes)
    lengths = batch.completion_mask.sum(-1).tolist()
    settings = GRPOSettings(foreign_correction="is", is_cap=2.0, foreign_weight=0.25)
    with torch.no_grad():
        part = micro_batch_loss(model, batch, slice(0, 3), advantages, None, None, settings, float(sum(lengths)))
    weights_foreign = sum(2.0 if t % 2 == 0 else 0.5 for t in range(len(ids)))
    a = advantages.tolist()
    expected = -(a[0] * lengths[0] + a[1] * weights_foreign + a[2] * 0.25 * lengths[2]) / sum(lengths)
    assert float(part.loss) == pytest.approx(expected, abs=1e-5)
    assert part.capped == len(range(0, len(ids), 2))  # the tokens whose ratio 3 was cut at C
    assert part.foreign_weight == pytest.approx(weights_foreign + 0.25 * lengths[2], abs=1e-5)


def test_the_update_reports_the_foreign_weight_and_the_default_reports_nothing(tiny_policy):
    tokenizer = tiny_policy.tokenizer
    generation = GenerationSettings(max_new_tokens=6)
    own = tuple(tokenizer("<answer>11</answer>", add_special_tokens=False)["input_ids"])[:5]
    groups = [RolloutGroup(PROMPT, [Completion("own", own), Completion("<answer>3</answer>", None, "peer")],
                           [1.0, 0.0])]
    plain = GRPOLearner(tiny_policy.model, tokenizer, GRPOSettings(), generation).update(groups)
    assert "foreign_tokens" not in plain.extra
    weighted = GRPOLearner(tiny_policy.model, tokenizer, GRPOSettings(foreign_correction="weight",
                                                                      foreign_weight=0.25), generation).update(groups)
    foreign_tokens = weighted.extra["foreign_tokens"]
    assert foreign_tokens == weighted.tokens - len(own)
    assert weighted.extra["foreign_weight_sum"] == pytest.approx(0.25 * foreign_tokens)
    assert weighted.extra["is_capped_tokens"] == 0


def test_mean_logprobs_is_the_per_token_mean_under_the_current_policy(tiny_policy):
    learner = tiny_policy.learner
    completions = [Completion("<answer>11</answer>", None, "peer"), Completion("zz qq", None, "peer")]
    scores = learner.mean_logprobs(PROMPT, completions)
    batch = build_batch(tiny_policy.tokenizer, [RolloutGroup(PROMPT, completions, [0.0, 0.0])], learner.generation)
    with torch.no_grad():
        logps = per_token_logps(tiny_policy.model, batch.input_ids, batch.attention_mask,
                                batch.completion_ids.shape[1])
    mask = batch.completion_mask.float()
    assert scores == pytest.approx(((logps * mask).sum(-1) / mask.sum(-1)).tolist(), abs=1e-5)
    assert scores[0] > scores[1]  # the warmed-up model prefers the answer format to junk
    assert learner.mean_logprobs(PROMPT, []) == []
