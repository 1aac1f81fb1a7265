"""Typed messages: each round-trips through Flower records, and the server's decoding of a reply refuses anything
malformed with a reason (the exchange's per-reply guard turns any exception into a drop of that reply alone)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from pubswap_flwr.algorithms.sapo_selection import Packet
from pubswap_flwr.protocols.fedavg import AdapterReply, LocalRound, LocalRoundConfig
from pubswap_flwr.protocols.pubswap import Segment, SegmentReply, SwapEntry
from pubswap_flwr.protocols.pubswap_messages import SegmentAsk, SegmentConfig
from pubswap_flwr.protocols.sapo import CollectRollouts, SapoAsyncRound, SapoReply, SapoTrain
from pubswap_flwr.protocols.sapo_messages import CollectRolloutsConfig, SapoTrainConfig
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from pubswap_flwr.tasks import Score, TaskItem
from pubswap_flwr.wire.codecs import (
    ADAPTER_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    PAYLOAD_KEY,
    WireError,
    payload_from_record,
    payload_record,
)
from pubswap_flwr.wire.counters import FormatCounts
from pubswap_flwr.wire.records import AskedEvaluations, ClientReport, Header, reply_records
from pubswap_flwr.wire.validate import Limits, Rejected

HEADER = Header(3, "run-x", "/runs/run-x", round_start=True)
REPORT = ClientReport(node_index=2, num_examples=64, cumulative_reward=1.5, total_steps=7, t_start=10.0, t_end=12.5,
                      sample_seconds=1.0, update_seconds=0.5, train_reward=0.25, train_completions=64,
                      model="embedded:tiny", tasks=("gcd", "count_bits"), formats=FormatCounts(16, 15))
ADAPTER = {"a.lora_A.weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 8,
           "a.lora_B.weight": np.ones((3, 2), dtype=np.float32)}
ITEM = TaskItem("gcd/0", "gcd", "What is gcd(4, 6)?", "2", "exact")


@pytest.fixture(autouse=True)
def _identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def _reply(content: RecordDict) -> Message:
    """A message carrying `content`, as the server's decoders receive replies."""
    return Message(content, dst_node_id=1, message_type="train")


def test_instructions_round_trip_through_records():
    local = LocalRound(HEADER, LocalRoundConfig(local_steps=5), ADAPTER)
    back = LocalRound.from_record(local.to_record())
    assert back.header == HEADER and back.config.local_steps == 5
    assert all(np.array_equal(back.adapter[k], ADAPTER[k].astype(np.float16)) for k in ADAPTER)  # fp16 on the wire
    sets = {"public/gcd/1": (SwapEntry(1.0, 2), SwapEntry(0.0, -1, "<answer>3</answer>", "00001-7"))}
    segment = Segment(HEADER, SegmentConfig(private_steps=2, public_uids="public/gcd/1\npublic/gcd/4", k=4), None, sets)
    assert Segment.from_record(segment.to_record()) == segment
    assert Segment.from_record(Segment(HEADER, SegmentConfig(k=4, final=True)).to_record()).response_sets is None
    pool = (Packet("00000-1", ITEM, ("<answer>2</answer>", "<answer>5</answer>")),)
    for kind in (SapoTrain, SapoAsyncRound):
        message = kind(HEADER, SapoTrainConfig(evaluate=True, evaluate_initial=True), pool)
        assert kind.from_record(message.to_record()) == message
    collect = CollectRollouts(HEADER, CollectRolloutsConfig(evaluate_initial=True))
    assert CollectRollouts.from_record(collect.to_record()) == collect
    assert {LocalRound.message_type, Segment.message_type, CollectRollouts.message_type, SapoTrain.message_type,
            SapoAsyncRound.message_type} == {"train.local_round", "train.segment", "query.rollouts", "train.sapo",
                                            "train.sapo_async"}


def test_replies_round_trip_and_the_server_rescores_public_responses():
    reply = _reply(AdapterReply(REPORT, ADAPTER).to_record())
    decoded = AdapterReply.from_message(reply, ADAPTER)
    assert decoded.report == REPORT and decoded.adapter["a.lora_B.weight"].dtype == np.float32

    class Public:
        def get(self, uid):
            return ITEM

    claimed = SegmentReply(REPORT, {"public/gcd/1": ["<answer>2</answer>", "<answer>9</answer>"]})
    ask = SegmentAsk(("public/gcd/1",), 2, Limits(), Public())
    scored = SegmentReply.from_message(_reply(claimed.to_record()), ask)
    assert scored.responses == {"public/gcd/1": [("<answer>2</answer>", 1.0), ("<answer>9</answer>", 0.0)]}
    graded = SegmentReply(REPORT, {"public/gcd/1": ["<answer>0.5</answer>"]})

    def half(text, item, max_chars):
        return Score(0.5)

    for partial_credit, reward in ((True, 0.5), (False, 0.0)):
        ask = SegmentAsk(("public/gcd/1",), 1, Limits(), Public(), score=half, partial_credit=partial_credit)
        rescored = SegmentReply.from_message(_reply(graded.to_record()), ask)
        assert rescored.responses == {"public/gcd/1": [("<answer>0.5</answer>", reward)]}
    shared = SapoReply(REPORT, packets=(Packet("", ITEM, ("<answer>2</answer>",)),), selection={"external-used": 3})
    back = SapoReply.from_message(_reply(shared.to_record()), Limits(), 4, packets=True, trained=True,
                                  asked=AskedEvaluations(None))
    assert back.packets[0].item == ITEM and back.selection["external-used"] == 3
    assert back.selection["external-received"] == 0


def test_a_malformed_relayed_packet_is_refused_naming_its_place_in_the_pool():
    good = Packet("00000-1", ITEM, ("<answer>2</answer>",))
    content = SapoTrain(HEADER, SapoTrainConfig(), (good, good)).to_record()
    payload = payload_from_record(content[PAYLOAD_KEY])
    payload["pool"][1]["completions"] = "not a list"
    content[PAYLOAD_KEY] = payload_record(payload)
    with pytest.raises(ValueError,
                       match=r"^relayed packet 1: a relayed packet.completions: expected `array`, got `str`$"):
        SapoTrain.from_record(content)


@pytest.mark.parametrize("metrics,reason", [
    ({"node-index": float("nan")}, "metrics.node-index: expected `int`, got `float`"),
    ({"node-index": 3.0}, "metrics.node-index: expected `int`, got `float`"),  # strict: no float for a count
    ({"node-index": 999999}, "metrics.node-index: expected `int` <= 9999"),
    ({"num-examples": float("inf")}, "metrics.num-examples: expected `int`, got `float`"),
    ({"cumulative-reward": [1.0, 2.0]}, "metrics.cumulative-reward: expected `float`, got `array`"),
    ({"cumulative-reward": float("inf")}, "metrics.cumulative-reward: expected `float` <= 1000000000000000.0"),
    ({"train-reward": float("nan")}, "metrics.train-reward: expected `float` >= -1000000.0"),
    ({"num-examples": -5}, "metrics.num-examples: expected `int` >= 0"),
    ({"train-reward": 1e308}, "metrics.train-reward: expected `float` <= 1000000.0"),  # a TRL reward's bound
    ({"num-examples": 10**13}, "metrics.num-examples: expected `int` <= 1000000000000"),
    ({"t-end": 1.0}, "metrics: t-end = 1.0 is before t-start = 10.0"),
    ({"sample-seconds": 1e12}, "metrics.sample-seconds: expected `float` <= 10000000.0"),
    ({"cumulative-reward": -1e16}, "metrics.cumulative-reward: expected `float` >= -1000000000000000.0"),
    ({"well-formed-completions": 17}, "metrics: well-formed-completions exceeds sampled-completions"),
])
def test_a_client_report_with_bad_numbers_is_refused(metrics, reason):
    content = reply_records(REPORT)
    values = dict(content[METRICS_KEY])
    values.update(metrics)
    content[METRICS_KEY] = MetricRecord(values)
    with pytest.raises(Rejected) as caught:
        AdapterReply.from_message(_reply(content), ADAPTER)
    assert str(caught.value) == reason


def test_a_record_of_the_wrong_kind_or_a_list_for_a_count_is_a_wire_error():
    content = reply_records(REPORT)
    content[ADAPTER_KEY] = ConfigRecord({"a.lora_A.weight": "text"})
    with pytest.raises(WireError, match="record 'adapter' must be ArrayRecord, got ConfigRecord"):
        AdapterReply.from_message(_reply(content), ADAPTER)
    content = LocalRound(HEADER, LocalRoundConfig(local_steps=5), ADAPTER).to_record()
    content[CONFIG_KEY] = MetricRecord({"server-round": 3, "local-steps": 5})
    with pytest.raises(WireError, match="record 'config' must be ConfigRecord, got MetricRecord"):
        LocalRound.from_record(content)
    content = LocalRound(HEADER, LocalRoundConfig(local_steps=5), ADAPTER).to_record()
    content[CONFIG_KEY] = ConfigRecord({**content[CONFIG_KEY], "local-steps": [5, 6]})
    with pytest.raises(ValueError, match=re.escape("instruction config.local-steps: expected `int`, got `array`")):
        LocalRound.from_record(content)


MISSING = object()


@pytest.mark.parametrize("kind, key, value, reason", [
    (LocalRound, "local-steps", 3.7, "instruction config.local-steps: expected `int`, got `float`"),  # never cut to 3
    (LocalRound, "local-steps", "5", "instruction config.local-steps: expected `int`, got `str`"),
    (LocalRound, "server-round", True, "instruction config.server-round: expected `int`, got `bool`"),
    (LocalRound, "local-steps", -1, "instruction config.local-steps: expected `int` >= 0"),
    (Segment, "k", 0, "instruction config.k: expected `int` >= 1"),
    (Segment, "final", 1, "instruction config.final: expected `bool`, got `int`"),  # 1 was read as True
    (SapoTrain, "save-adapter", "no", "instruction config.save-adapter: expected `bool`, got `str`"),  # was True
    (CollectRollouts, "run-name", MISSING, "instruction config: object missing required field `run-name`"),
    (CollectRollouts, "node-round", 4, "node-round = 4 is not a round in [0, 3]"),
    (LocalRound, "proximal-mu", -0.1, "instruction config.proximal-mu: expected `float` >= 0"),
    (Segment, "proximal-mu", 1e6, "instruction config.proximal-mu: expected `float` <= 1000"),
])
def test_an_instruction_whose_config_breaks_its_declaration_is_refused_naming_the_key(kind, key, value, reason):
    message = {LocalRound: LocalRound(HEADER, LocalRoundConfig(local_steps=5), ADAPTER),
               Segment: Segment(HEADER, SegmentConfig(private_steps=2, public_uids="public/gcd/1", k=4)),
               SapoTrain: SapoTrain(HEADER, SapoTrainConfig(), ()),
               CollectRollouts: CollectRollouts(HEADER, CollectRolloutsConfig(evaluate_initial=True))}[kind]
    content = message.to_record()
    config = {k: v for k, v in content[CONFIG_KEY].items() if k != key}
    content[CONFIG_KEY] = ConfigRecord(config if value is MISSING else {**config, key: value})
    with pytest.raises(ValueError, match=re.escape(reason)):
        kind.from_record(content)
    content[CONFIG_KEY] = ConfigRecord({**message.to_record()[CONFIG_KEY], "a-later-key": "ignored"})
    assert kind.from_record(content).header == HEADER  # a key the declaration does not name is left alone


def test_fedprox_mu_travels_in_the_header_and_only_when_set():
    from dataclasses import replace

    with_mu = LocalRound(replace(HEADER, proximal_mu=0.05), LocalRoundConfig(local_steps=5), ADAPTER)
    assert with_mu.to_record()[CONFIG_KEY]["proximal-mu"] == 0.05
    assert LocalRound.from_record(with_mu.to_record()).header.proximal_mu == 0.05
    plain = LocalRound(HEADER, LocalRoundConfig(local_steps=5), ADAPTER).to_record()
    assert "proximal-mu" not in plain[CONFIG_KEY]  # other modes' bytes unchanged
    assert LocalRound.from_record(plain).header.proximal_mu == 0.0


@pytest.mark.parametrize("flat, mu", [({"strategy.mode": "fedprox"}, 0.05), ({"strategy.mode": "fedavg"}, 0.0),
                                      ({"strategy.mode": "pubswap", "pubswap.base": "fedprox"}, 0.05),
                                      ({"strategy.mode": "pubswap"}, 0.0)])
def test_the_protocol_puts_its_mu_in_every_message_it_sends(flat, mu, tmp_path):
    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.protocols import run_protocol
    from pubswap_flwr.rounds.context import RoundContext

    cfg = ExperimentConfig.from_flat({**flat, "strategy.proximal-mu": 0.05})
    protocol = run_protocol(cfg).from_config(cfg)
    assert protocol.proximal_mu == mu
    ctx = RoundContext(1, False, False, None, None, "run", str(tmp_path))
    assert ctx.header(True, protocol.proximal_mu).to_config().get("proximal-mu", 0.0) == mu


def test_a_round_start_without_the_global_adapter_is_refused_with_a_reason():
    from types import SimpleNamespace

    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.protocols.transfer import take_global

    with pytest.raises(ValueError, match="the message carries no global adapter"):
        take_global(SimpleNamespace(settings=SimpleNamespace(strategy=ExperimentConfig().strategy)), None, None)


def _garbage(kind: str):
    def hook(msg, context, reply):
        if int(context.node_config["partition-id"]) != 0 or reply.has_error():
            return reply
        if kind == "not-json":
            reply.content[PAYLOAD_KEY] = ConfigRecord({"json": "{not json"})
        elif kind == "deep-json":
            reply.content[PAYLOAD_KEY] = ConfigRecord({"json": "[" * 100_000 + "]" * 100_000})
        elif kind == "payload-list":
            reply.content[PAYLOAD_KEY] = payload_record([1, 2, 3])
        elif kind == "no-metrics":
            del reply.content[METRICS_KEY]
        elif kind == "metrics-list":
            values = dict(reply.content[METRICS_KEY])
            values["num-examples"] = [1.0, 2.0]
            reply.content[METRICS_KEY] = MetricRecord(values)
        return reply

    return hook


@pytest.mark.parametrize("kind,reason", [
    ("not-json", "payload is not valid JSON"), ("deep-json", "RecursionError"),
    ("payload-list", "payload is not a JSON object"), ("no-metrics", "reply lacks its metrics or payload record"),
    ("metrics-list", "metrics.num-examples: expected `int`, got `array`"),
])
def test_a_malformed_reply_drops_only_that_client(tmp_path, kind, reason):
    simulate_in_process({"num-server-rounds": 1, "train.local-steps": 1, "train.prompts-per-step": 2,
                         "train.completions-per-prompt": 4, "eval.items-per-task": 2, "eval.samples": 1,
                         "strategy.apply-below-robust": True,  # the 2 replies left (#54 keeps them by default)
                         "output.dir": str(tmp_path),
                         "run-name": kind}, 3, reply_hook=_garbage(kind))
    rows = read_metrics(tmp_path / kind)
    (dropped,) = rows[1]["dropped"].values()
    assert reason in dropped and dropped.startswith("rejected reply")
    assert rows[1]["aggregated"] is True and {c["node_index"] for c in rows[1]["clients"].values()} == {1, 2}
    assert json.loads((tmp_path / kind / "status.json").read_text())["status"] == "completed"


def _npy(header: str, payload: bytes) -> bytes:
    """A .npy file (format 1.0) with the given header dict text and value bytes."""
    text = header.encode("latin1")
    padding = 64 - (10 + len(text) + 1) % 64
    text += b" " * padding + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + payload


@pytest.mark.parametrize("data,reason", [
    (_npy("{'descr': '<f2', 'fortran_order': False, 'shape': (1000000000000,), }", b"\0" * 16),
     "declares 2000000000000 bytes of values but carries 16"),
    (_npy("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", b"\0" * 16), "has an object dtype"),
    (_npy("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 4), }", b"\0" * 7), "carries 7"),
    (b"\x93NUMPY\x01", "is not a readable .npy array"),
])
def test_malformed_array_bytes_are_refused_before_numpy_allocates_them(data, reason):
    from flwr.app import Array, ArrayRecord

    from pubswap_flwr.wire.codecs import WireError, adapter_from_record

    record = ArrayRecord({"m.lora_A.weight": Array(dtype="float16", shape=(2, 4), stype="numpy.ndarray", data=data)})
    with pytest.raises(WireError, match=re.escape(reason)):
        adapter_from_record(record)
