"""Per-node health of runs: each node's held-out accuracy at its evaluations, its training reward and the share of its
own samples with an intact answer format (`well_formed`), flagging collapsed nodes. Reads metrics.jsonl only.

    python scripts/node_health.py docs/results/diagnose-sapo-collapse/runs/*

A node counts as collapsed when its held-out sampled accuracy at some evaluation falls below --collapsed (default
0.05) after having started above it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def node_rows(rows: list[dict]) -> dict[int, dict]:
    """node index -> {"eval": [(round, sampled, greedy)], "well_formed": [(round, share)], "reward": [(round, r)]}."""
    index = {node: c["node_index"] for row in rows for node, c in row.get("clients", {}).items()}
    out: dict[int, dict] = {}
    for row in rows:
        for node, evaluation in (row.get("node_eval") or {}).items():
            entry = out.setdefault(index.get(node, -1), {"eval": [], "well_formed": [], "reward": []})
            entry["eval"].append((row["round"], evaluation["sampled_accuracy"], evaluation["greedy_accuracy"]))
        for node, client in row.get("clients", {}).items():
            entry = out.setdefault(client["node_index"], {"eval": [], "well_formed": [], "reward": []})
            if "well_formed" in client:
                entry["well_formed"].append((row["round"], client["well_formed"]))
            reward = client.get("rollout_reward", client.get("train_reward"))
            if reward is not None:
                entry["reward"].append((row["round"], reward))
    return out


def collapse_round(evals: list[tuple[int, float, float]], threshold: float) -> int | None:
    """The first evaluated round where sampled accuracy fell below `threshold` after starting above it."""
    if not evals or evals[0][1] < threshold:
        return None
    return next((r for r, sampled, _ in evals if sampled < threshold), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories holding metrics.jsonl")
    parser.add_argument("--collapsed", type=float, default=0.05, help="held-out sampled accuracy of a collapsed node")
    args = parser.parse_args()
    print("| run | node | held-out sampled (round: value) | well-formed min / last | reward last | collapsed at |")
    print("|---|---|---|---|---|---|")
    for run in args.runs:
        path = run / "metrics.jsonl"
        if not path.is_file():
            raise SystemExit(f"{run}: no metrics.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for node, entry in sorted(node_rows(rows).items()):
            evals = entry["eval"]
            shares = [share for _, share in entry["well_formed"]]
            when = collapse_round(evals, args.collapsed)
            print(f"| {run.name} | {node} | " + ", ".join(f"{r}: {s:.3f}" for r, s, _ in evals)
                  + (f" | {min(shares):.3f} / {shares[-1]:.3f}" if shares else " | n/a")
                  + (f" | {entry['reward'][-1][1]:.3f}" if entry["reward"] else " | n/a")
                  + f" | {'round ' + str(when) if when is not None else '-'} |")


if __name__ == "__main__":
    main()
