"""Helper processes for work on untrusted text: a long-lived subprocess spoken to over JSON lines, with deadlines.

Used by the math checker (`math_answers.MathChecker`) and the isolated scorer (`isolation.IsolatedScorer`). A
worker is started with `subprocess` (not multiprocessing), so it can be started from any thread, from Ray actors and
from daemonic processes, and it forks nothing that holds the caller's locks. It writes one JSON line per reply on a
private pipe (its --reply-fd, which it makes non-inheritable), never on its stdout: a scorer's prints, a library's
and those of any child it starts go to the worker's stdout and stderr, which the caller reads apart into a bounded
tail (`WorkerProcess.output`), so no text a scorer writes can pose as a reply (#54: forged lines on fd 1 had become
the rewards of later completions). The first reply line is {"ready": true} once the worker's imports are done. Each
request carries a random id, and a reply with another id, or one that is not a JSON object, is refused: the worker
is killed and replaced. A reader thread feeds the reply lines into a queue, so the caller can wait for a reply with a
deadline from any thread and kill the process when the deadline passes (threads cannot interrupt C-level work, a
killed process can). The worker leads its own process group and is killed with the whole group, so a child a scorer
left running dies with it and holds nothing the caller waits on.

`WorkerClient` is the caller's side both of them share: it starts its worker script on first use, sends one request
at a time with the worker's own (soft) timeout in it, waits for the reply at most that plus `grace_s` (the hard
bound), and kills the worker when the bound passes or it dies. The replacement is started and waited for within
the same request, so a completion that kills or crashes the worker pays for the restart in its own time (a
`budget.ScoringBudget` charges it to its sender), not the next caller. What a request asks and what its reply means
stay with the subclass. The worker scripts share their side of the protocol in `_worker_loop.py`. `LazyDefault`
holds the client a verifier uses unless told otherwise.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Callable, Generic, Mapping, Sequence, TypeVar

log = logging.getLogger(__name__)

OUTPUT_TAIL_LINES = 200  # a worker's captured stdout/stderr keeps its last lines ...
OUTPUT_LINE_CHARS = 300  # ... each cut to this length: at most 60 KB however much a scorer prints
REPLY_MAX_BYTES = 1 << 20  # a reply line longer than this is refused


class ScoringTimeout(ValueError):
    """A scorer did not finish within its time limit. `score_completion` turns it into reward 0 with a reason that
    starts with "scoring timeout: " (`Score.timed_out`)."""


class BadReply(RuntimeError):
    """A worker wrote a reply that is not a JSON object or does not match its request; the worker is replaced."""


_EOF = object()  # the reply channel closed: the worker exited


def _pump(stream: IO[bytes], lines: "queue.Queue[Any]") -> None:
    with stream:
        while line := stream.readline(REPLY_MAX_BYTES + 1):
            lines.put(line)
    lines.put(_EOF)


def _drain(stream: IO[bytes], tail: "collections.deque[str]", name: str) -> None:
    """Read a worker's stdout and stderr to their end, keeping a bounded tail (and logging each line at debug)."""
    with stream:
        while chunk := stream.readline(OUTPUT_LINE_CHARS):
            text = chunk.decode("utf-8", "replace").rstrip("\n")
            tail.append(text)
            log.debug("%s: %s", name, text)


def parse_reply(line: bytes, name: str) -> dict:
    """One reply line as a JSON object; BadReply (naming `name`) for anything else, a line over REPLY_MAX_BYTES too."""
    try:
        reply = json.loads(line) if len(line) <= REPLY_MAX_BYTES else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        reply = None
    if not isinstance(reply, dict):
        raise BadReply(f"{name} wrote a reply that is not a JSON object: {line[:200]!r}")
    return reply


def _stop(process: subprocess.Popen, name: str) -> None:
    """Kill the worker's whole process group (also when the worker itself exited: its children may live on)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone (or its id was reused by someone else's)
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        log.warning("%s %s did not exit after kill", name, process.pid)
    if process.stdin is not None:
        try:
            process.stdin.close()
        except OSError as err:
            log.debug("closing %s pipe: %s", name, err)


class WorkerProcess:
    """One worker process, a reader thread feeding its reply lines into a queue and one capturing its output.

    The constructor starts the process and returns at once; `wait_ready` waits for its {"ready": true} line (the
    imports). The process (with its process group) is killed when this object is stopped or garbage-collected.
    """

    def __init__(self, argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None):
        self.name = name
        reply_read, reply_write = os.pipe()
        try:
            self.process = subprocess.Popen(
                [*argv, "--reply-fd", str(reply_write)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, pass_fds=(reply_write,), start_new_session=True,
                env=None if env is None else dict(env),
            )
        except BaseException:
            os.close(reply_read)
            raise
        finally:
            os.close(reply_write)  # the worker holds the only write end
        self._finalizer = weakref.finalize(self, _stop, self.process, name)
        self.lines: queue.Queue[Any] = queue.Queue()
        self.output: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self.exited = False  # its reply channel closed
        self.ready = False
        label = f"{name}-{self.process.pid}"
        threading.Thread(target=_pump, args=(os.fdopen(reply_read, "rb"), self.lines), daemon=True,
                         name=label).start()
        assert self.process.stdout is not None
        threading.Thread(target=_drain, args=(self.process.stdout, self.output, name), daemon=True,
                         name=f"{label}-output").start()

    @property
    def alive(self) -> bool:
        return not self.exited and self.process.poll() is None

    def output_tail(self, lines: int = 5) -> str:
        """The last `lines` lines the worker printed, joined for a message ('' when none)."""
        return " | ".join(list(self.output)[-lines:])

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the worker's ready line; RuntimeError (and the worker stopped) when it does not come in time."""
        if self.ready:
            return
        try:
            reply = self.read(time.monotonic() + timeout_s)
        except BadReply as err:
            self.stop()
            raise RuntimeError(f"{self.name} did not start: {err}") from None
        if reply is None or not reply.get("ready"):
            self.stop()
            output = self.output_tail()
            raise RuntimeError(f"{self.name} did not start within {timeout_s:g} s (exit code {self.process.poll()})"
                               + (f"; its last output: {output}" if output else ""))
        self.ready = True

    def read(self, deadline: float) -> dict | None:
        """The next reply, or None when the deadline (time.monotonic) passes or the worker exits (`exited`).
        BadReply when the line is not a JSON object (or too long)."""
        remaining = deadline - time.monotonic()
        if self.exited or remaining <= 0:
            return None
        try:
            line = self.lines.get(timeout=remaining)
        except queue.Empty:
            return None
        if line is _EOF:
            self.exited = True
            return None
        return parse_reply(line, self.name)

    def send(self, request: dict) -> None:
        """Write one request line; OSError when the pipe is broken (the worker died)."""
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
        self.process.stdin.flush()

    def stop(self) -> None:
        self._finalizer()


_LIVE_CLIENTS: "weakref.WeakSet[WorkerClient]" = weakref.WeakSet()


class WorkerClient:
    """The caller's side of one long-lived worker script, with a soft and a hard timeout per request.

    Subclasses set `script` and `name` and may add arguments (`_arguments`, after which come --memory-mb and
    --reply-fd) and an environment (`_env`). `_request` (called with `_lock` held, which serializes requests) starts
    the worker when there is none (its first start is not charged to a request), and returns the reply, or None when
    the hard bound passed and the worker was killed. A worker killed at the hard bound, found dead, or refused for a
    reply that does not match its request is replaced within that same request (`restarts` counts them), so the
    restart's time is the request's. `soft_timeout=False` sends the worker 0 as its own timeout, leaving only the
    hard bound (tests of the kill path). Workers are stopped on `close`, and at exit.
    """

    script: Path
    name = "worker"

    def __init__(self, *, grace_s: float, memory_mb: int, startup_timeout_s: float, soft_timeout: bool):
        self.grace_s = float(grace_s)
        self.memory_mb = int(memory_mb)
        self.startup_timeout_s = float(startup_timeout_s)
        self.soft_timeout = soft_timeout
        self.restarts = 0  # workers killed at the hard deadline, found dead or refused for a bad reply
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        _LIVE_CLIENTS.add(self)

    def _arguments(self) -> list[str]:
        return []

    def _env(self) -> Mapping[str, str] | None:
        return None

    def _spawn(self) -> WorkerProcess:
        return WorkerProcess([sys.executable, str(self.script), *self._arguments(), "--memory-mb", str(self.memory_mb)],
                             name=self.name, env=self._env())

    def output_tail(self) -> list[str]:
        """The current worker's captured stdout/stderr, its last lines (bounded: OUTPUT_TAIL_LINES x
        OUTPUT_LINE_CHARS)."""
        worker = self._worker
        return [] if worker is None else list(worker.output)

    def _ready_worker(self) -> WorkerProcess:
        if self._worker is not None and not self._worker.alive:
            self._replace(self._worker, f"exited (code {self._worker.process.poll()}) between requests")
        if self._worker is None:
            self._worker = self._spawn()
        try:
            self._worker.wait_ready(self.startup_timeout_s)
        except RuntimeError:
            self._worker = None
            raise
        return self._worker

    def _replace(self, worker: WorkerProcess, why: str) -> None:
        """Kill `worker` (its process group) and start and wait for its replacement, in the caller's time: the
        request that caused the restart pays for it. A replacement that cannot start is left to the next request."""
        output = worker.output_tail()
        log.warning("%s %s: %s; restarting it%s", self.name, worker.process.pid, why,
                    f" (its last output: {output})" if output else "")
        worker.stop()
        self.restarts += 1
        if self._worker is worker:
            self._worker = None
        try:
            self._ready_worker()
        except (OSError, RuntimeError) as err:  # cannot fork or start now: the next request tries again
            log.warning("could not start a replacement %s: %s", self.name, err)

    def _request(self, fields: dict, timeout_s: float) -> dict | None:
        """Send `fields` as one request (with a random id and the worker's timeout) and return the worker's reply,
        or None when none came within `timeout_s + grace_s` (the worker is killed and replaced). The caller holds
        `_lock`. RuntimeError when the worker cannot start, dies during the request, or replies with something that
        does not match the request (BadReply; the worker is replaced)."""
        worker = self._ready_worker()
        request_id = secrets.token_hex(16)  # unguessable: no line written before this request can match it
        try:
            worker.send({"id": request_id, **fields, "timeout_s": timeout_s if self.soft_timeout else 0})
        except OSError as err:  # broken pipe: the worker died between requests
            self._replace(worker, f"pipe failed: {err}")
            raise RuntimeError(f"{self.name} pipe failed: {err}") from err
        try:
            reply = worker.read(time.monotonic() + timeout_s + self.grace_s)
        except BadReply as err:
            self._replace(worker, str(err))
            raise
        if reply is None:
            if worker.exited or not worker.alive:
                worker.stop()  # reaps it, so its exit code is known
                code = worker.process.poll()
                self._replace(worker, f"exited (code {code}) during a request")
                raise RuntimeError(f"{self.name} exited (code {code}) during a check")
            self._replace(worker, f"no reply within the {timeout_s + self.grace_s:g} s hard timeout")
            return None
        if reply.get("id") != request_id:
            bad = BadReply(f"{self.name} sent a reply that does not match the request (id {reply.get('id')!r}); "
                           "refused")
            self._replace(worker, str(bad))
            raise bad
        return reply

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None


@atexit.register
def _close_all() -> None:
    for client in list(_LIVE_CLIENTS):
        client.close()


T = TypeVar("T")


class LazyDefault(Generic[T]):
    """A module's default instance (a worker client), created on first use and replaceable (tests, benchmarks)."""

    def __init__(self, make: Callable[[], T]):
        self._make = make
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value

    def replace(self, value: T | None) -> T | None:
        """Make `value` the default (None: a new one on next use); returns the previous one (not closed)."""
        with self._lock:
            previous, self._value = self._value, value
            return previous
