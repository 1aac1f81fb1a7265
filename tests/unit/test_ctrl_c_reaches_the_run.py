"""A Ctrl-C during `pubswap simulate` reaches the run even where Python drops the KeyboardInterrupt it raised (a
weakref callback or `__del__` running when the signal arrives: "Exception ignored in ..."): the handler also tells
the run to stop, and the command ends with exit code 130 and its one line, printing no dropped traceback."""

from __future__ import annotations

import gc
import signal
import sys
from pathlib import Path

import pytest

from pubswap_flwr import cli, interruption, simulation
from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.server.metrics import RunRecorder, read_status

PROJECT = Path(__file__).resolve().parents[2]
SMOKE = PROJECT / "configs" / "smoke.toml"


@pytest.fixture(autouse=True)
def _no_interrupt_left():
    interruption.clear_interrupt()
    yield
    interruption.clear_interrupt()  # the flag is the process's: other tests' runs must not see this one's Ctrl-C


class _DropsWhatItRaises:
    """An object whose `__del__` is where the Ctrl-C lands: Python reports the exception as unraisable and drops it."""

    def __del__(self):
        # the handler as Python calls it on SIGINT (a real signal would also reach the suite's Ctrl-C watcher, whose
        # wake-up descriptor ends this worker)
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)


def test_a_ctrl_c_dropped_on_its_way_still_stops_the_command(tmp_path, monkeypatch, capsys):
    seen = {}

    def run_whose_ctrl_c_is_dropped(config, nodes):
        _DropsWhatItRaises()  # deleted at once: the KeyboardInterrupt is raised in __del__, and dropped
        gc.collect()
        seen["interrupted"] = interruption.interrupted()  # the run's next check raises RunInterrupted

    earlier = RunRecorder(tmp_path / "earlier", ExperimentConfig.from_flat({"run-name": "earlier"}), "e")
    earlier.started -= 1.0  # an earlier run of this process, still running: not this command's to report or stop
    monkeypatch.setattr(simulation, "simulate_in_process", run_whose_ctrl_c_is_dropped)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a suite started in the background
    code = cli.main(["simulate", "--engine", "inprocess", "-c", str(SMOKE), "--out", str(tmp_path / "runs"),
                     "--run-name", "r"])
    err = capsys.readouterr().err
    assert seen == {"interrupted": True}
    assert code == cli.INTERRUPTED
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert err.rstrip("\n").splitlines()[-1] == "interrupted (Ctrl-C) before the run started: it wrote nothing"
    assert read_status(earlier.run_dir)["status"] == "running"
    assert signal.getsignal(signal.SIGINT) is before  # the command's handler is gone after it


def test_other_dropped_errors_still_reach_the_previous_hook_while_a_run_goes_on(monkeypatch):
    class DropsAnError:
        def __del__(self):
            raise RuntimeError("a real problem in a finaliser")

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))
    with cli.ctrl_c_reaches_the_run():
        DropsAnError()
        gc.collect()
    assert [str(err) for err in reported] == ["a real problem in a finaliser"]
    assert not interruption.interrupted()
    DropsAnError()  # the previous hook is back after the run
    assert len(reported) == 2
