"""Issue #53, items 1 and 4: how many groups carry a learning signal (rewards that differ), measured per node and
round (own trained groups, SAPO's received ones, PubSwap's per public prompt before and after the swap), checked as a
metrics row, shown in the progress line and the report; and a SAPO sender that shares only groups that differ."""

from __future__ import annotations

import json
import logging
import random

import pytest

from pubswap_flwr import metrics_schema as ms
from pubswap_flwr.algorithms.group_signal import ExternalSignal, has_signal, zero_advantage_share
from pubswap_flwr.algorithms.pubswap_response_sets import (
    DonorChoice,
    Response,
    SwapOutcome,
    build_response_sets,
    rewards_after_swap,
)
from pubswap_flwr.algorithms.sapo_selection import shared_groups
from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.report import write_report
from pubswap_flwr.rounds.roundlog import RoundLog
from pubswap_flwr.server.metrics import MetricsError, RunRecorder, check_row
from pubswap_flwr.wire.counters import SignalCounts
from pubswap_flwr.wire.validate import Rejected
from tests.unit.test_report_files import _table, make_run


# -- the share computations -----------------------------------------------------------------------------------------
def test_a_group_has_signal_only_when_its_rewards_differ():
    assert has_signal([0.0, 1.0]) and has_signal([0.5, 0.5, 0.25])
    assert not has_signal([1.0, 1.0, 1.0]) and not has_signal([0.0]) and not has_signal([])
    assert not has_signal([0.3, 0.3 + 1e-13])  # float noise is not a signal (the loss's own tolerance)


def test_zero_advantage_share_counts_groups_whose_rewards_are_all_equal():
    assert zero_advantage_share([[1, 1], [0, 1], [0, 0], [1, 0]]) == 0.5
    assert zero_advantage_share([[0, 0, 0]]) == 1.0
    assert zero_advantage_share([[0, 1]]) == 0.0
    assert zero_advantage_share([]) is None  # no groups: no share, never a made-up 0


def test_external_signal_derives_the_usable_groups_and_the_share_among_scored_ones():
    signal = ExternalSignal(received=24, rejected=4, zero_advantage=15)
    assert signal.usable == 5 and signal.zero_advantage_share == 0.75  # 15 of the 20 it could score
    assert signal.problem() == ""
    assert ExternalSignal(3, 3, 0).zero_advantage_share is None  # none scored
    assert ExternalSignal(0, 0, 0).usable == 0
    assert ExternalSignal(5, 2, 4).problem() == "external-zero-advantage + external-rejected = 6 exceed " \
                                                "external-received = 5"


def test_signal_counts_add_up_and_give_the_client_row():
    counts = SignalCounts.of_groups([[1, 1], [0, 1], [0, 0]]) + SignalCounts.of_groups([[0.5, 0.0]])
    assert (counts.groups, counts.zero_advantage) == (4, 2)
    assert counts.row() == {ms.TRAINED_GROUPS: 4, ms.ZERO_ADVANTAGE_GROUPS: 2, ms.ZERO_ADVANTAGE_SHARE: 0.5}
    assert SignalCounts.from_metrics({"node-index": 0, **counts.to_metrics()}) == counts
    assert SignalCounts().to_metrics() == {} and SignalCounts().row() == {}  # trained nothing: nothing on the wire
    with pytest.raises(Rejected, match="zero-advantage-groups exceeds trained-groups"):
        SignalCounts.from_metrics({"trained-groups": 2, "zero-advantage-groups": 3})
    with pytest.raises(Rejected, match="trained-groups"):
        SignalCounts.from_metrics({"trained-groups": -1})


def _responses(client: str, rewards: list[float]) -> list[Response]:
    return [Response(client, i, f"{client}{i}", r) for i, r in enumerate(rewards)]


def test_balanced_swap_turns_an_all_wrong_group_into_one_that_differs():
    pool = _responses("a", [0, 0, 0, 0]) + _responses("b", [1, 1, 1, 1])
    outcomes = build_response_sets(pool, "balanced", 0.5, 4, random.Random(0))
    before = [[r.reward for r in pool if r.client == c] for c in ("a", "b")]
    after = [rewards_after_swap(outcomes[c]) for c in ("a", "b")]
    assert zero_advantage_share(before) == 1.0  # both groups all-equal before the swap
    assert sorted(after[0]) == [0, 0, 1, 1] and after[1] == [1, 1, 1, 1]
    assert zero_advantage_share(after) == 0.5  # a now teaches; b kept its own (all right)


def test_rewards_after_a_likely_donor_swap_fill_its_slots_with_the_lowest_candidate():
    own = _responses("a", [0.0, 1.0, 0.0, 0.0])
    choice = DonorChoice((0, 2), tuple(_responses("b", [1.0, 0.75])))
    outcome = SwapOutcome(own, 2, 2, 1, choice)
    assert rewards_after_swap(outcome) == [0.75, 1.0, 0.75, 0.0]
    assert rewards_after_swap(SwapOutcome(own, 0, 0, 1)) == [0.0, 1.0, 0.0, 0.0]


# -- the sender filter (item 4) -------------------------------------------------------------------------------------
REWARDS = [[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1], [0.5, 0.5, 0.5]]


def test_a_sender_shares_only_groups_whose_rewards_differ_when_told():
    order = [4, 2, 0, 3, 1]  # the node's seeded shuffle
    assert shared_groups(order, REWARDS, 3) == [4, 2, 0]  # today's rule: the first `share` of the shuffle
    assert shared_groups(order, REWARDS, 3, informative_only=False) == [4, 2, 0]
    assert shared_groups(order, REWARDS, 3, informative_only=True) == [3, 1]  # only the mixed ones, shuffle order
    assert shared_groups(order, REWARDS, 1, informative_only=True) == [3]  # never more than the share
    assert shared_groups(order, REWARDS, 0, informative_only=True) == []
    assert shared_groups(order, [[1, 1]] * 5, 3, informative_only=True) == []


def test_the_sapo_key_is_off_by_default_and_a_bool():
    assert ExperimentConfig.from_flat({}).sapo.share_informative_only is False
    cfg = ExperimentConfig.from_flat({"strategy.mode": "sapo", "sapo.share-informative-only": True})
    assert cfg.sapo.share_informative_only is True
    with pytest.raises(ConfigError, match="sapo.share-informative-only"):
        ExperimentConfig.from_flat({"sapo.share-informative-only": "sometimes"})


@pytest.fixture()
def sapo_node(tmp_path):
    from pubswap_flwr.node_runtime.learner import Learner, NodeSettings
    from pubswap_flwr.node_runtime.state import NodeIdentity
    from pubswap_flwr.protocols.sapo import SapoNode

    def build(**overrides):
        cfg = ExperimentConfig.from_flat({"strategy.mode": "sapo", "tasks.mix": "gcd:1", "tasks.per-node": 0,
                                          "eval.items-per-task": 5, "sapo.completions": 3, "sapo.sharing": "fixed",
                                          "sapo.questions": 5, "sapo.share": 3, "sapo.local": 2, **overrides})
        learner = Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / "node", "embedded:tiny"))
        return SapoNode(learner, cfg.sapo)

    return build


def _scripted_rollout(node):
    """Replace the node's sampling with groups of scripted rewards (REWARDS, in the order of the items drawn)."""
    from pubswap_flwr.rollouts import Completion, RolloutGroup

    def rollout(items, k):
        return [RolloutGroup(f"q{i}", [Completion(f"c{j}", (j,)) for j in range(k)], list(REWARDS[i]), item.uid,
                             item.task) for i, item in enumerate(items)], 0.0

    node.learner.rollout = rollout


def test_sapo_node_with_the_option_shares_only_its_mixed_groups_and_keeps_all_for_training(sapo_node):
    from pubswap_flwr.node_runtime.learner import WorkReport

    plain, filtered = sapo_node(), sapo_node(**{"sapo.share-informative-only": True})
    for node in (plain, filtered):
        _scripted_rollout(node)
    before = plain.generate_rollouts(1, WorkReport())
    after = filtered.generate_rollouts(1, WorkReport())
    uids = [g.item["uid"] for g in filtered.saved.pending]
    mixed = {uids[1], uids[3]}
    assert len(before) == 3 and {p.item.uid for p in before} != mixed  # today's rule: 3 of 5 whatever they hold
    assert {p.item.uid for p in after} == mixed  # only the groups whose rewards differ
    assert len(filtered.saved.pending) == 5  # the node still trains on its own groups as before


# -- the metrics row, the progress line, the round log ------------------------------------------------------------
def _row(**fields) -> dict:
    return {"round": 1, "mode": "sapo", **fields}


def test_the_metrics_row_accepts_the_signal_fields():
    row = _row(zero_advantage_share=0.75, swap={"zero_advantage_before_swap": 1.0, "zero_advantage_after_swap": 0.5},
               clients={"7": {"trained_groups": 4, "zero_advantage_groups": 3, "zero_advantage_share": 0.75,
                              "external_usable": 5, "external_zero_advantage_share": 0.0}})
    assert check_row(row, "m") is row


@pytest.mark.parametrize("fields,named", [
    ({"zero_advantage_share": 1.5}, "zero_advantage_share"),
    ({"zero_advantage_share": -0.1}, "zero_advantage_share"),
    ({"swap": {"zero_advantage_after_swap": 2.0}}, "zero_advantage_after_swap"),
    ({"clients": {"7": {"zero_advantage_share": 1.01}}}, "zero_advantage_share"),
    ({"clients": {"7": {"external_zero_advantage_share": -1}}}, "external_zero_advantage_share"),
    ({"clients": {"7": {"external_usable": -3}}}, "external_usable"),
    ({"clients": {"7": {"trained_groups": 2.5}}}, "trained_groups"),
])
def test_the_metrics_row_refuses_a_share_outside_0_1_or_a_negative_count(fields, named):
    with pytest.raises(MetricsError, match=named):
        check_row(_row(**fields), "metrics.jsonl:2")


def test_the_progress_line_shows_the_rounds_zero_advantage_share(tmp_path, caplog):
    recorder = RunRecorder(tmp_path / "run", ExperimentConfig.from_flat({"num-server-rounds": 3}), 1)
    with caplog.at_level(logging.INFO, logger="pubswap_flwr"):
        recorder.progress({"round": 2, "train_reward": 0.25, "cumulative_reward": 0.5, "zero_advantage_share": 0.8125})
        recorder.progress({"round": 3, "train_reward": 0.25, "cumulative_reward": 0.75})
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("[round 2/3] | train reward 0.250 (cumulative 0.50) | zero-advantage groups 0.81")
    assert "zero-advantage" not in lines[1]


def test_round_log_adds_up_a_clients_segments_and_writes_its_share():
    from pubswap_flwr.rounds.exchange import ExchangeResult
    from pubswap_flwr.wire.records import ClientReport

    round_log = RoundLog(1)
    for counts in (SignalCounts(4, 3), SignalCounts(2, 0)):  # a PubSwap round's two segments
        report = ClientReport(0, 8, 0.0, 1, 0.0, 0.0, signal=counts)
        reply = type("Reply", (), {"report": report})()
        round_log.absorb(ExchangeResult(replies={11: reply}))
    row = round_log.clients[11]
    assert (row[ms.TRAINED_GROUPS], row[ms.ZERO_ADVANTAGE_GROUPS], row[ms.ZERO_ADVANTAGE_SHARE]) == (6, 3, 0.5)


# -- the report's column ----------------------------------------------------------------------------------------------
def _with_shares(run, shares: list[float | None], usable: list[int] | None = None):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for position, (row, share) in enumerate(zip(rows[1:], shares)):
        if share is not None:
            row["zero_advantage_share"] = share
        if usable is not None:
            row["clients"]["1"]["external_usable"] = usable[position]
            row["clients"]["2"]["external_usable"] = usable[position] + 2
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run


def test_report_shows_the_mean_informative_share_over_rounds_with_an_interval_over_seeds(tmp_path):
    plain = write_report(tmp_path / "plain", [make_run(tmp_path / "plain", "a", 0, 0.2)]).read_text()
    assert "## Learning signal" not in plain  # runs that did not record it get no section

    root = tmp_path / "sig"
    runs = [_with_shares(make_run(root, "a", 0, 0.2), [0.9, 0.8, 0.7]),  # informative 0.1, 0.2, 0.3: mean 0.2
            _with_shares(make_run(root, "a", 1, 0.2), [0.6, None, 0.8]),  # 0.4, 0.2 (round 2 unrecorded): 0.3
            _with_shares(make_run(root, "b", 0, 0.2, mode="sapo"), [0.5, 0.5, 0.5], usable=[1, 2, 3])]
    text = write_report(root, runs).read_text()
    section = text.split("## Learning signal")[1]
    a, b = _table(section, "a"), _table(section, "b")
    assert a[1].startswith("0.250 [0.000, ")  # mean over seeds of 0.2 and 0.3, its t interval cut at 0
    assert a[2] == "–"  # not sapo: no external groups
    assert b[1] == "0.500 [n/a]"
    assert b[2] == "3.000 [n/a]"  # usable external groups per receiver-round: (1+3 + 2+4 + 3+5) / 6
    summary = json.loads((root / "summary.json").read_text())
    assert summary["signal"]["a"]["informative_share"]["mean"] == pytest.approx(0.25)
    assert summary["runs"]["a-s1"]["informative_share"] == pytest.approx(0.3)
