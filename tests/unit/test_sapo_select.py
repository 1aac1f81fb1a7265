"""SAPO relay and the I local + J external selection."""

from __future__ import annotations

import random

import pytest

from pubswap_flwr.algorithms.sapo_selection import (
    Packet,
    ScoredPacket,
    Selection,
    capped,
    fair_draw,
    relay,
    select_external,
    select_local,
)
from pubswap_flwr.tasks import TaskItem


def item(uid: str, answer: str = "4") -> TaskItem:
    return TaskItem(uid=uid, task="basic", question=f"question {uid}", answer=answer, verifier="exact")


def packet(sender: str, uid: str, *completions: str, answer: str = "4") -> Packet:
    return Packet(sender, item(uid, answer), tuple(completions))


def exact_rescore(p: Packet) -> list[float]:
    """Reward 1 for completions equal to the item answer, like a receiver-side exact verifier."""
    return [1.0 if c == p.item.answer else 0.0 for c in p.completions]


# --- relay ------------------------------------------------------------------------------------------------------


def test_relay_excludes_own_packets_and_keeps_order():
    pool = [packet("n0", "q1", "4"), packet("n1", "q2", "4"), packet("n2", "q3", "4"), packet("n1", "q4", "5")]
    got = relay(pool, "n1")
    assert [(p.sender, p.item.uid) for p in got] == [("n0", "q1"), ("n2", "q3")]
    assert relay(pool, "n9") == pool
    assert relay([packet("n1", "q", "4")], "n1") == []


def test_packet_wire_round_trip():
    p = Packet("n3", TaskItem("u/1", "gcd", "gcd(4, 6)?", "2", "rg", {"x": 1}, {"seed": 5}, "math"), ("a", "b"))
    back = Packet.from_wire(p.to_wire())
    assert back == p
    assert back.item.metadata == {"x": 1} and back.item.provenance == {"seed": 5} and back.item.family == "math"
    assert isinstance(back.completions, tuple)


@pytest.mark.parametrize("change, reason", [
    ({"completions": "ab"}, "a relayed packet.completions: expected `array`, got `str`"),
    ({"completions": []}, "a relayed packet.completions: expected `array` of length >= 1"),
    ({"sender": 3}, "a relayed packet.sender: expected `str`, got `int`"),
    ({"item": {"uid": "u"}}, "task item: object missing required field `task`"),
    ({"behaviour": [None]}, "behaviour must list one entry per completion (2)"),
])
def test_a_malformed_relayed_packet_is_refused_naming_the_field(change, reason):
    wire = Packet("n3", TaskItem("u/1", "gcd", "q", "2", "exact"), ("a", "b")).to_wire()
    with pytest.raises(ValueError) as caught:
        Packet.from_wire({**wire, **change})
    assert str(caught.value) == reason


# --- select_external --------------------------------------------------------------------------------------------


def test_zero_advantage_groups_are_dropped():
    pool = [
        packet("n1", "all-right", "4", "4", "4"),
        packet("n1", "all-wrong", "1", "2", "3"),
        packet("n2", "mixed-a", "4", "5"),
        packet("n2", "mixed-b", "0", "4", "4"),
    ]
    sel = select_external(pool, 4, exact_rescore, random.Random(0))
    assert sel.received == 4
    assert sel.zero_advantage == 2
    assert sel.rejected == 0
    assert sorted(s.packet.item.uid for s in sel.chosen) == ["mixed-a", "mixed-b"]
    assert sel.shortfall == 2
    by_uid = {s.packet.item.uid: s.rewards for s in sel.chosen}
    assert by_uid == {"mixed-a": (1.0, 0.0), "mixed-b": (0.0, 1.0, 1.0)}


def test_rewards_come_from_receiver_rescore_not_sender():
    # The receiver's verifier says answer "7" is right, whatever the packet's sender believed.
    p = packet("n1", "q", "7", "4", answer="4")
    sel = select_external([p], 1, lambda pk: [1.0 if c == "7" else 0.0 for c in pk.completions], random.Random(0))
    assert sel.chosen[0].rewards == (1.0, 0.0)


def test_j_larger_than_usable_pool_takes_all_and_records_shortfall():
    pool = [packet(f"n{i}", f"q{i}", "4", "x") for i in range(3)] + [packet("n9", "flat", "x", "x")]
    sel = select_external(pool, 10, exact_rescore, random.Random(0))
    assert len(sel.chosen) == 3
    assert {s.packet.item.uid for s in sel.chosen} == {"q0", "q1", "q2"}
    assert sel.shortfall == 7
    assert sel.zero_advantage == 1


def test_j_smaller_than_pool_draws_exactly_j_without_replacement():
    pool = [packet(f"n{i % 3}", f"q{i}", "4", "x") for i in range(12)]
    sel = select_external(pool, 5, exact_rescore, random.Random(1))
    uids = [s.packet.item.uid for s in sel.chosen]
    assert len(uids) == 5 and len(set(uids)) == 5
    assert sel.shortfall == 0
    assert sel.received == 12


def test_j_zero_and_empty_pool():
    pool = [packet("n1", "q", "4", "x")]
    sel = select_external(pool, 0, exact_rescore, random.Random(0))
    assert sel.chosen == [] and sel.shortfall == 0 and sel.received == 1
    empty = select_external([], 3, exact_rescore, random.Random(0))
    assert empty.chosen == [] and empty.shortfall == 3 and empty.received == 0


def test_selection_is_deterministic_under_seed_and_uniform_over_usable():
    pool = [packet(f"n{i % 4}", f"q{i}", "4", "x") for i in range(20)]
    first = [s.packet.item.uid for s in select_external(pool, 6, exact_rescore, random.Random(42)).chosen]
    second = [s.packet.item.uid for s in select_external(pool, 6, exact_rescore, random.Random(42)).chosen]
    assert first == second
    draws = {tuple(s.packet.item.uid for s in select_external(pool, 6, exact_rescore, random.Random(seed)).chosen)
             for seed in range(20)}
    assert len(draws) > 1
    # over many seeds every usable packet gets chosen at some point
    seen = {uid for d in draws for uid in d}
    assert seen == {f"q{i}" for i in range(20)}


def test_packet_whose_rescore_raises_value_error_is_rejected_with_reason():
    good = packet("n1", "good", "4", "x")
    forged = packet("n2", "forged", "4", "x")

    def rescore(p: Packet) -> list[float]:
        if p.item.uid == "forged":
            raise ValueError("unknown verifier 'evil'")
        return exact_rescore(p)

    sel = select_external([forged, good], 2, rescore, random.Random(0))
    assert sel.rejected == 1
    assert sel.rejections == ["n2/forged: unknown verifier 'evil'"]
    assert [s.packet.item.uid for s in sel.chosen] == ["good"]
    assert sel.shortfall == 1
    assert sel.zero_advantage == 0


def test_rescore_errors_other_than_value_error_propagate():
    def rescore(p: Packet) -> list[float]:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        select_external([packet("n1", "q", "4")], 1, rescore, random.Random(0))


def test_empty_or_single_reward_group_has_no_signal():
    assert not ScoredPacket(packet("n", "q"), ()).has_signal
    assert not ScoredPacket(packet("n", "q", "4"), (1.0,)).has_signal
    assert not ScoredPacket(packet("n", "q", "4", "4"), (0.5, 0.5 + 1e-13)).has_signal
    assert ScoredPacket(packet("n", "q", "4", "4"), (0.5, 0.51)).has_signal
    sel = select_external([packet("n1", "empty")], 1, lambda p: [], random.Random(0))
    assert sel.zero_advantage == 1 and sel.chosen == [] and sel.shortfall == 1


def test_selection_defaults():
    sel = Selection(chosen=[])
    assert (sel.received, sel.zero_advantage, sel.rejected, sel.shortfall, sel.rejections) == (0, 0, 0, 0, [])


# --- select_local -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("i,expected", [(0, 0), (3, 3), (8, 8), (12, 8)])
def test_select_local_size(i, expected):
    groups = [f"g{n}" for n in range(8)]
    out = select_local(groups, i, random.Random(0))
    assert len(out) == expected
    assert len(set(out)) == expected
    assert set(out) <= set(groups)


def test_select_local_is_seeded():
    groups = list(range(30))
    assert select_local(groups, 5, random.Random(9)) == select_local(groups, 5, random.Random(9))
    assert len({tuple(select_local(groups, 5, random.Random(s))) for s in range(10)}) > 1


# --- fairness across senders (#34) -------------------------------------------------------------------------------


def test_capped_keeps_each_senders_first_packets_and_counts_the_rest():
    pool = [packet("a", f"a{i}", "4") for i in range(5)] + [packet("b", "b0", "4")] + [packet("a", "a5", "4")]
    kept, cut = capped(pool, 2)
    assert [p.item.uid for p in kept] == ["a0", "a1", "b0"] and cut == {"a": 4}
    assert capped(pool, 0) == ([], {"a": 6, "b": 1})


def test_fair_draw_goes_round_robin_over_senders_in_order_of_first_appearance():
    order = ["a1", "a2", "a3", "a4", "b1", "c1", "c2"]
    assert fair_draw(order, 5, lambda x: x[0]) == ["a1", "b1", "c1", "a2", "c2"]
    assert fair_draw(order, 7, lambda x: x[0]) == ["a1", "b1", "c1", "a2", "c2", "a3", "a4"]
    assert fair_draw(order, 0, lambda x: x[0]) == [] and fair_draw([], 3, lambda x: x[0]) == []
