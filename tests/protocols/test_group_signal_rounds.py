"""Issue #53 in process: a SAPO run records each node's zero-advantage share and its usable external groups per
round, and `sapo.share-informative-only` makes senders share only groups whose rewards differ (the receivers, who
score the same way, then find none of them zero-advantage); PubSwap records the share before and after the swap."""

from __future__ import annotations

import statistics

import pytest

from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from tests.protocols.test_rounds import SAPO, SMOKE, TINY, _count_shared

CONFIG = {**TINY, **SAPO, "tasks.partial-credit": True, "num-server-rounds": 2, "eval.every": 0,
          "sapo.sharing": "fixed", "sapo.questions": 4, "sapo.share": 4, "sapo.local": 2, "sapo.external": 4}


def _run(tmp_path, name: str, **overrides) -> tuple[list[dict], dict]:
    counts: dict = {}
    simulate_in_process({**CONFIG, **overrides, "output.dir": str(tmp_path), "run-name": name}, 3,
                        reply_hook=_count_shared(counts))
    return read_metrics(tmp_path / name)[1:], counts


def _check_signal_fields(rows: list[dict]) -> None:
    for row in rows:
        clients = row["clients"].values()
        for c in clients:
            assert c["zero_advantage_share"] == c["zero_advantage_groups"] / c["trained_groups"]
            assert c["trained_groups"] == 2 + c["external_used"]  # I own groups + the external ones used
            assert c["external_usable"] == c["external_received"] - c["external_rejected"] \
                - c["external_zero_advantage"]
            assert c["external_used"] == min(4, c["external_usable"])
            scored = c["external_received"] - c["external_rejected"]
            if scored:
                assert c["external_zero_advantage_share"] == c["external_zero_advantage"] / scored
        mean = statistics.fmean(c["zero_advantage_share"] for c in clients)
        assert row["zero_advantage_share"] == pytest.approx(mean)


def test_sapo_records_the_signal_and_shares_only_mixed_groups_when_told(tmp_path):
    today, shared_today = _run(tmp_path, "today")
    informative, shared = _run(tmp_path, "informative", **{"sapo.share-informative-only": True})
    _check_signal_fields(today)
    _check_signal_fields(informative)
    assert shared_today == {0: 4, 1: 4, 2: 4}  # the option off: every node shares sapo.share, as before
    assert all(n <= 4 for n in shared.values())
    received_today = sum(c["external_received"] for r in today for c in r["clients"].values())
    received = sum(c["external_received"] for r in informative for c in r["clients"].values())
    assert 0 < received < received_today  # some groups differed, and fewer were sent
    for row in informative:  # what was shared differed under the sender's scoring, and so under the receiver's
        assert all(c["external_zero_advantage"] == 0 for c in row["clients"].values())
    usable_today = sum(c["external_usable"] for r in today for c in r["clients"].values())
    usable = sum(c["external_usable"] for r in informative for c in r["clients"].values())
    assert usable == received and usable_today <= received_today


def test_pubswap_records_the_share_before_and_after_the_swap_per_public_prompt(tmp_path):
    config = {**TINY, **SMOKE["pubswap"]["config"], "tasks.partial-credit": False, "num-server-rounds": 1,
              "eval.every": 0, "output.dir": str(tmp_path), "run-name": "swap"}
    simulate_in_process(config, 3)
    row = read_metrics(tmp_path / "swap")[-1]
    steps = row["public_steps"]
    assert steps
    for step in steps:
        before, after = step["zero_advantage_before_swap"], step["zero_advantage_after_swap"]
        assert len(before) == len(after) == len(step["prompts"])
        assert all(0 <= share <= 1 for share in before + after)
    for key in ("zero_advantage_before_swap", "zero_advantage_after_swap"):  # the mean over the round's prompts
        assert row["swap"][key] == pytest.approx(statistics.fmean(s for step in steps for s in step[key]))
    for before_key, mixed_key in (("zero_advantage_before_swap", "mixed_groups_before_swap"),
                                  ("zero_advantage_after_swap", "mixed_groups_after_swap")):
        for step in steps:  # per client, its groups with unequal rewards: the shares' complement, client by client
            counts = step[mixed_key]
            assert set(counts) == set(row["clients"])
            assert all(0 <= c <= len(step["prompts"]) for c in counts.values())
            assert sum(counts.values()) == round(sum((1 - share) * step["clients"] for share in step[before_key]))
        assert row["swap"][mixed_key] == {n: sum(step[mixed_key][n] for step in steps) for n in row["clients"]}
    assert all("trained_groups" in c for c in row["clients"].values())
