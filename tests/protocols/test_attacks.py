"""The boundary's second pass (issue #26): the seven attack classes that broke a run, each reproduced as a hostile
participant (or a hostile file, local user or grid) would mount it, and now held. Server rounds are driven against
model-free fake clients (fake_clients.py); the warm worker's side runs over a socket pair."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.supercore.task_identity import TaskIdentity

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.node import app as nodeapp
from pubswap_flwr.rollouts import Behaviour
from pubswap_flwr.server import checkpoint
from pubswap_flwr.server.checkpoint import ServerCheckpoint
from pubswap_flwr.shared import task_universe
from pubswap_flwr.wire.codecs import (
    ADAPTER_KEY,
    PAYLOAD_KEY,
    QUANTIZED_KEY,
    adapter_from_record,
    payload_from_record,
    payload_record,
)
from pubswap_flwr.wire.compression import Codec
from tests.protocols.fake_clients import FakeClientsGrid, serve_rounds

ADAPTER = {"m.lora_A.weight": np.full((2, 4), 0.5, dtype=np.float32),
           "m.lora_B.weight": np.zeros((4, 2), dtype=np.float32)}
ATTACKER = 101  # the fake grid's node of index 0
STEP = 0.01  # honest updates move every value by STEP x (1 + index / 4)


def _norm(a: dict, b: dict) -> float:
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in b)))


def _honest_bound(nodes: int = 3) -> float:
    """The largest honest update norm of the fake grid's honest nodes (indices 1..)."""
    size = sum(v.size for v in ADAPTER.values())
    return max(STEP * (1 + 0.25 * i) for i in range(1, nodes)) * np.sqrt(size)


def _adapter_as(values: dict, dtype) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v, dtype=dtype)) for k, v in values.items()})


# the 2 honest replies left when the attacker's is refused: applied (a robust rule keeps a round of 2 by default, #54)
TWO_LEFT = {"strategy.apply-below-robust": True}


# -- 1. a float64 adapter of 1e300 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [{}, {"strategy.clip-norm": 1.0}])
def test_1_a_float64_adapter_of_1e300_is_refused_and_the_global_stays_finite(extra):
    def tamper(node, message, content):
        if node == ATTACKER and ADAPTER_KEY in content:
            content[ADAPTER_KEY] = _adapter_as({k: np.full(v.shape, 1e300) for k, v in ADAPTER.items()}, np.float64)
        return content

    rows, master = serve_rounds({"seed": 1, **extra, **TWO_LEFT}, tamper, adapter=ADAPTER, step=STEP)
    assert all(np.isfinite(v).all() for v in master.values())
    for row in rows.values():
        assert row["aggregated"] is True and len(row["aggregated_clients"]) == 2
        assert "not finite in float32" in row["dropped"][str(ATTACKER)]


# -- 2. magnitude poisoning with a valid adapter ----------------------------------------------------------------------
def _fp16_extremes(node, message, content):
    if node == ATTACKER and ADAPTER_KEY in content:
        content[ADAPTER_KEY] = _adapter_as({k: np.full(v.shape, 6e4) for k, v in ADAPTER.items()}, np.float16)
    return content


def _largest_compressed_delta(node, message, content):
    """Every node replies a compressed delta; the attacker's is the largest the codec carries (scale 1024, code
    127), the honest ones a small step."""
    codec = Codec("int8", 64)
    if node == ATTACKER:
        honest = codec.encode({k: np.zeros(v.shape, np.float32) for k, v in ADAPTER.items()})
        quantized = type(honest)(np.full_like(honest.codes, 127), np.full_like(honest.scales, 1024.0))
    else:
        quantized = codec.encode({k: np.full(v.shape, STEP * (1 + 0.25 * (node - ATTACKER)), np.float32)
                                  for k, v in ADAPTER.items()})
    content[QUANTIZED_KEY] = ArrayRecord({"codes": Array(quantized.codes), "scales": Array(quantized.scales)})
    return content


@pytest.mark.parametrize("extra, tamper", [({}, _fp16_extremes),
                                           ({"strategy.compression": "int8"}, _largest_compressed_delta)])
def test_2_magnitude_poisoning_cannot_take_over_the_default_mean(extra, tamper):
    rows, master = serve_rounds({"seed": 1, **extra, **TWO_LEFT}, tamper, adapter=ADAPTER, step=STEP)
    # two rounds: the honest clients keep taking part (before, round 2 dropped them for NaN/Inf)
    for row in rows.values():
        honest = {n for n in row["aggregated_clients"] if n != ATTACKER}
        assert honest == {102, 103} and row["aggregated"] is True
    # the global moved at most as far as two rounds of honest-sized steps (the attacker's update is clipped to
    # strategy.median-clip x the median norm, or refused)
    assert _norm(master, ADAPTER) <= 2 * 2 * _honest_bound()
    first = rows[1]
    assert "101" in first.get("median_clip", {}).get("clipped", {}) or "101" in first["dropped"]


def test_2_fp16_extremes_in_a_real_run_are_clipped_and_the_honest_clients_stay(tmp_path):
    """The issue's run: one of three tiny-model clients replies fp16 6e4 everywhere; under the plain mean the
    global took it, and the next round dropped both honest clients for NaN/Inf."""
    from pubswap_flwr.server.metrics import read_metrics
    from pubswap_flwr.simulation import simulate_in_process

    def extremes(msg, context, reply):
        if int(context.node_config["partition-id"]) == 0 and not reply.has_error():
            reply.content[ADAPTER_KEY] = ArrayRecord({k: Array(np.full(a.shape, 6e4, dtype=np.float16)) for k, a
                                                      in adapter_from_record(reply.content[ADAPTER_KEY]).items()})
        return reply

    simulate_in_process({"seed": 2, "num-server-rounds": 2, "train.local-steps": 1, "train.prompts-per-step": 2,
                         "train.completions-per-prompt": 4, "eval.items-per-task": 2, "eval.sampled": False,
                         "output.dir": str(tmp_path), "run-name": "r"}, 3, reply_hook=extremes)
    final = checkpoint.load(tmp_path / "r").master
    largest = max(float(np.abs(v).max()) for v in final.values())
    assert np.isfinite(largest) and largest < 10  # the plain mean: 2e4
    rows = read_metrics(tmp_path / "r")
    assert [(row["dropped"], len(row["aggregated_clients"])) for row in rows[1:]] == [({}, 3), ({}, 3)]
    for row in rows[1:]:
        (attacker,) = [n for n, c in row["clients"].items() if c["node_index"] == 0]
        clip = row["median_clip"]
        assert list(clip["clipped"]) == [attacker] and clip["bound"] == pytest.approx(3 * clip["median"])
    assert rows[-1]["eval"]["greedy_accuracy"] >= rows[0]["eval"]["greedy_accuracy"] - 0.2


# -- 3. behaviour bloat under pubswap.donor = likely --------------------------------------------------------------
DONOR = {"seed": 1, "strategy.mode": "pubswap", "train.local-steps": 1, "pubswap.tau-swap": 1,
         "pubswap.public-prompts": 4, "train.completions-per-prompt": 8, "pubswap.donor": "likely",
         "pubswap.donor-candidates": 16, "train.foreign-correction": "is"}


def test_3_colluding_clients_cannot_bloat_behaviours_past_generation_max_new_tokens():
    public = task_universe(ExperimentConfig.from_flat(DONOR)).public
    bloated = Behaviour((7,) * 32768, (-0.5,) * 32768).to_wire()  # the wire maximum, not max-new-tokens (16)

    def collude(node, message, content):
        if node not in (101, 102) or PAYLOAD_KEY not in content:
            return content
        payload = payload_from_record(content[PAYLOAD_KEY])
        if payload.get("responses"):  # every public prompt answered right, with long behaviours
            payload["responses"] = {uid: [f"<answer>{public.get(uid).answer}</answer>"] * len(texts)
                                    for uid, texts in payload["responses"].items()}
            payload["behaviour"] = {uid: [bloated] * len(texts) for uid, texts in payload["responses"].items()}
            content[PAYLOAD_KEY] = payload_record(payload)
        return content

    rows, master = serve_rounds(DONOR, collude, nodes=4, rounds=1, adapter=ADAPTER, step=STEP)
    row = rows[1]
    assert sorted(row["aggregated_clients"]) == [103, 104]  # the honest ones, every segment
    assert set(row["dropped"]) == {"101", "102"}
    assert all("longer than 16 tokens (generation.max-new-tokens = 16)" in r for r in row["dropped"].values())


def test_3_a_sapo_packets_behaviour_is_bounded_by_generation_max_new_tokens_too():
    from pubswap_flwr.wire.validate import Limits, Rejected, check_packet

    limits = Limits.of(ExperimentConfig.from_flat({"generation.max-new-tokens": 4}))
    packet = {"item": PACKET["item"], "completions": ["<answer>1</answer>"], "tokenizer": "t"}
    fits = Behaviour((1, 2, 3, 4), (-0.5,) * 4).to_wire()
    assert check_packet({**packet, "behaviour": [fits]}, limits, 4).behaviour is not None
    with pytest.raises(Rejected, match=r"behaviour has 5 tokens \(1..4\) \(generation.max-new-tokens = 4\)"):
        check_packet({**packet, "behaviour": [Behaviour((1,) * 5, (-0.5,) * 5).to_wire()]}, limits, 4)


# -- 4. checkpoint state.json: huge integers, wrong types and values -------------------------------------------------
def _two_checkpoints(run: Path, flat: dict, protocol: dict, adapters: dict | None = None,
                     node_index: dict | None = None) -> None:
    mode = flat["strategy.mode"]
    master = None if mode == "sapo" else ADAPTER
    for number in (1, 2):
        checkpoint.save(run, ServerCheckpoint(number, flat, 0.5 * number, node_index or {7: 0, 8: 1},
                                              {0: number, 1: number}, protocol, master, adapters or {}))


def _raw_edit(run: Path, old: str, new: str) -> None:
    path = run / checkpoint.CHECKPOINT_DIR / checkpoint.STATE_FILE
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


PUBSWAP = ExperimentConfig.from_flat({"run-name": "x", "strategy.mode": "pubswap",
                                      "strategy.compression": "int8"}).to_flat()
SAPO_ASYNC = ExperimentConfig.from_flat({"run-name": "x", "strategy.mode": "sapo", "sapo.async": True}).to_flat()
PACKET = {"sender": "00000-7", "item": {"uid": "gcd/1", "task": "gcd", "question": "q?", "answer": "1",
                                        "verifier": "exact"}, "completions": ["<answer>1</answer>"]}


@pytest.mark.parametrize("old, new", [
    ('"round": 2', '"round": ' + "9" * 5000),
    ('"cumulative_reward": 1.0', '"cumulative_reward": ' + "9" * 5000),
    ('"public_cursor": 8', '"public_cursor": 1.9'),
    ('"public_cursor": 8', '"public_cursor": true'),
    ('"public_cursor": 8', '"public_cursor": -7'),
    ('"public_cursor": 8', '"public_cursor": 1e308'),
    ('"public_cursor": 8', '"public_cursor": 10000000000000000000000'),
    ('"downlink_holders": [7, 8]', '"downlink_holders": [-1, 1e30]'),
    ('"last_disagreement": 0.5', '"last_disagreement": NaN'),
    ('"node_index": {"7": 0', '"node_index": {"7": 99999999'),
    ('"node_rounds": {"0": 2', '"node_rounds": {"0": 3'),
])
def test_4_a_bad_number_in_state_json_falls_back_to_checkpoint_prev(tmp_path, caplog, old, new):
    _two_checkpoints(tmp_path, PUBSWAP, {"public_cursor": 8, "last_disagreement": 0.5, "downlink_holders": [7, 8]},
                     {"downlink": ADAPTER})
    _raw_edit(tmp_path, old, new)
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        loaded = checkpoint.load(tmp_path)
    assert loaded.round == 1 and loaded.source == tmp_path / checkpoint.PREVIOUS_DIR
    assert f"{tmp_path / 'checkpoint' / 'state.json'}: " in caplog.text


def test_4_a_sapo_pool_of_100k_packets_falls_back_to_checkpoint_prev(tmp_path):
    _two_checkpoints(tmp_path, SAPO_ASYNC, {"sapo_pool": [PACKET]})
    _raw_edit(tmp_path, '"sapo_pool": [', '"sapo_pool": [' + (json.dumps(PACKET) + ", ") * 100_000)
    loaded = checkpoint.load(tmp_path)
    assert loaded.round == 1 and len(loaded.protocol["sapo_pool"]) == 1


# -- 5. warm worker directory squatted by another local user ---------------------------------------------------------
def test_5_a_squatted_worker_directory_falls_back_to_one_in_the_home_directory(tmp_path, monkeypatch):
    from pubswap_flwr.node.warm import client

    monkeypatch.delenv(client.RUNTIME_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(client.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(client.Path, "home", lambda: tmp_path / "home")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "other-user").mkdir()  # another user's directory, where ours would be
    (tmp_path / "tmp" / f"pubswap-workers-{os.getuid()}").symlink_to(tmp_path / "other-user")
    path = client.runtime_dir()
    assert path == tmp_path / "home" / ".pubswap" / "workers" and (path.stat().st_mode & 0o777) == 0o700


def test_5_a_node_whose_worker_cannot_be_reached_serves_its_message_in_process(monkeypatch, caplog):
    from pubswap_flwr.node.warm import client

    def squatted():
        raise client.WorkerUnavailable("warm worker directory /tmp/pubswap-workers-0 belongs to uid 1234")

    monkeypatch.setattr(client, "runtime_dir", squatted)
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)  # as Flower's ClientApp process has them
    monkeypatch.setattr(TaskIdentity, "_node_id", 11)
    monkeypatch.setattr(TaskIdentity, "_task_id", 3)
    served = []
    monkeypatch.setattr(nodeapp, "in_process_app", lambda: lambda m, c: served.append(m) or m)
    message = Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=11, message_type="train.segment")
    context = Context(run_id=7, node_id=11, node_config={"state-dir": "/tmp/x"}, state=RecordDict(), run_config={})
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        assert nodeapp.route(message, context) is message
    assert served == [message] and "belongs to uid 1234" in caplog.text and "in this process" in caplog.text


# -- 6. warm worker: crafted frames from the same user ---------------------------------------------------------------
def serve_in_thread(feed, **kwargs) -> dict:
    """worker.serve_one on one end of a socket pair while `feed(other_end)` plays the client; what it returned or
    raised, and whether it finished within 10 s."""
    from pubswap_flwr.node.warm import worker

    outcome: dict = {}
    left, right = socket.socketpair()

    def run():
        try:
            outcome["result"] = worker.serve_one(right, lambda m, c: m, **kwargs)
        except BaseException as err:  # noqa: BLE001 - the test reports whatever escaped
            outcome["error"] = err
        finally:
            right.close()  # as `serve` does: a client still sending gets a broken pipe

    with left, right:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            feed(left)
        except OSError:  # the worker hung up first
            pass
        thread.join(10)
        outcome["finished"] = not thread.is_alive()
    return outcome


def test_6_a_deep_json_header_is_dropped_and_the_worker_goes_on():
    from pubswap_flwr.node.warm import framing

    outcome = serve_in_thread(lambda sock: framing.send_frame(sock, b"[" * 500_000 + b"]" * 500_000))
    assert outcome == {"result": None, "finished": True}


def test_6_a_silent_connection_is_dropped_after_the_request_timeout():
    started = time.monotonic()
    outcome = serve_in_thread(lambda sock: None, request_seconds=0.3)  # takes the hello, sends nothing
    assert outcome == {"result": None, "finished": True} and time.monotonic() - started < 5


# -- 7. smaller ones ------------------------------------------------------------------------------------------------
class _TwiceGrid(FakeClientsGrid):
    """Delivers every reply twice; the second copy of node 101's is broken (no adapter) or another valid one."""

    def __init__(self, second: str):
        super().__init__(3, None, ADAPTER, STEP)
        self.second = second

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for reply in super().send_and_receive(messages, timeout=timeout):
            out.append(reply)
            if reply.metadata.src_node_id == ATTACKER:
                copy = message_from_proto(message_to_proto(reply))  # same message id answered
                if self.second == "broken":
                    del copy.content[ADAPTER_KEY]
                else:
                    copy.content[ADAPTER_KEY] = _adapter_as(ADAPTER, np.float16)
                out.append(copy)
        return out


@pytest.mark.parametrize("second", ["broken", "valid"])
def test_7_a_second_reply_to_one_message_is_ignored(second, caplog):
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        rows, master = serve_rounds({"seed": 1}, None, rounds=1, adapter=ADAPTER, grid=_TwiceGrid(second))
    row = rows[1]
    assert sorted(row["aggregated_clients"]) == [101, 102, 103] and row["dropped"] == {}
    assert "ignored a second reply" in caplog.text
    expected = np.mean([STEP * (1 + 0.25 * i) for i in range(3)])  # the first reply of each node, not the copy
    assert np.allclose(master["m.lora_B.weight"], np.float16(expected), atol=1e-3)


@pytest.mark.parametrize("name", ["../../x", "/etc", "a\0b", "x" * 300, " leading", "back\\slash", "..", "new\nline"])
def test_7_a_run_name_must_be_one_plain_path_component_for_the_server_as_for_every_node(name):
    from pubswap_flwr.server import preflight

    with pytest.raises(ConfigError, match="run-name .* is not one plain path component"):
        preflight.check({"run-name": name}, run_dir=False)


@pytest.mark.parametrize("text, message", [
    (json.dumps({"0": 10**300}), "rounds in"),
    (json.dumps({str(i): 1 for i in range(1_000_000)}), "longer than"),
    ("[" * 100_000 + "]" * 100_000, "node-rounds"),
    (json.dumps({"9" * 5000: 1}), "node-rounds"),
])
def test_7_a_node_rounds_map_is_bounded_by_the_round_and_the_node_count(text, message):
    from pubswap_flwr.wire.codecs import NODE_ROUNDS_KEY
    from pubswap_flwr.wire.records import Header

    config = ConfigRecord({**Header(3, "run").to_config(), NODE_ROUNDS_KEY: text})
    started = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        Header.from_config(config)
    assert time.perf_counter() - started < 0.5


def test_7_a_data_row_with_a_lone_surrogate_is_a_bad_row(tmp_path):
    from pubswap_flwr.tasks import load_items
    from pubswap_flwr.tasks.specs import TaskError

    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "ok?", "answer": "1"}\n{"question": "what \\ud800?", "answer": "2"}\n')
    with pytest.raises(TaskError, match="row 2: 'question' is not valid Unicode text"):
        load_items(path)


def test_7_an_8_mb_question_is_a_bad_row_without_being_tokenized(tmp_path):
    from pubswap_flwr.tasks import load_items
    from pubswap_flwr.tasks.specs import TaskError

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "q" * (8 * 1024 * 1024 - 100), "answer": "1"}) + "\n"
                    + json.dumps({"question": "ok?", "answer": "1"}) + "\n")
    with pytest.raises(TaskError, match=r"row 1: 'question' has 8388508 chars, over the 8192 limit"):
        load_items(path)
