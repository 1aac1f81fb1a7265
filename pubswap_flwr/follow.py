"""Following a submitted run cheaply: `flwr ls` asked on a back-off schedule (each call starts a Python process that
imports Flower), asked at once when the streamed log ends or the run's status.json records its end, and the streamed
log with the known noise lines of Ray and Flower left out."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from .server.metrics import STATUS_FILE, read_status

FINISHED = "finished:"
# seconds between `flwr ls` calls: asked at 5, 15, 35 and 75 s, then every minute
BACKOFF = (5.0, 10.0, 20.0, 40.0)
LONGEST_GAP = 60.0
# once the log stream or status.json says the run ended, Flower marks it finished within a moment: asked again at
# these gaps, then back on the back-off
AFTER_END = (0.5, 1.0, 2.0, 4.0, 8.0)
TICK = 1.0  # how often the cheap local signals (a stat of status.json, the log process) are looked at
ENDED_STATUSES = ("completed", "failed", "stopped")

# Lines of the streamed log that every run prints and that say nothing about it (matched on the whole line, after
# any "LEVEL :" prefix Flower adds); everything else is passed on verbatim.
NOISE = (
    # Ray's and gRPC's absl logging: mutex and fork-handler chatter, and the note that precedes it
    re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"),
    re.compile(r"[IWE]\d{4} [\d:. ]+\d+ (mutex|fork_posix|chttp2_transport|ev_epoll1_linux)\.cc:\d+\].*"),
    re.compile(r"\[mutex\.cc : \d+\] RAW: .*"),
    # Flower's simulation start: the federation-size notice, on every run
    re.compile(r"Since flwr 1\.32, default simulated SuperNodes changed from 10 to 2\."),
    re.compile(r"To change federation size, use the following command:"),
    re.compile(r"\s*flwr federation simulation-config \S+ <superlink> --num-supernodes <N>"),
)
_LEVEL_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)*(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*(\x1b\[[0-9;]*m)*\s*:\s*")


def is_noise(line: str) -> bool:
    """Whether a streamed log line is one of NOISE (with or without Flower's level prefix)."""
    line = line.rstrip("\r\n")
    bare = _LEVEL_PREFIX.sub("", line, count=1)
    return any(pattern.fullmatch(text) for pattern in NOISE for text in (line, bare))


def copy_without_noise(source: IO[str], sink: IO[str]) -> int:
    """Copy lines from `source` to `sink` until it ends, leaving out noise; returns how many lines were left out."""
    dropped = 0
    for line in source:
        if is_noise(line):
            dropped += 1
            continue
        sink.write(line)
        sink.flush()
    return dropped


class LogStream:
    """`flwr log RUN --stream` with its noise filtered onto `sink` by a thread; `ended` once the stream closed."""

    def __init__(self, args: list[str], env: dict[str, str], sink: IO[str]):
        self.process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="replace", bufsize=1)
        self._copier = threading.Thread(target=copy_without_noise, args=(self.process.stdout, sink), daemon=True)
        self._copier.start()

    def ended(self) -> bool:
        return self.process.poll() is not None

    def close(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout=timeout)
        self._copier.join(timeout=timeout)


def ask_gaps(first: Iterable[float] = BACKOFF) -> Iterator[float]:
    """Seconds to wait before each `flwr ls`: `first`, then LONGEST_GAP for ever."""
    yield from first
    while True:
        yield LONGEST_GAP


def status_file_ended(run_dir: Path) -> Callable[[], bool]:
    """A check that the run's status.json was rewritten after now and records an end (completed, failed, stopped):
    a resumed run's file may say failed from the attempt before."""
    path = Path(run_dir) / STATUS_FILE
    try:
        before = path.stat().st_mtime_ns
    except FileNotFoundError:
        before = -1

    def ended() -> bool:
        try:
            changed = path.stat().st_mtime_ns != before
        except FileNotFoundError:
            return False
        return changed and read_status(run_dir).get("status") in ENDED_STATUSES

    return ended


def finished_row(stdout: str) -> dict | None:
    """The run's row from `flwr ls --run-id ... --format json` output when its status is finished, else None."""
    try:
        rows = json.loads(stdout[stdout.index("{"):]).get("runs", [])
    except (ValueError, json.JSONDecodeError, AttributeError):
        return None
    if rows and isinstance(rows[0], dict) and str(rows[0].get("status", "")).startswith(FINISHED):
        return rows[0]
    return None


def follow(ask: Callable[[], dict | None], *, ended: Callable[[], bool] = lambda: False,
           gaps: Iterable[float] | None = None, timeout: float | None = None,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
           tick: float = TICK) -> dict:
    """Call `ask` (one `flwr ls`) after each gap of `gaps` (default: the back-off) until it returns a row; `ended`
    (cheap, looked at every `tick`) switching to true makes the next asks come at once and then AFTER_END apart.
    Raises TimeoutError after `timeout` seconds."""
    start = clock()
    schedule = iter(gaps) if gaps is not None else ask_gaps()
    next_ask = start + next(schedule)
    signalled = False
    while True:
        now = clock()
        if not signalled and ended():
            signalled = True
            schedule = ask_gaps(AFTER_END)
            next_ask = now
        if now >= next_ask:
            row = ask()
            if row is not None:
                return row
            next_ask = clock() + next(schedule)
        if timeout is not None and clock() - start > timeout:
            raise TimeoutError(f"did not finish within {timeout:.0f} s")
        sleep(max(0.0, min(tick, next_ask - clock())))
