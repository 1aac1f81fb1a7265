"""Ctrl-C on `pubswap simulate` ends it at once on both engines: status.json says `stopped` (interrupted (Ctrl-C)),
one line on stderr says where the partial run is, exit code 130, no traceback, and no process of the run is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
SMOKE = PROJECT / "configs" / "smoke.toml"
ENDS_WITHIN_S = 10.0


def _status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _interrupted_run(tmp_path: Path, engine: str) -> tuple[int, float, str, Path]:
    """`pubswap simulate --engine ENGINE` of many rounds, sent SIGINT (to its whole process group, as a terminal's
    Ctrl-C is) two seconds after its status.json says running: (exit code, seconds it took to end, stderr, run dir)."""
    out = tmp_path / "runs"
    run_dir = out / "r"
    err_path = tmp_path / "stderr.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROJECT)}
    with err_path.open("w") as err, (tmp_path / "stdout.txt").open("w") as stdout:
        command = [sys.executable, "-m", "pubswap_flwr.cli", "simulate", "--engine", engine, "--nodes", "2",
                   "-c", str(SMOKE), "-c", "num-server-rounds=200 model.threads=1", "--out", str(out),
                   "--run-name", "r"]
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout, stderr=err, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while _status(run_dir).get("status") != "running":
                assert proc.poll() is None, f"ended before running: {err_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "never said running"
                time.sleep(0.2)
            time.sleep(2.0)
            sent = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running 30 s after Ctrl-C: {err_path.read_text()[-3000:]}")
            took = time.monotonic() - sent
            deadline = time.monotonic() + ENDS_WITHIN_S
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not _group_alive(proc.pid), "a process of the run outlived it (Ray not shut down?)"
        finally:
            if _group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
    return code, took, err_path.read_text(), run_dir


def _assert_stopped_cleanly(code: int, took: float, err: str, run_dir: Path) -> None:
    assert "Traceback" not in err, err[-3000:]
    assert code == 130, err[-3000:]
    assert took < ENDS_WITHIN_S
    status = _status(run_dir)
    assert (status["status"], status["detail"]) == ("stopped", "interrupted (Ctrl-C)")
    assert err.rstrip("\n").splitlines()[-1] == (f"interrupted (Ctrl-C): the partial run is in {run_dir} "
                                                 "(status.json says stopped)")


def test_ctrl_c_on_simulate_inprocess_stops_cleanly(tmp_path):
    _assert_stopped_cleanly(*_interrupted_run(tmp_path, "inprocess"))


@pytest.mark.slow
def test_ctrl_c_on_simulate_with_ray_stops_cleanly(tmp_path):
    _assert_stopped_cleanly(*_interrupted_run(tmp_path, "ray"))
