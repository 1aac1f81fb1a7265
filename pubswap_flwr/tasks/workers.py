"""Helper processes for work on untrusted text: a long-lived subprocess spoken to over JSON lines, with deadlines.

Used by the math checker (`math_answers.MathChecker`) and the isolated scorer (`isolation.IsolatedScorer`). A
worker is started with `subprocess` (not multiprocessing), so it can be started from any thread, from Ray actors and
from daemonic processes, and it forks nothing that holds the caller's locks. It writes one JSON line per reply; the
first line is {"ready": true} once its imports are done. A reader thread feeds the reply lines into a queue, so the
caller can wait for a reply with a deadline from any thread and kill the process when the deadline passes (threads
cannot interrupt C-level work, a killed process can).

`WorkerClient` is the caller's side both of them share: it starts its worker script on first use, sends one request
at a time with the worker's own (soft) timeout in it, waits for the reply at most that plus `grace_s` (the hard
bound), kills the worker when the bound passes or it dies, and starts a replacement. What a request asks and what
its reply means stay with the subclass. The worker scripts share their side of the protocol in `_worker_loop.py`.
`LazyDefault` holds the client a verifier uses unless told otherwise.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

log = logging.getLogger(__name__)


class ScoringTimeout(ValueError):
    """A scorer did not finish within its time limit. `score_completion` turns it into reward 0 with a reason that
    starts with "scoring timeout: " (`Score.timed_out`)."""


def _pump(stream: Any, lines: "queue.Queue[str | None]") -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _stop(process: subprocess.Popen, name: str) -> None:
    if process.poll() is None:
        process.kill()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("%s %s did not exit after kill", name, process.pid)
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError as err:
                log.debug("closing %s pipe: %s", name, err)


class WorkerProcess:
    """One worker process and a reader thread feeding its reply lines into a queue.

    The constructor starts the process and returns at once; `wait_ready` waits for its {"ready": true} line (the
    imports), so a replacement can be started right after a kill and finish starting while the caller does other
    work. The process is killed when this object is stopped or garbage-collected.
    """

    def __init__(self, argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None):
        self.name = name
        self.process = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8", bufsize=1,
            env=None if env is None else dict(env),
        )
        self._finalizer = weakref.finalize(self, _stop, self.process, name)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.ready = False
        threading.Thread(target=_pump, args=(self.process.stdout, self.lines), daemon=True,
                         name=f"{name}-{self.process.pid}").start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the worker's ready line; RuntimeError (and the worker stopped) when it does not come in time."""
        if self.ready:
            return
        reply = self.read(time.monotonic() + timeout_s)
        if reply is None or not reply.get("ready"):
            self.stop()
            raise RuntimeError(f"{self.name} did not start within {timeout_s:g} s (exit code {self.process.poll()})")
        self.ready = True

    def read(self, deadline: float) -> dict | None:
        """The next reply, or None when the deadline (time.monotonic) passes or the worker exits."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                return None
            if line is None:
                return None
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s wrote a non-JSON line: %.200s", self.name, line)

    def send(self, request: dict) -> None:
        """Write one request line; OSError when the pipe is broken (the worker died)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        self._finalizer()


_LIVE_CLIENTS: "weakref.WeakSet[WorkerClient]" = weakref.WeakSet()


class WorkerClient:
    """The caller's side of one long-lived worker script, with a soft and a hard timeout per request.

    Subclasses set `script` and `name` and may add arguments (`_arguments`, after which comes --memory-mb) and an
    environment (`_env`). `_request` (called with `_lock` held, which serializes requests) starts the worker when
    there is none or it died (`restarts` counts workers killed or found dead), waits for it to be ready (the start
    is not charged to the request), and returns the reply, or None when the hard bound passed and the worker was
    killed. With `eager_restart` a killed worker's replacement starts at once, so its imports overlap the caller's
    other work; otherwise on the next request. `soft_timeout=False` sends the worker 0 as its own timeout, leaving
    only the hard bound (tests of the kill path). Workers are stopped on `close`, and at exit.
    """

    script: Path
    name = "worker"
    eager_restart = False

    def __init__(self, *, grace_s: float, memory_mb: int, startup_timeout_s: float, soft_timeout: bool):
        self.grace_s = float(grace_s)
        self.memory_mb = int(memory_mb)
        self.startup_timeout_s = float(startup_timeout_s)
        self.soft_timeout = soft_timeout
        self.restarts = 0  # workers killed at the hard deadline or found dead
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        self._next_id = 0
        _LIVE_CLIENTS.add(self)

    def _arguments(self) -> list[str]:
        return []

    def _env(self) -> Mapping[str, str] | None:
        return None

    def _spawn(self) -> WorkerProcess:
        return WorkerProcess([sys.executable, str(self.script), *self._arguments(), "--memory-mb", str(self.memory_mb)],
                             name=self.name, env=self._env())

    def _ready_worker(self) -> WorkerProcess:
        if self._worker is not None and not self._worker.alive:
            log.warning("%s exited (code %s); restarting", self.name, self._worker.process.poll())
            self._worker.stop()
            self._worker = None
            self.restarts += 1
        if self._worker is None:
            self._worker = self._spawn()
        try:
            self._worker.wait_ready(self.startup_timeout_s)
        except RuntimeError:
            self._worker = None
            raise
        return self._worker

    def _kill(self, worker: WorkerProcess) -> None:
        worker.stop()
        self.restarts += 1
        if self._worker is worker:
            self._worker = None
            if self.eager_restart:
                try:
                    self._worker = self._spawn()
                except OSError as err:  # cannot fork now: the next request tries again
                    log.warning("could not start a replacement %s: %s", self.name, err)

    def _request(self, fields: dict, timeout_s: float) -> dict | None:
        """Send `fields` as one request (with an id and the worker's timeout) and return the worker's reply, or None
        when none came within `timeout_s + grace_s` (the worker is killed). The caller holds `_lock`. RuntimeError
        when the worker cannot start or dies during the request."""
        worker = self._ready_worker()
        self._next_id += 1
        request_id = self._next_id
        try:
            worker.send({"id": request_id, **fields, "timeout_s": timeout_s if self.soft_timeout else 0})
        except OSError as err:  # broken pipe: the worker died between requests
            self._kill(worker)
            raise RuntimeError(f"{self.name} pipe failed: {err}") from err
        deadline = time.monotonic() + timeout_s + self.grace_s
        while True:
            reply = worker.read(deadline)
            if reply is None:
                died = not worker.alive
                self._kill(worker)
                if died:
                    raise RuntimeError(f"{self.name} exited (code {worker.process.poll()}) during a check")
                return None
            if reply.get("id") == request_id:
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
