"""Report statistics: Student t quantiles, the t interval of a mean (n/a for one value), and paired differences
between arms by seed (a seed run by only one arm left out and named)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pubswap_flwr.report import (
    PairedDifference,
    RunSummary,
    fmt_ci,
    mean_ci,
    paired_band,
    paired_differences,
    t_quantile,
    t_two_sided_cdf,
)

# 0.975 quantiles of Student's t (scipy.stats.t.ppf(0.975, df), to 15 digits)
T975 = {1: 12.706204736174707, 2: 4.302652729911275, 3: 3.182446305284263, 4: 2.7764451051977987,
        5: 2.570581835636314, 9: 2.2621571627409915, 10: 2.2281388519649385, 29: 2.045229642132703,
        30: 2.0422724563012373, 100: 1.983971518523552}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_the_tables(df):
    assert t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-8)


def test_t_quantile_other_levels_and_cdf():
    assert t_quantile(0.995, 7) == pytest.approx(3.4994832973505, abs=1e-8)
    assert t_quantile(0.95, 1) == pytest.approx(6.313751514675, abs=1e-8)
    assert t_two_sided_cdf(0.0, 3) == 0.0
    assert t_two_sided_cdf(T975[4], 4) == pytest.approx(0.95, abs=1e-12)
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)
    with pytest.raises(ValueError):
        t_two_sided_cdf(1.0, 0)


def test_interval_of_one_two_three_is_two_plus_minus_t2_over_sqrt3():
    interval = mean_ci([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # sample SD of [1, 2, 3] is exactly 1
    assert interval.n == 3 and interval.mean == 2.0 and interval.sd == 1.0
    assert interval.low == pytest.approx(2.0 - half, abs=1e-9)  # -0.48414...
    assert interval.high == pytest.approx(2.0 + half, abs=1e-9)  # 4.48414...
    assert fmt_ci(interval) == "2.000 [-0.484, 4.484]"


def test_interval_of_two_values_uses_one_degree_of_freedom():
    interval = mean_ci([0.2, 0.4])
    half = 12.706204736174707 * (math.sqrt(0.02) / math.sqrt(2))  # SD = 0.1414..., SE = 0.1
    assert interval.mean == pytest.approx(0.3)
    assert (interval.low, interval.high) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert half == pytest.approx(1.2706204736174707)


def test_one_seed_has_no_interval_and_says_so():
    interval = mean_ci([0.269])
    assert interval.n == 1 and not interval.has_interval
    assert fmt_ci(interval) == "0.269 [n/a]"
    assert "±" not in fmt_ci(interval) and "0.000" not in fmt_ci(interval)
    assert fmt_ci(mean_ci([])) == "–"
    assert fmt_ci(mean_ci([float("nan"), None, 0.5])) == "0.500 [n/a]"  # missing values are left out


def test_signed_format_of_differences():
    assert fmt_ci(mean_ci([-0.03, -0.01]), signed=True) == "-0.020 [-0.147, +0.107]"
    assert fmt_ci(mean_ci([0.0]), signed=True) == "0.000 [n/a]"


def _run(arm: str, seed: int, sampled: float, cumulative: float, curve: list[float]) -> RunSummary:
    rows = [{"round": r, "train_reward": v, "eval": {"sampled_accuracy": sampled}} for r, v in enumerate(curve)]
    values = {"sampled_accuracy": sampled, "greedy_accuracy": sampled + 0.1, "sampled_reward": sampled / 2,
              "cumulative_reward": cumulative}
    return RunSummary(arm, seed, Path(f"runs/{arm}-s{seed}"), "fedavg", values, {}, rows)


def _sweep() -> dict[str, list[RunSummary]]:
    """2 arms x 3 seeds; the baseline lacks seed 3 and the treatment lacks seed 2."""
    return {
        "base": [_run("base", 0, 0.20, 1.0, [0.1, 0.2]), _run("base", 1, 0.30, 2.0, [0.1, 0.3]),
                 _run("base", 2, 0.90, 9.0, [0.9, 0.9])],
        "treat": [_run("treat", 0, 0.25, 1.5, [0.1, 0.4]), _run("treat", 1, 0.40, 2.2, [0.1, 0.4]),
                  _run("treat", 3, 0.00, 0.0, [0.0, 0.0])],
    }


def test_paired_differences_pair_by_seed_and_leave_unpaired_seeds_out():
    [pair] = paired_differences(_sweep(), "base")
    assert isinstance(pair, PairedDifference)
    assert (pair.arm, pair.baseline, pair.seeds) == ("treat", "base", [0, 1])
    assert pair.only_arm == [3] and pair.only_baseline == [2]
    assert pair.per_seed["sampled_accuracy"] == {0: pytest.approx(0.05), 1: pytest.approx(0.10)}
    assert pair.per_seed["cumulative_reward"] == {0: pytest.approx(0.5), 1: pytest.approx(0.2)}
    # paired t over 2 seeds: mean 0.075, SD of [0.05, 0.10] = 0.035355..., SE = 0.025, t(0.975, 1) = 12.7062
    interval = pair.intervals["sampled_accuracy"]
    assert interval.n == 2 and interval.mean == pytest.approx(0.075)
    assert interval.low == pytest.approx(0.075 - 12.706204736174707 * 0.025)
    assert interval.high == pytest.approx(0.075 + 12.706204736174707 * 0.025)
    cumulative = pair.intervals["cumulative_reward"]
    assert cumulative.mean == pytest.approx(0.35)
    assert cumulative.high - cumulative.mean == pytest.approx(12.706204736174707 * 0.15)


def test_paired_differences_against_another_baseline_and_an_unknown_one():
    [pair] = paired_differences(_sweep(), "treat")
    assert pair.arm == "base" and pair.per_seed["sampled_accuracy"] == {0: pytest.approx(-0.05),
                                                                         1: pytest.approx(-0.10)}
    with pytest.raises(ValueError, match="nope"):
        paired_differences(_sweep(), "nope")


def test_paired_difference_curve_per_round():
    arms = _sweep()
    rounds, intervals = paired_band(arms["treat"], arms["base"], lambda r: r.get("train_reward"))
    assert rounds == [0, 1]
    assert intervals[0].mean == pytest.approx(0.0) and intervals[0].n == 2  # seeds 0 and 1 only
    assert intervals[1].mean == pytest.approx(0.15)  # (0.2 + 0.1) / 2
    assert intervals[1].low == pytest.approx(0.15 - 12.706204736174707 * 0.05)


def test_the_report_names_the_runs_sampling_temperature(tmp_path):
    import json

    from pubswap_flwr.report.markdown import _sampled_description
    from pubswap_flwr.report.summaries import summarize_run

    runs = []
    for name, temperature in (("a-s0", 0.7), ("a-s1", 0.7)):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"round": 0, "mode": "fedavg", "eval": {"samples": 4}}) + "\n")
        (run / "config.json").write_text(json.dumps({"config": {"generation.temperature": temperature}}))
        runs.append(summarize_run(run))
    assert "n = 4 T=0.7 samples" in _sampled_description(runs)
    (tmp_path / "a-s1" / "config.json").unlink()
    mixed = [runs[0], summarize_run(tmp_path / "a-s1")]
    assert "T=0.7 samples" in _sampled_description(mixed)
    (tmp_path / "a-s0" / "config.json").unlink()
    assert "T=1 samples" in _sampled_description([summarize_run(tmp_path / "a-s0")])
