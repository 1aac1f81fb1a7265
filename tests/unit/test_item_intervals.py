"""Item-level intervals: two-way cluster-robust over seeds x items (report/item_intervals.py), and the report using
them where runs recorded per-item results (eval_items.jsonl)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pubswap_flwr.report import item_intervals, write_report
from pubswap_flwr.report.item_intervals import common_items, difference_table, two_way_interval
from pubswap_flwr.report.statistics import mean_ci

T2 = 4.302652729911275  # t(0.975, 2)


def test_an_item_effect_shared_by_every_seed_widens_the_interval_the_seeds_alone_would_give():
    # each seed: items a, c right and b, d wrong: the seeds agree exactly, so a paired t over seeds has no width
    table = {s: {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0} for s in range(3)}
    seeds_only = mean_ci(sum(row.values()) / 4 for row in table.values())
    assert seeds_only.low == seeds_only.high == 0.5
    interval = two_way_interval(table)
    assert interval.mean == 0.5 and interval.n == 3
    assert interval.high - 0.5 == pytest.approx(T2 * math.sqrt(2 / 33), abs=1e-8)  # by hand: the next test
    assert interval.low == pytest.approx(0.5 - T2 * math.sqrt(2 / 33), abs=1e-8)


def test_interval_construction_is_named_for_the_reports():
    assert item_intervals.INTERVAL_CONSTRUCTION == ("two-way cluster-robust over seeds × items "
                                                    "(Cameron-Gelbach-Miller), t with seeds - 1 df")


def test_interval_construction_item_effects_alone_get_the_cgm_variance_not_the_one_way_floor():
    # 3 seeds x items a..d scoring 1, 0, 1, 0: residuals +-1/2 in all 12 cells. By hand: V_seed = 0 (every seed's
    # residuals sum to 0); V_item = 4 x 1.5^2 / 12^2 x 4/3 = 1/12; V_cell = 12 x 1/4 / 12^2 x 12/11 = 1/44;
    # V = 1/12 - 1/44 = 2/33. The old floor max(V_seed, V_item) gave 1/12, a half-width 17% wider (the wider
    # construction over-covers: docs/results/interval-coverage).
    table = {s: {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0} for s in range(3)}
    interval = two_way_interval(table)
    assert interval.high - interval.mean == pytest.approx(T2 * math.sqrt(2 / 33), abs=1e-9)


def test_interval_construction_seed_and_item_effects_get_v_seed_plus_v_item_minus_v_cell():
    # 0.5 + seed effect (-0.05, 0, +0.05) + item effect (-0.25, -0.25, +0.25, +0.25), no interaction. By hand:
    # V_seed = (0.2^2 + 0 + 0.2^2) / 12^2 x 3/2 = 1/1200; V_item = 4 x 0.75^2 / 12^2 x 4/3 = 25/1200;
    # V_cell = (4 x 0.005 + 3 x 0.25) / 12^2 x 12/11 = 0.77/132 = 7/1200; V = (1 + 25 - 7)/1200 = 19/1200 (the old
    # floor: V_item = 25/1200)
    table = {0: {"a": 0.2, "b": 0.2, "c": 0.7, "d": 0.7}, 1: {"a": 0.25, "b": 0.25, "c": 0.75, "d": 0.75},
             2: {"a": 0.3, "b": 0.3, "c": 0.8, "d": 0.8}}
    interval = two_way_interval(table)
    assert interval.mean == pytest.approx(0.5, abs=1e-9)
    assert interval.high - interval.mean == pytest.approx(T2 * math.sqrt(19 / 1200), abs=1e-9)
    assert interval.mean - interval.low == pytest.approx(T2 * math.sqrt(19 / 1200), abs=1e-9)


def test_interval_construction_seed_effects_alone_get_a_little_less_than_the_seeds_only_interval():
    # every item of a seed has that seed's value (0.1, 0.3, 0.2 on 6 items). By hand: V_seed = (0.6^2 + 0.6^2) / 18^2
    # x 3/2 = 1/300, the seeds-only variance 0.1^2 / 3; V_item = 0; V_cell = 6 x 0.02 / 18^2 x 18/17 = 1/2550;
    # V = 1/300 - 1/2550 = 1/340: CGM takes the cell part out of both one-way sums, so with seeds alone it is
    # (I - 1) S / (S I - 1) of the seeds-only variance (0.88 at 6 items, 0.99 at 64)
    values = {0: 0.1, 1: 0.3, 2: 0.2}
    table = {s: {i: v for i in "abcdef"} for s, v in values.items()}
    interval = two_way_interval(table)
    seeds_only = mean_ci(values.values())
    assert interval.mean == pytest.approx(seeds_only.mean)
    assert (seeds_only.high - seeds_only.mean) ** 2 == pytest.approx(T2 ** 2 / 300, abs=1e-9)
    assert interval.high - interval.mean == pytest.approx(T2 * math.sqrt(1 / 340), abs=1e-9)


def test_interval_construction_falls_back_to_the_larger_one_way_part_where_the_cgm_sum_is_not_positive():
    # 2 seeds x 2 items, mostly interaction: residuals (+0.55, -0.45 / -0.55, +0.45). By hand: V_seed = 2 x 0.1^2 /
    # 4^2 x 2 = 0.0025, V_item = 0, V_cell = 1.01 / 16 x 4/3 = 0.084: the sum is negative, so V = V_seed; t with 1 df
    interval = two_way_interval({0: {"a": 1.1, "b": 0.1}, 1: {"a": 0.0, "b": 1.0}})
    assert interval.mean == pytest.approx(0.55)
    assert interval.high - interval.mean == pytest.approx(12.706204736174707 * 0.05, abs=1e-9)


def test_one_seed_or_one_item_gives_no_interval_and_items_missing_from_a_seed_are_left_out():
    assert not two_way_interval({0: {"a": 1.0, "b": 0.0}}).has_interval
    assert not two_way_interval({0: {"a": 1.0}, 1: {"a": 0.0}}).has_interval
    assert common_items({0: {"a": 1, "b": 0}, 1: {"b": 1, "c": 0}}) == ["b"]
    assert two_way_interval({}).n == 0
    assert difference_table({0: {"a": 1.0, "b": 0.5}, 1: {"a": 0.0}}, {0: {"a": 0.25}}) == {0: {"a": 0.75}}


def _run(root: Path, arm: str, seed: int, per_item: list[int], final: float, constant_share: float = 0.1,
         flag: bool = False) -> Path:
    """A 1-round run whose held-out items x0..xN score `per_item` (correct of 4 samples) at round 1 and 0 at round 0."""
    run = root / f"{arm}-s{seed}"
    run.mkdir(parents=True)
    uids = [f"x{i}" for i in range(len(per_item))]

    def evaluation(accuracy: float, shortcut: bool) -> dict:
        return {"greedy_accuracy": accuracy, "sampled_accuracy": accuracy, "sampled_reward": accuracy, "samples": 4,
                "per_task": {"gcd": {"greedy_accuracy": accuracy, "sampled_accuracy": accuracy,
                                     "constant_accuracy": constant_share, "constant_answer": "1",
                                     "greedy_modal_share": 0.95 if shortcut else 0.2}},
                "greedy_shortcut_tasks": ["gcd"] if shortcut else [], "sampled_shortcut_tasks": []}

    rows = [{"round": 0, "mode": "fedavg", "eval": evaluation(0.0, False)},
            {"round": 1, "mode": "fedavg", "eval": evaluation(final, flag), "train_reward": 0.1,
             "cumulative_reward": 0.1, "clients": {}, "dropped": {}}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    items = [{"round": 0, "global": {"uids": uids, "tasks": ["gcd"] * len(uids), "greedy": [0] * len(uids),
                                     "sampled": [0] * len(uids), "samples": 4}},
             {"round": 1, "global": {"uids": uids, "tasks": ["gcd"] * len(uids),
                                     "greedy": [int(c >= 2) for c in per_item], "sampled": per_item, "samples": 4}}]
    (run / "eval_items.jsonl").write_text("\n".join(json.dumps(r) for r in items) + "\n")
    return run


def test_the_report_uses_item_level_intervals_when_every_run_recorded_its_items(tmp_path):
    # every seed: the arm gets items x0, x1 fully right, x2, x3 wrong; the baseline nothing: +0.5 on every seed
    runs = [_run(tmp_path / "runs", "base", s, [0, 0, 0, 0], 0.0) for s in range(3)]
    runs += [_run(tmp_path / "runs", "arm", s, [4, 4, 0, 0], 0.5) for s in range(3)]
    text = write_report(tmp_path / "out", runs, arm_order=["base", "arm"]).read_text()
    assert "cover both the seeds and the draw of held-out items" in text
    row = next(line for line in text.splitlines() if line.startswith("| arm | sampled acc |"))
    half = T2 * math.sqrt(2 / 33)  # per seed 1, 1, 0, 0 on x0..x3: the item-effect table above
    assert row.endswith(f"| +0.500 [{0.5 - half:+.3f}, {0.5 + half:+.3f}] | seeds × items |")
    reward = next(line for line in text.splitlines() if line.startswith("| arm | sampled reward |"))
    assert reward.endswith("| +0.500 [+0.500, +0.500] | seeds |")  # no per-item rewards: seeds only
    learning = next(line for line in text.splitlines() if line.startswith("| arm | sampled strict |"))
    assert learning.endswith("| seeds × items |")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["paired"]["arm"]["sampled_accuracy"]["covers"] == "seeds × items"


def test_interval_construction_is_quoted_by_the_report_and_recorded_in_summary_json(tmp_path):
    runs = [_run(tmp_path / "runs", "base", s, [0, 0, 0, 0], 0.0) for s in range(3)]
    runs += [_run(tmp_path / "runs", "arm", s, [4, 4, 0, 0], 0.5) for s in range(3)]
    text = write_report(tmp_path / "out", runs, arm_order=["base", "arm"]).read_text()
    assert (f"**cover both the seeds and the draw of held-out items**: {item_intervals.INTERVAL_CONSTRUCTION}, from "
            "each run's per-item results;") in text
    assert "Cameron, Gelbach & Miller" not in text  # the wording of the floored construction it replaced
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["item_interval_construction"] == item_intervals.INTERVAL_CONSTRUCTION


def test_interval_construction_is_not_claimed_by_a_report_whose_intervals_cover_seeds_only(tmp_path):
    runs = [_run(tmp_path / "runs", "base", s, [0, 0], 0.0) for s in range(2)]
    runs += [_run(tmp_path / "runs", "arm", s, [4, 0], 0.5) for s in range(2)]
    for run in runs:
        (run / "eval_items.jsonl").unlink()
    text = write_report(tmp_path / "out", runs, arm_order=["base", "arm"]).read_text()
    assert item_intervals.INTERVAL_CONSTRUCTION not in text and "| seeds × items |" not in text
    assert "item_interval_construction" not in json.loads((tmp_path / "out" / "summary.json").read_text())


def test_runs_without_item_results_say_their_intervals_cover_seeds_only(tmp_path):
    runs = [_run(tmp_path / "runs", "base", s, [0, 0], 0.0) for s in range(2)]
    runs += [_run(tmp_path / "runs", "arm", s, [4, 0], 0.5) for s in range(2)]
    (runs[0] / "eval_items.jsonl").unlink()
    text = write_report(tmp_path / "out", runs, arm_order=["base", "arm"]).read_text()
    assert "Intervals cover the seeds only" in text and "only 3 of 4 runs recorded per-item results" in text
    row = next(line for line in text.splitlines() if line.startswith("| arm | sampled acc |"))
    assert row.endswith("| seeds |")


def test_the_report_shows_the_constant_baseline_and_flags_a_collapsed_run(tmp_path):
    runs = [_run(tmp_path / "runs", "fedavg", s, [4, 0, 0, 0], 0.25, constant_share=0.25, flag=(s == 1))
            for s in range(2)]
    text = write_report(tmp_path / "out", runs).read_text()
    assert "## Shortcut check" in text
    assert "| best constant answer | 0.250 (`1`) |" in text
    assert "| fedavg: sampled − constant | +0.000 |" in text
    assert "| fedavg: greedy modal share | 0.57 (0.95) |" in text
    assert "**Flagged**: fedavg-s1 (gcd)." in text
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["shortcuts"]["flagged"] == {"fedavg-s1": ["gcd"]}


def test_item_records_without_their_sample_count_take_it_from_the_metrics_row(tmp_path):
    from pubswap_flwr.report.summaries import summarize_run

    run = _run(tmp_path, "fedavg", 0, [4, 2, 0], 0.5)
    rows = [json.loads(line) for line in (run / "eval_items.jsonl").read_text().splitlines()]
    for row in rows:
        del row["global"]["samples"]  # as the first runs that wrote eval_items.jsonl recorded it
    (run / "eval_items.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert summarize_run(run).items[1]["sampled_accuracy"] == {"x0": 1.0, "x1": 0.5, "x2": 0.0}


@pytest.mark.parametrize("content", ['{"round": 1, "global": {"uids": ["x0"], "greedy": ["1"]}}',
                                     '{"round": 1, "global": {"greedy": [1]}}', "not json", '[1, 2]',
                                     '{"round": 1, "global": {"uids": ["x0"], "sampled": [1], "samples": "4"}}'])
def test_a_malformed_eval_items_file_is_a_one_line_report_error(tmp_path, capsys, content):
    from pubswap_flwr.cli import main as pubswap

    run = _run(tmp_path / "runs", "fedavg", 0, [4, 0], 0.5)
    (run / "eval_items.jsonl").write_text(content + "\n")
    assert pubswap(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval_items.jsonl" in err and "Traceback" not in err


def test_a_linked_eval_items_file_is_refused(tmp_path, capsys):
    from pubswap_flwr.cli import main as pubswap

    run = _run(tmp_path / "runs", "fedavg", 0, [4, 0], 0.5)
    secret = tmp_path / "secret.jsonl"
    (run / "eval_items.jsonl").rename(secret)
    (run / "eval_items.jsonl").symlink_to(secret)
    assert pubswap(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    assert "link" in capsys.readouterr().err
