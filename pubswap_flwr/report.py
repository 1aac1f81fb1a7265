"""Comparison report from run directories' metrics.jsonl alone: report.md and PNG plots.

report.md: per arm, the mean over seeds with its 95% confidence interval (Student t, n-1 degrees of freedom; "n/a"
with one seed), wall time as the median and range over seeds; each arm minus a baseline arm paired by seed (arms of a
sweep see the same question streams and held-out items for a given seed), with the paired-t interval of the mean
difference; every run's final numbers (with the standard error of its held-out sampled pass@1 over items when the
metrics carry one); a per-task breakdown; failures. Plots: held-out accuracy, reward per round, cumulative reward,
client drift, bytes per round (each with a 95% CI band over seeds, one fixed colour and marker per arm in every
figure, in the sweep's order of the arms; one line style per arm where arms draw the same line), and the per-round
paired difference to the baseline (its band: the 95% CI of the paired mean difference over seeds). A figure or
panel no arm has data for is left out.

An existing report.md is never replaced unless `force` is given; a regenerated report keeps the title, notes and
the command that made the runs from the summary.json the previous one left, unless new ones are given.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from .metrics import STATUS_FILE, json_safe, read_metrics
from . import metrics_schema as schema
from .metrics_schema import WELL_FORMED_WARNING

RUN_NAME = re.compile(r"^(?P<arm>.+)-s(?P<seed>\d+)$")
DEFAULT_TITLE = "pubswap-flwr comparison"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
HEADLINE = [  # (column title, key in RunSummary.values)
    ("greedy pass@1", "greedy_accuracy"),
    ("sampled acc", "sampled_accuracy"),
    ("sampled reward", "sampled_reward"),
    ("cumulative reward", "cumulative_reward"),
    ("rounds", "rounds"),
    ("wall time (s), median (range)", "wall_s"),
    ("MB on the wire", "megabytes"),
]
WALL = "wall_s"  # reported as median and range over seeds, not as a mean with a t interval
PAIRED = [  # the metrics each arm is compared to the baseline on, seed by seed
    ("sampled acc", "sampled_accuracy"),
    ("greedy pass@1", "greedy_accuracy"),
    ("sampled reward", "sampled_reward"),
    ("cumulative reward", "cumulative_reward"),
]
# Every figure a report may write; one no arm has data for is not written (and a stale copy is removed).
PLOT_NAMES = ("heldout_accuracy", "reward", "cumulative_reward", "paired_difference", "drift", "bytes")
CONFIDENCE = 0.95
NAN = float("nan")


class ReportExistsError(FileExistsError):
    """report.md is already there and overwriting was not asked for."""


# ----------------------------------------------------------------------------------------------- statistics

def t_two_sided_cdf(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer number of degrees of freedom (closed form, Abramowitz &
    Stegun 26.7.3-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        series, term = 1.0, 1.0
        for k in range(1, (df - 3) // 2 + 1):  # 1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...
            term *= (2 * k) / (2 * k + 1) * cos2
            series += term
        inner = theta + (sin * math.cos(theta) * series if df > 1 else 0.0)
        return min(1.0, 2.0 / math.pi * inner)
    series, term = 1.0, 1.0
    for k in range(1, (df - 2) // 2 + 1):  # 1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...
        term *= (2 * k - 1) / (2 * k) * cos2
        series += term
    return min(1.0, sin * series)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom, e.g. t_quantile(0.975, 2) =
    4.3027; by bisection on the closed-form CDF, to about 1e-12."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    coverage = 2 * p - 1
    low, high = 0.0, 1.0
    while t_two_sided_cdf(high, df) < coverage:
        low, high = high, high * 2
    for _ in range(200):
        mid = (low + high) / 2
        if t_two_sided_cdf(mid, df) < coverage:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """Mean of n values with its two-sided confidence interval (Student t, n-1 df); low/high are NaN for n < 2."""

    mean: float
    low: float
    high: float
    n: int
    sd: float = NAN

    @property
    def has_interval(self) -> bool:
        return self.n >= 2


def _finite(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and v == v]


def mean_ci(values: Iterable[float | None], confidence: float = CONFIDENCE) -> Interval:
    """Mean and its t confidence interval over the values (None and NaN left out)."""
    clean = _finite(values)
    n = len(clean)
    if n == 0:
        return Interval(NAN, NAN, NAN, 0)
    mean = statistics.fmean(clean)
    if n == 1:
        return Interval(mean, NAN, NAN, 1)
    sd = statistics.stdev(clean)
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd)


def _num(value: float, digits: int, signed: bool) -> str:
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return "0." + "0" * digits if signed and float(text) == 0 and digits > 0 else text


def fmt_ci(interval: Interval, digits: int = 3, signed: bool = False) -> str:
    """`mean [low, high]`; `mean [n/a]` from one value (no interval can be estimated); `–` from none."""
    if interval.n == 0:
        return "–"
    mean = _num(interval.mean, digits, signed)
    if not interval.has_interval:
        return f"{mean} [n/a]"
    return f"{mean} [{_num(interval.low, digits, signed)}, {_num(interval.high, digits, signed)}]"


# ----------------------------------------------------------------------------------------------- runs

@dataclass
class RunSummary:
    arm: str
    seed: int
    run_dir: Path
    mode: str
    values: dict[str, float]
    per_task: dict[str, dict[str, float]]
    rows: list[dict] = field(repr=False)


def arm_and_seed(run_dir: Path) -> tuple[str, int]:
    match = RUN_NAME.match(run_dir.name)
    if not match:
        return run_dir.name, 0
    return match["arm"], int(match["seed"])


def _get(mapping: dict, key: str) -> float:
    value = mapping.get(key)
    return NAN if value is None else float(value)


def summarize_run(run_dir: Path) -> RunSummary:
    """The headline numbers of one run, all from its metrics.jsonl (and status.json's elapsed time if present).
    `sampled_accuracy_se` and `samples` are NaN when the run's evaluation did not record them (older metrics)."""
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}: metrics.jsonl is empty")
    evaluated = [r for r in rows if r.get("eval")]
    final = evaluated[-1]["eval"] if evaluated else {}
    trained = [r for r in rows if r["round"] > 0]
    wall = sum(r["time"]["round_s"] for r in trained if "time" in r)
    status = run_dir / STATUS_FILE
    if status.is_file():
        wall = float(json.loads(status.read_text()).get("elapsed_s") or wall)
    values = {
        "greedy_accuracy": _get(final, "greedy_accuracy"),
        "sampled_accuracy": _get(final, "sampled_accuracy"),
        "sampled_accuracy_se": _get(final, "sampled_accuracy_se"),
        "samples": _get(final, "samples"),
        "sampled_reward": _get(final, "sampled_reward"),
        "cumulative_reward": trained[-1].get("cumulative_reward", 0.0) if trained else 0.0,
        "rounds": float(max(r["round"] for r in rows)),
        "wall_s": wall,
        "megabytes": sum(r["bytes"]["sent_by_clients"] + r["bytes"]["received_by_clients"]
                         for r in trained if "bytes" in r) / 1e6,
    }
    values.update(format_health(trained))
    arm, seed = arm_and_seed(run_dir)
    return RunSummary(arm, seed, run_dir, rows[-1].get("mode", "?"), values, final.get("per_task", {}), rows)


def format_health(trained: list[dict]) -> dict[str, float]:
    """How well clients kept the <answer>...</answer> format in their own samples (`well_formed` per client per
    round): the mean over clients in the last round that recorded it, and how many client-rounds fell below the
    warning threshold (the first sign of a collapse, which the server also logs). NaN / 0 without the field."""
    shares = [(r["round"], c["well_formed"]) for r in trained for c in r.get("clients", {}).values()
              if isinstance(c.get("well_formed"), (int, float))]
    if not shares:
        return {"well_formed_last": NAN, "format_breaks": 0.0, "format_client_rounds": 0.0}
    last = max(number for number, _ in shares)
    return {"well_formed_last": statistics.fmean(v for number, v in shares if number == last),
            "format_breaks": float(sum(v < WELL_FORMED_WARNING for _, v in shares)),
            "format_client_rounds": float(len(shares))}


def group(runs: list[RunSummary]) -> dict[str, list[RunSummary]]:
    """Runs by arm, arms in the order first given (a sweep's own order), seeds ascending within an arm."""
    arms: dict[str, list[RunSummary]] = {}
    for run in runs:
        arms.setdefault(run.arm, []).append(run)
    return {arm: sorted(members, key=lambda r: r.seed) for arm, members in arms.items()}


# ----------------------------------------------------------------------------------------------- paired differences

@dataclass
class PairedDifference:
    """One arm minus the baseline on the same seeds."""

    arm: str
    baseline: str
    seeds: list[int]                            # seeds both arms ran
    only_arm: list[int]                         # seeds left out: run by the arm only
    only_baseline: list[int]                    # ... by the baseline only
    per_seed: dict[str, dict[int, float]]       # metric -> seed -> arm - baseline
    intervals: dict[str, Interval]              # metric -> mean difference with its paired-t interval


def paired_differences(arms: dict[str, list[RunSummary]], baseline: str,
                       metrics: Iterable[str] = tuple(key for _, key in PAIRED)) -> list[PairedDifference]:
    """Every other arm minus `baseline`, seed by seed; seeds present in only one of the two are left out (and
    named). A seed whose value is missing (NaN) in either arm is left out of that metric only."""
    if baseline not in arms:
        raise ValueError(f"baseline arm {baseline!r} has no runs; arms: {list(arms)}")
    base = {r.seed: r for r in arms[baseline]}
    out = []
    for arm, members in arms.items():
        if arm == baseline:
            continue
        mine = {r.seed: r for r in members}
        seeds = sorted(set(mine) & set(base))
        per_seed: dict[str, dict[int, float]] = {}
        for key in metrics:
            diffs = {s: mine[s].values[key] - base[s].values[key] for s in seeds}
            per_seed[key] = {s: d for s, d in diffs.items() if d == d}
        out.append(PairedDifference(arm, baseline, seeds, sorted(set(mine) - set(base)),
                                    sorted(set(base) - set(mine)), per_seed,
                                    {key: mean_ci(values.values()) for key, values in per_seed.items()}))
    return out


# ----------------------------------------------------------------------------------------------- curves

Pick = Callable[[dict], "float | None"]


def _series(rows: list[dict], pick: Pick) -> dict[int, float]:
    out = {}
    for r in rows:
        value = pick(r)
        if value is not None and value == value:
            out[r["round"]] = float(value)
    return out


def band(runs: list[RunSummary], pick: Pick) -> tuple[list[int], list[Interval]]:
    """Per round, the mean over seeds with its 95% CI (over the seeds that have a value that round)."""
    per_round: dict[int, list[float]] = {}
    for run in runs:
        for rnd, value in _series(run.rows, pick).items():
            per_round.setdefault(rnd, []).append(value)
    rounds = sorted(per_round)
    return rounds, [mean_ci(per_round[r]) for r in rounds]


def paired_band(runs: list[RunSummary], baseline_runs: list[RunSummary],
                pick: Pick) -> tuple[list[int], list[Interval]]:
    """Per round, the arm-minus-baseline difference on each shared seed, averaged over seeds with its 95% CI."""
    base = {r.seed: _series(r.rows, pick) for r in baseline_runs}
    per_round: dict[int, list[float]] = {}
    for run in runs:
        if run.seed not in base:
            continue
        for rnd, value in _series(run.rows, pick).items():
            if rnd in base[run.seed]:
                per_round.setdefault(rnd, []).append(value - base[run.seed][rnd])
    rounds = sorted(per_round)
    return rounds, [mean_ci(per_round[r]) for r in rounds]


def _eval(key: str) -> Pick:
    return lambda r: (r.get(schema.EVAL) or {}).get(key)


def _megabytes(row: dict) -> float | None:
    if "bytes" not in row or row["round"] == 0:
        return None
    return (row["bytes"]["sent_by_clients"] + row["bytes"]["received_by_clients"]) / 1e6


PICKS: dict[str, Pick] = {
    schema.SAMPLED_ACCURACY: _eval(schema.SAMPLED_ACCURACY),
    schema.GREEDY_ACCURACY: _eval(schema.GREEDY_ACCURACY),
    schema.TRAIN_REWARD: lambda r: r.get(schema.TRAIN_REWARD),
    schema.CUMULATIVE_REWARD: lambda r: r.get(schema.CUMULATIVE_REWARD) if r[schema.ROUND] > 0 else None,
    schema.PARAMETER_DRIFT: lambda r: r.get(schema.PARAMETER_DRIFT),
    "policy_disagreement": lambda r: (r.get(schema.SWAP) or {}).get("policy_disagreement"),
    "megabytes": _megabytes,
}


# ----------------------------------------------------------------------------------------------- plots

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")  # matplotlib's tab10
PALETTE_NAMES = ("blue", "orange", "green", "red", "purple", "brown", "pink", "grey", "olive", "cyan")


def arm_colours(arm_names: Iterable[str]) -> dict[str, str]:
    """A fixed colour per arm by its position in the sweep, used by every panel of every figure."""
    names = list(dict.fromkeys(arm_names))
    if len(names) <= len(PALETTE):
        return {arm: PALETTE[i] for i, arm in enumerate(names)}
    import matplotlib

    cmap = matplotlib.colormaps["turbo"]
    return {arm: matplotlib.colors.to_hex(cmap(i / (len(names) - 1))) for i, arm in enumerate(names)}


def _colour_name(colour: str) -> str:
    return PALETTE_NAMES[PALETTE.index(colour)] if colour in PALETTE else colour


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
MARKER_NAMES = {"o": "circles", "s": "squares", "^": "triangles", "D": "diamonds", "v": "down triangles",
                "P": "pluses", "X": "crosses", "*": "stars", "<": "left triangles", ">": "right triangles"}
LINESTYLES = ("-", "--", ":", "-.")  # in figures whose arms often draw the same line (bytes per round)
MARKED_POINTS = 12  # markers per curve of a long run, each arm's at other rounds than the others'


@dataclass(frozen=True)
class ArmStyle:
    """How one arm is drawn in every figure: its colour and marker (and line style where lines coincide); `phase`
    shifts its markers along a long curve so that arms drawing the same line still show each marker."""

    colour: str
    marker: str
    linestyle: str
    phase: float


def arm_styles(arm_names: Iterable[str]) -> dict[str, ArmStyle]:
    """A fixed style per arm by its position in the sweep."""
    names = list(dict.fromkeys(arm_names))
    colours = arm_colours(names)
    return {arm: ArmStyle(colours[arm], MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)],
                          i / max(1, len(names))) for i, arm in enumerate(names)}


def _draw(ax, rounds: list[int], intervals: list[Interval], style: ArmStyle, label: str, gid: str,
          linestyle: str = "-") -> None:
    """The mean curve with the arm's markers (every round of a short run, MARKED_POINTS of a long one), and the 95%
    CI band where at least two seeds give the round a value."""
    means = [iv.mean for iv in intervals]
    step = max(1, math.ceil(len(rounds) / MARKED_POINTS))
    markevery = None if step == 1 else (int(style.phase * step), step)
    ax.plot(rounds, means, color=style.colour, label=label, linestyle=linestyle, marker=style.marker,
            markersize=3.5 if step == 1 else 4.5, markevery=markevery, gid=gid)
    if any(iv.has_interval for iv in intervals):
        fill = ax.fill_between(rounds, [iv.low for iv in intervals], [iv.high for iv in intervals],
                               color=style.colour, alpha=0.15, linewidth=0)
        fill.set_gid(gid)


def _band_note(arms: dict[str, list[RunSummary]]) -> str:
    seeds = {len(members) for members in arms.values()}
    if seeds == {1}:
        return "one seed per arm: no interval"
    return "band: 95% CI over seeds"


def write_plots(out: Path, arms: dict[str, list[RunSummary]], baseline: str | None = None,
                styles: dict[str, ArmStyle] | None = None) -> list[tuple[Path, str]]:
    """The report's figures under out/plots/, each with a one-line caption; a figure no arm has data for is
    not written, and a panel no arm has data for is left out of its figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = styles or arm_styles(arms)
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Path, str]] = []
    note = _band_note(arms)

    def curves(key: str) -> dict[str, tuple[list[int], list[Interval]]]:
        found = {arm: band(runs, PICKS[key]) for arm, runs in arms.items()}
        return {arm: curve for arm, curve in found.items() if curve[0]}

    def figure(panels: list[tuple[str, str, str, dict]], name: str, caption: str, *, from_zero: bool = False,
               sharey: bool = False, zero_line: str | None = None, suptitle: str | None = None,
               arm_linestyles: bool = False) -> None:
        """panels: (title, y label, line style, {arm: curve}); panels without curves are left out. With
        `arm_linestyles` each arm has its own line style (arms that draw the same line stay visible)."""
        panels = [p for p in panels if p[3]]
        if not panels:
            return
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 0.8, 4.4 if suptitle else 4),
                                 sharey=sharey, squeeze=False)
        if suptitle:
            fig.suptitle(suptitle, fontsize=9)
        for index, (ax, (title, ylabel, linestyle, found)) in enumerate(zip(axes[0], panels)):
            if zero_line is not None:
                ax.axhline(0.0, color="black", linewidth=0.9, linestyle="--", label=zero_line)
            for arm, (rounds, intervals) in found.items():
                _draw(ax, rounds, intervals, styles[arm], arm, arm,
                      styles[arm].linestyle if arm_linestyles else linestyle)
            ax.set(xlabel="round", ylabel=ylabel, title=title)
            if from_zero:
                top = max(max(iv.high if iv.has_interval else iv.mean for iv in intervals)
                          for _, intervals in found.values())
                ax.set_ylim(0, top * 1.12 if top > 0 else 1)
            ax.grid(alpha=0.25)
            # Colours are fixed per arm, so one legend (in the first panel) serves the figure, unless another
            # panel shows arms the first one lacks.
            if index == 0 or set(found) - set(panels[0][3]):
                ax.legend(fontsize=7)
        written.append((_save(fig, plots / f"{name}.png"), caption))

    figure([(f"Held-out sampled accuracy ({note})", "sampled pass@1", "-", curves("sampled_accuracy")),
            (f"Held-out greedy pass@1 ({note})", "greedy pass@1", "-", curves("greedy_accuracy"))],
           "heldout_accuracy", "held-out sampled accuracy and greedy pass@1 at each evaluated round, mean over "
           f"seeds ({note})", sharey=True)
    figure([(f"Training reward per round ({note})", "mean reward of the clients' own rollouts", "-",
             curves("train_reward"))], "reward",
           f"training reward per round (mean over clients of their own rollouts), mean over seeds ({note})")
    figure([(f"Cumulative training reward ({note})", "sum over rounds of the round's reward", "-",
             curves("cumulative_reward"))], "cumulative_reward",
           f"cumulative training reward (SAPO's headline metric), mean over seeds ({note})")

    if baseline is not None and len(arms) > 1:
        others = {arm: runs for arm, runs in arms.items() if arm != baseline}

        def differences(key: str) -> dict[str, tuple[list[int], list[Interval]]]:
            found = {arm: paired_band(runs, arms[baseline], PICKS[key]) for arm, runs in others.items()}
            return {arm: curve for arm, curve in found.items() if curve[0]}

        paired_n = {len({r.seed for r in runs} & {r.seed for r in arms[baseline]}) for runs in others.values()}
        diff_note = "one seed: no interval" if paired_n <= {0, 1} else \
            "band: 95% CI of the paired mean difference over seeds (paired t, n-1 df)"
        figure([("Held-out sampled accuracy", f"difference to {baseline}", "-", differences("sampled_accuracy")),
                ("Training reward per round", f"difference to {baseline}", "-", differences("train_reward")),
                ("Cumulative training reward", f"difference to {baseline}", "-",
                 differences("cumulative_reward"))],
               "paired_difference", f"each arm minus {baseline} on the same seed, mean over seeds ({diff_note}); "
               "the dashed line is no difference", zero_line=f"{baseline} (zero)",
               suptitle=f"Each arm minus {baseline} on the same seed, mean over seeds; {diff_note}")

    figure([("Parameter-space drift", "mean pairwise L2 of client adapters", "-", curves("parameter_drift")),
            ("Policy-space drift (public prompts)", "pairwise answer disagreement", "-",
             curves("policy_disagreement"))],
           "drift", f"client drift per round, mean over seeds ({note}); arms whose mode does not measure it are "
           "absent (SAPO: the server never sees weights; answers to public prompts exist in pubswap mode only)",
           from_zero=True)
    figure([("Bytes on the wire per round", "MB per round (all clients, both ways)", "-", curves("megabytes"))],
           "bytes", f"MB per round, all clients both ways, mean over seeds ({note}); the y axis starts at 0; arms "
           "that send the same bytes draw the same line, so each arm has its own line style and marker",
           from_zero=True, arm_linestyles=True)
    return written


def _save(fig, path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    for axis in fig.axes:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------- report.md

def read_summary(out: Path) -> dict:
    """The summary.json a previous report left under `out` ({} when there is none or it cannot be read)."""
    try:
        summary = json.loads((out / SUMMARY_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _interval_json(interval: Interval, values: list[float]) -> dict:
    return {"mean": interval.mean, "ci_low": interval.low, "ci_high": interval.high, "n": interval.n,
            "sd": interval.sd, "values": values}


def fmt_spread(values: list[float], digits: int = 1) -> str:
    """`median (min–max)` of the finite values; the value alone from one; `–` from none."""
    clean = sorted(_finite(values))
    if not clean:
        return "–"
    median = f"{statistics.median(clean):.{digits}f}"
    return median if len(clean) == 1 else f"{median} ({clean[0]:.{digits}f}–{clean[-1]:.{digits}f})"


def _spread_json(values: list[float]) -> dict:
    clean = sorted(_finite(values))
    return {"median": statistics.median(clean) if clean else NAN, "min": clean[0] if clean else NAN,
            "max": clean[-1] if clean else NAN, "n": len(clean), "values": values}


def _rounds_cell(values: list[float]) -> str:
    rounds = sorted({int(v) for v in values})
    return str(rounds[0]) if len(rounds) == 1 else f"{rounds[0]}–{rounds[-1]}"


def _sampled_description(runs: list[RunSummary]) -> str:
    counts = sorted({int(r.values["samples"]) for r in runs if r.values["samples"] == r.values["samples"]})
    if not counts:
        return "one T=1 sample per held-out item (fixed seed)"
    n = ", ".join(str(c) for c in counts)
    unrecorded = " (one where not recorded)" if any(r.values["samples"] != r.values["samples"] for r in runs) else ""
    return (f"pass@1 over n = {n}{unrecorded} T=1 samples per held-out item (fixed seed), averaged over items "
            "and samples")


def _describe_unpaired(pairs: list[PairedDifference]) -> list[str]:
    notes = []
    for pair in pairs:
        if pair.only_arm:
            notes.append(f"{pair.arm} seed(s) {', '.join(map(str, pair.only_arm))} (no {pair.baseline} run)")
        if pair.only_baseline:
            notes.append(f"{pair.baseline} seed(s) {', '.join(map(str, pair.only_baseline))} (no {pair.arm} run)")
    return notes


def format_lines(arms: dict[str, list[RunSummary]], summary: dict) -> list[str]:
    """The report's answer-format section (only when the runs recorded `well_formed`); adds it to `summary`."""
    if not any(r.values["format_client_rounds"] for members in arms.values() for r in members):
        return []
    lines = ["", "## Answer format", "",
             "Share of the clients' own samples with exactly one `<answer>...</answer>` and nothing after it: the mean "
             "over clients in the last round (mean over seeds, with the lowest and highest seed: a share, so no t "
             f"interval that could leave [0, 1]), and the client-rounds below "
             f"{WELL_FORMED_WARNING:.0%}, where the server warns that a client's answers may be breaking down.", "",
             "| arm | well-formed, last round | client-rounds below | runs with any |", "|---|---|---|---|"]
    summary["format"] = {}
    for arm, members in arms.items():
        seeds = _finite(r.values["well_formed_last"] for r in members)
        breaks = sum(int(r.values["format_breaks"]) for r in members)
        total = sum(int(r.values["format_client_rounds"]) for r in members)
        broken_runs = sum(r.values["format_breaks"] > 0 for r in members)
        summary["format"][arm] = {"well_formed_last": _interval_json(mean_ci(seeds), seeds),
                                  "client_rounds_below": breaks, "client_rounds": total, "runs_with_any": broken_runs}
        share = "–" if not seeds else f"{statistics.fmean(seeds):.3f}"
        if len(seeds) > 1:
            share += f" ({min(seeds):.3f}–{max(seeds):.3f})"
        lines.append(f"| {arm} | {share} | {breaks} of {total} | {broken_runs} of {len(members)} |")
    return lines


LEARNING = [  # (label, eval key): held-out change from round 0 to the last evaluated round, per arm
    ("greedy strict", "greedy_accuracy"),
    ("greedy lenient", "greedy_lenient_accuracy"),
    ("sampled strict", "sampled_accuracy"),
    ("sampled lenient", "sampled_lenient_accuracy"),
    ("well-formed", "sampled_well_formed"),
]


def learning_lines(arms: dict[str, list[RunSummary]], summary: dict) -> list[str]:
    """'Change since round 0': per arm and metric, round 0, the last evaluated round, and their difference seed by
    seed with its interval (what RL did to the model it started from). Only metrics every run recorded."""
    def ends(run: RunSummary) -> tuple[dict, dict] | None:
        evaluated = [r for r in run.rows if r.get("eval")]
        if len(evaluated) < 2 or evaluated[0]["round"] != 0:
            return None
        return evaluated[0]["eval"], evaluated[-1]["eval"]

    pairs = {arm: [ends(r) for r in members] for arm, members in arms.items()}
    if not pairs or any(p is None for found in pairs.values() for p in found):
        return []
    keys = [(label, key) for label, key in LEARNING
            if all(key in first and key in last for found in pairs.values() for first, last in found)]
    lines = ["", "## Change since round 0", "",
             "Held-out metrics of the model each run started from (round 0: for a real model after its warm-up, "
             "before RL) and of the last evaluated round, mean over seeds, and their difference seed by seed with its "
             f"{CONFIDENCE:.0%} confidence interval (paired t). *lenient*: the tagged answer, else the last number or "
             "word; *strict*: a right answer in the tags (the training reward); *well-formed*: one `<answer>...</answer>` and "
             "nothing after it.", "",
             "| arm | metric | round 0 | last | last − round 0 [95% CI] |", "|---|---|---|---|---|"]
    summary["learning"] = {}
    for arm, found in pairs.items():
        summary["learning"][arm] = {}
        for label, key in keys:
            start = [first[key] for first, _ in found]
            end = [last[key] for _, last in found]
            change = mean_ci(b - a for a, b in zip(start, end))
            summary["learning"][arm][key] = {"round0": statistics.fmean(start), "last": statistics.fmean(end),
                                             "change": _interval_json(change, [b - a for a, b in zip(start, end)])}
            lines.append(f"| {arm} | {label} | {statistics.fmean(start):.3f} | {statistics.fmean(end):.3f} | "
                         f"{fmt_ci(change, 3, True)} |")
    return lines


def provenance_lines(runs: list[RunSummary]) -> tuple[list[str], dict[str, list[str]]]:
    """The report's lines on which code and environment made its runs, with a warning when they differ (also
    between the starts of a resumed run), and {run: [code label of each start]} for summary.json."""
    from .provenance import code_label, environment_label, read

    made_with: dict[str, list[str]] = {}
    environments: dict[str, set[str]] = {}
    for r in runs:
        starts = read(r.run_dir)
        made_with[r.run_dir.name] = [code_label(s) for s in starts]
        environments[r.run_dir.name] = {environment_label(s) for s in starts}
    labels = {label for found in made_with.values() for label in found}
    missing = sorted(name for name, found in made_with.items() if not found)
    envs = {e for found in environments.values() for e in found}
    lines = [""]
    if len(labels) == 1 and not missing:
        lines.append(f"All {len(runs)} run(s) were made by code {next(iter(labels))}"
                     + (f" with {next(iter(envs))}." if len(envs) == 1 else "."))
    elif labels:
        mixed = [name for name, found in made_with.items() if len(set(found)) > 1]
        lines.append("**Warning: these runs were not all made by the same code.** "
                     + "; ".join(f"{label}: {', '.join(n for n, f in made_with.items() if label in f)}"
                                 for label in sorted(labels))
                     + (f"; resumed under different code: {', '.join(mixed)}" if mixed else "")
                     + (f"; no record (made before provenance.json): {', '.join(missing)}" if missing else "") + ".")
    else:
        lines.append("The runs record no provenance (made before runs wrote provenance.json).")
    if len(envs) > 1:
        lines.append("**Warning: the runs' environments differ:** " + "; ".join(sorted(envs)) + ".")
    return lines, made_with


def write_report(out: Path, run_dirs: list[Path], *, failures: dict[tuple[str, int], str] | None = None,
                 title: str | None = None, notes: str | None = None, command: str = "",
                 made_by: str | None = None, baseline: str | None = None, force: bool = False,
                 arm_order: list[str] | None = None) -> Path:
    """report.md + summary.json + plots/ under `out`, from the runs' metrics.jsonl.

    Raises ReportExistsError when out/report.md exists and `force` is not given. `title`, `notes`, `made_by`
    (the command that made the runs, when another one writes this report) and `baseline` default to what the
    previous summary.json recorded, then to the default title, no notes, `command` and the first arm. The arms (their
    colours and markers) follow `arm_order` (the sweep file's, given by `pubswap compare` and publish_results.py; the
    default baseline is then its first arm), then the previous summary's order, then the order the runs are given
    in."""
    out = Path(out)
    report = out / REPORT_FILE
    if report.exists() and not force:
        raise ReportExistsError(f"{report} exists; pass force=True (pubswap report --force) to replace it, or "
                                "write the new report elsewhere (--out)")
    previous = read_summary(out)
    title = title if title is not None else previous.get("title") or DEFAULT_TITLE
    notes = notes if notes is not None else previous.get("notes") or ""
    made_by = made_by if made_by is not None else previous.get("made_by") or command
    runs = [summarize_run(Path(d)) for d in run_dirs]
    arms = group(runs)
    # The sweep's own order, else a regenerated report keeps the previous one's (colours and the default baseline
    # stay put), whatever order a shell glob gives the run directories in.
    order = list(dict.fromkeys([arm for arm in arm_order or [] if arm in arms]
                               + [arm for arm in previous.get("arms") or {} if arm in arms]))
    arms = {arm: arms[arm] for arm in order + [a for a in arms if a not in order]}
    if baseline is None:
        stored = previous.get("baseline")  # a sweep's own report compares with its first arm
        baseline = stored if stored in arms and not arm_order else next(iter(arms), None)
    elif baseline not in arms:
        raise ValueError(f"baseline arm {baseline!r} has no runs; arms: {list(arms)}")
    failures = failures or {}
    out.mkdir(parents=True, exist_ok=True)
    generated = datetime.now(timezone.utc)

    lines = [f"# {title}", ""]
    stamp = f"{generated:%Y-%m-%d %H:%M} UTC from {len(runs)} run(s)"
    if made_by and command and made_by != command:
        lines.append(f"Runs made by `{made_by}`; this report generated {stamp} by `{command}`.")
    else:
        lines.append(f"Generated {stamp}" + (f" by `{command}`" if command else "") + ".")
    if notes:
        lines += ["", notes.strip()]
    code_lines, made_with = provenance_lines(runs)
    lines += code_lines
    lines += ["", f"Each value is the mean over seeds with its {CONFIDENCE:.0%} confidence interval in brackets "
                  "(Student t, n-1 degrees of freedom; *n/a* with a single seed, where no interval can be "
                  "estimated), except wall time: the median over seeds with the range (fastest–slowest) in "
                  "parentheses, since it depends on how loaded the machine was rather than varying around a mean. "
                  "Held-out metrics are from the last evaluated round; *sampled* is "
                  f"{_sampled_description(runs)}.", ""]
    lines.append("| arm | mode | seeds | " + " | ".join(t for t, _ in HEADLINE) + " |")
    lines.append("|---|---|---|" + "---|" * len(HEADLINE))
    summary: dict = {"title": title, "notes": notes, "made_by": made_by, "command": command,
                     "generated": f"{generated:%Y-%m-%d %H:%M} UTC", "confidence": CONFIDENCE,
                     "baseline": baseline, "arms": {}, "paired": {}, "runs": {},
                     "failures": {f"{a}-s{s}": d for (a, s), d in failures.items()}, "provenance": made_with}
    for arm, members in arms.items():
        cells = []
        entry: dict = {"seeds": [r.seed for r in members], "mode": members[0].mode}
        for _, key in HEADLINE:
            values = [r.values[key] for r in members]
            if key == WALL:
                entry[key] = _spread_json(values)
                cells.append(fmt_spread(values))
                continue
            interval = mean_ci(values)
            entry[key] = _interval_json(interval, values)
            cells.append(_rounds_cell(values) if key == "rounds" else fmt_ci(interval, 3))
        summary["arms"][arm] = entry
        lines.append(f"| {arm} | {members[0].mode} | {', '.join(str(r.seed) for r in members)} | "
                     + " | ".join(cells) + " |")
    for arm in sorted({a for a, _ in failures}):
        if arm not in arms:
            lines.append(f"| {arm} | – | – | " + " | ".join("FAILED" for _ in HEADLINE) + " |")

    pairs = paired_differences(arms, baseline) if baseline is not None and len(arms) > 1 else []
    if pairs:
        seeds = sorted({s for p in pairs for s in p.seeds})
        lines += ["", f"## Paired differences against {baseline}", "",
                  f"For a given seed every arm sees the same question streams and held-out items, so each arm is "
                  f"compared with the baseline **{baseline}** seed by seed: arm minus {baseline} per seed, then the "
                  f"mean difference over seeds with its {CONFIDENCE:.0%} confidence interval (paired t, n-1 degrees "
                  "of freedom; *n/a* with one paired seed). An interval that excludes 0 is a difference the seeds "
                  "resolve; one that includes 0 is not."]
        unpaired = _describe_unpaired(pairs)
        if unpaired:
            lines += ["", "Left out of the pairing (a seed run by only one of the two arms): "
                      + "; ".join(unpaired) + "."]
        lines += ["", f"| arm − {baseline} | metric | " + " | ".join(f"s{s}" for s in seeds)
                  + " | mean difference [95% CI] |", "|---|---|" + "---|" * len(seeds) + "---|"]
        for pair in pairs:
            summary["paired"][pair.arm] = {"seeds": pair.seeds, "left_out": {pair.arm: pair.only_arm,
                                                                             baseline: pair.only_baseline}}
            for label, key in PAIRED:
                per_seed = pair.per_seed[key]
                interval = pair.intervals[key]
                summary["paired"][pair.arm][key] = _interval_json(interval, [per_seed[s] for s in sorted(per_seed)])
                cells = [_num(per_seed[s], 3, True) if s in per_seed else "–" for s in seeds]
                lines.append(f"| {pair.arm} | {label} | " + " | ".join(cells) + f" | {fmt_ci(interval, 3, True)} |")

    with_se = any(r.values["sampled_accuracy_se"] == r.values["sampled_accuracy_se"] for r in runs)
    lines += ["", "## Per run", "", "Final numbers of each run (held-out: last evaluated round)."
              + (" *SE* is the run's own standard error of its held-out sampled accuracy over items; *n* is the "
                 "number of samples per item." if with_se else ""), ""]
    columns = ["greedy pass@1", "sampled acc"] + (["SE", "n"] if with_se else []) + [
        "sampled reward", "cumulative reward", "rounds", "wall time (s)", "MB on the wire"]
    lines += ["| run | seed | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]

    def number(value: float, digits: int = 3) -> str:
        return "–" if value != value else f"{value:.{digits}f}"

    for arm, members in arms.items():
        for r in members:
            v = r.values
            cells = [number(v["greedy_accuracy"]), number(v["sampled_accuracy"])]
            if with_se:
                cells += [number(v["sampled_accuracy_se"]), number(v["samples"], 0)]
            cells += [number(v["sampled_reward"]), number(v["cumulative_reward"]), str(int(v["rounds"])),
                      number(v["wall_s"], 1), number(v["megabytes"])]
            lines.append(f"| {r.run_dir.name} | {r.seed} | " + " | ".join(cells) + " |")
            summary["runs"][r.run_dir.name] = {"arm": arm, "seed": r.seed, **v}

    tasks = sorted({t for r in runs for t in r.per_task})
    if tasks:
        lines += ["", "## Per task", "", "Held-out sampled accuracy, mean over seeds [95% CI]; greedy pass@1 "
                  "(mean over seeds) in parentheses.", "",
                  "| arm | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for arm, members in arms.items():
            cells = []
            for task in tasks:
                sampled = mean_ci(r.per_task.get(task, {}).get("sampled_accuracy") for r in members)
                greedy = mean_ci(r.per_task.get(task, {}).get("greedy_accuracy") for r in members)
                cells.append(fmt_ci(sampled) + (f" ({greedy.mean:.3f})" if greedy.n else ""))
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        task_se = any(t.get("sampled_accuracy_se") is not None for r in runs for t in r.per_task.values())
        if task_se:
            lines += ["", "Per run: held-out sampled accuracy ± the run's standard error over the task's items.", "",
                      "| run | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
            for members in arms.values():
                for r in members:
                    cells = []
                    for task in tasks:
                        entry = r.per_task.get(task, {})
                        value, se = entry.get("sampled_accuracy"), entry.get("sampled_accuracy_se")
                        cells.append("–" if value is None else f"{value:.3f}"
                                     + (f" ± {se:.3f}" if se is not None else ""))
                    lines.append(f"| {r.run_dir.name} | " + " | ".join(cells) + " |")

    lines += learning_lines(arms, summary)
    lines += format_lines(arms, summary)
    if failures:
        lines += ["", "## Failed runs", ""]
        for (arm, seed), detail in sorted(failures.items()):
            lines.append(f"- **{arm}** seed {seed}: FAILED — {detail.strip().splitlines()[-1] if detail else ''}")
    styles = arm_styles(arms)
    plots = write_plots(out, arms, baseline, styles) if arms else []
    kept = {path.stem for path, _ in plots}
    for name in PLOT_NAMES:  # a figure this report no longer draws must not linger from an older one
        stale = out / "plots" / f"{name}.png"
        if name not in kept and stale.is_file():
            stale.unlink()
    if plots:
        lines += ["", "## Plots", "", "Colours and markers are fixed per arm across every figure: "
                  + ", ".join(f"{arm} {_colour_name(styles[arm].colour)} {MARKER_NAMES[styles[arm].marker]}"
                              for arm in arms) + "."]
        for path, caption in plots:
            lines += ["", f"**{path.stem}**: {caption}.", "", f"![{path.stem}](plots/{path.name})"]
    lines += ["", "## Runs", ""] + [f"- `{r.run_dir}`" for r in runs]
    summary["plots"] = [f"plots/{p.name}" for p, _ in plots]
    report.write_text("\n".join(lines) + "\n")
    (out / SUMMARY_FILE).write_text(json.dumps(json_safe(summary), indent=2))
    return report
