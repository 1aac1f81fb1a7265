"""Ctrl-C on the README's test command: pytest on two xdist workers, one running a simulation on Ray, exits within
5 s of the terminal's SIGINT and leaves none of the processes its tests started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import MARK, marked

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# a Ray simulation of 3 clients and 3 rounds: Ray's processes and the clients' actors are up long before it ends
RUNNING = "tests/integration/test_simulation.py::test_a_client_raising_mid_round_is_dropped_and_the_round_completes"
EXIT_SECONDS = 5.0


def _wait_for(check, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + timeout
    while not check():
        assert proc.poll() is None, f"pytest ended before {what}: {proc.communicate()[0][-3000:]}"
        assert time.time() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.2)


def test_ctrl_c_ends_the_workers_and_every_process_their_tests_started_within_5_s(tmp_path):
    mark = f"{os.environ.get(MARK, 'pytest')}/ctrl-c-{os.getpid()}"  # the inner run's processes carry it
    env = {**os.environ, MARK: mark}
    # its own session and process group, as a shell gives a foreground job: the terminal's Ctrl-C is a SIGINT to
    # that group (pytest, its workers and every child that did not leave the group). SIGINT's default restored in
    # it: a suite started in the background of a non-interactive shell inherits SIGINT ignored, as no foreground
    # job does.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", RUNNING, "-n", "2", "-q", "-p", "no:cacheprovider",
                             f"--basetemp={tmp_path / 'inner'}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for(lambda: any("raylet" in command for command in marked(mark).values()), 240, "raylet", proc)
        time.sleep(3.0)  # the simulation under way: actors started, rounds running
        running = marked(mark)
        os.killpg(proc.pid, signal.SIGINT)
        interrupted = time.time()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        took = time.time() - interrupted
        time.sleep(0.5)  # a process killed last is gone from /proc within this
        left = marked(mark)
    finally:
        for pid in [proc.pid, *marked(mark)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    output = proc.communicate()[0]
    assert took < EXIT_SECONDS, f"pytest exited {took:.1f} s after SIGINT:\n{output[-3000:]}"
    assert proc.returncode != 0, output[-3000:]
    assert len(running) >= 4, running  # the two workers and Ray's processes below one of them
    assert left == {}, f"left running after Ctrl-C: {left}\n{output[-3000:]}"
