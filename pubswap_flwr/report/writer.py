"""write_report: report.md, summary.json and plots/ under one folder, from the runs' metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from ..server.metrics import json_safe
from ..untrusted import UntrustedFileError, check_no_links, is_present, parse_json, read_bytes, write_replacing
from .budget_lines import cost_lines, harder_tier_lines
from .drift_lines import drift_lines
from .formatting import code_span
from .markdown import (
    arms_table_lines,
    failure_lines,
    format_lines,
    heading_lines,
    learning_lines,
    paired_lines,
    per_run_lines,
    per_task_lines,
    plot_lines,
    provenance_lines,
    self_reported_lines,
)
from .plots import arm_styles, remove_stale_plots, write_plots
from .shortcut_lines import shortcut_lines
from .signal_lines import signal_lines
from .statistics import CONFIDENCE
from .summaries import RunSummary, group, summarize_run
from .task_differences import task_difference_lines

DEFAULT_TITLE = "pubswap-flwr comparison"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"


class ReportExistsError(FileExistsError):
    """report.md is already there and overwriting was not asked for."""


def read_summary(out: Path) -> dict:
    """The summary.json a previous report left under `out` ({} when there is none or it is no JSON object). A link
    or FIFO is refused (UntrustedFileError): `out` may be a downloaded sweep's folder."""
    path = out / SUMMARY_FILE
    if not is_present(path):
        return {}
    try:
        summary = parse_json(read_bytes(path).decode("utf-8", "replace"), str(path))
    except UntrustedFileError:
        if not path.is_file() or path.is_symlink():
            raise
        return {}
    return summary if isinstance(summary, dict) else {}


def _reusable(previous: dict) -> dict:
    """What a new report takes over from the previous summary: title, notes, made_by, baseline and the arms' order,
    each only when it has its type."""
    kinds = {"title": str, "notes": str, "made_by": str, "baseline": str, "arms": dict}
    return {key: previous[key] for key, kind in kinds.items() if isinstance(previous.get(key), kind)}


def _ordered_arms(runs: list[RunSummary], arm_order: list[str] | None, previous: dict) -> dict[str, list[RunSummary]]:
    """Runs by arm in the sweep's own order, else the previous report's (colours and the default baseline stay
    put), whatever order a shell glob gives the run directories in; arms neither names follow as given."""
    arms = group(runs)
    order = list(dict.fromkeys([arm for arm in arm_order or [] if arm in arms]
                               + [arm for arm in previous.get("arms") or {} if arm in arms]))
    return {arm: arms[arm] for arm in order + [a for a in arms if a not in order]}


def _baseline(baseline: str | None, arms: dict[str, list[RunSummary]], arm_order: list[str] | None,
              previous: dict) -> str | None:
    if baseline is None:
        stored = previous.get("baseline")  # a sweep's own report compares with its first arm
        return stored if stored in arms and not arm_order else next(iter(arms), None)
    if baseline not in arms:
        raise ValueError(f"baseline arm {baseline!r} has no runs; arms: {list(arms)}")
    return baseline


def _shown(run_dir: Path, out: Path) -> str:
    """A run's folder as the report names it: relative to the report's own folder when inside it (a published
    sweep's runs/), so the report reads the same wherever the folder is."""
    try:
        return Path(run_dir).resolve().relative_to(out.resolve()).as_posix()
    except ValueError:
        return str(run_dir)


# parameters: `pubswap report`'s options, keyword-only with their defaults
def write_report(out: Path, run_dirs: list[Path], *, failures: dict[tuple[str, int], str] | None = None,
                 title: str | None = None, notes: str | None = None, command: str = "",
                 made_by: str | None = None, baseline: str | None = None, force: bool = False,
                 arm_order: list[str] | None = None, pending: list[tuple[str, int]] | None = None,
                 exclude_self_reported: bool = False) -> Path:
    """report.md + summary.json + plots/ under `out`, from the runs' metrics.jsonl.

    Raises ReportExistsError when out/report.md exists and `force` is not given. `title`, `notes`, `made_by`
    (the command that made the runs, when another one writes this report) and `baseline` default to what the
    previous summary.json recorded, then to the default title, no notes, `command` and the first arm. The arms (their
    colours and markers) follow `arm_order` (the sweep file's, given by `pubswap compare` and publish_results.py; the
    default baseline is then its first arm), then the previous summary's order, then the order the runs are given
    in. `pending`: the (arm, seed) runs of a sweep not made yet (stopped early), listed under the title so that
    nobody reads a partial sweep as a whole one. `exclude_self_reported`: leave out the runs whose held-out results
    their nodes reported themselves (sapo, local), named under the title; ValueError when that leaves none."""
    out = Path(out)
    report = out / REPORT_FILE
    if report.exists() and not force:
        raise ReportExistsError(f"{report} exists; pass force=True (pubswap report --force) to replace it, or "
                                "write the new report elsewhere (--out)")
    previous = _reusable(read_summary(out))
    title = title if title is not None else previous.get("title") or DEFAULT_TITLE
    notes = notes if notes is not None else previous.get("notes") or ""
    made_by = made_by if made_by is not None else previous.get("made_by") or command
    runs = [summarize_run(Path(d)) for d in run_dirs]
    left_out = [r for r in runs if exclude_self_reported and r.values["self_reported"]]
    runs = [r for r in runs if r not in left_out]
    excluded = [r.run_dir.name for r in left_out]
    if not runs and excluded:
        raise ValueError("--exclude-self-reported leaves no run: every run's held-out results are self-reported ("
                         + ", ".join(excluded) + ")")
    arms = _ordered_arms(runs, arm_order, previous)
    baseline = _baseline(baseline, arms, arm_order, previous)
    failures = failures or {}
    out.mkdir(parents=True, exist_ok=True)

    code_lines, made_with = provenance_lines(runs)
    lines = heading_lines(title, notes, command, made_by, runs, code_lines, pending, excluded)
    summary: dict = {"title": title, "notes": notes, "made_by": made_by, "command": command, "confidence": CONFIDENCE,
                     "baseline": baseline, "arms": {}, "paired": {}, "runs": {},
                     "failures": {f"{a}-s{s}": d for (a, s), d in failures.items()}, "provenance": made_with}
    if pending:  # only then: summaries of whole sweeps stay byte for byte what they were
        summary["pending"] = [f"{a}-s{s}" for a, s in pending]
    if exclude_self_reported:
        summary["excluded_self_reported"] = excluded
    lines += arms_table_lines(arms, failures, summary)
    lines += paired_lines(arms, baseline, summary)
    lines += per_run_lines(arms, runs, summary)
    lines += self_reported_lines(arms)
    lines += per_task_lines(arms, runs)
    lines += shortcut_lines(arms, runs, summary)
    lines += task_difference_lines(arms, baseline, runs, summary)
    lines += learning_lines(arms, summary)
    lines += format_lines(arms, summary)
    lines += harder_tier_lines(arms, baseline, summary)
    lines += signal_lines(arms, summary)
    lines += cost_lines(arms, baseline, summary)
    lines += drift_lines(arms, summary)
    lines += failure_lines(failures)
    styles = arm_styles(arms)
    check_no_links(out / "plots", out)
    plots = write_plots(out, arms, baseline, styles) if arms else []
    remove_stale_plots(out, plots)
    lines += plot_lines(plots, arms, styles)
    lines += ["", "## Runs", ""] + [f"- `{code_span(_shown(r.run_dir, out))}`" for r in runs]
    summary["plots"] = [f"plots/{p.name}" for p, _ in plots]
    write_replacing(report, ("\n".join(lines) + "\n").encode())  # links planted in `out` are replaced, not followed
    write_replacing(out / SUMMARY_FILE, json.dumps(json_safe(summary), indent=2).encode())
    return report
