"""The in-process engine enforces `strategy.timeout` as a Flower run does (issue #54, class 6): a node that does not
answer in time is dropped from the exchange with its reason logged, its late reply is never used, and the run goes
on. Timing bounds are loose (the old engine waited for the slow node however long it took)."""

from __future__ import annotations

import logging
import threading
import time

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

from pubswap_flwr.inprocess import InProcessGrid, server_context
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process as simulate

TINY = {"train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 5, "eval.samples": 1,
        "seed": 2}


def _echo_app() -> ClientApp:
    """A node that answers every train message at once with its own node id and the message's tag."""
    app = ClientApp()

    @app.train()
    def _train(msg: Message, context) -> Message:
        tag = msg.content["config"]["tag"]
        return Message(RecordDict({"config": ConfigRecord({"node": context.node_id, "tag": tag})}), reply_to=msg)

    return app


def _send(grid: InProcessGrid, nodes: list[int], tag: str, timeout: float | None) -> tuple[list[Message], float]:
    """Train messages to `nodes`; the replies of send_and_receive and the seconds it took."""
    server_context(grid)
    messages = [Message(RecordDict({"config": ConfigRecord({"tag": tag})}), dst_node_id=node, message_type="train")
                for node in nodes]
    started = time.monotonic()
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    return replies, time.monotonic() - started


def _answers(replies: list[Message]) -> list[tuple[int, str]]:
    return sorted((r.content["config"]["node"], r.content["config"]["tag"]) for r in replies)


def test_inprocess_timeout_drops_slow_node(caplog):
    slow = {1002: 3.0}  # node -> seconds it takes; the timeout is 2 s
    finished: list[int] = []

    def deliver(msg, context, call):
        time.sleep(slow.get(context.node_id, 0.0))
        finished.append(context.node_id)
        return call(msg, context)

    grid = InProcessGrid(_echo_app(), 3, {}, deliver=deliver)
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        replies, took = _send(grid, [1001, 1002, 1003], "first", timeout=2.0)
    # The slow node is dropped; 1003 waited for its abandoned work (1 s, see the next test), then answered.
    assert _answers(replies) == [(1001, "first"), (1003, "first")]
    assert took < 10
    assert "node 1002 did not answer within 2 s" in caplog.text
    # Its late reply is never used: nothing to pull once it has finished, and its next message gets a fresh answer.
    deadline = time.monotonic() + 10
    while 1002 not in finished and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert grid.pull_messages([f"m{i}" for i in range(1, 10)]) == []
    slow.clear()
    replies, _ = _send(grid, [1001, 1002, 1003], "second", timeout=2.0)
    assert _answers(replies) == [(1001, "second"), (1002, "second"), (1003, "second")]


def _overlap_recorder(hangs, release: threading.Event):
    """A deliver hook that hangs the messages `hangs(msg, context)` picks until `release`, and the list of moments
    when more than one node's handler ran at once (never allowed: the nodes share the model)."""
    running: list[int] = []
    overlaps: list[list[int]] = []

    def deliver(msg, context, call):
        running.append(context.node_id)
        if len(running) > 1:
            overlaps.append(list(running))
        try:
            if hangs(msg, context):
                release.wait(30)  # hung until the test releases it
            return call(msg, context)
        finally:
            running.remove(context.node_id)

    return deliver, overlaps


def test_inprocess_timeout_hung_node_does_not_hold_the_exchange_or_run_beside_the_next(caplog):
    release = threading.Event()
    deliver, overlaps = _overlap_recorder(lambda msg, context: context.node_id == 1001, release)

    grid = InProcessGrid(_echo_app(), 2, {}, deliver=deliver)
    try:
        with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
            replies, took = _send(grid, [1001, 1002], "first", timeout=0.5)
        assert replies == [] and took < 10  # 1001 hangs; 1002's message waited its own 0.5 s behind it
        assert "node 1001 did not answer within 0.5 s" in caplog.text
        assert "node 1002's message was not served: node 1001's abandoned message still runs" in caplog.text
    finally:
        release.set()
    replies, _ = _send(grid, [1001, 1002], "second", timeout=10)  # once the hung work ends, both are served
    assert _answers(replies) == [(1001, "second"), (1002, "second")]
    assert overlaps == []


def test_inprocess_timeout_a_message_without_a_timeout_waits_for_the_abandoned_work_first():
    release = threading.Event()
    deliver, overlaps = _overlap_recorder(lambda msg, context: msg.content["config"]["tag"] == "hangs", release)

    grid = InProcessGrid(_echo_app(), 2, {}, deliver=deliver)
    try:
        assert _send(grid, [1001], "hangs", timeout=0.5)[0] == []
        threading.Timer(0.5, release.set).start()
        replies, _ = _send(grid, [1002], "after", timeout=None)  # push_messages' path: no timeout of its own
    finally:
        release.set()
    assert _answers(replies) == [(1002, "after")]
    assert overlaps == []  # it waited for 1001's abandoned handling instead of running beside it


def test_inprocess_timeout_without_a_timeout_waits_as_before():
    def deliver(msg, context, call):
        time.sleep(0.3)
        return call(msg, context)

    grid = InProcessGrid(_echo_app(), 2, {}, deliver=deliver)
    replies, _ = _send(grid, [1001, 1002], "x", timeout=None)  # Flower's send_and_receive(timeout=None) waits
    assert _answers(replies) == [(1001, "x"), (1002, "x")]


def test_inprocess_timeout_slow_node_is_dropped_and_the_run_completes(tmp_path):
    release, late = threading.Event(), threading.Event()

    def slow_last_node_in_round_two(msg, context, call):
        reply = call(msg, context)
        if int(context.node_config["partition-id"]) == 3 and int(msg.content["config"]["server-round"]) == 2:
            release.wait(60)  # the old engine waited here for the node, however long it took
            late.set()
        return reply

    try:
        simulate({**TINY, "num-server-rounds": 2, "train.local-steps": 1, "strategy.timeout": 15.0,
                  "output.dir": str(tmp_path), "run-name": "slow"}, 4, deliver=slow_last_node_in_round_two)
        assert not late.is_set()  # the run finished while the slow node was still working
    finally:
        release.set()
    rows = read_metrics(tmp_path / "slow")
    assert [len(r.get("clients", {})) for r in rows] == [0, 4, 3]
    assert list(rows[2]["dropped"].values()) == ["no reply within strategy.timeout = 15 s"]
    assert rows[2]["aggregated"] is True
