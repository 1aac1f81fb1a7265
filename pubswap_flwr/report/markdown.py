"""report.md's sections, each as lines of markdown; the sections with numbers also record them in summary.json's
dict."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..metrics_schema import WELL_FORMED_WARNING
from .formatting import code_span, fmt_ci, fmt_number, fmt_rounds, fmt_spread, fmt_value, interval_json, spread_json
from .formatting import escape_markdown as md
from .item_intervals import (
    INTERVAL_CONSTRUCTION,
    ITEM_METRICS,
    learning_item_interval,
    paired_item_interval,
    record_construction,
)
from .plots import MARKER_NAMES, ArmStyle, colour_name
from .statistics import CONFIDENCE, NAN, PAIRED, PairedDifference, finite, mean_ci, paired_differences
from .summaries import RunSummary

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
LEARNING = [  # (label, eval key): held-out change from round 0 to the last evaluated round, per arm
    ("greedy strict", "greedy_accuracy"),
    ("greedy lenient", "greedy_lenient_accuracy"),
    ("sampled strict", "sampled_accuracy"),
    ("sampled lenient", "sampled_lenient_accuracy"),
    ("well-formed", "sampled_well_formed"),
]
Arms = dict[str, list[RunSummary]]
SELF_REPORTED = "self-reported by the nodes"  # summary.json's `held_out` of an arm whose runs' evals are the nodes'


# parameters: the parts of the report's heading, each from write_report
def heading_lines(title: str, notes: str, command: str, made_by: str, runs: list[RunSummary],
                  code_lines: list[str], pending: list[tuple[str, int]] | None = None,
                  excluded: list[str] | None = None) -> list[str]:
    """The title, who made the runs and the report, the runs not made yet and those left out (`excluded`: run names
    whose held-out results were self-reported), the notes, the provenance lines and how to read the numbers.
    Nothing in it but the runs' files and the arguments: a published report regenerates byte for byte."""
    lines = [f"# {md(title)}", ""]
    stamp = f"from {len(runs)} run(s)"
    if made_by and command and made_by != command:
        lines.append(f"Runs made by `{code_span(made_by)}`; this report generated {stamp} by `{code_span(command)}`.")
    else:
        lines.append(f"Generated {stamp}" + (f" by `{code_span(command)}`" if command else "") + ".")
    if pending:
        lines += ["", pending_line(pending)]
    if excluded:
        lines += ["", excluded_line(excluded)]
    if notes:
        lines += ["", notes.strip()]
    lines += code_lines
    lines += ["", f"Each value is the mean over seeds with its {CONFIDENCE:.0%} confidence interval in brackets "
                  "(Student t, n-1 degrees of freedom; *n/a* with a single seed, where no interval can be "
                  "estimated), except wall time: the median over seeds with the range (fastest–slowest) in "
                  "parentheses, since it depends on how loaded the machine was rather than varying around a mean. "
                  "Held-out metrics are from the last evaluated round; *sampled* is "
                  f"{_sampled_description(runs)}.", "", _interval_coverage(runs), ""]
    return lines


def _interval_coverage(runs: list[RunSummary]) -> str:
    """What the held-out intervals cover: every run scores the same held-out items, so seeds alone miss which
    questions were drawn (report/item_intervals.py)."""
    recorded = [r for r in runs if r.items]
    if runs and len(recorded) == len(runs):
        return ("**Intervals of held-out accuracy** (greedy and sampled, in the paired differences and the change "
                f"since round 0) **cover both the seeds and the draw of held-out items**: {INTERVAL_CONSTRUCTION}, "
                "from each run's per-item results; rewards and the per-arm table cover the seeds only.")
    return ("**Intervals cover the seeds only, not which held-out questions were drawn**: every run was scored on "
            "the same held-out items and " + ("these runs recorded no per-item results (made before eval_items.jsonl)"
                                              if not recorded else
                                              f"only {len(recorded)} of {len(runs)} runs recorded per-item results")
            + ", so an item-level interval would be wider.")


def _sampled_description(runs: list[RunSummary]) -> str:
    # Held-out samples are drawn at the run's generation.temperature; when no run has a config.json to say, T=1,
    # the default every such run used.
    temperatures = sorted({t for r in runs if (t := r.values.get("temperature", NAN)) == t}) or [1.0]
    at = "T=" + "/".join(f"{t:g}" for t in temperatures)
    counts = sorted({int(r.values["samples"]) for r in runs if r.values["samples"] == r.values["samples"]})
    if not counts:
        return f"one {at} sample per held-out item (fixed seed)"
    n = ", ".join(str(c) for c in counts)
    unrecorded = " (one where not recorded)" if any(r.values["samples"] != r.values["samples"] for r in runs) else ""
    return (f"pass@1 over n = {n}{unrecorded} {at} samples per held-out item (fixed seed), averaged over items "
            "and samples")


def arms_table_lines(arms: Arms, failures: dict[tuple[str, int], str], summary: dict) -> list[str]:
    """The headline table: per arm the mean over seeds with its interval (wall time: median and range); an arm
    whose every run failed is a row of FAILED. Fills summary["arms"]."""
    lines = ["| arm | mode | seeds | " + " | ".join(t for t, _ in HEADLINE) + " |",
             "|---|---|---|" + "---|" * len(HEADLINE)]
    for arm, members in arms.items():
        cells = []
        self_reported = any(r.values["self_reported"] for r in members)
        entry: dict = {"seeds": [r.seed for r in members], "mode": members[0].mode,
                       "held_out": SELF_REPORTED if self_reported else "server-evaluated"}
        for _, key in HEADLINE:
            values = [r.values[key] for r in members]
            if key == WALL:
                entry[key] = spread_json(values)
                cells.append(fmt_spread(values))
                continue
            interval = mean_ci(values)
            entry[key] = interval_json(interval, values)
            cells.append(fmt_rounds(values) if key == "rounds" else fmt_ci(interval, 3))
        summary["arms"][arm] = entry
        mode = md(members[0].mode) + (" (held-out self-reported)" if self_reported else "")
        lines.append(f"| {md(arm)} | {mode} | {', '.join(str(r.seed) for r in members)} | "
                     + " | ".join(cells) + " |")
    for arm in sorted({a for a, _ in failures}):
        if arm not in arms:
            lines.append(f"| {md(arm)} | – | – | " + " | ".join("FAILED" for _ in HEADLINE) + " |")
    if any(entry["held_out"] == SELF_REPORTED for entry in summary["arms"].values()):
        lines += ["", "*held-out self-reported*: every node evaluated its own adapter and reported the numbers; the "
                  "server holds no weights of these runs to check them, so one node can move the mean over nodes "
                  "as far as it likes. The paired differences and changes since round 0 of these arms are of the "
                  "same reports. Each node's report is under \"Self-reported held-out\"; `pubswap verify` "
                  "re-evaluates the runs' published node adapters."]
    return lines


def self_reported_lines(arms: Arms) -> list[str]:
    """'Self-reported held-out': per run, what each node reported of its own adapter at the last evaluation (the
    headline's held-out numbers of such runs are their mean)."""
    runs = [r for members in arms.values() for r in members if r.node_evals]
    if not runs:
        return []
    nodes = sorted({index for r in runs for index in r.node_evals})
    lines = ["", "## Self-reported held-out", "", "Each node's own held-out sampled accuracy (greedy where it "
             "sampled none) of its own adapter, as it reported it at the run's last evaluation: not checked by the "
             "server.", "", "| run | " + " | ".join(f"node {n}" for n in nodes) + " |", "|---|" + "---|" * len(nodes)]
    for r in runs:
        cells = []
        for n in nodes:
            result = r.node_evals.get(n, {})
            value = result.get("sampled_accuracy", result.get("greedy_accuracy"))
            cells.append("–" if value is None else f"{value:.3f}")
        lines.append(f"| {md(r.run_dir.name)} | " + " | ".join(cells) + " |")
    return lines


def paired_lines(arms: Arms, baseline: str | None, summary: dict) -> list[str]:
    """'Paired differences against the baseline': each arm minus the baseline seed by seed, with the paired-t
    interval of the mean difference (none with one arm). Fills summary["paired"]."""
    if baseline is None or len(arms) < 2:
        return []
    pairs = paired_differences(arms, baseline)
    if not pairs:
        return []
    seeds = sorted({s for p in pairs for s in p.seeds})
    lines = ["", f"## Paired differences against {md(baseline)}", "",
             f"For a given seed every arm sees the same question streams and held-out items, so each arm is "
             f"compared with the baseline **{md(baseline)}** seed by seed: arm minus {md(baseline)} per seed, then the "
             f"mean difference over seeds with its {CONFIDENCE:.0%} confidence interval (paired t, n-1 degrees "
             "of freedom; *n/a* with one paired seed). An interval that excludes 0 is a difference the seeds "
             "resolve; one that includes 0 is not."]
    unpaired = _describe_unpaired(pairs)
    if unpaired:
        lines += ["", "Left out of the pairing (a seed run by only one of the two arms): "
                  + "; ".join(unpaired) + "."]
    lines += ["", f"| arm − {md(baseline)} | metric | " + " | ".join(f"s{s}" for s in seeds)
              + " | mean difference [95% CI] | CI covers |", "|---|---|" + "---|" * len(seeds) + "---|---|"]
    for pair in pairs:
        summary["paired"][pair.arm] = {"seeds": pair.seeds, "left_out": {pair.arm: pair.only_arm,
                                                                         baseline: pair.only_baseline}}
        for label, key in PAIRED:
            per_seed = pair.per_seed[key]
            by_item = paired_item_interval(arms[pair.arm], arms[baseline], key) if key in ITEM_METRICS else None
            interval, covers = (by_item, "seeds × items") if by_item is not None else (pair.intervals[key], "seeds")
            if by_item is not None:
                record_construction(summary)
            summary["paired"][pair.arm][key] = {**interval_json(interval, [per_seed[s] for s in sorted(per_seed)]),
                                                "covers": covers}
            cells = [fmt_number(per_seed[s], 3, True) if s in per_seed else "–" for s in seeds]
            lines.append(f"| {md(pair.arm)} | {label} | " + " | ".join(cells)
                         + f" | {fmt_ci(interval, 3, True)} | {covers} |")
    return lines


def _describe_unpaired(pairs: list[PairedDifference]) -> list[str]:
    notes = []
    for pair in pairs:
        if pair.only_arm:
            notes.append(f"{md(pair.arm)} seed(s) {', '.join(map(str, pair.only_arm))} (no {md(pair.baseline)} run)")
        if pair.only_baseline:
            notes.append(f"{md(pair.baseline)} seed(s) {', '.join(map(str, pair.only_baseline))} "
                         f"(no {md(pair.arm)} run)")
    return notes


def per_run_lines(arms: Arms, runs: list[RunSummary], summary: dict) -> list[str]:
    """'Per run': each run's final numbers (with its own standard error where recorded). Fills summary["runs"]."""
    with_se = any(r.values["sampled_accuracy_se"] == r.values["sampled_accuracy_se"] for r in runs)
    lines = ["", "## Per run", "", "Final numbers of each run (held-out: last evaluated round)."
             + (" *SE* is the run's own standard error of its held-out sampled accuracy over items; *n* is the "
                "number of samples per item." if with_se else ""), ""]
    columns = ["greedy pass@1", "sampled acc"] + (["SE", "n"] if with_se else []) + [
        "sampled reward", "cumulative reward", "rounds", "wall time (s)", "MB on the wire"]
    lines += ["| run | seed | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for arm, members in arms.items():
        for r in members:
            v = r.values
            cells = [fmt_value(v["greedy_accuracy"]), fmt_value(v["sampled_accuracy"])]
            if with_se:
                cells += [fmt_value(v["sampled_accuracy_se"]), fmt_value(v["samples"], 0)]
            cells += [fmt_value(v["sampled_reward"]), fmt_value(v["cumulative_reward"]), str(int(v["rounds"])),
                      fmt_value(v["wall_s"], 1), fmt_value(v["megabytes"])]
            lines.append(f"| {md(r.run_dir.name)} | {r.seed} | " + " | ".join(cells) + " |")
            summary["runs"][r.run_dir.name] = {"arm": arm, "seed": r.seed, **v}
    return lines


def per_task_lines(arms: Arms, runs: list[RunSummary]) -> list[str]:
    """'Per task': held-out accuracy per task and arm, and per run with its standard error where recorded."""
    tasks = sorted({t for r in runs for t in r.per_task})
    if not tasks:
        return []
    lines = ["", "## Per task", "", "Held-out sampled accuracy, mean over seeds [95% CI]; greedy pass@1 "
             "(mean over seeds) in parentheses.", "",
             "| arm | " + " | ".join(map(md, tasks)) + " |", "|---|" + "---|" * len(tasks)]
    for arm, members in arms.items():
        cells = []
        for task in tasks:
            sampled = mean_ci(r.per_task.get(task, {}).get("sampled_accuracy") for r in members)
            greedy = mean_ci(r.per_task.get(task, {}).get("greedy_accuracy") for r in members)
            cells.append(fmt_ci(sampled) + (f" ({greedy.mean:.3f})" if greedy.n else ""))
        lines.append(f"| {md(arm)} | " + " | ".join(cells) + " |")
    if any(t.get("sampled_accuracy_se") is not None for r in runs for t in r.per_task.values()):
        lines += _per_task_run_lines(arms, tasks)
    return lines


def _per_task_run_lines(arms: Arms, tasks: list[str]) -> list[str]:
    lines = ["", "Per run: held-out sampled accuracy ± the run's standard error over the task's items.", "",
             "| run | " + " | ".join(map(md, tasks)) + " |", "|---|" + "---|" * len(tasks)]
    for members in arms.values():
        for r in members:
            cells = []
            for task in tasks:
                entry = r.per_task.get(task, {})
                value, se = entry.get("sampled_accuracy"), entry.get("sampled_accuracy_se")
                cells.append("–" if value is None else f"{value:.3f}"
                             + (f" ± {se:.3f}" if se is not None else ""))
            lines.append(f"| {md(r.run_dir.name)} | " + " | ".join(cells) + " |")
    return lines


def learning_lines(arms: Arms, summary: dict) -> list[str]:
    """'Change since round 0': per arm and metric, round 0, the last evaluated round, and their difference seed by
    seed with its interval (what RL did to the model it started from). Only metrics every run recorded."""
    def ends(run: RunSummary) -> tuple[dict, dict] | None:
        evaluated = [r for r in run.rows if r.get("eval")]
        if len(evaluated) < 2 or evaluated[0]["round"] != 0:
            return None
        return evaluated[0]["eval"], evaluated[-1]["eval"]

    every_end = {arm: [ends(r) for r in members] for arm, members in arms.items()}
    if not every_end or any(p is None for found in every_end.values() for p in found):
        return []
    pairs = {arm: [p for p in found if p is not None] for arm, found in every_end.items()}
    keys = [(label, key) for label, key in LEARNING
            if all(first.get(key) is not None and last.get(key) is not None  # null: not recorded
                   for found in pairs.values() for first, last in found)]
    lines = ["", "## Change since round 0", "",
             "Held-out metrics of the model each run started from (round 0: for a real model after its warm-up, "
             "before RL) and of the last evaluated round, mean over seeds, and their difference seed by seed with its "
             f"{CONFIDENCE:.0%} confidence interval (paired t over seeds; over seeds × items where the column says "
             "so). *lenient*: the tagged answer, else the last number or "
             "word; *strict*: a right answer in the tags (the training reward); *well-formed*: one "
             "`<answer>...</answer>` and nothing after it.", "",
             "| arm | metric | round 0 | last | last − round 0 [95% CI] | CI covers |", "|---|---|---|---|---|---|"]
    summary["learning"] = {}
    for arm, found in pairs.items():
        summary["learning"][arm] = {}
        for label, key in keys:
            start = [first[key] for first, _ in found]
            end = [last[key] for _, last in found]
            by_item = learning_item_interval(arms[arm], key) if key in ITEM_METRICS else None
            change, covers = ((by_item, "seeds × items") if by_item is not None
                              else (mean_ci(b - a for a, b in zip(start, end)), "seeds"))
            if by_item is not None:
                record_construction(summary)
            summary["learning"][arm][key] = {"round0": statistics.fmean(start), "last": statistics.fmean(end),
                                             "change": {**interval_json(change, [b - a for a, b in zip(start, end)]),
                                                        "covers": covers}}
            lines.append(f"| {md(arm)} | {label} | {statistics.fmean(start):.3f} | {statistics.fmean(end):.3f} | "
                         f"{fmt_ci(change, 3, True)} | {covers} |")
    return lines


def format_lines(arms: Arms, summary: dict) -> list[str]:
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
        seeds = finite(r.values["well_formed_last"] for r in members)
        breaks = sum(int(r.values["format_breaks"]) for r in members)
        total = sum(int(r.values["format_client_rounds"]) for r in members)
        broken_runs = sum(r.values["format_breaks"] > 0 for r in members)
        summary["format"][arm] = {"well_formed_last": interval_json(mean_ci(seeds), seeds),
                                  "client_rounds_below": breaks, "client_rounds": total, "runs_with_any": broken_runs}
        share = "–" if not seeds else f"{statistics.fmean(seeds):.3f}"
        if len(seeds) > 1:
            share += f" ({min(seeds):.3f}–{max(seeds):.3f})"
        lines.append(f"| {md(arm)} | {share} | {breaks} of {total} | {broken_runs} of {len(members)} |")
    return lines


def pending_line(pending: list[tuple[str, int]]) -> str:
    """A partial sweep's warning: which runs it does not have yet (pairs and intervals cover only the others)."""
    names = ", ".join(f"{md(arm)} seed {seed}" for arm, seed in pending)
    return (f"**Partial sweep: {len(pending)} run(s) not made yet** ({names}). Every figure below is of the runs "
            "made so far; an arm with fewer seeds than the sweep declares has wider or no intervals.")


def excluded_line(names: list[str]) -> str:
    """The runs `--exclude-self-reported` left out: their held-out numbers were their nodes' own reports."""
    runs = "1 run whose held-out results its nodes" if len(names) == 1 else \
        f"{len(names)} runs whose held-out results their nodes"
    return f"Left out (`--exclude-self-reported`): {runs} reported themselves ({', '.join(md(n) for n in names)})."


def failure_lines(failures: dict[tuple[str, int], str]) -> list[str]:
    """'Failed runs': each failed arm and seed with the last line of what it reported."""
    if not failures:
        return []
    lines = ["", "## Failed runs", ""]
    for (arm, seed), detail in sorted(failures.items()):
        last = md(detail.strip().splitlines()[-1]) if detail.strip() else ""
        lines.append(f"- **{md(arm)}** seed {seed}: FAILED — {last}")
    return lines


def plot_lines(plots: list[tuple[Path, str]], arms: Arms, styles: dict[str, ArmStyle]) -> list[str]:
    """'Plots': how each arm is drawn, then each figure with its caption."""
    if not plots:
        return []
    lines = ["", "## Plots", "", "Colours and markers are fixed per arm across every figure: "
             + ", ".join(f"{md(arm)} {colour_name(styles[arm].colour)} {MARKER_NAMES[styles[arm].marker]}"
                         for arm in arms) + "."]
    for path, caption in plots:
        lines += ["", f"**{path.stem}**: {caption}.", "", f"![{path.stem}](plots/{path.name})"]
    return lines


def provenance_lines(runs: list[RunSummary]) -> tuple[list[str], dict[str, list[str]]]:
    """The report's lines on which code, environment and CPU made its runs, with a warning when they differ (also
    between the starts of a resumed run), and {run: [code label of each start]} for summary.json."""
    from ..provenance import code_label, cpu_label, environment_label, read

    made_with: dict[str, list[str]] = {}
    environments: dict[str, set[str]] = {}
    cpus: dict[str, set[str]] = {}
    for r in runs:
        starts = read(r.run_dir)
        made_with[r.run_dir.name] = [code_label(s) for s in starts]
        environments[r.run_dir.name] = {environment_label(s) for s in starts}
        cpus[r.run_dir.name] = {cpu_label(s) for s in starts}
    labels = {label for found in made_with.values() for label in found}
    missing = sorted(name for name, found in made_with.items() if not found)
    envs = {e for found in environments.values() for e in found}
    lines = [""]
    if len(labels) == 1 and not missing:
        lines.append(f"All {len(runs)} run(s) were made by code {md(next(iter(labels)))}"
                     + (f" with {md(next(iter(envs)))}." if len(envs) == 1 else "."))
    elif labels:
        mixed = [name for name, found in made_with.items() if len(set(found)) > 1]
        lines.append("**Warning: these runs were not all made by the same code.** "
                     + "; ".join(f"{md(label)}: {', '.join(md(n) for n, f in made_with.items() if label in f)}"
                                 for label in sorted(labels))
                     + (f"; resumed under different code: {', '.join(map(md, mixed))}" if mixed else "")
                     + (f"; no record (made before provenance.json): {', '.join(map(md, missing))}" if missing else "")
                     + ".")
    else:
        lines.append("The runs record no provenance (made before runs wrote provenance.json).")
    if len(envs) > 1:
        lines.append("**Warning: the runs' environments differ:** " + "; ".join(map(md, sorted(envs))) + ".")
    cpu_names = {c for found in cpus.values() for c in found}
    if len(cpu_names) > 1:  # different kernels: the same seed's figures can differ in an item or two, even at round 0
        lines.append("**Warning: the runs were made on different CPUs,** whose kernels round differently (the same "
                     "seed's figures can differ by an item or two, even before training): "
                     + "; ".join(f"{md(c)}: {', '.join(md(n) for n, f in cpus.items() if c in f)}"
                                 for c in sorted(cpu_names)) + ".")
    return lines, made_with
