"""Model-free honest clients behind a Grid, for driving a protocol's server side directly: each answers every
instruction with a well-formed reply of its message type (a mode without one here gets the bare report), and
`tamper(node, message, content)` may rewrite a reply's records before the server sees them (property tests feed it
arbitrary mutations)."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
from flwr.app import Error, Message, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from pubswap_flwr.algorithms.sapo_selection import Packet
from pubswap_flwr.inprocess import CLIENT_APP_RAISED_EXCEPTION, InProcessGrid
from pubswap_flwr.protocols.fedavg import AdapterReply, LocalRound
from pubswap_flwr.protocols.pubswap import Segment, SegmentReply
from pubswap_flwr.protocols.sapo import CollectRollouts, SapoAsyncRound, SapoReply, SapoTrain
from pubswap_flwr.tasks import TaskItem
from pubswap_flwr.wire.records import ClientReport, reply_records

Tamper = Callable[[int, Message, RecordDict], RecordDict]
ITEM = TaskItem("gcd/7", "gcd", "What is the greatest common divisor of 12 and 18?", "6", "exact")
SELECTION = {"external-received": 3, "external-used": 2, "external-zero-advantage": 1, "external-rejected": 0,
             "external-shortfall": 0}


def report(node_index: int, examples: int = 64) -> ClientReport:
    return ClientReport(node_index, examples, 0.5, 3, 1.0, 2.0, 0.1, 0.1, 0.5, examples, None, "embedded:tiny",
                        ("gcd",))


def honest_reply(index: int, message: Message) -> RecordDict:
    kind = message.metadata.message_type
    step = honest_reply.step  # type: ignore[attr-defined]
    if kind == LocalRound.message_type:
        instruction = LocalRound.from_record(message.content)
        adapter = instruction.adapter
        if step and adapter is not None:
            adapter = stepped(adapter, index, step)
        return AdapterReply(report(index), adapter).to_record()
    if kind == Segment.message_type:
        segment = Segment.from_record(message.content)
        if segment.adapter is not None and step:  # segment 0: the global the final adapter steps from
            honest_reply.adapters[index] = stepped(segment.adapter, index, step)  # type: ignore[attr-defined]
        responses = {uid: [f"<answer>{i % 3}</answer>" for i in range(segment.config.k)] for uid in segment.config.uids}
        adapter = None
        if segment.config.final:
            adapter = honest_reply.adapters[index]  # type: ignore[attr-defined]
        return SegmentReply(report(index), responses, adapter).to_record()
    packets = (Packet("", ITEM, ("<answer>6</answer>", "<answer>5</answer>")),)
    if kind == CollectRollouts.message_type:
        return SapoReply(report(index), packets=packets).to_record()
    if kind in (SapoTrain.message_type, SapoAsyncRound.message_type):
        shared = packets if kind == SapoAsyncRound.message_type else None
        return SapoReply(report(index), packets=shared, selection=SELECTION).to_record()
    # any other mode's instruction: the report every reply carries, all a reply needs in a mode that exchanges
    # nothing else (local); a mode whose server wants more drops this reply, and the property tests then fail
    return reply_records(report(index))


honest_reply.adapters = {}  # type: ignore[attr-defined]  # pubswap: the adapter each node returns at the end
honest_reply.step = 0.0  # type: ignore[attr-defined]  # the size of an honest update (0: the global comes back)


def stepped(adapter: dict, index: int, step: float) -> dict:
    """An honest-looking update: the global moved by `step` (a little more for each node index) in every value."""
    return {k: (v.astype(np.float32) + step * (1 + 0.25 * index)).astype(np.float16) for k, v in adapter.items()}


class FakeClientsGrid(Grid):
    """`num_nodes` honest model-free clients (node ids 101.., node index = position); `tamper` rewrites replies."""

    def __init__(self, num_nodes: int, tamper: Tamper | None = None, global_adapter: dict | None = None,
                 step: float = 0.0):
        self.ids = [101 + i for i in range(num_nodes)]
        self.tamper = tamper
        self.counter = itertools.count(1)
        honest_reply.adapters = {i: global_adapter for i in range(num_nodes)}  # type: ignore[attr-defined]
        honest_reply.step = step  # type: ignore[attr-defined]
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1

    def set_run(self, run: Run) -> None:
        pass

    @property
    def run(self) -> Run:
        return Run.create_empty(1)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type)

    def get_node_ids(self):
        return list(self.ids)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"m{next(self.counter)}"
            received = message_from_proto(message_to_proto(message))
            node = message.metadata.dst_node_id
            try:
                content = honest_reply(self.ids.index(node), received)
            except ValueError as err:  # a message the honest client cannot read: an error reply, as in Flower
                replies.append(Message(Error(CLIENT_APP_RAISED_EXCEPTION, f"{type(err).__name__}: {err}"),
                                       reply_to=received))
                continue
            if self.tamper is not None:
                content = self.tamper(node, received, content)
            replies.append(InProcessGrid._sent(Message(content, reply_to=received), received))
        return replies



def serve_rounds(flat: dict, tamper: Tamper | None, *, nodes: int = 3, rounds: int = 2, adapter: dict | None = None,
                 step: float = 0.0, grid: Grid | None = None) -> tuple[dict[int, dict], dict | None]:
    """`rounds` server rounds of the run config `flat` against `nodes` fake clients (`tamper` rewrites replies);
    the metrics rows by round and the final global adapter (None in modes without one)."""
    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.protocols import protocol_class
    from pubswap_flwr.protocols.base import RoundContext
    from pubswap_flwr.rounds.exchange import Exchange
    from pubswap_flwr.rounds.roundlog import RoundLog
    from pubswap_flwr.server.metrics import RunRecorder, read_metrics
    from pubswap_flwr.server.runner import Runner
    from pubswap_flwr.shared import task_universe

    cfg = ExperimentConfig.from_flat(flat)
    protocol = protocol_class(cfg.strategy.mode).from_config(cfg, task_universe(cfg).public)
    if protocol.holds_global_adapter:
        protocol.master = {k: np.asarray(v, dtype=np.float32).copy() for k, v in adapter.items()}
    grid = grid or FakeClientsGrid(nodes, tamper, adapter, step)
    exchange = Exchange(grid, timeout=5, min_clients=cfg.strategy.min_clients, fraction=1.0, seed=1,
                        settle_seconds=0)
    with tempfile.TemporaryDirectory() as tmp:
        recorder = RunRecorder(Path(tmp) / "run", cfg, "p")
        runner = Runner(cfg, recorder, protocol)
        runner.exchange = exchange
        for number in range(1, rounds + 1):
            log = RoundLog(number)
            protocol.run_round(RoundContext(number, number == rounds, True, exchange, log, "run", tmp))
            runner._evaluate_and_record(log, final=number == rounds)
        rows = {row["round"]: row for row in read_metrics(recorder.run_dir)}
    return rows, protocol.master
