"""A Ray-free Flower grid: the ServerApp's messages go to a ClientApp in this process, one node after another.

Every message crosses a real Flower serialization round trip (protobuf, as on the wire), so server and nodes never
share objects; a ClientApp that raises becomes an error reply with code 2, as in Flower's own runtimes. Tests use it
to exercise every mode's round protocol, dropped and hostile clients, resume and the privacy audit in seconds; it
also runs small experiments without starting Ray (`pubswap simulate --engine inprocess`).
"""

from __future__ import annotations

import itertools
import logging
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

log = logging.getLogger(__name__)

CLIENT_APP_RAISED_EXCEPTION = 2  # flwr.common.constant.ErrorCode.CLIENT_APP_RAISED_EXCEPTION

# deliver(msg, context, call) -> reply, or None for "no reply" (a node that never answers: the timeout path).
# `call(msg, context)` runs the ClientApp; a test wraps it to inject failures or rewrite replies.
Deliver = Callable[[Message, Context, Callable[[Message, Context], Message]], Message | None]


def _wire_copy(message: Message) -> Message:
    """The message as the other side receives it: serialized to bytes and parsed back."""
    proto = message_to_proto(message)
    return message_from_proto(type(proto).FromString(proto.SerializeToString()))


@dataclass
class _Node:
    node_id: int
    context: Context


@dataclass
class InProcessGrid(Grid):
    """A Grid whose SuperNodes are `num_nodes` partitions served by `client_app` in this process.

    Node ids are fixed (`first_node_id + partition`), so runs repeat exactly; `node_config` carries `partition-id`
    and `num-partitions` as Flower's simulation sets them (plus `extra_node_config` per partition)."""

    # every node answers within push_messages, so the exchange keeps send_and_receive (pubswap_flwr.server.exchange): a
    # withheld reply is then the timeout path without waiting for the timeout
    synchronous: ClassVar[bool] = True

    client_app: ClientApp
    num_nodes: int
    run_config: dict[str, Any]
    run_id: int = 1
    first_node_id: int = 1001
    deliver: Deliver | None = None
    extra_node_config: Callable[[int], dict[str, Any]] | None = None
    nodes: dict[int, _Node] = field(default_factory=dict, init=False)
    _replies: dict[str, Message] = field(default_factory=dict, init=False)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), init=False)

    def __post_init__(self) -> None:
        for partition in range(self.num_nodes):
            node_id = self.first_node_id + partition
            node_config: dict[str, Any] = {"partition-id": partition, "num-partitions": self.num_nodes}
            if self.extra_node_config is not None:
                node_config.update(self.extra_node_config(partition))
            self.nodes[node_id] = _Node(node_id, Context(run_id=self.run_id, node_id=node_id, node_config=node_config,
                                                         state=RecordDict(), run_config=dict(self.run_config)))

    # -- Grid interface ----------------------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self.run_id = run.run_id

    @property
    def run(self) -> Run:
        return Run.create_empty(self.run_id)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            ids.append(message.metadata.message_id)
            reply = self._serve(_wire_copy(message))
            if reply is not None:
                self._replies[message.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Every node answers before this returns, so the timeout never has to be waited for."""
        return self.pull_messages(self.push_messages(messages))

    # -- the node side -----------------------------------------------------------------------------------------
    def _serve(self, message: Message) -> Message | None:
        node = self.nodes.get(message.metadata.dst_node_id)
        if node is None:
            return None  # Flower would report the node unavailable; the server sees no reply
        saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = self.run_id, node.node_id, node.node_id
        try:
            reply = (self.deliver(message, node.context, self._call) if self.deliver is not None
                     else self._call(message, node.context))
            return None if reply is None else self._sent(reply, message)
        finally:
            TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved

    @staticmethod
    def _sent(reply: Message, message: Message) -> Message:
        """The reply as the server receives it; one that cannot be serialized fails on the node, as in Flower."""
        try:
            return _wire_copy(reply)
        except (ValueError, TypeError) as err:  # protobuf refuses e.g. text that is not valid Unicode
            reason = f"the reply could not be serialized: {type(err).__name__}: {err}"
            return _wire_copy(Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message))

    def _call(self, message: Message, context: Context) -> Message:
        try:
            return self.client_app(message, context)
        except Exception as err:  # noqa: BLE001 - Flower's runtimes turn any ClientApp exception into an error reply
            reason = "".join(traceback.format_exception(err))
            log.debug("node %d raised: %s", context.node_id, reason)
            return Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)


def server_context(grid: InProcessGrid) -> Context:
    """The ServerApp's context for a run on `grid`, with TaskIdentity set as Flower's ServerApp process sets it."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = grid.run_id, SUPERLINK_NODE_ID, 1
    return Context(run_id=grid.run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                   run_config=dict(grid.run_config))
