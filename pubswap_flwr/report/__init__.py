"""Comparison report from run directories' metrics.jsonl alone: report.md and PNG plots.

report.md: per arm, the mean over seeds with its 95% confidence interval (Student t, n-1 degrees of freedom; "n/a"
with one seed), wall time as the median and range over seeds; each arm minus a baseline arm paired by seed (arms of a
sweep see the same question streams and held-out items for a given seed), with the paired-t interval of the mean
difference; every run's final numbers (with the standard error of its held-out sampled pass@1 over items when the
metrics carry one); a per-task breakdown, and where runs recorded each item's result and task (eval_items.jsonl)
each task's paired difference and change since round 0 over seeds x items; the clients' drift at aggregation;
failures. Plots: held-out accuracy, reward per round, cumulative reward, client drift, bytes per round (each with a
95% CI band over seeds, one fixed colour and marker per arm in every figure, in the sweep's order of the arms; one
line style per arm where arms draw the same line), and the per-round paired difference to the baseline (its band:
the 95% CI of the paired mean difference over seeds). A figure or panel no arm has data for is left out.

An existing report.md is never replaced unless `force` is given; a regenerated report keeps the title, notes and
the command that made the runs from the summary.json the previous one left, unless new ones are given.

The package, by job: summaries (one run's numbers from its metrics), statistics (t intervals, paired differences),
curves (per-round means over seeds), plots, formatting (cells and summary.json records), markdown (report.md's
sections; shortcut_lines, task_differences and drift_lines hold three of them) and writer (write_report).
"""

from .curves import PICKS, band, paired_band
from .formatting import fmt_ci, fmt_spread
from .markdown import format_lines, learning_lines, provenance_lines
from .plots import PLOT_NAMES, ArmStyle, arm_colours, arm_styles, write_plots
from .statistics import (
    CONFIDENCE,
    PAIRED,
    Interval,
    PairedDifference,
    mean_ci,
    paired_differences,
    t_quantile,
    t_two_sided_cdf,
)
from .summaries import RunSummary, arm_and_seed, format_health, group, summarize_run
from .writer import DEFAULT_TITLE, REPORT_FILE, SUMMARY_FILE, ReportExistsError, read_summary, write_report

__all__ = ["ArmStyle", "CONFIDENCE", "DEFAULT_TITLE", "Interval", "PAIRED", "PICKS", "PLOT_NAMES", "PairedDifference",
           "REPORT_FILE", "ReportExistsError", "RunSummary", "SUMMARY_FILE", "arm_and_seed", "arm_colours",
           "arm_styles", "band", "fmt_ci", "fmt_spread", "format_health", "format_lines", "group", "learning_lines",
           "mean_ci", "paired_band", "paired_differences", "provenance_lines", "read_summary", "summarize_run",
           "t_quantile", "t_two_sided_cdf", "write_plots", "write_report"]
