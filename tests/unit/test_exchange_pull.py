"""The exchange pushes and pulls through a grid with Flower's push_messages / pull_messages itself, at PULL_INTERVAL
instead of HttpGrid.send_and_receive's 3 s sleeps, with send_and_receive's rules: replies, error replies and
rejected replies dropped with their reason, the timeout, byte counts. Grids without push/pull, or that answer within
push (the in-process grid), keep send_and_receive. A fake clock: nothing here waits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from pubswap_flwr.inprocess import InProcessGrid
from pubswap_flwr.rounds.exchange import PULL_INTERVAL, Exchange


@pytest.fixture(autouse=True)
def task_identity():
    """Flower's Message reads the process's run, node and task ids: set them (as in a ServerApp), then put back."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class PollingGrid:
    """Push/pull only. `ready`: node -> the pull from which its reply is there (None: never answers); `errors`: nodes
    that answer with an error; `refused`: nodes whose message push_messages does not take (None id, as HttpGrid)."""

    def __init__(self, ready: dict[int, int | None], errors=(), refused=()):
        self.ready, self.errors, self.refused = ready, set(errors), set(refused)
        self.now = 0.0
        self.pulls: list[list[str]] = []
        self.sleeps: list[float] = []
        self.sent: dict[str, Message] = {}

    def get_node_ids(self):
        return sorted(self.ready)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            if node in self.refused:
                ids.append(None)
                continue
            message.metadata.__dict__["_message_id"] = f"m{node}"
            self.sent[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        self.pulls.append(list(message_ids))
        out = []
        for message_id in message_ids:
            message = self.sent[message_id]
            node = message.metadata.dst_node_id
            if self.ready[node] is None or len(self.pulls) < self.ready[node]:
                continue
            if node in self.errors:
                out.append(Message(Error(code=0, reason="Traceback ...\nRuntimeError: boom"), reply_to=message))
            else:
                out.append(Message(RecordDict({"r": ConfigRecord({"node": node, "pad": "x" * node})}),
                                   reply_to=message))
        return out

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("the exchange pulls itself from a grid with push/pull")

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _decode(node: int, reply: Message):
    if node == 5:
        raise ValueError("not a reply this protocol accepts")
    return SimpleNamespace(report=SimpleNamespace(node_index=node - 1, t_start=0.0, t_end=0.0,
                                                 train_reward=None, rollout_reward=None))


def _exchange(grid, timeout: float = 1.0) -> Exchange:
    exchange = Exchange(grid, timeout=timeout, min_clients=1, fraction=1.0, seed=0, settle_seconds=0)
    exchange._clock, exchange._sleep = grid.clock, grid.sleep
    return exchange


def _send(exchange: Exchange, nodes):
    return exchange.send([Message(RecordDict({"c": ConfigRecord({"n": n})}), dst_node_id=n, message_type="train")
                          for n in nodes], _decode)


def test_replies_are_pulled_at_the_short_interval_until_all_answered():
    grid = PollingGrid({1: 1, 2: 3, 3: 2})
    exchange = _exchange(grid)
    assert exchange.pulls and PULL_INTERVAL <= 0.2
    out = _send(exchange, [1, 2, 3])
    assert sorted(out.replies) == [1, 2, 3] and out.dropped == {}
    # pull, wait the short interval, pull again only for what is missing; stop as soon as all have answered
    assert grid.pulls == [["m1", "m2", "m3"], ["m2", "m3"], ["m2"]]
    assert grid.sleeps == [PULL_INTERVAL, PULL_INTERVAL]
    assert set(out.bytes_in) == {1, 2, 3} and out.bytes_in[3] > out.bytes_in[1] > 0
    assert set(out.bytes_out) == {1, 2, 3}


def test_timeouts_errors_and_rejected_replies_are_dropped_with_their_reason():
    grid = PollingGrid({1: 1, 3: None, 4: 2, 5: 1}, errors=[4])
    out = _send(_exchange(grid, timeout=1.0), [1, 3, 4, 5])
    assert list(out.replies) == [1]
    assert out.dropped[3] == "no reply within strategy.timeout = 1 s"
    assert out.dropped[4].startswith("client error (code 0): RuntimeError: boom")
    assert out.dropped[5].startswith("rejected reply (ValueError): not a reply this protocol accepts")
    assert set(out.bytes_in) == {1}  # only accepted replies count
    # node 3 was pulled for until the timeout, every PULL_INTERVAL, and no longer
    assert all(ids == ["m3"] for ids in grid.pulls[2:]) and len(grid.pulls) >= 10
    assert max(grid.sleeps) == PULL_INTERVAL and sum(grid.sleeps) == pytest.approx(1.0)
    assert grid.now <= 1.0 + 1e-9


def test_a_message_the_grid_did_not_take_is_dropped_without_waiting():
    grid = PollingGrid({1: 1, 2: 1}, refused=[2])
    out = _send(_exchange(grid, timeout=600.0), [1, 2])
    assert list(out.replies) == [1]
    assert out.dropped == {2: "the message could not be pushed to the SuperLink"}
    assert grid.pulls == [["m1"]] and grid.sleeps == []


class SendOnlyGrid(PollingGrid):
    """A test grid that implements send_and_receive only (as tests/protocols/fake_clients.py does)."""

    def push_messages(self, messages):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        self.calls = getattr(self, "calls", 0) + 1
        return PollingGrid.pull_messages(self, PollingGrid.push_messages(self, messages))


def test_grids_without_push_and_pull_keep_send_and_receive():
    grid = SendOnlyGrid({1: 1, 2: 1})
    exchange = _exchange(grid)
    out = _send(exchange, [1, 2])
    assert sorted(out.replies) == [1, 2] and grid.calls == 1 and not exchange.pulls
    _send(exchange, [1, 2])
    assert grid.calls == 2

    class OnlySendAndReceive:
        def send_and_receive(self, messages, *, timeout=None):
            return []

    assert not Exchange(OnlySendAndReceive(), timeout=1, min_clients=1, fraction=1.0, seed=0).pulls
    # the in-process grid answers within push: it keeps send_and_receive (a withheld reply does not wait)
    assert InProcessGrid.synchronous


def test_flowers_deployed_grid_is_pulled_from_directly():
    from flwr.superlink.grid.http_grid import HttpGrid

    assert Exchange(HttpGrid.__new__(HttpGrid), timeout=1, min_clients=1, fraction=1.0, seed=0).pulls


def test_each_message_carries_the_last_round_the_exchange_accepted_from_its_node():
    """By node index: by its own round when the exchange knows the node's id, else every index's round (new ids after
    a resume under Flower's Ray engine), and nothing before any reply was accepted."""
    import json

    from pubswap_flwr.wire.codecs import CONFIG_KEY, NODE_ROUND_KEY, NODE_ROUNDS_KEY

    shared = ConfigRecord({"server-round": 3})

    def send(exchange, grid, round_number: int, nodes=(1, 2, 5)):
        grid.pulls, grid.sent = [], {}
        shared["server-round"] = round_number
        exchange.send([Message(RecordDict({CONFIG_KEY: shared}), dst_node_id=n, message_type="train") for n in nodes],
                      _decode)
        return {m.metadata.dst_node_id: {k: v for k, v in m.content[CONFIG_KEY].items() if k.startswith("node-")}
                for m in grid.sent.values()}

    grid = PollingGrid({1: 1, 2: 1, 5: 1}, errors=[2])
    exchange = _exchange(grid)
    assert send(exchange, grid, 3) == {1: {}, 2: {}, 5: {}}
    assert exchange.accepted_round == {0: 3}  # node 1 is index 0; node 2 erred and node 5's reply was rejected
    stamps = send(exchange, grid, 4)
    # one shared config record: each message got its own copy
    assert stamps[1] == {NODE_ROUND_KEY: 3} and NODE_ROUND_KEY not in shared
    assert stamps[2] == stamps[5] == {NODE_ROUNDS_KEY: json.dumps({"0": 3})}
    assert exchange.accepted_round == {0: 4}

    resumed_grid = PollingGrid({11: 1, 12: 1})  # the same nodes under new ids
    resumed = _exchange(resumed_grid)
    resumed.node_index, resumed.accepted_round = {1: 0}, {0: 4}
    stamps = send(resumed, resumed_grid, 5, nodes=(11, 12))
    assert stamps == {11: {NODE_ROUNDS_KEY: '{"0": 4}'}, 12: {NODE_ROUNDS_KEY: '{"0": 4}'}}
    assert resumed.accepted_round == {0: 4, 10: 5, 11: 5} and send(resumed, resumed_grid, 6, nodes=(11,)) == {
        11: {NODE_ROUND_KEY: 5}}


def test_a_line_every_30_s_says_how_many_clients_replied_while_waiting(caplog):
    import logging

    grid = PollingGrid({1: 2, 2: 701})  # node 2 answers at the 701st pull: 70 s at PULL_INTERVAL
    exchange = _exchange(grid, timeout=600.0)
    exchange.round = 3
    logger, clients = logging.getLogger("pubswap_flwr"), logging.getLogger("pubswap_flwr.clients")
    saved = clients.level
    clients.setLevel(logging.WARNING)  # no per-client lines (--verbose)
    logger.addHandler(caplog.handler)  # the project's logger may not propagate (logs.setup)
    try:
        with caplog.at_level(logging.INFO, logger="pubswap_flwr"):
            out = _send(exchange, [1, 2])
    finally:
        logger.removeHandler(caplog.handler)
        clients.setLevel(saved)
    assert sorted(out.replies) == [1, 2]
    lines = list(dict.fromkeys(r.getMessage() for r in caplog.records if r.name == "pubswap_flwr"))
    assert lines == ["[round 3] train #1: sent to 2 client(s), waiting for replies",
                     "[round 3] train #1: 1 of 2 replied after 30 s", "[round 3] train #1: 1 of 2 replied after 60 s",
                     "[round 3] train #1: 2 of 2 replied in 0.0 s"]
