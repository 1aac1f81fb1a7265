"""A run's final state in status.json: a stopped run says `stopped` (stopped through Flower's exit handlers, as
`flwr stop` ends the ServerApp's process, or marked by `pubswap run` when Flower reports the stop), and resuming a
run that already completed says so, starts nothing and changes no file."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from pubswap_flwr import cli
from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.server import preflight
from pubswap_flwr.server.metrics import STOP_DETAIL, final_adapters, read_metrics, read_status
from pubswap_flwr.simulation import simulate_in_process

ROOT = Path(__file__).resolve().parents[2]
SMALL = {**preflight.app_defaults(ROOT), "num-server-rounds": 2, "train.local-steps": 1, "train.prompts-per-step": 2,
         "train.completions-per-prompt": 2, "eval.items-per-task": 2, "eval.samples": 1, "model.threads": 1,
         "tasks.mix": "gcd:1", "tasks.per-node": 0, "seed": 2,
         "strategy.apply-below-robust": True}  # 2 nodes: below the robust minimum (#54 class 4)


def _files(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


LOGGED: list[str] = []  # the log lines of the `finished` run


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    collector = logging.Handler()
    collector.emit = lambda record: LOGGED.append(record.getMessage())
    package = logging.getLogger("pubswap_flwr")
    level = package.level
    package.addHandler(collector)
    package.setLevel(logging.INFO)
    try:
        simulate_in_process({**SMALL, "output.dir": str(out), "run-name": "done"}, 2)
    finally:
        package.removeHandler(collector)
        package.setLevel(level)
    return out / "done"


def test_the_last_line_of_a_run_names_its_final_adapter(finished, tmp_path):
    assert LOGGED[-1].startswith("run finished in ")
    assert LOGGED[-1].endswith(f"; final adapter: {finished / 'adapters' / 'final'}")
    assert (finished / "adapters" / "final" / "adapter_model.safetensors").is_file()
    for index in (0, 2, 1):
        (tmp_path / "nodes" / f"partition-{index}" / "adapter").mkdir(parents=True)
    assert final_adapters(tmp_path, False) == \
        f"final adapters, one per node: {tmp_path / 'nodes'}/partition-{{0,1,2}}/adapter"
    assert final_adapters(tmp_path / "deployed", False) == (
        "final adapters: one per node, on each node's machine in <its state-dir>/deployed/adapter")


def test_a_run_stopped_through_flowers_exit_handlers_says_stopped(tmp_path):
    from flwr.supercore.exit.exit_handler import trigger_exit_handlers

    def stop_in_round_two(msg, context):
        if msg.content["config"]["server-round"] == 2:
            # what `flwr stop` does to the ServerApp's process: its heartbeat thread raises SIGINT, Flower's handler
            # runs the exit handlers and raises SystemExit in the main thread, which here runs the rounds
            trigger_exit_handlers(run_before_force_exit=True)
            raise SystemExit(0)

    with pytest.raises(SystemExit):
        simulate_in_process({**SMALL, "output.dir": str(tmp_path), "run-name": "stopped"}, 2,
                            client_hook=stop_in_round_two)
    run_dir = tmp_path / "stopped"
    status = read_status(run_dir)
    assert status["status"] == "stopped" and status["detail"] == STOP_DETAIL  # not the SystemExit's "failed"
    assert [row["round"] for row in read_metrics(run_dir)] == [0, 1]


def test_resuming_a_completed_run_changes_nothing(finished, capsys):
    before = _files(finished)
    assert read_status(finished)["status"] == "completed"
    # the ServerApp (plain `flwr run`): says so and returns before writing anything
    simulate_in_process({**SMALL, "output.dir": str(finished.parent), "run-name": "done", "resume": True}, 2)
    assert _files(finished) == before
    # `pubswap simulate`: before Ray starts, exit 0
    started = time.perf_counter()
    assert pubswap(["simulate", "--engine", "inprocess", "--nodes", "2", "--json", json.dumps(SMALL),
                    "-c", "resume=true", "--run-name", "done", "--out", str(finished.parent)]) == 0
    assert time.perf_counter() - started < 10
    printed = capsys.readouterr().out
    assert f"{finished} already completed (round 2 of num-server-rounds = 2): resume = true has nothing to run " \
           "and changed nothing; raise num-server-rounds to train it further" in printed
    assert _files(finished) == before


def test_pubswap_run_resuming_a_completed_run_submits_nothing(finished, monkeypatch, capsys):
    before = _files(finished)
    monkeypatch.setattr(cli, "submit", lambda *a, **k: pytest.fail("a finished run was submitted"))
    overrides = {k: v for k, v in SMALL.items() if k not in preflight.app_defaults(ROOT) or
                 preflight.app_defaults(ROOT)[k] != v}
    pairs = " ".join(f"{k}={cli.toml_value(v)}" for k, v in overrides.items())
    assert pubswap(["run", str(ROOT), "-c", pairs, "-c", f"run-name='done' output.dir='{finished.parent}' "
                    "resume=true", "--quiet"]) == 0
    assert "already completed (round 2 of num-server-rounds = 2)" in capsys.readouterr().out
    assert _files(finished) == before


def test_raising_the_rounds_resumes_a_completed_run(finished):
    saved = preflight.check({**SMALL, "output.dir": str(finished.parent), "run-name": "done", "resume": True,
                             "num-server-rounds": 3})
    assert saved.finished is None and saved.saved.round == 2


def test_pubswap_run_marks_a_run_flower_reports_stopped(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "status.json").write_text(json.dumps({"status": "running", "detail": "", "elapsed_s": 0.0}))
    monkeypatch.setattr(cli, "submit", lambda *a, **k: "7")
    monkeypatch.setattr(cli, "wait", lambda *a, **k: {"status": "finished:stopped", "elapsed": 3.0})
    monkeypatch.setattr(cli.superlink, "mismatch_warning", lambda env: None)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # where pubswap run records the runs it submits
    assert pubswap(["run", str(ROOT), "-c", f"run-name='r' output.dir='{tmp_path}'", "--quiet"]) == 1
    assert read_status(run_dir)["status"] == "stopped"
    assert "`flwr stop` (recorded by pubswap run" in read_status(run_dir)["detail"]
    assert f"{run_dir / 'status.json'} now says stopped" in capsys.readouterr().out
    # a run whose own process recorded its end keeps it
    (run_dir / "status.json").write_text(json.dumps({"status": "completed", "detail": "2 rounds", "elapsed_s": 5}))
    assert pubswap(["run", str(ROOT), "-c", f"run-name='r' output.dir='{tmp_path}'", "--quiet"]) == 1
    assert read_status(run_dir)["status"] == "completed"
    capsys.readouterr()
    # a completed run: the last line names its final adapter
    (run_dir / "adapters" / "final").mkdir(parents=True)
    monkeypatch.setattr(cli, "wait", lambda *a, **k: {"status": "finished:completed", "elapsed": 3.0})
    assert pubswap(["run", str(ROOT), "-c", f"run-name='r' output.dir='{tmp_path}'", "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"final adapter: {run_dir / 'adapters' / 'final'}"
