"""Hostile and broken replies: each is rejected with its reason while the round completes with the honest clients.

Every scenario is a real simulation through Flower's engine; the hostile client is the honest ClientApp whose reply
a hook rewrites before it leaves the node.
"""

from __future__ import annotations

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.metrics import read_metrics
from pubswap_flwr.node import task_universe
from pubswap_flwr.simulation import simulate
from pubswap_flwr.tasks import score_completion
from pubswap_flwr.wire import PAYLOAD_KEY, payload_from_record, payload_record

pytestmark = pytest.mark.integration

TINY = {"train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 5, "seed": 2}


def _partition(context) -> int:
    return int(context.node_config["partition-id"])


def _rewrite_payload(reply, change) -> object:
    payload = payload_from_record(reply.content[PAYLOAD_KEY])
    reply.content[PAYLOAD_KEY] = payload_record(change(payload))
    return reply


def _forge_public(msg, context, reply):
    config = msg.content["config"]
    if config["task"] != "pubswap-segment" or reply.has_error():
        return reply
    node, round_number = _partition(context), int(config["server-round"])

    def change(payload):
        responses = payload.get("responses")
        if not responses:
            return payload
        if node == 0:  # wrong answers, claimed to be right
            payload["responses"] = {uid: ["<answer>-12345</answer>"] * len(texts) for uid, texts in responses.items()}
            payload["rewards"] = {uid: [1.0] * len(texts) for uid, texts in responses.items()}
        if node == 1 and round_number == 1:  # an id the server never asked for
            first = next(iter(responses))
            responses["public/not-a-prompt/0"] = responses.pop(first)
        if node == 1 and round_number == 2:  # too few responses
            first = next(iter(responses))
            responses[first] = responses[first][:1]
        return payload

    return _rewrite_payload(reply, change)


def test_forged_and_malformed_public_responses(tmp_path):
    config = {**TINY, "strategy.mode": "pubswap", "num-server-rounds": 2, "train.local-steps": 2,
              "pubswap.tau-swap": 2, "pubswap.public-prompts": 3, "output.dir": str(tmp_path), "run-name": "forged"}
    simulate(config, 4, reply_hook=_forge_public)
    public = task_universe(ExperimentConfig.from_flat(config)).public
    rows = read_metrics(tmp_path / "forged")
    for r in rows[1:]:
        assert r["aggregated"] is True and len(r["clients"]) == 3 and len(r["dropped"]) == 1
        assert {c["node_index"] for c in r["clients"].values()} == {0, 2, 3}  # partition 1 was dropped
    liar = next(n for n, c in rows[1]["clients"].items() if c["node_index"] == 0)
    broken = next(iter(rows[1]["dropped"]))
    # The server scored the forger's responses itself: the claimed rewards of 1 changed nothing.
    for r in rows[1:]:
        for step in r["public_steps"]:
            own = [score_completion("<answer>-12345</answer>", public.get(uid)).reward for uid in step["prompts"]]
            assert step["public_reward_before_swap"][liar] == pytest.approx(sum(own) / len(own))
            assert step["public_reward_before_swap"][liar] < 0.2
        assert list(r["dropped"]) == [broken]
        assert set(r["aggregated_clients"]) == {int(n) for n in r["clients"]}
    assert "unknown ids ['public/not-a-prompt/0']" in rows[1]["dropped"][broken]
    assert "expected a list of 4 responses, got 1" in rows[2]["dropped"][broken]


def _bad_packets(msg, context, reply):
    config = msg.content["config"]
    if config["task"] != "sapo-generate" or _partition(context) != 0 or reply.has_error():
        return reply

    def change(payload):
        good = payload["packets"][0]
        item = good["item"]
        payload["packets"] = [
            {**good, "completions": "not a list"},
            {**good, "completions": ["x" * 50_000]},
            {**good, "item": {**item, "verifier": "exact", "answer": None}},
            {**good, "completions": good["completions"] * 10},
            {**good, "item": {**item, "verifier": "astrology"}},
            {**good, "item": {**item, "question": 42}},
            good,
        ]
        return payload

    return _rewrite_payload(reply, change)


def test_malformed_sapo_packets_are_dropped_one_by_one(tmp_path):
    simulate({**TINY, "strategy.mode": "sapo", "num-server-rounds": 1, "sapo.local": 2, "sapo.external": 4,
              "sapo.questions": 3, "sapo.completions": 4, "sapo.share": 3, "output.dir": str(tmp_path),
              "run-name": "packets"}, 3, reply_hook=_bad_packets)
    row = read_metrics(tmp_path / "packets")[-1]
    assert not row["dropped"] and len(row["clients"]) == 3
    sender = next(n for n, c in row["clients"].items() if c["node_index"] == 0)
    reasons = row["rejected_packets"][sender]
    expected = ["'completions' must be a non-empty list", "over the 4096 limit", "'answer' is missing",
                "more than L = 4", "unknown verifier 'astrology'", "'question' must be text"]
    assert len(reasons) == len(expected)
    for reason, words in zip(reasons, expected):
        assert words in reason
    # The others still got node 0's one good packet plus each other's three.
    for node, c in row["clients"].items():
        if node != sender:
            assert c["external_received"] == 1 + 3
