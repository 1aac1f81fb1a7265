"""The report's 'Harder tier' and 'Sampling cost and gain per CPU-hour' sections (issue #53) on hand-made runs: the
interval widened by the runs' item variances, the sampling seconds per round and per trained group against the
baseline, the curriculum level, CPU-hours from provenance.json, the gain per CPU-hour and its ratio; and the progress
line's curriculum levels and harder tier."""

from __future__ import annotations

import json
import logging
import math

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.report import write_report
from pubswap_flwr.report.statistics import mean_ci, mean_ci_with_item_variance, t_quantile, within
from pubswap_flwr.server.metrics import MetricsError, RunRecorder, check_row
from tests.unit.test_report_files import _table, make_run


def test_the_item_variance_widens_the_interval_over_seeds_and_does_not_shrink_with_seeds():
    interval = mean_ci_with_item_variance([0.1, 0.2, 0.3], [0.01, 0.01, 0.01])
    half = t_quantile(0.975, 2) * math.sqrt(0.1 ** 2 / 3 + 0.01)
    assert (interval.mean, interval.n) == (pytest.approx(0.2), 3)
    assert (interval.low, interval.high) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    plain = mean_ci([0.1, 0.2, 0.3])
    assert interval.high - interval.low > plain.high - plain.low
    # every seed evaluates the same items: the item part stays however many seeds agree exactly
    many = mean_ci_with_item_variance([0.2] * 30, [0.01] * 30)
    assert many.high - 0.2 == pytest.approx(t_quantile(0.975, 29) * 0.1)
    assert mean_ci_with_item_variance([0.2], [0.01]).has_interval is False
    assert mean_ci_with_item_variance([], []).n == 0


def test_within_cuts_an_interval_to_what_the_quantity_can_take():
    cut = within(mean_ci([0.0, 0.1]), 0.0, 1.0)
    assert cut.low == 0.0 and cut.high == pytest.approx(mean_ci([0.0, 0.1]).high) and cut.mean == pytest.approx(0.05)
    assert within(mean_ci([0.95, 1.0]), 0.0, 1.0).high == 1.0
    assert within(mean_ci([0.5]), 0.0, 1.0).has_interval is False


def _edit(run, elapsed_s: float, cpus: int, harder_last: float, sampling: float, levels=None, filled=None):
    """Give a make_run run a harder tier (round 0 at 0.1), its clients' sampling seconds and 16 trained groups each,
    curriculum levels and dynamic sampling's filled share where given, and provenance and status files."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        value = 0.1 if row["round"] == 0 else harder_last
        row["eval"]["harder_tier"] = {"greedy_accuracy": value, "sampled_accuracy": value,
                                      "sampled_accuracy_se": 0.02, "items": 100}
        if row["round"] == 0:
            continue
        row["time"]["sampling_s"] = sampling
        for client in row["clients"].values():
            client.update(sample_s=sampling / 2, trained_groups=16)
            if levels is not None:
                client["curriculum_levels"] = levels(row["round"])
            if filled is not None:
                client["dynamic_filled_share"] = filled
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "provenance.json").write_text(json.dumps({"starts": [{"device": {"cpu": "x", "cpus": cpus}}]}))
    (run / "status.json").write_text(json.dumps({"status": "completed", "detail": "", "elapsed_s": elapsed_s}))
    return run


@pytest.fixture()
def report(tmp_path):
    root = tmp_path / "sweep"
    levels = lambda rnd: {"t1": 2, "t2": 2} if rnd == 3 else {"t1": 1, "t2": 2}  # noqa: E731
    runs = [_edit(make_run(root, "fixed", 0, 0.3, se=True), 1800, 2, 0.12, 40.0),
            _edit(make_run(root, "fixed", 1, 0.3, se=True), 1800, 2, 0.12, 40.0),
            _edit(make_run(root, "ctrl", 0, 0.3, se=True), 3600, 2, 0.20, 60.0, levels, 0.75),
            _edit(make_run(root, "ctrl", 1, 0.3, se=True), 3600, 2, 0.22, 60.0, levels, 0.75)]
    text = write_report(root, runs, arm_order=["fixed", "ctrl"]).read_text()
    return text, json.loads((root / "summary.json").read_text())


def test_harder_tier_shows_round_0_last_the_change_and_the_difference_with_the_baseline(report):
    text, summary = report
    section = text.split("## Harder tier")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ctrl | sampled strict")]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2:4] == ["0.100", "0.210"]
    half = t_quantile(0.975, 1) * math.sqrt(0.0002 / 2 + 2 * 0.02 ** 2)  # variance of (0.10, 0.12): 0.0002
    assert cells[4] == f"+0.110 [{0.11 - half:+.3f}, {0.11 + half:+.3f}]"
    assert cells[5].startswith("+0.090 [")  # 0.21 − 0.12 at the last round, seed by seed
    assert cells[6] == "seeds + items (approx.)"
    change = summary["harder"]["ctrl"]["sampled_accuracy"]["change"]
    assert change["values"] == [pytest.approx(0.1), pytest.approx(0.12)]
    assert summary["harder"]["fixed"]["sampled_accuracy"].get("against_baseline") is None


def test_cost_shows_sampling_per_round_and_per_trained_group_against_the_baseline(report):
    text, summary = report
    section = text.split("## Sampling cost and gain per CPU-hour")[1]
    fixed, ctrl = _table(section, "fixed"), _table(section, "ctrl")
    assert fixed[1:6] == ["40.0 (40.0–40.0)", "1.00×", "1.25 (1.25–1.25)", "1.00×", "–"]  # 40 s / 32 groups
    assert ctrl[1:8] == ["60.0 (60.0–60.0)", "1.50×", "1.88 (1.88–1.88)", "1.50×", "0.75", "1.67 (2.00)",
                         "2.000 (2.000–2.000)"]  # 3600 s × 2 CPUs
    assert fixed[6:8] == ["–", "1.000 (1.000–1.000)"]
    assert summary["cost"]["ctrl"]["cpu_hours"]["values"] == [2.0, 2.0]


def test_gain_per_cpu_hour_divides_the_gain_by_the_arms_cpu_hours_and_compares_with_the_baseline(report):
    text, summary = report
    gains = text.split("## Sampling cost and gain per CPU-hour")[1].split("*Gain*")[1]
    ctrl = _table(gains, "ctrl")
    # harder tier: ctrl gains 0.11 in 2 CPU-hours, fixed 0.02 in 1: 0.055 / 0.02
    assert ctrl[4].startswith("+0.110 [") and ctrl[5].startswith("+0.055 [") and ctrl[6] == "2.75×"
    assert ctrl[1].startswith("+0.030 [") and ctrl[2].startswith("+0.015 [") and ctrl[3] == "0.50×"
    assert ctrl[7] == "seeds + items (approx.); seeds + items (approx.)"
    rate = summary["cost"]["ctrl"]["gain_harder_tier"]["per_cpu_hour"]
    change = summary["harder"]["ctrl"]["sampled_accuracy"]["change"]
    assert rate["ci_low"] == pytest.approx(change["ci_low"] / 2)
    assert rate["ci_high"] == pytest.approx(change["ci_high"] / 2)


def test_no_ratio_against_a_baseline_that_did_not_gain(tmp_path):
    root = tmp_path / "sweep"
    runs = [_edit(make_run(root, "fixed", 0, 0.3, se=True), 1800, 2, 0.08, 40.0),  # harder tier fell: 0.1 → 0.08
            _edit(make_run(root, "ctrl", 0, 0.3, se=True), 1800, 2, 0.20, 40.0)]
    text = write_report(root, runs, arm_order=["fixed", "ctrl"]).read_text()
    ctrl = _table(text.split("*Gain*")[1], "ctrl")
    assert ctrl[4] == "+0.100 [n/a]" and ctrl[6] == "–"


def test_runs_without_harder_tier_or_sampling_seconds_get_neither_section(tmp_path):
    text = write_report(tmp_path / "r", [make_run(tmp_path / "r", "a", 0, 0.2)]).read_text()
    assert "## Harder tier" not in text and "## Sampling cost" not in text


@pytest.mark.parametrize("client,named", [({"sample_s": -1.0}, "sample_s"),
                                          ({"dynamic_filled_share": 1.5}, "dynamic_filled_share"),
                                          ({"curriculum_levels": {"t": -1}}, "curriculum_levels")])
def test_the_metrics_row_refuses_a_negative_time_or_level_or_a_share_above_1(client, named):
    row = {"round": 1, "clients": {"7": client}}
    with pytest.raises(MetricsError, match=named):
        check_row(row, "metrics.jsonl:2")


def test_the_progress_line_shows_the_curriculum_levels_and_the_harder_tier(tmp_path, caplog):
    recorder = RunRecorder(tmp_path / "run", ExperimentConfig.from_flat({"num-server-rounds": 3}), 1)
    row = {"round": 2, "clients": {"1": {"curriculum_levels": {"a": 0, "b": 2}}, "2": {"curriculum_levels": {"a": 1}}},
           "eval": {"greedy_accuracy": 0.3, "sampled_accuracy": 0.25,
                    "harder_tier": {"greedy_accuracy": 0.125, "sampled_accuracy": 0.1}}}
    with caplog.at_level(logging.INFO, logger="pubswap_flwr"):
        recorder.progress(row)
    line = caplog.records[-1].getMessage()
    assert "curriculum levels 0-2 (mean 1.00)" in line
    assert "held-out greedy 0.300 sampled 0.250, harder tier greedy 0.125 sampled 0.100" in line


def _with_harder_items(run, right_last: int):
    """eval_items.jsonl for a run: 10 held-out items and 10 harder-tier items at rounds 0 and 3, the harder tier's
    last round with `right_last` items right (1 at round 0)."""
    def record(prefix: str, right: int) -> dict:
        return {"uids": [f"{prefix}{i}" for i in range(10)], "tasks": ["t1"] * 10, "samples": 4,
                "greedy": [1.0 if i < right else 0.0 for i in range(10)],
                "sampled": [4.0 if i < right else 0.0 for i in range(10)]}
    rows = [{"round": 0, "global": record("e", 3), "harder_tier": record("h", 1)},
            {"round": 3, "global": record("e", 3), "harder_tier": record("h", right_last)}]
    (run / "eval_items.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run


def test_harder_tier_intervals_cover_seeds_and_items_where_the_runs_recorded_the_tiers_items(tmp_path):
    root = tmp_path / "sweep"
    runs = [_with_harder_items(_edit(make_run(root, arm, seed, 0.3, se=True), 1800, 2, last, 40.0), round(last * 10))
            for arm, seed, last in (("fixed", 0, 0.2), ("fixed", 1, 0.2), ("ctrl", 0, 0.4), ("ctrl", 1, 0.5))]
    text = write_report(root, runs, arm_order=["fixed", "ctrl"]).read_text()
    section = text.split("## Harder tier")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| ctrl | greedy strict"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4].startswith("+0.350 [") and cells[5].startswith("+0.250 [") and cells[6] == "seeds × items"
    summary = json.loads((root / "summary.json").read_text())
    assert summary["harder"]["ctrl"]["greedy_accuracy"]["against_baseline"]["covers"] == "seeds × items"
    assert "item_interval_construction" in summary
    # the held-out tier's item intervals read the global records only, never the harder tier's
    from pubswap_flwr.report import summarize_run
    assert set(summarize_run(runs[0]).items[3]["greedy_accuracy"]) == {f"e{i}" for i in range(10)}
