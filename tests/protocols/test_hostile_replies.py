"""Hostile and broken replies: each is rejected with its reason while the round completes with the honest clients.

Every scenario is a whole run served in process (InProcessGrid: Flower's serialization, no Ray); the hostile client
is the honest ClientApp whose reply a hook rewrites before it leaves the node.
"""

from __future__ import annotations

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.shared import task_universe
from pubswap_flwr.simulation import simulate_in_process as simulate
from pubswap_flwr.tasks import score_completion
from pubswap_flwr.wire.codecs import PAYLOAD_KEY, adapter_from_record, payload_from_record, payload_record

# a round of 2 replies (2 nodes, or 3 with one dropped) is applied: a robust rule keeps it by default (#54)
TINY = {"train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 5, "eval.samples": 1,
        "seed": 2, "strategy.apply-below-robust": True}


def _partition(context) -> int:
    return int(context.node_config["partition-id"])


def _rewrite_payload(reply, change) -> object:
    payload = payload_from_record(reply.content[PAYLOAD_KEY])
    reply.content[PAYLOAD_KEY] = payload_record(change(payload))
    return reply


def _forge_public(msg, context, reply):
    config = msg.content["config"]
    if msg.metadata.message_type != "train.segment" or reply.has_error():
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
              "pubswap.tau-swap": 2, "pubswap.public-prompts": 3, "output.dir": str(tmp_path), "run-name": "forged",
              "tasks.partial-credit": True}  # graded: the server's own score of the forged answers is not 0 or 1
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
    assert rows[2]["dropped"][broken].endswith(": responses: expected `array` of length >= 4")


def _bad_packets(msg, context, reply):
    if msg.metadata.message_type != "query.rollouts" or _partition(context) != 0 or reply.has_error():
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
              "sapo.questions": 3, "sapo.completions": 4, "sapo.share": 3, "sapo.sharing": "fixed",
              "output.dir": str(tmp_path),
              "run-name": "packets"}, 3, reply_hook=_bad_packets)
    row = read_metrics(tmp_path / "packets")[-1]
    assert not row["dropped"] and len(row["clients"]) == 3
    sender = next(n for n, c in row["clients"].items() if c["node_index"] == 0)
    reasons = row["rejected_packets"][sender]
    assert reasons == ["packet 0.completions: expected `array`, got `str`",
                       "packet 1.completions[0]: expected `str` of length <= 4096",
                       "packet 2.item: 'answer' is missing",
                       "packet 3.completions: expected `array` of length <= 4",
                       "packet 4.item: unknown verifier 'astrology'",
                       "packet 5.item.question: expected `str`, got `int`"]
    # The others still got node 0's one good packet plus each other's three.
    for node, c in row["clients"].items():
        if node != sender:
            assert c["external_received"] == 1 + 3


def _withhold_partition_three_in_round_two(msg, context, call):
    reply = call(msg, context)
    if _partition(context) == 3 and int(msg.content["config"]["server-round"]) == 2:
        return None  # the node never answers: the server gets no reply before strategy.timeout
    return reply


def test_a_client_that_never_answers_is_dropped_and_the_run_finishes(tmp_path):
    simulate({**TINY, "num-server-rounds": 2, "train.local-steps": 1, "strategy.timeout": 45.0,
              "output.dir": str(tmp_path), "run-name": "timeout"}, 4, deliver=_withhold_partition_three_in_round_two)
    rows = read_metrics(tmp_path / "timeout")
    assert [len(r.get("clients", {})) for r in rows] == [0, 4, 3]
    assert list(rows[2]["dropped"].values()) == ["no reply within strategy.timeout = 45 s"]
    assert rows[2]["aggregated"] is True


def _hostile_adapters(msg, context, reply):
    """Partitions 0-3 each send one kind of broken adapter; 4 and 5 are honest."""
    import numpy as np
    from flwr.app import Array, ArrayRecord

    from pubswap_flwr.wire.codecs import ADAPTER_KEY

    node = _partition(context)
    if reply.has_error() or node > 3:
        return reply
    arrays = {k: v.copy() for k, v in adapter_from_record(reply.content[ADAPTER_KEY]).items()}
    first = sorted(arrays)[0]
    if node == 0:
        arrays[first][0, 0] = np.nan
    elif node == 1:
        arrays[first] = np.zeros((3, 3), dtype=np.float16)
    elif node == 2:
        del arrays[first]
    else:
        arrays["base_model.model.backdoor.weight"] = np.ones(4, dtype=np.float16)
    reply.content[ADAPTER_KEY] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    return reply


def test_broken_adapters_are_rejected_each_with_its_reason(tmp_path):
    simulate({**TINY, "num-server-rounds": 1, "train.local-steps": 1, "output.dir": str(tmp_path),
              "run-name": "adapters"}, 6, reply_hook=_hostile_adapters)
    row = read_metrics(tmp_path / "adapters")[-1]
    assert row["aggregated"] is True and len(row["aggregated_clients"]) == 2
    reasons = sorted(row["dropped"].values())
    assert len(reasons) == 4
    assert any("has NaN or Inf values" in r for r in reasons)
    assert any("has shape (3, 3), expected" in r for r in reasons)
    assert any("adapter keys differ from the global adapter (missing ['base_model" in r for r in reasons)
    assert any("unexpected ['base_model.model.backdoor.weight']" in r for r in reasons)


def _oversized_response(msg, context, reply):
    if msg.metadata.message_type != "train.segment" or _partition(context) != 0 or reply.has_error():
        return reply

    def change(payload):
        for texts in (payload.get("responses") or {}).values():
            texts[0] = "<answer>" + "9" * 5000 + "</answer>"
        return payload

    return _rewrite_payload(reply, change)


def test_oversized_public_response_is_rejected(tmp_path):
    simulate({**TINY, "strategy.mode": "pubswap", "num-server-rounds": 1, "train.local-steps": 1,
              "pubswap.tau-swap": 1, "pubswap.public-prompts": 2, "output.dir": str(tmp_path), "run-name": "big"},
             3, reply_hook=_oversized_response)
    row = read_metrics(tmp_path / "big")[-1]
    assert row["aggregated"] is True and len(row["clients"]) == 2
    (reason,) = row["dropped"].values()
    assert reason.endswith(": responses[0]: expected `str` of length <= 4096")


def _scaled_adapter(msg, context, reply):
    """Partition 0 sends its adapter scaled x100 (a poisoning attempt)."""
    from flwr.app import Array, ArrayRecord

    from pubswap_flwr.wire.codecs import ADAPTER_KEY

    if _partition(context) != 0 or reply.has_error():
        return reply
    reply.content[ADAPTER_KEY] = ArrayRecord({k: Array((a.astype("float32") * 100).astype("float16"))
                                              for k, a in adapter_from_record(reply.content[ADAPTER_KEY]).items()})
    return reply


def test_median_and_trimmed_mean_resist_a_scaled_adapter(tmp_path):
    import numpy as np
    from safetensors.numpy import load_file

    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.server.app import GlobalEvaluator

    initial = GlobalEvaluator(ExperimentConfig.from_flat({"seed": 2})).initial_adapter()
    moved = {}
    for method in ("mean", "median", "trimmed-mean"):
        # strategy.median-clip off: each aggregator alone against the plain mean (the default bound is
        # tests/protocols/test_attacks.py's)
        simulate({**TINY, "num-server-rounds": 1, "train.local-steps": 1, "strategy.aggregation": method,
                  "strategy.trim-fraction": 0.25, "strategy.min-clients": 4, "strategy.median-clip": 0.0,
                  "output.dir": str(tmp_path), "run-name": method}, 4,
                 reply_hook=_scaled_adapter)
        final = load_file(str(tmp_path / method / "checkpoint" / "global.safetensors"))
        moved[method] = float(np.sqrt(sum(np.sum((final[k] - initial[k]) ** 2) for k in initial)))
    assert moved["median"] * 10 < moved["mean"], moved
    assert moved["trimmed-mean"] * 10 < moved["mean"], moved


def _forge_answers(msg, context, reply):
    if msg.metadata.message_type != "query.rollouts" or _partition(context) != 0 or reply.has_error():
        return reply

    def change(payload):
        for packet in payload["packets"]:
            packet["item"]["answer"] = "424242"
            packet["completions"] = ["<answer>424242</answer>"] + packet["completions"][1:]
        return payload

    return _rewrite_payload(reply, change)


def test_sapo_receivers_drop_packets_with_forged_answers(tmp_path):
    simulate({**TINY, "strategy.mode": "sapo", "num-server-rounds": 1, "sapo.local": 2, "sapo.external": 4,
              "sapo.questions": 3, "sapo.completions": 4, "sapo.share": 3, "sapo.sharing": "fixed",
              "output.dir": str(tmp_path),
              "run-name": "forged-sapo"}, 3, reply_hook=_forge_answers)
    row = read_metrics(tmp_path / "forged-sapo")[-1]
    assert not row["dropped"] and len(row["clients"]) == 3
    for c in row["clients"].values():
        if c["node_index"] == 0:
            assert c["external_rejected"] == 0
        else:
            assert c["external_rejected"] == 3 and c["external_received"] == 6
            assert all("answer does not match its provenance (forged)" in r for r in c["external_rejections"])
