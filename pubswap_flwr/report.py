"""Comparison report from run directories' metrics.jsonl alone: report.md (a table per arm with mean ± sample
standard deviation over seeds, per-task breakdown, failures) and PNG plots (held-out accuracy, reward with the
min/max band over clients, client drift, bytes per round)."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .metrics import STATUS_FILE, read_metrics

RUN_NAME = re.compile(r"^(?P<arm>.+)-s(?P<seed>\d+)$")
HEADLINE = [  # (column title, key in RunSummary.values)
    ("greedy pass@1", "greedy_accuracy"),
    ("sampled acc", "sampled_accuracy"),
    ("sampled reward", "sampled_reward"),
    ("cumulative reward", "cumulative_reward"),
    ("rounds", "rounds"),
    ("wall time (s)", "wall_s"),
    ("MB on the wire", "megabytes"),
]


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


def summarize_run(run_dir: Path) -> RunSummary:
    """The headline numbers of one run, all from its metrics.jsonl (and status.json's elapsed time if present)."""
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
        "greedy_accuracy": final.get("greedy_accuracy", float("nan")),
        "sampled_accuracy": final.get("sampled_accuracy", float("nan")),
        "sampled_reward": final.get("sampled_reward", float("nan")),
        "cumulative_reward": trained[-1].get("cumulative_reward", 0.0) if trained else 0.0,
        "rounds": float(max(r["round"] for r in rows)),
        "wall_s": wall,
        "megabytes": sum(r["bytes"]["sent_by_clients"] + r["bytes"]["received_by_clients"]
                         for r in trained if "bytes" in r) / 1e6,
    }
    arm, seed = arm_and_seed(run_dir)
    return RunSummary(arm, seed, run_dir, rows[-1].get("mode", "?"), values, final.get("per_task", {}), rows)


def mean_sd(values: list[float]) -> tuple[float, float]:
    clean = [v for v in values if v == v]  # drop NaN
    if not clean:
        return float("nan"), float("nan")
    return statistics.fmean(clean), statistics.stdev(clean) if len(clean) > 1 else 0.0


def fmt(mean: float, sd: float, digits: int = 3) -> str:
    if mean != mean:
        return "–"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def group(runs: list[RunSummary]) -> dict[str, list[RunSummary]]:
    """Runs by arm, arms in the order first given (a sweep's own order), seeds ascending within an arm."""
    arms: dict[str, list[RunSummary]] = {}
    for run in runs:
        arms.setdefault(run.arm, []).append(run)
    return {arm: sorted(members, key=lambda r: r.seed) for arm, members in arms.items()}


def _series(rows: list[dict], pick) -> dict[int, float]:
    out = {}
    for r in rows:
        value = pick(r)
        if value is not None:
            out[r["round"]] = float(value)
    return out


def _client_rewards(row: dict) -> list[float]:
    """Each client's reward on its own rollouts this round (private steps; SAPO: its B x L rollouts)."""
    rewards = []
    for client in row.get("clients", {}).values():
        value = client.get("train_reward", client.get("rollout_reward"))
        if value is not None:
            rewards.append(value)
    return rewards


def _mean_curve(runs: list[RunSummary], pick) -> tuple[list[int], list[float]]:
    per_round: dict[int, list[float]] = {}
    for run in runs:
        for rnd, value in _series(run.rows, pick).items():
            per_round.setdefault(rnd, []).append(value)
    rounds = sorted(per_round)
    return rounds, [statistics.fmean(per_round[r]) for r in rounds]


def write_plots(out: Path, arms: dict[str, list[RunSummary]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, runs in arms.items():
        x, y = _mean_curve(runs, lambda r: (r.get("eval") or {}).get("sampled_accuracy"))
        line = ax.plot(x, y, marker="o", label=f"{arm} sampled")[0]
        x, y = _mean_curve(runs, lambda r: (r.get("eval") or {}).get("greedy_accuracy"))
        ax.plot(x, y, linestyle="--", color=line.get_color(), label=f"{arm} greedy")
    ax.set(xlabel="round", ylabel="held-out accuracy (mean over seeds)", title="Held-out accuracy")
    ax.legend(fontsize=7, ncol=2)
    written.append(_save(fig, plots / "heldout_accuracy.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, runs in arms.items():
        x, y = _mean_curve(runs, lambda r: r.get("train_reward"))
        line = ax.plot(x, y, label=arm)[0]
        _, low = _mean_curve(runs, lambda r: min(_client_rewards(r)) if _client_rewards(r) else None)
        _, high = _mean_curve(runs, lambda r: max(_client_rewards(r)) if _client_rewards(r) else None)
        if len(low) == len(x) and len(high) == len(x):
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
    ax.set(xlabel="round", ylabel="training reward", title="Reward per round (band: min/max over clients)")
    ax.legend(fontsize=8)
    written.append(_save(fig, plots / "reward.png"))

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for arm, runs in arms.items():
        x, y = _mean_curve(runs, lambda r: r.get("parameter_drift"))
        if x:
            left.plot(x, y, marker=".", label=arm)
        x, y = _mean_curve(runs, lambda r: (r.get("swap") or {}).get("policy_disagreement"))
        if x:
            right.plot(x, y, marker=".", label=arm)
    left.set(xlabel="round", ylabel="mean pairwise L2 of client adapters", title="Parameter-space drift")
    right.set(xlabel="round", ylabel="pairwise answer disagreement", title="Policy-space drift (public prompts)")
    empty_reasons = ((left, "not measured:\nin sapo mode the server never sees weights"),
                     (right, "not measured:\nanswers to public prompts exist in pubswap mode only"))
    for axis, reason in empty_reasons:
        if axis.lines:
            axis.legend(fontsize=8)
        else:
            axis.text(0.5, 0.5, reason, ha="center", va="center", transform=axis.transAxes, fontsize=9)
            axis.set(xticks=[], yticks=[])
    written.append(_save(fig, plots / "drift.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, runs in arms.items():
        x, y = _mean_curve(runs, lambda r: (r["bytes"]["sent_by_clients"] + r["bytes"]["received_by_clients"]) / 1e6
                           if "bytes" in r else None)
        ax.plot(x, y, marker=".", label=arm)
    ax.set(xlabel="round", ylabel="MB per round (all clients, both ways)", title="Bytes on the wire")
    ax.legend(fontsize=8)
    written.append(_save(fig, plots / "bytes.png"))
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


def write_report(out: Path, run_dirs: list[Path], *, failures: dict[tuple[str, int], str] | None = None,
                 title: str = "pubswap-flwr comparison", notes: str = "", command: str = "") -> Path:
    """report.md + summary.json + plots/ under `out`, from the runs' metrics.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [summarize_run(Path(d)) for d in run_dirs]
    arms = group(runs)
    failures = failures or {}
    lines = [f"# {title}", ""]
    lines.append(f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from {len(runs)} run(s)"
                 + (f" by `{command}`" if command else "") + ".")
    if notes:
        lines += ["", notes.strip()]
    lines += ["", "Values are mean ± sample standard deviation over seeds; held-out metrics are from the last "
                  "evaluated round. *Sampled* is one T=1 sample per held-out item (fixed seed).", ""]
    lines.append("| arm | mode | seeds | " + " | ".join(title for title, _ in HEADLINE) + " |")
    lines.append("|---|---|---|" + "---|" * len(HEADLINE))
    summary: dict = {"arms": {}, "failures": {f"{a}-s{s}": d for (a, s), d in failures.items()}}
    for arm, members in arms.items():
        cells = []
        summary["arms"][arm] = {"seeds": [r.seed for r in members], "mode": members[0].mode}
        for _, key in HEADLINE:
            mean, sd = mean_sd([r.values[key] for r in members])
            summary["arms"][arm][key] = {"mean": mean, "sd": sd, "values": [r.values[key] for r in members]}
            digits = 1 if key in ("wall_s", "rounds") else 3
            cells.append(fmt(mean, sd, digits))
        lines.append(f"| {arm} | {members[0].mode} | {', '.join(str(r.seed) for r in members)} | "
                     + " | ".join(cells) + " |")
    failed_arms = sorted({a for a, _ in failures})
    for arm in failed_arms:
        if arm not in arms:
            lines.append(f"| {arm} | – | – | " + " | ".join("FAILED" for _ in HEADLINE) + " |")
    tasks = sorted({t for r in runs for t in r.per_task})
    if tasks:
        lines += ["", "## Per task: held-out sampled accuracy (greedy pass@1 in brackets)", "",
                  "| arm | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for arm, members in arms.items():
            cells = []
            for task in tasks:
                sampled = mean_sd([r.per_task.get(task, {}).get("sampled_accuracy", float("nan")) for r in members])
                greedy = mean_sd([r.per_task.get(task, {}).get("greedy_accuracy", float("nan")) for r in members])
                cells.append(f"{fmt(*sampled)} ({greedy[0]:.3f})" if greedy[0] == greedy[0] else fmt(*sampled))
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    if failures:
        lines += ["", "## Failed runs", ""]
        for (arm, seed), detail in sorted(failures.items()):
            lines.append(f"- **{arm}** seed {seed}: FAILED — {detail.strip().splitlines()[-1] if detail else ''}")
    plots = write_plots(out, arms) if arms else []
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    lines += ["", "## Runs", ""] + [f"- `{r.run_dir}`" for r in runs]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return report
