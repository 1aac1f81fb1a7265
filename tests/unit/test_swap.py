"""PubSwap response-set rules (Balanced, Random) on hand-built pools, plus hypothesis properties."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubswap_flwr.algorithms.pubswap_response_sets import (
    Response,
    SwapOutcome,
    balanced,
    build_response_sets,
    is_correct,
    random_set,
    swaps_needed,
)

T = 1.0  # correctness threshold used throughout


def responses(client: str, rewards: list[float]) -> list[Response]:
    return [Response(client, i, f"{client}-{i}", r) for i, r in enumerate(rewards)]


def correct_count(rs, threshold=T) -> int:
    return sum(is_correct(r, threshold) for r in rs)


# --- swaps_needed / is_correct ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "correct,k,expected",
    [(0, 4, 2), (1, 4, 1), (2, 4, 0), (4, 4, 0), (0, 5, 3), (1, 5, 2), (2, 5, 1), (3, 5, 0), (0, 1, 1), (1, 1, 0),
     (0, 2, 1), (1, 2, 0)],
)
def test_swaps_needed(correct, k, expected):
    assert swaps_needed(correct, k) == expected


def test_is_correct_uses_threshold_inclusively():
    r = Response("a", 0, "x", 0.5)
    assert is_correct(r, 0.5)
    assert not is_correct(r, 0.51)


# --- balanced: exact outputs ------------------------------------------------------------------------------------


def test_half_correct_keeps_own_set_unchanged():
    own = responses("a", [1, 1, 0, 0])
    pool = own + responses("b", [1, 1, 1, 1])
    out = balanced(own, pool, T, random.Random(0))
    assert out == own


def test_all_correct_keeps_own_set():
    own = responses("a", [1, 1, 1])
    pool = own + responses("b", [1, 0, 0])
    assert balanced(own, pool, T, random.Random(0)) == own


def test_zero_correct_of_four_gets_two_correct_donors_from_other_clients():
    own = responses("a", [0, 0, 0, 0])
    others = responses("b", [1, 0, 1, 0]) + responses("c", [0, 1, 0, 0])
    pool = own + others
    out = balanced(own, pool, T, random.Random(3))
    assert len(out) == 4
    replaced = [i for i, (o, n) in enumerate(zip(own, out)) if o != n]
    assert len(replaced) == 2
    donors = {r for r in others if is_correct(r, T)}
    for i in replaced:
        assert out[i] in donors  # correct, and from another client
        assert out[i].client != "a"
    # untouched slots hold the client's own response at the same position
    for i in set(range(4)) - set(replaced):
        assert out[i] is own[i]
    assert len(set(out[i] for i in replaced)) == 2  # distinct donors (sampled without replacement)


def test_one_correct_of_four_gets_one_swap_and_keeps_its_correct_response():
    own = responses("a", [0, 1, 0, 0])
    pool = own + responses("b", [1, 1, 1, 1])
    out = balanced(own, pool, T, random.Random(1))
    assert out[1] is own[1]  # the own correct response stays in place
    replaced = [i for i in range(4) if out[i] is not own[i]]
    assert len(replaced) == 1
    assert replaced[0] in (0, 2, 3)  # only incorrect slots are replaced
    assert out[replaced[0]].client == "b" and out[replaced[0]].reward == 1
    assert correct_count(out) == 2


def test_fewer_donors_than_needed_swaps_only_available_donors():
    own = responses("a", [0, 0, 0, 0, 0, 0])  # needs 3
    donor = Response("b", 2, "b-2", 1.0)
    pool = own + [Response("b", 0, "b-0", 0.0), Response("b", 1, "b-1", 0.5), donor]
    out = balanced(own, pool, T, random.Random(0))
    assert sum(r is not o for r, o in zip(out, own)) == 1
    assert donor in out
    assert correct_count(out) == 1


def test_no_donors_leaves_set_unchanged():
    own = responses("a", [0, 0, 0, 0])
    pool = own + responses("b", [0, 0.5, 0, 0]) + responses("c", [0, 0, 0, 0])
    assert balanced(own, pool, T, random.Random(0)) == own


def test_own_correct_responses_are_never_donors_to_oneself():
    # client a has 1 correct of 4 (needs 1 more); its own correct response is in the pool but must not count.
    own = responses("a", [1, 0, 0, 0])
    pool = own + responses("b", [0, 0, 0, 0])
    assert balanced(own, pool, T, random.Random(0)) == own


def test_odd_k_five_with_two_correct_gets_one_swap():
    own = responses("a", [1, 0, 1, 0, 0])
    pool = own + responses("b", [1, 1, 1, 1, 1])
    out = balanced(own, pool, T, random.Random(7))
    assert sum(r is not o for r, o in zip(out, own)) == 1
    assert correct_count(out) == 3
    assert out[0] is own[0] and out[2] is own[2]


def test_odd_k_five_with_three_correct_keeps_own():
    own = responses("a", [1, 0, 1, 0, 1])
    pool = own + responses("b", [1, 1, 1, 1, 1])
    assert balanced(own, pool, T, random.Random(7)) == own


def test_single_client_is_unchanged_for_lack_of_donors():
    own = responses("a", [0, 0, 0])
    assert balanced(own, own, T, random.Random(0)) == own
    outcome = build_response_sets(own, "balanced", T, 3, random.Random(0))
    assert list(outcome) == ["a"]
    assert outcome["a"] == SwapOutcome(own, 0, 0, 0)


def test_empty_own_gives_empty_set():
    assert balanced([], responses("b", [1]), T, random.Random(0)) == []


def test_threshold_below_one_counts_partial_rewards_as_correct():
    own = responses("a", [0.4, 0.4, 0.4, 0.4])
    pool = own + responses("b", [0.6, 0.6, 0.1, 0.1])
    out = balanced(own, pool, 0.5, random.Random(0))
    assert sorted(r.text for r in out if r.client == "b") == ["b-0", "b-1"]


def test_balanced_is_deterministic_under_a_seed_and_varies_across_seeds():
    own = responses("a", [0] * 8)
    pool = own + responses("b", [1] * 8) + responses("c", [1] * 8)
    a = balanced(own, pool, T, random.Random(11))
    b = balanced(own, pool, T, random.Random(11))
    assert a == b
    outputs = {tuple(balanced(own, pool, T, random.Random(s))) for s in range(10)}
    assert len(outputs) > 1  # slots and donors are random


# --- random rule --------------------------------------------------------------------------------------------


def test_random_set_draws_k_distinct_from_pool_and_is_seeded():
    pool = responses("a", [1, 0, 0]) + responses("b", [0, 1, 1]) + responses("c", [0, 0, 0])
    out = random_set(pool, 4, random.Random(5))
    assert len(out) == 4
    assert len(set(out)) == 4
    assert all(r in pool for r in out)
    assert out == random_set(pool, 4, random.Random(5))
    everything = random_set(pool, 9, random.Random(0))
    assert sorted(r.text for r in everything) == sorted(r.text for r in pool)
    orders = {tuple(r.text for r in random_set(pool, 4, random.Random(s))) for s in range(10)}
    assert len(orders) > 1


def test_random_set_rejects_k_above_pool():
    with pytest.raises(ValueError, match="cannot draw 5 responses from a pool of 4"):
        random_set(responses("a", [1, 1, 1, 1]), 5, random.Random(0))


def test_build_random_rule_outcomes():
    pool = responses("a", [1, 0]) + responses("b", [0, 0]) + responses("c", [1, 1])
    out = build_response_sets(pool, "random", T, 2, random.Random(2))
    again = build_response_sets(pool, "random", T, 2, random.Random(2))
    assert out == again
    assert sorted(out) == ["a", "b", "c"]
    for client, outcome in out.items():
        assert len(outcome.responses) == 2
        assert all(r in pool for r in outcome.responses)
        assert outcome.swapped == sum(r.client != client for r in outcome.responses)
    assert out["a"].donors_available == 2 and out["a"].own_correct == 1
    assert out["b"].donors_available == 3 and out["b"].own_correct == 0
    assert out["c"].donors_available == 1 and out["c"].own_correct == 2


def test_none_rule_keeps_every_clients_own_responses_even_when_failing():
    pool = responses("a", [0, 0, 0, 0]) + responses("b", [1, 1, 1, 1])
    rng = random.Random(3)
    state = rng.getstate()
    out = build_response_sets(pool, "none", T, 4, rng)
    assert [r.client for r in out["a"].responses] == ["a"] * 4 and out["a"].swapped == 0
    assert out["a"].donors_available == 4 and out["a"].own_correct == 0  # donors existed; none were used
    assert out["b"].responses == responses("b", [1, 1, 1, 1])
    assert rng.getstate() == state  # no random draw


def test_build_unknown_rule_raises():
    with pytest.raises(ValueError,
                       match="unknown swap rule 'mixed'; expected one of \\['balanced', 'none', 'random'\\]"):
        build_response_sets(responses("a", [1]), "mixed", T, 1, random.Random(0))


# --- build_response_sets metrics ----------------------------------------------------------------------------


def test_build_balanced_metrics():
    # a: 0/4 correct (needs 2), b: 3/4 (keeps), c: 1/4 (needs 1); pool order shuffled by client.
    a = responses("a", [0, 0, 0, 0])
    b = responses("b", [1, 1, 0, 1])
    c = responses("c", [0, 0, 1, 0])
    pool = [*c, *a, *b]
    out = build_response_sets(pool, "balanced", T, 4, random.Random(0))
    assert list(out) == ["a", "b", "c"]  # sorted clients
    assert (out["a"].swapped, out["a"].donors_available, out["a"].own_correct) == (2, 4, 0)
    assert (out["b"].swapped, out["b"].donors_available, out["b"].own_correct) == (0, 1, 3)
    assert (out["c"].swapped, out["c"].donors_available, out["c"].own_correct) == (1, 3, 1)
    assert out["b"].responses == b
    assert correct_count(out["a"].responses) == 2
    assert correct_count(out["c"].responses) == 2


def test_build_sorts_own_responses_by_index():
    a = [Response("a", 2, "a-2", 0.0), Response("a", 0, "a-0", 1.0), Response("a", 1, "a-1", 1.0),
         Response("a", 3, "a-3", 0.0)]
    out = build_response_sets(a + responses("b", [1, 1, 1, 1]), "balanced", T, 4, random.Random(0))
    assert [r.index for r in out["a"].responses] == [0, 1, 2, 3]


# --- properties ---------------------------------------------------------------------------------------------


@st.composite
def pools(draw):
    n = draw(st.integers(1, 5))
    k = draw(st.integers(1, 8))
    pool = []
    for c in range(n):
        for i in range(k):
            pool.append(Response(f"c{c}", i, f"c{c}-{i}", draw(st.sampled_from([0.0, 0.5, 1.0]))))
    seed = draw(st.integers(0, 2**32 - 1))
    return n, k, pool, seed


@settings(max_examples=150, deadline=None)
@given(pools())
def test_balanced_properties(data):
    n, k, pool, seed = data
    out = build_response_sets(pool, "balanced", T, k, random.Random(seed))
    assert len(out) == n
    for client, outcome in out.items():
        own = [r for r in pool if r.client == client]
        c = correct_count(own)
        donors = [r for r in pool if r.client != client and is_correct(r, T)]
        assert len(outcome.responses) == k
        # own correct responses are never removed (and keep their positions)
        for i, r in enumerate(own):
            if is_correct(r, T):
                assert outcome.responses[i] is r
        # every non-own response is correct and from another client
        foreign = [r for r in outcome.responses if r not in own]
        assert all(r.client != client and is_correct(r, T) for r in foreign)
        assert len(set(foreign)) == len(foreign)
        assert outcome.swapped == len(foreign)
        # donors_available counts only other clients' correct responses
        assert outcome.donors_available == len(donors)
        assert outcome.own_correct == c
        after = correct_count(outcome.responses)
        assert after >= min(math.ceil(k / 2), c + len(donors))
        # and no more swaps than the rule allows
        assert outcome.swapped == min(swaps_needed(c, k), len(donors))


@settings(max_examples=100, deadline=None)
@given(pools())
def test_random_rule_properties(data):
    n, k, pool, seed = data
    out = build_response_sets(pool, "random", T, k, random.Random(seed))
    assert out == build_response_sets(pool, "random", T, k, random.Random(seed))
    for client, outcome in out.items():
        assert len(outcome.responses) == k
        assert len(set(outcome.responses)) == k
        assert all(r in pool for r in outcome.responses)
        assert outcome.own_correct == correct_count([r for r in pool if r.client == client])
