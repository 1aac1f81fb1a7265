"""Hermetic `flwr run` for tests: a private FLWR_HOME and ports, status checked with `flwr ls`, and every process
the local SuperLink started stopped by PID afterwards."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from pubswap_flwr.cli import flower_env, submit, wait

PROJECT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _processes() -> dict[int, tuple[int, str]]:
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


def stop_pids(pids: list[int], grace: float = 5.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class LocalFlower:
    """`flwr run` against a private managed local SuperLink (simulation runtime)."""

    def __init__(self, root: Path):
        self.root = root
        self.http_port = free_port()
        self.control_port = free_port()
        self.env = flower_env({
            "FLWR_HOME": str(root / "flwr-home"),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port),
        })

    def run(self, overrides: list[str], nodes: int = 2, timeout: float = 900) -> dict:
        """Submit `flwr run <project>` with run-config overrides (one -c each) and wait; returns the `flwr ls` row."""
        run_id = submit(PROJECT, overrides, f"num-supernodes={nodes} client-resources-num-cpus=1", self.env)
        row = wait(run_id, self.env, timeout=timeout)
        row["run-id"] = run_id
        return row

    def close(self) -> None:
        table = _processes()
        roots = [pid for pid, (_, cmd) in table.items()
                 if "flower-superlink" in cmd and str(self.http_port) in cmd]
        pids = [p for root in roots for p in descendants(root, table)] + roots
        stop_pids(pids)
