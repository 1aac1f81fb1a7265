"""#16's extensions at the protocol level: receiver-aware donors (pubswap.donor = likely), the adaptive public-step
schedule, and sampling log-probs in replies and packets (validated like any reply)."""

from __future__ import annotations

import base64
import random
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

from pubswap_flwr.algorithms.public_schedule import even_positions, fixed_positions, public_step_count
from pubswap_flwr.algorithms.pubswap_response_sets import Response, balanced_choice, build_response_sets, most_likely
from pubswap_flwr.algorithms.sapo_selection import Packet
from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.node_runtime.learner import Learner, WorkReport
from pubswap_flwr.protocols.pubswap import (
    DonorChoice,
    PubSwapProtocol,
    Segment,
    SegmentReply,
    SwapEntry,
    likeliest,
)
from pubswap_flwr.protocols.pubswap_messages import SegmentAsk, SegmentConfig, check_behaviours
from pubswap_flwr.rollouts import Behaviour
from pubswap_flwr.tasks import TaskItem
from pubswap_flwr.wire.records import ClientReport, Header
from pubswap_flwr.wire.validate import Limits, Rejected, check_packet

HEADER = Header(2, "run-x", "/runs/run-x", round_start=False)
REPORT = ClientReport(node_index=1, num_examples=8, cumulative_reward=0.5, total_steps=3, t_start=1.0, t_end=2.0)
ITEM = TaskItem("gcd/0", "gcd", "What is gcd(4, 6)?", "2", "exact")


@pytest.fixture(autouse=True)
def _identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def _pool(correct: dict[str, int], k: int = 4) -> list[Response]:
    return [Response(client, i, f"{client}-{i}", 1.0 if i < n else 0.0) for client, n in correct.items()
            for i in range(k)]


# -- receiver-aware donors ---------------------------------------------------------------------------------------
def test_a_failing_client_gets_balanceds_slots_and_every_donor_as_candidates():
    pool = _pool({"a": 0, "b": 3, "c": 2})
    own = [r for r in pool if r.client == "a"]
    choice = balanced_choice(own, pool, 1.0, random.Random(0), max_candidates=8)
    assert len(choice.slots) == 2 and len(set(choice.slots)) == 2 and list(choice.slots) == sorted(choice.slots)
    assert sorted(r.text for r in choice.candidates) == ["b-0", "b-1", "b-2", "c-0", "c-1"]
    capped = balanced_choice(own, pool, 1.0, random.Random(0), max_candidates=3)
    assert len(capped.candidates) == 3 and all(r.client != "a" and r.reward == 1.0 for r in capped.candidates)


def test_no_choice_for_a_client_that_is_not_failing_or_has_no_donors():
    pool = _pool({"a": 2, "b": 4})
    assert balanced_choice([r for r in pool if r.client == "a"], pool, 1.0, random.Random(0), 8) is None
    lonely = _pool({"a": 0, "b": 0})
    assert balanced_choice([r for r in lonely if r.client == "a"], lonely, 1.0, random.Random(0), 8) is None
    assert balanced_choice([], pool, 1.0, random.Random(0), 8) is None


def test_with_likely_the_response_set_is_the_clients_own_until_it_chooses():
    pool = _pool({"a": 0, "b": 3, "c": 1})
    outcomes = build_response_sets(pool, "balanced", 1.0, 4, random.Random(1), donor="likely", max_candidates=8)
    assert [r.client for r in outcomes["a"].responses] == ["a"] * 4
    assert outcomes["a"].swapped == 2 and len(outcomes["a"].choice.candidates) == 4
    assert outcomes["c"].swapped == 1 and outcomes["b"].choice is None
    with pytest.raises(ValueError, match="unknown donor choice 'best'"):
        build_response_sets(pool, "balanced", 1.0, 4, random.Random(1), donor="best")


def test_most_likely_orders_by_score_then_position():
    assert most_likely([-1.0, -0.2, -3.0, -0.2], 3) == [1, 3, 0]
    assert most_likely([-1.0], 2) == [0]


def _work(scores: dict[str, float]):
    """A client whose policy scores each text as `scores` says (a known policy)."""
    policy_learner = SimpleNamespace(mean_logprobs=lambda prompt, completions: [scores[c.text] for c in completions])
    cfg = ExperimentConfig()
    learner = SimpleNamespace(settings=SimpleNamespace(train=cfg.train, generation=cfg.generation),
                              policy=SimpleNamespace(learner=policy_learner, tokenizer=None))
    learner.foreign_completion = lambda *args: Learner.foreign_completion(learner, *args)
    return SimpleNamespace(learner=learner, report=WorkReport())


def test_the_client_fills_the_slots_with_the_candidates_its_policy_finds_most_likely():
    entries = tuple(SwapEntry(0.0, i) for i in range(4))
    candidates = tuple(SwapEntry(1.0, -1, text, "peer") for text in ("x", "y", "z"))
    work = _work({"x": -2.0, "y": -0.5, "z": -1.0})
    chosen = likeliest(work, "prompt", entries, DonorChoice((1, 3), candidates))
    assert [e.text or e.own_index for e in chosen] == [0, "y", 2, "z"]
    with pytest.raises(ValueError, match="slot 1 is not one of the client's own responses"):
        likeliest(work, "prompt", chosen, DonorChoice((1,), candidates))


def test_donor_ordering_under_the_real_policy_prefers_what_it_would_say(tiny_policy):
    cfg = ExperimentConfig()
    learner = SimpleNamespace(settings=SimpleNamespace(train=cfg.train, generation=cfg.generation), policy=tiny_policy)
    learner.foreign_completion = lambda *args: Learner.foreign_completion(learner, *args)
    work = SimpleNamespace(learner=learner, report=WorkReport())
    prompt = tiny_policy.formatter(ITEM)
    entries = tuple(SwapEntry(0.0, i) for i in range(2))
    candidates = (SwapEntry(1.0, -1, "qq zz 2 xx", "a"), SwapEntry(1.0, -1, "<answer>2</answer>", "b"))
    chosen = likeliest(work, prompt, entries, DonorChoice((0,), candidates))
    assert chosen[0].source == "b" and chosen[1].own_index == 1


def test_donor_choices_round_trip_and_malformed_ones_are_refused():
    sets = {"public/gcd/1": (SwapEntry(0.0, 0), SwapEntry(0.0, 1))}
    choices = {"public/gcd/1": DonorChoice((1,), (SwapEntry(1.0, -1, "<answer>2</answer>", "p",
                                                             Behaviour((3, 4), (-0.5, -1.0))),))}
    segment = Segment(HEADER, SegmentConfig(private_steps=1, k=2), None, sets, None, choices)
    assert Segment.from_record(segment.to_record()) == segment
    for bad, reason in (({"slots": [2], "candidates": []}, r"slots must be distinct integers in \[0, 2\)"),
                        ({"slots": [0, 0], "candidates": []}, "distinct"),
                        ({"slots": [0], "candidates": []}, "needs 1..64 foreign candidates"),
                        ({"slots": [0], "candidates": [{"own_index": 1, "reward": 1.0}]}, "foreign candidates"),
                        ({"slots": [0], "candidates": [{"reward": 1.0}]},
                         r"^a donor choice.candidates\[0\]: a foreign response needs its text$"),
                        ({"slots": [0], "candidates": [{"reward": 2, "text": "t"}]},
                         r"^a donor choice.candidates\[0\].reward: expected `float` <= 1.0$"),
                        ({"slots": [True], "candidates": []},
                         r"^a donor choice.slots\[0\]: expected `int`, got `bool`$"),
                        ("x", "^a donor choice: expected `object`, got `str`$")):
        with pytest.raises(ValueError, match=reason):
            DonorChoice.from_dict(bad, 2)


def test_donor_likely_needs_balanced():
    with pytest.raises(ConfigError, match="pubswap.donor = 'likely' chooses among Balanced's donors"):
        ExperimentConfig.from_flat({"strategy.mode": "pubswap", "pubswap.swap": "random", "pubswap.donor": "likely"})


# -- adaptive schedule -------------------------------------------------------------------------------------------
def test_the_step_count_follows_the_signal_between_its_bounds():
    counts = [public_step_count(s, 0.2, 0.6, 1, 9) for s in (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9)]
    assert counts == [1, 1, 3, 5, 7, 9, 9]
    with pytest.raises(ValueError, match="low = 0.6 must be below high = 0.2"):
        public_step_count(0.5, 0.6, 0.2, 1, 9)
    with pytest.raises(ValueError, match="need 1 <= min_steps"):
        public_step_count(0.5, 0.2, 0.6, 4, 2)


def test_even_positions_reproduce_the_fixed_schedule_and_spread_any_count():
    assert even_positions(20, 4) == fixed_positions(20, 5) == [5, 10, 15, 20]
    assert even_positions(20, 6) == [4, 7, 10, 14, 17, 20]
    assert even_positions(20, 1) == [20] and even_positions(3, 3) == [1, 2, 3]
    with pytest.raises(ValueError, match="cannot place 5 public steps in a round of 4"):
        even_positions(4, 5)


def _protocol(**overrides) -> PubSwapProtocol:
    flat = {"strategy.mode": "pubswap", "train.local-steps": 20, "pubswap.tau-swap": 5, **overrides}
    return PubSwapProtocol.from_config(ExperimentConfig.from_flat(flat))


def test_the_protocol_adapts_to_a_synthetic_drift_signal_and_keeps_it_across_a_restart():
    fixed = _protocol()
    fixed.last_disagreement = 0.9
    assert fixed.public_step_positions() == [5, 10, 15, 20]  # the fixed schedule ignores the signal
    adaptive = _protocol(**{"pubswap.schedule": "adaptive", "pubswap.max-public-steps": 10})
    assert adaptive.public_step_positions() == [5, 10, 15, 20]  # round 1: no signal yet, tau / tau-swap steps
    steps = []
    for signal in (0.1, 0.3, 0.5, 0.7):  # disagreement rising: more public steps
        adaptive.last_disagreement = signal
        steps.append(len(adaptive.public_step_positions()))
    assert steps == [1, 3, 8, 10]
    restarted = _protocol(**{"pubswap.schedule": "adaptive", "pubswap.max-public-steps": 10})
    restarted.restore(adaptive.state())
    assert restarted.last_disagreement == 0.7 and len(restarted.public_step_positions()) == 10
    assert "last_disagreement" not in _protocol().state()  # nothing measured yet: nothing saved


@pytest.mark.parametrize("overrides, reason", [
    ({"pubswap.min-public-steps": 5, "pubswap.max-public-steps": 3}, "min-public-steps = 5 exceeds"),
    ({"pubswap.max-public-steps": 30}, "max-public-steps = 30 exceeds train.local-steps = 20"),
    ({"pubswap.disagreement-low": 0.7}, "disagreement-low = 0.7 must be below"),
])
def test_an_impossible_adaptive_schedule_is_refused(overrides, reason):
    with pytest.raises(ConfigError, match=reason):
        _protocol(**{"pubswap.schedule": "adaptive", **overrides})


# -- log-probs in replies ----------------------------------------------------------------------------------------
def _reply(content) -> Message:
    return Message(content, dst_node_id=1, message_type="train")


class _Public:
    def get(self, uid):
        return ITEM


def _wire(ids, logps, id_dtype: str = "<u2") -> str:
    """A behaviour's wire form built by hand (rollouts.Behaviour.to_wire's encoding), holding what it never writes."""
    return base64.b64encode(bytes([np.dtype(id_dtype).itemsize]) + np.asarray(ids, dtype=id_dtype).tobytes()
                            + np.asarray(logps, dtype="<f2").tobytes()).decode()


def test_a_reply_carries_its_sampling_behaviour_to_the_server():
    behaviour = {"p": [Behaviour((1, 2), (-0.5, -0.25)), None]}
    reply = SegmentReply(REPORT, {"p": ["<answer>2</answer>", "<answer>3</answer>"]}, behaviour=behaviour)
    decoded = SegmentReply.from_message(_reply(reply.to_record()),
                                        SegmentAsk(("p",), 2, Limits(), _Public(), with_behaviour=True))
    assert decoded.behaviour == behaviour
    plain = SegmentReply.from_message(_reply(reply.to_record()), SegmentAsk(("p",), 2, Limits(), _Public()))
    assert plain.behaviour == {}  # not asked for: ignored


@pytest.mark.parametrize("raw, reason", [
    ({"q": []}, "keyed by the requested prompt ids"),
    ([], "keyed by the requested prompt ids"),
    ({"p": [None]}, "behaviour must list 2 entries"),
    ({"p": [_wire([1], [float("inf")]), None]}, "prompt p: behaviour log-probs must be finite"),
    ({"p": [_wire([1, 2], [-1.0]), None]}, "prompt p: behaviour's 6 bytes are not whole tokens"),
    ({"p": [{"ids": [1], "logps": [-1.0]}, None]}, "prompt p: behaviour is dict, not a base64 string"),
    ({"p": [_wire([1] * 17, [-1.0] * 17), None]},
     r"prompt p: behaviour has 17 tokens \(1..16\) \(generation.max-new-tokens = 16\)"),
])
def test_malformed_log_probs_in_a_reply_reject_it_with_the_reason(raw, reason):
    limits = Limits.of(ExperimentConfig())
    with pytest.raises(Rejected, match=reason):
        check_behaviours(raw, ["p"], 2, limits)
    assert check_behaviours(None, ["p"], 2, limits) == {"p": [None, None]}


def test_a_packets_behaviour_is_validated_and_relayed():
    packet = Packet("", ITEM, ("<answer>2</answer>", "<answer>5</answer>"),
                    (Behaviour((5, 6), (-0.125, -0.25)), None), "abcdef0123456789")  # fp16 values: exact
    checked = check_packet(packet.to_wire(), Limits(), 4)
    assert checked.behaviour == packet.behaviour and checked.tokenizer == "abcdef0123456789"
    assert Packet.from_wire(packet.with_sender("n1").to_wire()).behaviour == packet.behaviour
    for behaviour, reason in (([_wire([5], [-0.1])], "one entry per completion"),
                              ([_wire([5], [3.0]), None], "log-probs must be finite"),
                              ([_wire([5, 2**31], [-1.0, -1.0], "<u4"), None], "ids must be integers")):
        with pytest.raises(Rejected, match=reason):
            check_packet({**packet.to_wire(), "behaviour": behaviour}, Limits(), 4)
    with pytest.raises(Rejected, match="packet.tokenizer: expected `str` of length <= 64"):
        check_packet({**packet.to_wire(), "tokenizer": "x" * 65}, Limits(), 4)
