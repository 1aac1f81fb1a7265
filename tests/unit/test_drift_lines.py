"""report.md's 'Client drift' (report/drift_lines.py): the clients' distance at aggregation per arm, first, last and
mean over rounds, each over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pubswap_flwr.report import write_report
from pubswap_flwr.report.formatting import fmt_ci
from pubswap_flwr.report.statistics import mean_ci
from tests.report_tables import table_row


def _run(root: Path, arm: str, seed: int, drifts: list[float | None]) -> Path:
    """A run with one training row per drift value (None: a round that aggregated nothing, as SAPO's)."""
    run = root / f"{arm}-s{seed}"
    run.mkdir(parents=True)
    rows: list[dict] = [{"round": 0, "mode": "fedavg", "eval": {"greedy_accuracy": 0.1, "sampled_accuracy": 0.1}}]
    for number, drift in enumerate(drifts, start=1):
        row = {"round": number, "mode": "fedavg", "train_reward": 0.1, "cumulative_reward": 0.1 * number,
               "clients": {}, "dropped": {}}
        if drift is not None:
            row["parameter_drift"] = drift
        rows.append(row)
    rows[-1]["eval"] = {"greedy_accuracy": 0.2, "sampled_accuracy": 0.2}
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run


def test_each_arm_gets_its_first_last_and_mean_drift_over_seeds(tmp_path):
    runs = [_run(tmp_path, "fedavg", 0, [0.8, 0.4]), _run(tmp_path, "fedavg", 1, [0.6, 0.2, 0.3]),
            _run(tmp_path, "pubswap", 0, [1.0, 0.5]), _run(tmp_path, "pubswap", 1, [1.2, 0.7])]
    text = write_report(tmp_path / "out", runs, arm_order=["fedavg", "pubswap"]).read_text()

    def row(arm: str) -> list[str]:
        return table_row(text, "Client drift", arm)

    assert row("fedavg") == [fmt_ci(mean_ci([0.8, 0.6])), fmt_ci(mean_ci([0.4, 0.3])),
                                    fmt_ci(mean_ci([0.6, 1.1 / 3])), "2–3"]
    assert row("pubswap")[:3] == ["1.100 [-0.171, 2.371]", "0.600 [-0.671, 1.871]", "0.850 [-0.421, 2.121]"]
    assert row("pubswap")[3] == "2"
    drift = json.loads((tmp_path / "out" / "summary.json").read_text())["drift"]
    assert drift["fedavg"]["last"]["values"] == [0.4, 0.3]
    assert drift["pubswap"]["mean"]["mean"] == 0.85


def test_arms_that_average_nothing_are_left_out_and_without_any_there_is_no_section(tmp_path):
    runs = [_run(tmp_path / "a", "fedavg", 0, [0.8, 0.4]), _run(tmp_path / "a", "local", 0, [None, None])]
    text = write_report(tmp_path / "out", runs, arm_order=["fedavg", "local"]).read_text()
    section = text.split("## Client drift", 1)[1].split("\n## ", 1)[0]
    assert "| fedavg |" in section and "| local |" not in section
    assert set(json.loads((tmp_path / "out" / "summary.json").read_text())["drift"]) == {"fedavg"}
    only_local = [_run(tmp_path / "b", "local", s, [None, None]) for s in range(2)]
    assert "## Client drift" not in write_report(tmp_path / "out-b", only_local).read_text()


def test_a_drift_that_is_not_a_finite_number_is_refused_naming_the_run_and_round(tmp_path):
    for name, bad in (("inf", float("inf")), ("nan", float("nan"))):
        runs = [_run(tmp_path / name, "fedavg", 0, [0.8, bad]), _run(tmp_path / name, "fedavg", 1, [0.6, 0.2])]
        with pytest.raises(ValueError, match=r"fedavg-s0: metrics.jsonl round 2: parameter_drift is (inf|nan), "
                                             "not a finite number"):
            write_report(tmp_path / f"out-{name}", runs)
