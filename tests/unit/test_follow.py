"""Following a run: the `flwr ls` back-off and its early end, the streamed log's noise filter, and a run Flower ended
as failed recorded `failed`."""

from __future__ import annotations

import io
import json
import os

import pytest

from pubswap_flwr import cli
from pubswap_flwr.follow import copy_without_noise, finished_row, follow, is_noise, status_file_ended
from pubswap_flwr.server.metrics import STOP_DETAIL, mark_failed, read_status, write_status

GREEN, YELLOW, RESET = "\x1b[92m", "\x1b[93m", "\x1b[0m"
NOISE_LINES = [
    f"{YELLOW}WARNING {RESET}:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
    f"{GREEN}INFO {RESET}:      To change federation size, use the following command:\n",
    f"{GREEN}INFO {RESET}:      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>\n",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1764688000.123456   12345 fork_posix.cc:71] Other threads are currently calling into gRPC, skipping "
    "fork() handlers\n",
    "E1202 15:42:01.123456  4242 mutex.cc:452] RAW: Lock blocking 0x7f3c  @\n",
    "[mutex.cc : 2400] RAW: Check w->waitp->cond == nullptr failed\n",
]
KEPT_LINES = [
    f"{GREEN}INFO {RESET}:      Federation `@none/default` (2 simulated SuperNodes)\n",
    f"{GREEN}INFO {RESET}:      [round 0/2] | held-out greedy 0.220 sampled 0.190 (reward 0.283)\n",
    f"{YELLOW}WARNING {RESET}:   Since flwr 1.32 something else changed\n",
    "E1202 15:42:01.123456  4242 raylet.cc:88] the raylet died\n",
    "Traceback (most recent call last):\n",
    "    mutex.cc: a line of someone's own output that mentions mutex.cc\n",
]


@pytest.mark.parametrize("line", NOISE_LINES)
def test_known_noise_lines_are_recognised(line):
    assert is_noise(line)


@pytest.mark.parametrize("line", KEPT_LINES)
def test_every_other_line_is_kept(line):
    assert not is_noise(line)


def test_the_filter_passes_everything_else_on_verbatim_and_in_order():
    source = io.StringIO("".join(line for pair in zip(KEPT_LINES, NOISE_LINES) for line in pair))
    sink = io.StringIO()
    assert copy_without_noise(source, sink) == len(KEPT_LINES)  # as many noise lines as kept ones were interleaved
    assert sink.getvalue() == "".join(KEPT_LINES)


class FakeClock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_flwr_ls_is_asked_on_the_back_off_schedule():
    clock, asked = FakeClock(), []

    def ask():
        asked.append(round(clock.now, 3))
        return {"status": "finished:completed"} if clock.now >= 300 else None

    row = follow(ask, clock=clock, sleep=clock.sleep)
    assert row == {"status": "finished:completed"}
    assert asked == [5, 15, 35, 75, 135, 195, 255, 315]  # 8 processes in 5 minutes; polling every 2 s started 150


def test_the_end_seen_locally_makes_the_next_ask_come_at_once():
    clock, asked = FakeClock(), []
    ended_at = 50.0

    def ask():
        asked.append(round(clock.now, 3))
        return {"status": "finished:failed"} if clock.now >= ended_at + 1 else None

    row = follow(ask, ended=lambda: clock.now >= ended_at, clock=clock, sleep=clock.sleep)
    assert row["status"] == "finished:failed"
    # back-off until 35 s, the end noticed within a tick of 50 s, then 0.5 and 1 s apart until Flower says finished
    assert asked == [5, 15, 35, 50, 50.5, 51.5]


def test_a_run_that_never_finishes_times_out():
    clock = FakeClock()
    with pytest.raises(TimeoutError, match="did not finish within 100 s"):
        follow(lambda: None, timeout=100, clock=clock, sleep=clock.sleep)
    assert 100 < clock.now <= 101


def test_fixed_gaps_replace_the_back_off():
    clock, asked = FakeClock(), []
    follow(lambda: asked.append(clock.now) or (len(asked) == 3 and {"status": "finished:completed"}) or None,
           gaps=iter([2.0] * 10), clock=clock, sleep=clock.sleep)
    assert asked == [2.0, 4.0, 6.0]


def test_finished_row_reads_flwr_ls_json_after_any_preamble():
    out = 'Using SuperLink: local\n{"success": true, "runs": [{"run-id": "7", "status": "finished:failed"}]}'
    assert finished_row(out) == {"run-id": "7", "status": "finished:failed"}
    assert finished_row('{"success": true, "runs": [{"run-id": "7", "status": "running"}]}') is None
    assert finished_row("connection refused") is None
    assert finished_row('{"runs": [') is None


def test_status_file_counts_only_an_end_written_after_the_check_began(tmp_path):
    write_status(tmp_path, "failed", "the attempt before a resume")
    os.utime(tmp_path / "status.json", ns=(1, 1))
    ended = status_file_ended(tmp_path)
    assert not ended()  # the old file's "failed" is not this attempt's end
    write_status(tmp_path, "running")
    assert not ended()
    write_status(tmp_path, "completed", "2 rounds")
    assert ended()
    assert not status_file_ended(tmp_path / "missing")()


def test_mark_failed_replaces_a_stop_the_process_guessed_or_a_running_status(tmp_path):
    write_status(tmp_path, "stopped", STOP_DETAIL, 42.0)
    assert mark_failed(tmp_path, "Flower ended the run as failed: heartbeats lost")
    status = read_status(tmp_path)
    assert status["status"] == "failed" and status["elapsed_s"] == 42.0
    assert status["detail"] == f"Flower ended the run as failed: heartbeats lost (the run's process had recorded: " \
                               f"stopped, {STOP_DETAIL})"
    write_status(tmp_path, "running")
    assert mark_failed(tmp_path, "x") and read_status(tmp_path)["status"] == "failed"
    write_status(tmp_path, "completed", "2 rounds")
    assert not mark_failed(tmp_path, "x") and read_status(tmp_path)["detail"] == "2 rounds"


def test_pubswap_run_records_a_run_flower_ended_as_failed(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    write_status(run_dir, "stopped", STOP_DETAIL, 9.0)  # what the exit handler writes when Flower ends the run
    monkeypatch.setattr(cli, "submit", lambda *a, **k: "7")
    monkeypatch.setattr(cli, "wait", lambda *a, **k: {"status": "finished:failed", "elapsed": 3.0,
                                                      "status-details": "Lost SuperNode heartbeats"})
    monkeypatch.setattr(cli.superlink, "mismatch_warning", lambda env: None)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # where pubswap run records the runs it submits
    root = cli.Path(__file__).resolve().parents[2]
    assert cli.main(["run", str(root), "-c", f"run-name='r' output.dir='{tmp_path}'", "--quiet"]) == 1
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "failed"
    assert status["detail"].startswith("Flower ended the run as failed: Lost SuperNode heartbeats")
    assert f"run 7: {run_dir / 'status.json'} now says failed" in capsys.readouterr().out
