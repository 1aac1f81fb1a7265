"""Processes the tests start, found through /proc: by parentage, or by the mark every one of them inherits."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

# Every process a test session starts inherits this variable from the session (tests/conftest.py sets it): a pytest
# process `<outer>/pytest-<pid>`, an xdist worker `<that>/gw<n>`. It survives what parentage does not: a process
# that outlives its parent (the local SuperLink `flwr run` leaves behind, Ray's processes of a killed worker) or
# starts a session of its own.
MARK = "PUBSWAP_TEST_PROCESSES"


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process we can read."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry.name)] = (ppid, cmdline)
    return out


def descendants(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in table.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie waiting for its parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_pids(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever still runs after `grace` seconds."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def marked(mark: str) -> dict[int, str]:
    """Live processes but this one whose environment's MARK is `mark` or below it (`mark/...`): pid -> command line."""
    found = {}
    for pid, (_, cmdline) in process_table().items():
        if pid == os.getpid() or not alive(pid):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        values = [item.split(b"=", 1)[1].decode(errors="replace") for item in environ
                  if item.startswith(MARK.encode() + b"=")]
        if values and (values[0] == mark or values[0].startswith(mark + "/")):
            found[pid] = cmdline
    return found
