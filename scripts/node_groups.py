"""SAPO node groups: held-out results of the nodes that run each model (e.g. the weak nodes of a strong/weak swarm),
or (`--split own-task`) of each node on the tasks it practises against the tasks only its peers practise, per arm
with 95% CIs over seeds, and paired against a baseline arm seed by seed. Reads metrics.jsonl and status.json, and
for the model groups eval_items.jsonl: each model's nodes' held-out pass@1 item by item (the mean over its nodes),
last round - round 0 and arm - baseline, with intervals over seeds x items (the reports' construction,
pubswap_flwr/report/item_intervals.py).

    python scripts/node_groups.py docs/results/control-sapo-strong-weak/runs --baseline sapo-8-0
    python scripts/node_groups.py docs/results/control-sapo-skills/runs --baseline sapo-8-0 --split own-task

Only completed runs count (status.json says so): a run still going, stopped or failed is named on stderr and left
out, so a sweep can be read while it runs. `--mechanism` adds, per run and model, the external groups its nodes
received, discarded for zero advantage, used and fell short of J by, summed over the rounds, and the well-formed
share of their own rollouts in the first and last round.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pubswap_flwr.report import fmt_ci, group, mean_ci, paired_differences, summarize_run  # noqa: E402
from pubswap_flwr.report.item_intervals import (  # noqa: E402
    INTERVAL_CONSTRUCTION,
    learning_item_interval,
    paired_item_interval,
)
from pubswap_flwr.report.summaries import RunSummary, item_values  # noqa: E402
from pubswap_flwr.server.metrics import read_status  # noqa: E402

METRICS = ("sampled_accuracy", "greedy_accuracy")


def node_models(rows: list[dict]) -> dict[str, str]:
    """node id -> the model it ran, from the metrics rows' clients."""
    return {node: c["model"] for row in rows for node, c in row.get("clients", {}).items()}


def model_groups(rows: list[dict]) -> dict[str, dict[str, float]]:
    """model -> metric -> mean over that model's nodes, at the last round where nodes evaluated."""
    models = node_models(rows)
    last = [r for r in rows if r.get("node_eval")][-1]
    out: dict[str, dict[str, list[float]]] = {}
    for node, evaluation in last["node_eval"].items():
        for metric in METRICS:
            if metric in evaluation:
                out.setdefault(models[node], {}).setdefault(metric, []).append(evaluation[metric])
    return {model: {m: sum(v) / len(v) for m, v in metrics.items()} for model, metrics in out.items()}


def own_task_groups(rows: list[dict]) -> dict[str, dict[str, float]]:
    """"own tasks" / "other tasks" -> metric -> mean over nodes (each node's mean over its own tasks, or over the
    held-out tasks it does not train on), at the last round where nodes evaluated."""
    tasks = {node: set(c["tasks"]) for row in rows for node, c in row.get("clients", {}).items()}
    last = [r for r in rows if r.get("node_eval")][-1]
    out: dict[str, dict[str, list[float]]] = {}
    for node, evaluation in last["node_eval"].items():
        per_task = evaluation["per_task"]
        for name, chosen in (("own tasks", [t for t in per_task if t in tasks[node]]),
                             ("other tasks", [t for t in per_task if t not in tasks[node]])):
            for metric in METRICS:
                values = [per_task[t][metric] for t in chosen if metric in per_task[t]]
                if values:
                    out.setdefault(name, {}).setdefault(metric, []).append(sum(values) / len(values))
    return {name: {m: sum(v) / len(v) for m, v in metrics.items()} for name, metrics in out.items()}


EXTERNAL = ("external_received", "external_zero_advantage", "external_used", "external_shortfall")


def mechanism(rows: list[dict]) -> dict[str, dict[str, float]]:
    """model -> the EXTERNAL counts summed over its nodes and rounds, and its nodes' mean well-formed share of their
    own rollouts in the first and the last training round."""
    out: dict[str, dict[str, float]] = {}
    trained = [r for r in rows if r.get("clients")]
    for row in trained:
        for client in row["clients"].values():
            totals = out.setdefault(client["model"], dict.fromkeys(EXTERNAL, 0.0))
            for key in EXTERNAL:
                totals[key] += client.get(key, 0)
    for label, row in (("well_formed first", trained[0]), ("well_formed last", trained[-1])) if trained else ():
        for model in out:
            shares = [c["well_formed"] for c in row["clients"].values()
                      if c["model"] == model and c.get("well_formed") is not None]
            out[model][label] = sum(shares) / len(shares) if shares else float("nan")
    return out


def model_runs(summary: RunSummary) -> dict[str, RunSummary]:
    """model -> the run as seen through that model's nodes only: its per-item held-out values are the mean over
    those nodes (eval_items.jsonl); empty when the run recorded no per-item results."""
    models = node_models(summary.rows)
    out = {}
    for model in sorted(set(models.values())):
        items, _ = item_values(summary.run_dir, nodes={node for node, m in models.items() if m == model})
        if items:
            out[model] = replace(summary, items=items)
    return out


def print_item_intervals(runs: list[RunSummary], baseline: str) -> None:
    """Per model: each arm's last - round 0 and arm - baseline at the last round, over seeds x items."""
    by_model: dict[str, list[RunSummary]] = {}
    for summary in runs:
        for model, seen in model_runs(summary).items():
            by_model.setdefault(model, []).append(seen)
    if not by_model:
        return
    print()
    print(f"Over seeds x items ({INTERVAL_CONSTRUCTION}), each item the mean over the model's nodes:")
    print()
    print("| model | arm | metric | last - round 0 | arm - " + baseline + " |")
    print("|---|---|---|---|---|")
    for model, seen in by_model.items():
        arms = group(seen)
        for arm, members in arms.items():
            for metric in METRICS:
                gain = learning_item_interval(members, metric)
                paired = None if arm == baseline or baseline not in arms else paired_item_interval(
                    members, arms[baseline], metric)
                cells = [fmt_ci(gain, signed=True) if gain else "n/a",
                         fmt_ci(paired, signed=True) if paired else ""]
                print(f"| {model} | {arm} (seeds {', '.join(str(r.seed) for r in members)}) | {metric} | "
                      + " | ".join(cells) + " |")


def completed_runs(runs: Path) -> tuple[list[Path], list[str]]:
    """The run folders under `runs` whose status.json says completed, and a line for each one left out."""
    done, left_out = [], []
    for run_dir in sorted(p for p in runs.iterdir() if (p / "metrics.jsonl").is_file()):
        status = read_status(run_dir)
        if status.get("status") == "completed":
            done.append(run_dir)
        else:
            detail = f" ({status['detail']})" if status.get("detail") else ""
            left_out.append(f"left out {run_dir.name}: {status.get('status') or 'no status'}{detail}")
    return done, left_out


def print_mechanism(run_dirs: list[Path]) -> None:
    columns = [*EXTERNAL, "well_formed first", "well_formed last"]
    print("| run | model | " + " | ".join(c.replace("external_", "").replace("_", " ") for c in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for run_dir in run_dirs:
        for model, values in mechanism(summarize_run(run_dir).rows).items():
            cells = [f"{values[c]:.0f}" if c in EXTERNAL else f"{values[c]:.3f}" for c in columns]
            print(f"| {run_dir.name} | {model} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", help="a sweep's runs/ folder")
    parser.add_argument("--baseline", required=True, help="the arm others are paired against")
    parser.add_argument("--split", choices=["model", "own-task"], default="model",
                        help="group nodes by model (default), or each node's own tasks against the others'")
    parser.add_argument("--mechanism", action="store_true",
                        help="also print each run's external groups and own well-formed share per model")
    args = parser.parse_args()
    groups_of = model_groups if args.split == "model" else own_task_groups
    runs = []
    run_dirs, left_out = completed_runs(Path(args.runs))
    for line in left_out:
        print(line, file=sys.stderr)
    for run_dir in run_dirs:
        summary = summarize_run(run_dir)
        for model, metrics in groups_of(summary.rows).items():
            for metric, value in metrics.items():
                summary.values[f"{model} {metric}"] = value
        runs.append(summary)
    arms = group(runs)
    keys = sorted({k for r in runs for k in r.values if " " in k})
    print("| arm | seeds | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for arm, members in arms.items():
        print(f"| {arm} | {', '.join(str(r.seed) for r in members)} | "
              + " | ".join(fmt_ci(mean_ci(r.values.get(k) for r in members)) for k in keys) + " |")
    print()
    shared = [k for k in keys if all(k in r.values for r in runs)]  # a model some arm lacks (its donors) pairs nothing
    print(f"| arm − {args.baseline} | " + " | ".join(shared) + " |")
    print("|---|" + "---|" * len(shared))
    for pair in paired_differences(arms, args.baseline, shared):
        print(f"| {pair.arm} (seeds {', '.join(map(str, pair.seeds))}) | "
              + " | ".join(fmt_ci(pair.intervals[k], signed=True) for k in shared) + " |")
    if args.split == "model":
        print_item_intervals(runs, args.baseline)
    if args.mechanism:
        print()
        print_mechanism(run_dirs)


if __name__ == "__main__":
    main()
