"""The untrusted-input boundary, served in process: claims cannot take over the average, a large sender cannot
crowd others out of the SAPO relay, text that is not valid Unicode is refused where it enters, the server's scoring
of a client's answers has a budget, a run name cannot move a node's state, and node evaluations with different
tasks average."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord
from safetensors.numpy import load_file

from pubswap_flwr.algorithms.lora_averaging import weighted_mean
from pubswap_flwr.algorithms.sapo_selection import Packet, fair_share
from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_runtime.state import NodeIdentity
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.server.runner import mean_eval
from pubswap_flwr.simulation import simulate_in_process
from pubswap_flwr.tasks import ScoringBudget, TaskItem
from pubswap_flwr.wire.codecs import METRICS_KEY, PAYLOAD_KEY, payload_from_record
from pubswap_flwr.wire.validate import Limits, Rejected, check_packet, check_public_responses
from tests.tiers import fast_only

PUBSWAP_ONE_SWAP = {"strategy.mode": "pubswap", "pubswap.tau-swap": 1, "pubswap.public-prompts": 2}
TINY = {"seed": 6, "train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 2,
        "eval.samples": 1, "eval.sampled": False,
        "train.local-steps": 2, "num-server-rounds": 1}
SAPO = {"strategy.mode": "sapo", "sapo.questions": 3, "sapo.completions": 4, "sapo.local": 2, "sapo.external": 3,
        "sapo.share": 3, "sapo.sharing": "fixed"}


def _partition(context) -> int:
    return int(context.node_config["partition-id"])


def _claim(examples: int):
    def hook(msg, context, reply):
        if _partition(context) == 0 and not reply.has_error():
            values = dict(reply.content[METRICS_KEY])
            values["num-examples"] = examples
            reply.content[METRICS_KEY] = MetricRecord(values)
        return reply

    return hook


@pytest.mark.parametrize("mode", fast_only([{}, PUBSWAP_ONE_SWAP], fast=[PUBSWAP_ONE_SWAP]))
def test_no_claim_of_examples_moves_the_average_beyond_what_the_server_asked_for(tmp_path, mode):
    config = {**TINY, **mode, "output.dir": str(tmp_path)}
    simulate_in_process({**config, "run-name": "honest"}, 3)
    simulate_in_process({**config, "run-name": "claims"}, 3, reply_hook=_claim(10**11))
    honest = load_file(str(tmp_path / "honest" / "checkpoint" / "global.safetensors"))
    claims = load_file(str(tmp_path / "claims" / "checkpoint" / "global.safetensors"))
    assert all(np.array_equal(honest[k], claims[k]) for k in honest)  # capped at steps x prompts x K: equal weights
    row = read_metrics(tmp_path / "claims")[1]
    assert len(row["aggregated_clients"]) == 3 and not row["dropped"]  # (a claim over 1e12 drops the reply:
    # tests/protocols/test_messages.py)


def test_weights_whose_sum_overflows_still_average():
    a = {"w": np.ones((2, 2), dtype=np.float32)}
    b = {"w": np.full((2, 2), 3.0, dtype=np.float32)}
    assert np.array_equal(weighted_mean([a, b], [1e308, 1e308])["w"], np.full((2, 2), 2.0, dtype=np.float32))


def _packet(sender: str, size: int) -> Packet:
    return Packet(sender, TaskItem(f"{sender}/{size}", "gcd", "q?", "1", "exact"), ("x" * size,))


def test_fair_share_keeps_every_senders_share_and_their_order():
    pool = [_packet("big", 5000), _packet("big", 5000), _packet("a", 100), _packet("b", 100), _packet("a", 100)]
    kept = fair_share(pool, 3 * 1000, lambda p: len(p.completions[0]))
    assert [(p.sender, len(p.completions[0])) for p in kept] == [("a", 100), ("b", 100), ("a", 100)]
    assert fair_share(pool, 10**9, lambda p: 1) == pool and fair_share([], 10, lambda p: 1) == []


def _flood(msg, context, reply):
    """Partition 0 shares many valid packets with long completions."""
    if msg.metadata.message_type != "query.rollouts" or _partition(context) != 0 or reply.has_error():
        return reply
    payload = payload_from_record(reply.content[PAYLOAD_KEY])
    good = payload["packets"][0]
    payload["packets"] = [{**good, "completions": ["<answer>1</answer>" + "z" * 3000] * 4} for _ in range(40)]
    reply.content[PAYLOAD_KEY] = ConfigRecord({"json": json.dumps(payload)})
    return reply


def test_one_sender_flooding_the_relay_cannot_crowd_out_the_others(tmp_path, monkeypatch):
    import pubswap_flwr.protocols.sapo as sapo_protocol

    monkeypatch.setattr(sapo_protocol, "RELAY_BYTES", 60_000)
    simulate_in_process({**TINY, **SAPO, "output.dir": str(tmp_path), "run-name": "flood"}, 3, reply_hook=_flood)
    row = read_metrics(tmp_path / "flood")[1]
    assert not row["dropped"] and len(row["clients"]) == 3
    flooder = next(n for n, c in row["clients"].items() if c["node_index"] == 0)
    assert row["clients"][flooder]["packets_over_cap"] == 40 - 3  # a node shares sapo.share = 3 per round
    for node, c in row["clients"].items():
        if node != flooder:
            cut = row["relay_cut"][node]  # its 3 long packets are over its share of the bytes
            assert list(cut) == [f"00000-{flooder}"] and 0 < cut[f"00000-{flooder}"] < 3
            assert c["external_received"] == 3 + 3 - cut[f"00000-{flooder}"]  # the other honest node's 3 all came


ITEM = {"uid": "gcd/1", "task": "gcd", "question": "q?", "answer": "1", "verifier": "exact"}


def test_text_that_is_not_valid_unicode_is_refused_where_it_enters():
    with pytest.raises(Rejected, match="a response is not valid Unicode text"):
        check_public_responses({"responses": {"p": ["ok", "\ud800"]}}, ["p"], 2, Limits())
    with pytest.raises(Rejected, match="a completion is not valid Unicode text"):
        check_packet({"item": ITEM, "completions": ["\udfff"]}, Limits(), 4)
    with pytest.raises(Rejected, match="'metadata' is not valid Unicode text"):
        check_packet({"item": {**ITEM, "metadata": {"x": ["\ud800"]}}, "completions": ["a"]}, Limits(), 4)
    deep: dict = {}
    for _ in range(40):
        deep = {"d": deep}
    with pytest.raises(Rejected, match="'metadata' is nested more than 16 levels deep"):
        check_packet({"item": {**ITEM, "metadata": deep}, "completions": ["a"]}, Limits(), 4)


def _surrogate_completion(msg, context, reply):
    """Partition 0 escapes a lone surrogate in the JSON of its first packet (valid JSON, invalid Unicode)."""
    if msg.metadata.message_type != "query.rollouts" or _partition(context) != 0 or reply.has_error():
        return reply
    payload = payload_from_record(reply.content[PAYLOAD_KEY])
    payload["packets"][0]["completions"][0] = "<answer>\ud800</answer>"
    reply.content[PAYLOAD_KEY] = ConfigRecord({"json": json.dumps(payload, ensure_ascii=True)})
    return reply


def test_a_lone_surrogate_in_a_shared_completion_drops_that_packet_only(tmp_path):
    simulate_in_process({**TINY, **SAPO, "output.dir": str(tmp_path), "run-name": "utf"}, 3,
                        reply_hook=_surrogate_completion)
    row = read_metrics(tmp_path / "utf")[1]
    assert not row["dropped"] and len(row["clients"]) == 3
    (reasons,) = row["rejected_packets"].values()
    assert reasons == ["packet 0: a completion is not valid Unicode text (surrogates not allowed at position 8)"]


def test_the_servers_scoring_of_one_client_stops_when_its_budget_is_spent(tmp_path, monkeypatch):
    import pubswap_flwr.protocols.pubswap as pubswap_protocol

    ticks = iter(range(10**6))
    monkeypatch.setattr(pubswap_protocol, "ScoringBudget",
                        lambda per_completion, per_sender, **kwargs: ScoringBudget(
                            per_completion, 2.5, clock=lambda: float(next(ticks)), **kwargs))
    simulate_in_process({**TINY, "strategy.mode": "pubswap", "pubswap.tau-swap": 1, "pubswap.public-prompts": 2,
                         "output.dir": str(tmp_path), "run-name": "budget"}, 2)
    row = read_metrics(tmp_path / "budget")[1]
    # Each scoring "takes" 1 s on this clock: 3 answers fit a 2.5 s budget, the other 2 steps x 2 prompts x 4 - 3
    # of each client are skipped with reward 0 (and counted).
    assert [(c["scoring_timeouts"], c["scoring_skipped"]) for c in row["clients"].values()] == [(0, 13), (0, 13)]


@pytest.mark.parametrize("name", ["../escape", "/abs", "a/b", "..", "", "x\\y", " pad"])
def test_a_run_name_that_is_not_one_path_component_is_refused(tmp_path, name):
    cfg = ExperimentConfig()
    with pytest.raises(ValueError, match="is not one plain path component"):
        NodeIdentity.from_flower(cfg, {"state-dir": str(tmp_path)}, 7, None, name)
    node = NodeIdentity.from_flower(cfg, {"state-dir": str(tmp_path)}, 7, None, "run-1")
    assert node.state_dir == Path(tmp_path).resolve() / "run-1"


def test_node_evaluations_with_different_tasks_average_per_task():
    a = {"greedy_accuracy": 0.5, "per_task": {"gcd": {"greedy_accuracy": 0.5}}}
    b = {"greedy_accuracy": 0.25, "sampled_accuracy": 0.5, "per_task": {"count_bits": {"greedy_accuracy": 0.25}}}
    out = mean_eval([a, b])
    assert out == {"greedy_accuracy": 0.375, "sampled_accuracy": 0.5,
                   "per_task": {"gcd": {"greedy_accuracy": 0.5}, "count_bits": {"greedy_accuracy": 0.25}}}


def test_a_task_flagged_as_a_shortcut_at_any_node_stays_flagged_in_the_nodes_mean():
    a = {"greedy_accuracy": 0.5, "greedy_shortcut_tasks": ["gcd"], "sampled_shortcut_tasks": []}
    b = {"greedy_accuracy": 0.25, "greedy_shortcut_tasks": ["products", "gcd"], "sampled_shortcut_tasks": []}
    out = mean_eval([a, b])
    assert out["greedy_shortcut_tasks"] == ["gcd", "products"] and out["sampled_shortcut_tasks"] == []
    assert "greedy_shortcut_tasks" not in mean_eval([{"greedy_accuracy": 1.0}])  # a node that recorded no check


def test_a_nodes_self_reported_shortcut_flags_cross_the_boundary_only_as_its_own_task_names():
    from pubswap_flwr.wire.validate import HeldOutRequest
    from pubswap_flwr.wire.validate import check_eval as check

    per_task = {"gcd": {"greedy_accuracy": 0.5}, "products": {"greedy_accuracy": 0.5}}
    items = {"uids": ["gcd/0", "products/0"], "tasks": ["gcd", "products"], "greedy": [1, 0]}
    report = {"greedy_accuracy": 0.5, "per_task": per_task, "item_results": items,
              "greedy_shortcut_tasks": ["products", "gcd", "gcd"], "sampled_shortcut_tasks": []}

    def check_eval(result: dict) -> dict:  # the items and tasks the server asked for, greedy answers only
        return check(result, HeldOutRequest(dict(zip(items["uids"], items["tasks"])), None))

    clean = check_eval(report)
    assert clean["greedy_shortcut_tasks"] == ["gcd", "products"] and clean["sampled_shortcut_tasks"] == []
    for bad, reason in ((["count_bits"], "eval: greedy_shortcut_tasks names tasks the evaluation does not report"),
                        ("gcd", "eval.greedy_shortcut_tasks: expected `array | null`, got `str`"),
                        ([1], "eval.greedy_shortcut_tasks[0]: expected `str`, got `int`")):
        with pytest.raises(Rejected) as caught:
            check_eval({**report, "greedy_shortcut_tasks": bad})
        assert str(caught.value) == reason
    assert "greedy_shortcut_tasks" not in check_eval({**report, "greedy_shortcut_tasks": None})  # null: none flagged


def test_a_packet_whose_provenance_cannot_be_read_is_refused_by_the_server_and_by_receivers(tmp_path):
    from pubswap_flwr.node_runtime.learner import Learner, NodeSettings, WorkReport
    from pubswap_flwr.protocols.sapo import SapoNode

    crafted = {**ITEM, "verifier": "rg", "provenance": {"generator": "gcd", "config": [1, 2], "seed": 1, "index": 2}}
    with pytest.raises(Rejected, match=r"packet.item: provenance.config: expected `object \| null`, got `array`"):
        check_packet({"item": crafted, "completions": ["a"]}, Limits(), 4)
    cfg = ExperimentConfig.from_flat({**SAPO, "tasks.mix": "gcd:1", "eval.items-per-task": 2})
    node = SapoNode(Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / "node", "embedded:tiny")), cfg.sapo)
    node.generate_rollouts(1, WorkReport())
    bad = Packet("peer", TaskItem("gcd/x", "gcd", "q?", None, "rg", {}, {"generator": "gcd", "config": [1, 2]}),
                 ("<answer>1</answer>", "<answer>2</answer>"))
    selection = node.train_on_pool([bad], 1, WorkReport())
    assert selection.rejected == 1 and "cannot be scored (TypeError" in selection.rejections[0]


def _lie(field: str, value):
    def hook(msg, context, reply):
        if _partition(context) == 0 and not reply.has_error():
            values = dict(reply.content[METRICS_KEY])
            values[field] = value
            reply.content[METRICS_KEY] = MetricRecord(values)
        return reply

    return hook


def test_a_reward_out_of_range_drops_the_reply_and_the_run_stays_resumable(tmp_path):
    # 1e308 x the completions made the round's mean reward inf, and the checkpoint then refused to load
    simulate_in_process({**TINY, "output.dir": str(tmp_path), "run-name": "r"}, 3,
                        reply_hook=_lie("train-reward", 1e308))
    row = read_metrics(tmp_path / "r")[1]
    (dropped,) = row["dropped"].values()
    assert "metrics.train-reward: expected `float` <= 1000000.0" in dropped and row["cumulative_reward"] < 1
    from pubswap_flwr.server.checkpoint import load

    assert load(tmp_path / "r").cumulative_reward == row["cumulative_reward"]


@pytest.mark.parametrize("value", [1.5, -0.25])
def test_a_reward_outside_zero_one_drops_the_reply_when_the_run_has_no_trl_rewards(tmp_path, value):
    # the wire admits +-1e6 for runs that train on tasks.trl-rewards; any other run's rewards are in [0, 1]
    simulate_in_process({**TINY, "output.dir": str(tmp_path), "run-name": "r"}, 3,
                        reply_hook=_lie("train-reward", value))
    row = read_metrics(tmp_path / "r")[1]
    (dropped,) = row["dropped"].values()
    assert f"metrics.train-reward = {value:g} is outside [0, 1], this run's reward range (tasks.trl-rewards is not " \
           "set)" in dropped
    assert 0 <= row["cumulative_reward"] <= 1


def _change_index(msg, context, reply):
    """Partition 0 claims another node index from round 2 on (to shed its reputation)."""
    if _partition(context) == 0 and int(msg.content["config"]["server-round"]) == 2 and not reply.has_error():
        values = dict(reply.content[METRICS_KEY])
        values["node-index"] = 7
        reply.content[METRICS_KEY] = MetricRecord(values)
    return reply


def test_a_node_cannot_change_its_index_midway(tmp_path):
    simulate_in_process({**TINY, **SAPO, "num-server-rounds": 2, "output.dir": str(tmp_path), "run-name": "idx"}, 3,
                        reply_hook=_change_index)
    rows = read_metrics(tmp_path / "idx")
    (reason,) = rows[2]["dropped"].values()
    assert "node-index 7 differs from the 0 this node reported before" in reason
