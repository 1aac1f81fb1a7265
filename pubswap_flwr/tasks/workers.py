"""Helper processes for work on untrusted text: a long-lived subprocess spoken to over JSON lines, with deadlines.

Used by the math checker (`math_answers.MathChecker`) and the isolated scorer (`isolation.IsolatedScorer`). A
worker is started with `subprocess` (not multiprocessing), so it can be started from any thread, from Ray actors and
from daemonic processes, and it forks nothing that holds the caller's locks. It writes one JSON line per reply; the
first line is {"ready": true} once its imports are done. A reader thread feeds the reply lines into a queue, so the
caller can wait for a reply with a deadline from any thread and kill the process when the deadline passes (threads
cannot interrupt C-level work, a killed process can).
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import threading
import time
import weakref
from typing import Any, Mapping, Sequence

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
