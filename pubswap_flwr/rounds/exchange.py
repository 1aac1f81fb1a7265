"""Send and receive through Flower's Grid: node selection, timeouts, drops, timings and byte counts, and the
per-reply guard — the one place where a reply from another party enters the server.

A reply is accepted only when its decoder (a protocol's typed reply `from_record`, plus any validation and
scoring the protocol asks for) returns without raising; any exception drops that reply, and only that reply,
with its reason. A node that errs or does not answer within `strategy.timeout` is dropped the same way. Only a
message's first reply counts: a second one (a grid that delivers twice) is ignored with a warning.

Replies are pulled every PULL_INTERVAL seconds: Flower 1.42's `HttpGrid.send_and_receive` (the deployed ServerApp's
grid, `flwr/superlink/grid/http_grid.py`) sleeps a fixed 3 s between pulls, on average 1.5 s of idle wait per
exchange. So with a grid that has `push_messages` and `pull_messages` (Flower's `Grid` interface) the exchange pushes
and pulls itself, with the same rules as `send_and_receive`: one push, pull until every message has a reply or the
timeout has passed. A grid that answers every message within `push_messages` (`synchronous = True`, the in-process
grid: a withheld reply is the timeout path without waiting) or that has no push/pull keeps `send_and_receive`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Protocol, TypeVar

from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid

from ..interruption import check_interrupted
from ..wire.codecs import CONFIG_KEY, NODE_ROUND_KEY, NODE_ROUNDS_KEY, record_bytes
from ..wire.validate import Rejected

if TYPE_CHECKING:
    from ..wire.records import ClientReport

log = logging.getLogger("pubswap_flwr")
client_log = logging.getLogger("pubswap_flwr.clients")  # a line per client reply, shown with --verbose

# Seconds between two pulls of the replies: what Flower's own in-memory grid waits (InMemoryGrid.pull_interval,
# the simulation engine's grid), against HttpGrid's 3 s. Each pull is one local request to the SuperLink.
PULL_INTERVAL = 0.1
# While replies are awaited, a line every this many seconds says how many clients have replied so far (a round of a
# real model can be silent for minutes between "waiting for replies" and "replied").
PROGRESS_EVERY = 30.0


class Reply(Protocol):
    """A decoded reply: every protocol's carries its client's report."""

    @property
    def report(self) -> ClientReport: ...


T = TypeVar("T", bound=Reply)


@dataclass
class ExchangeResult(Generic[T]):
    """One send-and-receive: decoded replies of the accepted nodes, dropped nodes with reasons, and costs."""

    replies: dict[int, T] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    wall: float = 0.0
    busy: float = 0.0  # union of the clients' handler intervals (shared clock in simulation/one host)
    decode_seconds: float = 0.0  # server time spent decoding, validating and scoring replies
    bytes_out: dict[int, int] = field(default_factory=dict)
    bytes_in: dict[int, int] = field(default_factory=dict)
    array_records: int = 0  # ArrayRecords sent plus received (weights on the wire)


def describe_error(reply: Message) -> str:
    lines = (reply.error.reason or "").strip().splitlines()
    detail = lines[-1] if lines else ""
    return f"client error (code {reply.error.code}): {detail[:300]}"


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _reason(err: Exception) -> str:
    text = str(err)[:500]
    return f"rejected reply: {text}" if isinstance(err, Rejected) else f"rejected reply ({type(err).__name__}): {text}"


def _pulls_itself(grid: object) -> bool:
    """Whether the exchange pushes and pulls through this grid itself (see the module docstring)."""
    return (not getattr(grid, "synchronous", False) and callable(getattr(grid, "push_messages", None))
            and callable(getattr(grid, "pull_messages", None)))


class Exchange:
    """The server's side of the wire for one run. `settle_seconds`: how long the node set must stay unchanged
    before a round starts (simulated nodes register one by one; an in-process grid has them all at once)."""

    # parameters: the exchange's strategy.* settings and its clock, keyword-only
    def __init__(self, grid: Grid, *, timeout: float, min_clients: int, fraction: float, seed: int,
                 settle_seconds: float = 1.0, pull_interval: float = PULL_INTERVAL,
                 progress_every: float = PROGRESS_EVERY, reward_range: tuple[float, float] = (0.0, 1.0)):
        self.grid = grid
        # a reported train or rollout reward outside it drops the reply: [0, 1] from verifiers and tasks.rewards, the
        # wider wire bound only when the run trains on tasks.trl-rewards (unclipped sums)
        self.reward_range = reward_range
        self.pull_interval = pull_interval
        self.progress_every = progress_every
        self.pulls = _pulls_itself(grid)  # False: the grid's send_and_receive (see the module docstring)
        self._clock: Callable[[], float] = time.monotonic  # replaced in tests, with _sleep
        self._sleep: Callable[[float], None] = time.sleep
        self.timeout = timeout
        self.min_clients = min_clients
        self.fraction = fraction
        self.seed = seed
        self.settle_seconds = settle_seconds
        self.node_index: dict[int, int] = {}  # Flower node id -> node index reported by the client
        # node index -> the last round whose reply from it was accepted (by index: Flower's Ray engine gives nodes
        # new ids when a run resumes)
        self.accepted_round: dict[int, int] = {}
        self.round = 0  # for progress lines: the round being run, and how many exchanges of each type it had
        self._sent: dict[str, int] = {}

    # -- who takes part --------------------------------------------------------------------------------------
    def select(self, round_number: int) -> list[int]:
        """Wait (up to the timeout) for at least min-clients nodes, then sample fraction-train of them."""
        self.round, self._sent = round_number, {}
        deadline = time.monotonic() + self.timeout
        nodes: list[int] = []
        stable_since = time.monotonic()
        while True:
            current = sorted(self.grid.get_node_ids())
            if current != nodes:
                nodes, stable_since = current, time.monotonic()
            # Always settle, even when the set is the one the last round used: a SuperNode restarted between
            # rounds keeps its node id, so the set can look unchanged while the SuperLink still lists the stopped
            # instance (its message then comes back "Node Unavailable"; test_deployment's restart test).
            if len(nodes) >= self.min_clients and time.monotonic() - stable_since >= self.settle_seconds:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(nodes)} node(s) connected after {self.timeout:.0f} s; "
                                   f"strategy.min-clients = {self.min_clients}")
            check_interrupted()
            time.sleep(0.2)
        count = max(self.min_clients, math.ceil(self.fraction * len(nodes)))
        return sorted(random.Random(f"{self.seed}:{round_number}").sample(nodes, min(count, len(nodes))))

    def label(self, node: int) -> str:
        """A client's name in swaps and pools: sorts by node index, so results do not depend on Flower's random
        node ids or on reply arrival order (a resumed run repeats an uninterrupted one)."""
        return f"{self.node_index.get(node, 99999):05d}-{node}"

    def ordered(self, nodes: Iterable[int]) -> list[int]:
        return sorted(nodes, key=self.label)

    def _check_identity(self, node: int, index: int) -> None:
        """A node keeps the index it first reported: labels (swap donors, SAPO senders and their reputation) rest on
        it, and a node that changed it could shed its record or receive its own packets."""
        known = self.node_index.get(node)
        if known is not None and known != index:
            raise Rejected(f"node-index {index} differs from the {known} this node reported before")

    def _check_rewards(self, report: ClientReport) -> None:
        low, high = self.reward_range
        for name, value in (("train-reward", report.train_reward), ("rollout-reward", report.rollout_reward)):
            if value is not None and not low <= value <= high:
                raise Rejected(f"metrics.{name} = {value:g} is outside [{low:g}, {high:g}], this run's reward range"
                               + ("" if (low, high) != (0.0, 1.0) else " (tasks.trl-rewards is not set)"))

    # -- send and receive ------------------------------------------------------------------------------------
    def send(self, messages: list[Message], decode: Callable[[int, Message], T]) -> ExchangeResult[T]:
        """Send, wait for replies (or the timeout), and accept each reply through the guard."""
        out: ExchangeResult[T] = ExchangeResult()
        by_id: dict[str, int] = {}
        step = self._progress_start(messages)
        rounds = {msg.metadata.dst_node_id: self._stamp_node_round(msg) for msg in messages}
        for msg in messages:
            out.bytes_out[msg.metadata.dst_node_id] = record_bytes(msg.content)
            out.array_records += len(msg.content.array_records)
        started = time.perf_counter()
        replies, unsent = self._send_and_receive(messages, step)
        out.wall = time.perf_counter() - started
        for msg in messages:
            by_id[msg.metadata.message_id] = msg.metadata.dst_node_id
        for missing in unsent:
            out.dropped[missing] = "the message could not be pushed to the SuperLink"
        intervals = []
        decode_started = time.perf_counter()
        answered: set[str] = set()
        for reply in replies:
            node = by_id.get(reply.metadata.reply_to_message_id)
            if node is None:
                log.warning("ignoring a reply to an unknown message %s", reply.metadata.reply_to_message_id)
                continue
            if reply.metadata.reply_to_message_id in answered:  # a grid that delivers a node's reply twice
                log.warning("ignored a second reply from node %d to one message (the first one counts)", node)
                continue
            answered.add(reply.metadata.reply_to_message_id)
            if reply.has_error():
                out.dropped[node] = describe_error(reply)
                continue
            try:
                decoded = decode(node, reply)
                self._check_identity(node, decoded.report.node_index)
                self._check_rewards(decoded.report)
            except Exception as err:  # noqa: BLE001 - the per-reply guard: this reply is dropped with its reason
                out.dropped[node] = _reason(err)
                continue
            out.replies[node] = decoded
            report = decoded.report
            self.node_index[node] = report.node_index
            self.accepted_round[report.node_index] = max(self.accepted_round.get(report.node_index, 0), rounds[node])
            out.bytes_in[node] = record_bytes(reply.content)
            out.array_records += len(reply.content.array_records)
            intervals.append((report.t_start, report.t_end))
        out.decode_seconds = time.perf_counter() - decode_started
        for node in by_id.values():
            if node not in out.replies and node not in out.dropped:
                out.dropped[node] = f"no reply within strategy.timeout = {self.timeout:g} s"
        for node, reason in out.dropped.items():
            log.warning("dropped client %d: %s", node, reason)
        out.busy = min(_union_length(intervals), out.wall)
        self._progress_end(step, out, len(messages))
        return out

    def _stamp_node_round(self, msg: Message) -> int:
        """Tell the node the last round whose reply from it was accepted (its saved state must reach that round:
        `node_runtime.serving.check_state_continues`): by its index when the node id is known, else every index's
        round, for the node to look its own up. Returns the round this message belongs to."""
        config = msg.content.config_records.get(CONFIG_KEY)
        if config is None:
            return self.round
        index = self.node_index.get(msg.metadata.dst_node_id)
        stamp: dict[str, int | str]
        if index is not None:
            stamp = {NODE_ROUND_KEY: self.accepted_round.get(index, 0)}
        elif self.accepted_round:
            stamp = {NODE_ROUNDS_KEY: json.dumps({str(i): r for i, r in sorted(self.accepted_round.items())})}
        else:
            stamp = {}
        msg.content[CONFIG_KEY] = ConfigRecord({**config, **stamp})  # a copy: messages may share one record
        server_round = config.get("server-round", self.round)  # the server's own instruction: always an int
        return server_round if isinstance(server_round, int) else self.round

    def _send_and_receive(self, messages: list[Message], step: str = "") -> tuple[list[Message], list[int]]:
        """The replies that came within the timeout, and the nodes whose message the grid did not take."""
        if self.pulls:
            try:
                ids = list(self.grid.push_messages(messages))
            except NotImplementedError:  # a grid that only implements send_and_receive (nothing was sent)
                self.pulls = False
            else:
                return (self._pull(ids, step),
                        [m.metadata.dst_node_id for m in messages if m.metadata.message_id not in ids])
        return list(self.grid.send_and_receive(messages, timeout=self.timeout)), []

    def _pull(self, ids: list[str], step: str = "") -> list[Message]:
        """Flower's send_and_receive loop (pull, stop when every message has its reply, stop at the timeout), with
        PULL_INTERVAL between pulls and a progress line every `progress_every` seconds. A message the grid did not
        take (no id, `None` from HttpGrid) has nothing to wait for."""
        pending = {i for i in ids if i}
        total = len(pending)
        started = self._clock()
        deadline = started + self.timeout
        next_note = started + self.progress_every
        replies: list[Message] = []
        while pending and self._clock() < deadline:
            check_interrupted()
            got = list(self.grid.pull_messages(sorted(pending)))
            replies.extend(got)
            pending.difference_update(reply.metadata.reply_to_message_id for reply in got)
            if pending:
                if self._clock() >= next_note:
                    log.info("%s: %d of %d replied after %.0f s", step, total - len(pending), total,
                             self._clock() - started)
                    next_note += self.progress_every
                self._sleep(max(0.0, min(self.pull_interval, deadline - self._clock())))
        return replies

    # -- progress lines --------------------------------------------------------------------------------------
    def _progress_start(self, messages: list[Message]) -> str:
        kind = messages[0].metadata.message_type if messages else "nothing"
        self._sent[kind] = self._sent.get(kind, 0) + 1
        step = f"[round {self.round}] {kind} #{self._sent[kind]}"
        log.info("%s: sent to %d client(s), waiting for replies", step, len(messages))
        return step

    def _progress_end(self, step: str, out: ExchangeResult, sent: int) -> None:
        log.info("%s: %d of %d replied in %.1f s%s", step, len(out.replies), sent, out.wall,
                 f", {len(out.dropped)} dropped" if out.dropped else "")
        if not client_log.isEnabledFor(logging.INFO):
            return
        for node in self.ordered(out.replies):
            report = out.replies[node].report
            reward = report.train_reward if report.train_reward is not None else report.rollout_reward
            client_log.info("%s:   client %d (node %d): %.1f s (sampling %.1f s, update %.1f s)%s, %.2f MB up, "
                            "%.2f MB down", step, report.node_index, node, report.t_end - report.t_start,
                            report.sample_seconds, report.update_seconds,
                            "" if reward is None else f", reward {reward:.3f}", out.bytes_in.get(node, 0) / 1e6,
                            out.bytes_out.get(node, 0) / 1e6)
