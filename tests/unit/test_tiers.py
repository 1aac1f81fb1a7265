"""tests/tiers.fast_only: the fast tier keeps the named variants, the full suite every one."""

from __future__ import annotations

import pytest

from tests.tiers import fast_only


def _slow(param) -> bool:
    return any(mark.name == "slow" for mark in getattr(param, "marks", ()))


def test_only_the_named_variants_stay_unmarked_and_the_rest_keep_their_values():
    params = fast_only(["pubswap", "sapo", "fedavg"], fast=["sapo"])
    assert params[1] == "sapo"
    assert [p.values for p in (params[0], params[2])] == [("pubswap",), ("fedavg",)]
    assert _slow(params[0]) and _slow(params[2])


def test_tuples_are_spread_over_the_arguments_and_dicts_kept_whole():
    params = fast_only([("a", 1), ("b", 2)], fast=[("a", 1)])
    assert params[0] == ("a", 1) and params[1].values == ("b", 2) and _slow(params[1])
    config = {"strategy.mode": "fedavg"}
    assert fast_only([{}, config], fast=[{}])[1].values == (config,)


def test_a_fast_variant_that_is_not_a_value_is_an_error():
    with pytest.raises(ValueError, match=r"fast variants \['sapo-sync'\] are not among \['sapo'\]"):
        fast_only(["sapo"], fast=["sapo-sync"])
