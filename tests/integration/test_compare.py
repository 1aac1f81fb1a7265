"""`pubswap compare`: a small sweep (each arm a `pubswap simulate` process, without Ray), its report and plots, a
bad arm and a failing run reported by name while the other arms complete, and `pubswap report` regenerating from
metrics."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.server.metrics import read_metrics

pytestmark = pytest.mark.slow

SWEEP = """
name = "mini"
nodes = 2
seeds = [7]
engine = "inprocess"  # no Ray start per arm; a sweep's arms through Ray: test_ray_cluster.py

[config]
num-server-rounds = 1
strategy.apply-below-robust = true  # 2 nodes: apply their rounds (#54 keeps them by default)
train.local-steps = 1
train.prompts-per-step = 2
train.completions-per-prompt = 4
eval.items-per-task = 3
eval.samples = 1
pubswap.tau-swap = 1
pubswap.public-prompts = 2

[arms.fedavg]
strategy.mode = "fedavg"

[arms.balanced]
strategy.mode = "pubswap"
pubswap.swap = "balanced"

[arms.typo]
train.local-step = 3

[arms.broken]
model.name = "embedded:does-not-exist"
"""


def _table(report: str) -> dict[str, list[str]]:
    rows = {}
    for line in report.splitlines():
        if line.startswith("| ") and not line.startswith("| arm") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.setdefault(cells[0], cells)
    return rows


@pytest.mark.rendered_figures  # it checks that every plot is a real, non-trivial PNG
def test_sweep_report_matches_metrics_and_names_failed_arms(tmp_path, capsys):
    sweep = tmp_path / "mini.toml"
    sweep.write_text(SWEEP)
    code = pubswap(["compare", str(sweep), "--out", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert code == 1  # two arms failed
    assert ("FAILED typo seed 7: arm 'typo': unknown config key 'train.local-step' "
            "(did you mean 'train.local-steps'?)") in err
    assert "FAILED broken seed 7" in err and "does-not-exist" in err
    out = tmp_path / "results" / "mini"
    report = (out / "report.md").read_text()
    for plot in ("heldout_accuracy", "reward", "cumulative_reward", "paired_difference", "drift", "bytes"):
        assert (out / "plots" / f"{plot}.png").stat().st_size > 1000
        assert f"plots/{plot}.png" in report
    table = _table(report)
    assert table["typo"][3:] == ["FAILED"] * 7 and table["broken"][3:] == ["FAILED"] * 7
    assert "**typo** seed 7: FAILED" in report and "**broken** seed 7: FAILED" in report
    for arm, mode in (("fedavg", "fedavg"), ("balanced", "pubswap")):
        rows = read_metrics(out / "runs" / f"{arm}-s7")
        final = [r for r in rows if r.get("eval")][-1]["eval"]
        cells = table[arm]
        assert cells[1] == mode and cells[2] == "7"
        assert cells[3] == f"{final['greedy_accuracy']:.3f} [n/a]"  # one seed: no interval
        assert cells[4] == f"{final['sampled_accuracy']:.3f} [n/a]"
        assert cells[5] == f"{final['sampled_reward']:.3f} [n/a]"
        assert cells[6] == f"{rows[-1]['cumulative_reward']:.3f} [n/a]"
        assert cells[7] == "1"
        megabytes = sum(r["bytes"]["sent_by_clients"] + r["bytes"]["received_by_clients"] for r in rows[1:]) / 1e6
        assert cells[9] == f"{megabytes:.3f} [n/a]"
    outcomes = {o["arm"]: o["status"] for o in json.loads((out / "outcomes.json").read_text())}
    assert outcomes == {"fedavg": "completed", "balanced": "completed", "typo": "skipped-invalid", "broken": "failed"}

    # Completed runs are skipped on a second invocation; the report is regenerated from metrics alone.
    assert pubswap(["compare", str(sweep), "--out", str(tmp_path / "results"), "--only", "fedavg"]) == 0
    second = json.loads((out / "outcomes.json").read_text())
    # the arms --only left alone keep their entries (publish_results publishes from this file), in the sweep's order
    assert [(o["arm"], o["status"], o["reused"]) for o in second] == [
        ("fedavg", "completed", True), ("balanced", "completed", False), ("typo", "skipped-invalid", False),
        ("broken", "failed", False)]
    regenerated = tmp_path / "again"
    assert pubswap(["report", str(out / "runs" / "fedavg-s7"), str(out / "runs" / "balanced-s7"), "--out",
                    str(regenerated)]) == 0
    again = _table((regenerated / "report.md").read_text())
    assert again["fedavg"][3:7] == table["fedavg"][3:7] and again["balanced"][3:7] == table["balanced"][3:7]


def test_report_interval_is_the_t_interval_over_seeds(tmp_path):
    from pubswap_flwr.report import write_report

    runs = []
    for seed, accuracy in ((0, 0.2), (1, 0.3), (2, 0.7)):
        run = tmp_path / "runs" / f"solo-s{seed}"
        run.mkdir(parents=True)
        rows = [{"round": 0, "mode": "fedavg", "eval": {"greedy_accuracy": 0.1, "per_task": {}}},
                {"round": 1, "mode": "fedavg", "train_reward": 0.5, "cumulative_reward": 0.5,
                 "clients": {"1": {"train_reward": 0.4}, "2": {"train_reward": 0.6}},
                 "eval": {"greedy_accuracy": accuracy, "sampled_accuracy": accuracy / 2, "sampled_reward": 0.3,
                          "per_task": {"gcd": {"greedy_accuracy": accuracy, "sampled_accuracy": 0.1}}},
                 "time": {"round_s": 2.0}, "bytes": {"sent_by_clients": 1_000_000, "received_by_clients": 500_000}}]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        runs.append(run)
    report = write_report(tmp_path / "out", runs).read_text()
    cells = _table(report)["solo"]
    mean, half = statistics.fmean([0.2, 0.3, 0.7]), 4.302652729911275 * statistics.stdev([0.2, 0.3, 0.7]) / 3 ** 0.5
    assert cells[3] == f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]" == "0.400 [-0.257, 1.057]"
    assert cells[9] == "1.500 [1.500, 1.500]"
    assert re.search(r"\| solo \| 0\.100 \[0\.100, 0\.100\] \(0\.400\) \|", report)
