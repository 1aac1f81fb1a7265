"""A Ray-free Flower grid: the ServerApp's messages go to a ClientApp in this process, one node after another.

Every message crosses a real Flower serialization round trip (protobuf, as on the wire), so server and nodes never
share objects; a ClientApp that raises becomes an error reply with code 2, as in Flower's own runtimes. Tests use it
to exercise every mode's round protocol, dropped and hostile clients, resume and the privacy audit in seconds; it
also runs small experiments without starting Ray (`pubswap simulate --engine inprocess`).

`send_and_receive(messages, timeout=...)` (what the exchange calls with `strategy.timeout`) enforces the timeout as a
Flower run does: a node that has not answered when it runs out is dropped from that exchange (the exchange logs
"no reply within strategy.timeout") and the others go on. Nodes are served one after another, like the nodes of one
Ray actor, so each message gets the whole timeout from its turn (in a parallel run every node has it at once).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
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
class _Handling:
    """One node's handling of one message, in a thread of its own so the server can stop waiting at the timeout.
    Only the thread writes `reply` / `error` (then sets `done`); the grid reads them only when `done` came in time."""

    node_id: int
    done: threading.Event = field(default_factory=threading.Event)
    reply: Message | None = None
    error: BaseException | None = None


@dataclass
class InProcessGrid(Grid):
    """A Grid whose SuperNodes are `num_nodes` partitions served by `client_app` in this process.

    Node ids are fixed (`first_node_id + partition`), so runs repeat exactly; `node_config` carries `partition-id`
    and `num-partitions` as Flower's simulation sets them (plus `extra_node_config` per partition)."""

    # every node answers (or runs out of time) within send_and_receive, so the exchange keeps it
    # (pubswap_flwr.rounds.exchange): a withheld reply is then the timeout path without waiting for the timeout
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
    _abandoned: _Handling | None = field(default=None, init=False)  # a timed-out handling that may still be running

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
        """Serve every message before returning, each node for as long as it takes (no timeout: see
        send_and_receive)."""
        return self._push(messages, None)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Serve the messages one after another and return the replies. With a `timeout`, a node that has not
        answered `timeout` seconds after its turn came is left behind: no reply from it (the timeout path) and the
        next node's turn starts. `None` waits for every node, as Flower's send_and_receive does."""
        return self.pull_messages(self._push(messages, timeout))

    def _push(self, messages: Iterable[Message], timeout: float | None) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            ids.append(message.metadata.message_id)
            reply = self._serve(_wire_copy(message), timeout)
            if reply is not None:
                self._replies[message.metadata.message_id] = reply
        return ids

    # -- the node side -----------------------------------------------------------------------------------------
    def _serve(self, message: Message, timeout: float | None) -> Message | None:
        node = self.nodes.get(message.metadata.dst_node_id)
        if node is None:
            return None  # Flower would report the node unavailable; the server sees no reply
        # Set (and restored) here, not in a handling's thread: an abandoned one must not change the server's identity
        saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = self.run_id, node.node_id, node.node_id
        try:
            if timeout is None:
                if self._abandoned is not None:  # no two handlings at once (see _handle_within), however long
                    self._abandoned.done.wait()
                    self._abandoned = None
                return self._handle(message, node)
            return self._handle_within(message, node, time.monotonic() + timeout, timeout)
        finally:
            TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved

    def _handle(self, message: Message, node: _Node) -> Message | None:
        reply = (self.deliver(message, node.context, self._call) if self.deliver is not None
                 else self._call(message, node.context))
        return None if reply is None else self._sent(reply, message)

    def _handle_within(self, message: Message, node: _Node, deadline: float, timeout: float) -> Message | None:
        """The node's reply if its handling ends by `deadline`, else None: the server stops waiting, as Flower's
        does. Python cannot stop a thread, so an abandoned handling runs on in the background (a daemon thread: it
        does not keep the process alive) and may still update its node's context, as a Flower node that finished
        late does; its reply is never read (the grid keeps only replies of handlings that ended in time). Nodes
        share this process's model (`policy.cached_policy`), so no other handling starts while an abandoned one
        runs: the next message waits for it within its own timeout, like a message queued behind a slow one on
        a Ray actor, and gets no reply if it is still running then."""
        if self._abandoned is not None:
            if not self._abandoned.done.wait(max(0.0, deadline - time.monotonic())):
                log.warning("node %d's message was not served: node %d's abandoned message still runs after "
                            "%g s", node.node_id, self._abandoned.node_id, timeout)
                return None
            self._abandoned = None
        handling = _Handling(node.node_id)

        def run() -> None:
            try:
                handling.reply = self._handle(message, node)
            except BaseException as err:  # noqa: BLE001 - raised again in the server's thread when read in time
                handling.error = err
            finally:
                handling.done.set()

        threading.Thread(target=run, name=f"inprocess-node-{node.node_id}", daemon=True).start()
        if not handling.done.wait(max(0.0, deadline - time.monotonic())):
            log.warning("node %d did not answer within %g s: dropped from this exchange, its late reply will be "
                        "discarded", node.node_id, timeout)
            self._abandoned = handling
            return None
        if handling.error is not None:
            raise handling.error
        return handling.reply

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
