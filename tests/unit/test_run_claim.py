"""A run name is claimed atomically before any preparation: of two runs given one run-name, exactly one goes on and
the other stops with one line naming the folder and the run that holds it; the run itself recognises its own claim
by the token passed in its config; a claim whose process is gone and whose run is not running is taken over."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import threading

import pytest

from pubswap_flwr import cli
from pubswap_flwr.server import preflight
from pubswap_flwr.server.preflight import CLAIM_FILE, RunClaimedError, claim_run_dir


def _dead_pid() -> int:
    probe = subprocess.Popen(["true"])
    probe.wait()
    return probe.pid


def test_claimed_run_name_two_claimers_exactly_one_wins(tmp_path):
    run_dir = tmp_path / "runs" / "real"
    barrier = threading.Barrier(8)
    results: list[tuple[str, str]] = []

    def claim() -> None:
        barrier.wait()
        try:
            results.append(("won", claim_run_dir(run_dir)))
        except RunClaimedError as err:
            results.append(("lost", str(err)))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [value for kind, value in results if kind == "won"]
    lost = [value for kind, value in results if kind == "lost"]
    assert len(won) == 1 and len(lost) == 7
    held = json.loads((run_dir / CLAIM_FILE).read_text())
    assert held["token"] == won[0] and held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    assert all(f"{run_dir} is claimed by another run (process {os.getpid()} on {socket.gethostname()}" in message
               for message in lost)


def test_claimed_run_name_own_token_is_recognised_and_released(tmp_path):
    run_dir = tmp_path / "real"
    token = claim_run_dir(run_dir)
    assert claim_run_dir(run_dir, token) == token  # the run itself, in another process: its token from the config
    with pytest.raises(RunClaimedError):
        claim_run_dir(run_dir, "someone-else")
    preflight.release_claim(run_dir, "someone-else")  # not theirs to release
    assert (run_dir / CLAIM_FILE).is_file()
    preflight.release_claim(run_dir, token)
    assert not (run_dir / CLAIM_FILE).exists()
    assert claim_run_dir(run_dir) != token


def test_claimed_run_name_stale_claim_is_taken_over_with_a_warning(tmp_path, caplog):
    run_dir = tmp_path / "real"
    run_dir.mkdir()
    dead = _dead_pid()
    (run_dir / CLAIM_FILE).write_text(json.dumps({"token": "old", "pid": dead, "host": socket.gethostname(),
                                                  "started": "2026-12-06T05:00:00Z"}))
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        token = claim_run_dir(run_dir)
    assert token != "old" and json.loads((run_dir / CLAIM_FILE).read_text())["token"] == token
    assert any(f"took over the stale claim of {run_dir} (process {dead} on {socket.gethostname()} is gone" in
               r.getMessage() for r in caplog.records)


def test_claimed_run_name_the_run_adopts_its_claim_and_a_killed_run_can_resume(tmp_path):
    """`pubswap run` claims in the CLI's process, the run goes on in the SuperLink's: the run adopts the claim (it
    names the run's process from then on), so the CLI may stop following. A killed run (status.json still says
    running, its process gone) leaves a stale claim: a resume takes it over."""
    run_dir = tmp_path / "real"
    run_dir.mkdir()
    (run_dir / CLAIM_FILE).write_text(json.dumps({"token": "cli", "pid": _dead_pid(), "host": socket.gethostname(),
                                                  "started": "2026-12-06T05:00:00Z"}))
    assert claim_run_dir(run_dir, "cli") == "cli"
    assert json.loads((run_dir / CLAIM_FILE).read_text())["pid"] == os.getpid()
    with pytest.raises(RunClaimedError):
        claim_run_dir(run_dir)  # its process (this one) lives
    (run_dir / CLAIM_FILE).write_text(json.dumps({"token": "killed", "pid": _dead_pid(),
                                                  "host": socket.gethostname(), "started": "2026-12-06T05:00:00Z"}))
    (run_dir / "status.json").write_text('{"status": "running", "detail": "", "elapsed_s": 3}')
    assert claim_run_dir(run_dir) not in ("cli", "killed")


def test_claimed_run_name_held_on_another_machine_says_which_file_to_remove(tmp_path):
    run_dir = tmp_path / "real"
    run_dir.mkdir()
    (run_dir / CLAIM_FILE).write_text(json.dumps({"token": "x", "pid": 1, "host": "elsewhere.invalid",
                                                  "started": "2026-12-06T05:00:00Z"}))
    with pytest.raises(RunClaimedError, match=rf"process 1 on elsewhere.invalid, since 2026-12-06T05:00:00Z\): "
                                              rf"choose another run-name, or wait for that run to end; if no run is "
                                              rf"using it, remove {run_dir / CLAIM_FILE}$"):
        claim_run_dir(run_dir)


def test_claimed_run_name_second_simulate_exits_2_before_preparation(tmp_path, monkeypatch, capsys):
    from pubswap_flwr import simulation

    started = []
    monkeypatch.setattr(simulation, "simulate", lambda config, nodes, **kw: started.append(config))
    monkeypatch.setattr(simulation, "simulate_in_process", lambda config, nodes, **kw: started.append(config))
    monkeypatch.setattr(cli.logs, "setup", lambda **kw: None)
    run_dir = tmp_path / "real"
    claim_run_dir(run_dir)  # the first run, still preparing its model: no metrics or status yet
    code = cli.main(["simulate", "--out", str(tmp_path), "--run-name", "real"])
    err = capsys.readouterr().err
    assert (code, started) == (2, [])
    assert err.startswith(f"error: {run_dir} is claimed by another run (process {os.getpid()} on ") and \
        err.count("\n") == 1


def test_claimed_run_name_simulate_passes_its_token_to_the_run(tmp_path, monkeypatch):
    from pubswap_flwr import simulation

    seen = {}

    def fake(config, nodes, **kw):  # the run reads its claim as the ServerApp would
        seen["token"] = config["run-claim"]
        seen["held"] = json.loads((tmp_path / "real" / CLAIM_FILE).read_text())["token"]

    monkeypatch.setattr(simulation, "simulate_in_process", fake)
    monkeypatch.setattr(cli.logs, "setup", lambda **kw: None)
    cli.main(["simulate", "--engine", "inprocess", "--out", str(tmp_path), "--run-name", "real"])
    assert seen["token"] == seen["held"] and len(seen["token"]) >= 16
    assert not (tmp_path / "real" / CLAIM_FILE).exists()  # released when the command ends


def test_claimed_run_name_the_server_app_refuses_another_runs_claim(tmp_path):
    from flwr.app import Context, RecordDict

    from pubswap_flwr.server import app as server

    run_dir = tmp_path / "real"
    claim_run_dir(run_dir)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"output.dir": str(tmp_path), "run-name": "real", "run-claim": "not-the-owner"})
    with pytest.raises(RunClaimedError, match="is claimed by another run"):
        server.run(None, context)  # no grid: it must stop before anything would use one
    assert sorted(p.name for p in run_dir.iterdir()) == [CLAIM_FILE]
