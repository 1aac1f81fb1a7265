"""Did the swap give a failing client something to learn from? Per PubSwap run of a sweep, round and client: its
public groups whose rewards differed before and after the swap (the round's swap.mixed_groups_before_swap and
_after_swap, summed over its public steps) and the responses swapped into it, then the totals per arm and client.

    python scripts/swap_groups.py docs/results/transfer-pubswap-skill/runs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pubswap_flwr import metrics_schema as schema  # noqa: E402
from pubswap_flwr.report.summaries import arm_and_seed  # noqa: E402
from pubswap_flwr.server.metrics import read_metrics, read_status  # noqa: E402

COLUMNS = ("public groups", "mixed before", "mixed after", "swapped in")


def swap_rows(rows: list[dict]) -> list[dict]:
    """One entry per (round, client) of a round with public steps: the client's node index and model, its public
    groups (one per public prompt), mixed before and after the swap, responses swapped into it."""
    out = []
    for row in rows:
        steps, swap = row.get("public_steps") or [], row.get(schema.SWAP) or {}
        if not steps or schema.MIXED_GROUPS_BEFORE_SWAP not in swap:
            continue
        for node, client in sorted((row.get("clients") or {}).items(), key=lambda c: c[1].get("node_index", 0)):
            out.append({"round": row["round"], "client": client.get("node_index"), "model": client.get("model", ""),
                        "public groups": sum(len(s["prompts"]) for s in steps if node in s.get(
                            schema.MIXED_GROUPS_BEFORE_SWAP, {})),
                        "mixed before": swap[schema.MIXED_GROUPS_BEFORE_SWAP].get(node, 0),
                        "mixed after": swap[schema.MIXED_GROUPS_AFTER_SWAP].get(node, 0),
                        "swapped in": sum(s["responses_swapped"].get(node, 0) for s in steps)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="a sweep's runs/ folder")
    args = parser.parse_args(argv)
    totals: dict[tuple[str, int, str], dict[str, int]] = {}
    print("| run | round | client | model | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|---|" + "---|" * len(COLUMNS))
    for run_dir in sorted(p for p in args.runs.iterdir() if (p / "metrics.jsonl").is_file()):
        if read_status(run_dir).get("status") != "completed":
            print(f"left out {run_dir.name}: not completed", file=sys.stderr)
            continue
        arm, _ = arm_and_seed(run_dir)
        for entry in swap_rows(read_metrics(run_dir)):
            print(f"| {run_dir.name} | {entry['round']} | {entry['client']} | {entry['model']} | "
                  + " | ".join(str(entry[c]) for c in COLUMNS) + " |")
            total = totals.setdefault((arm, entry["client"], entry["model"]), dict.fromkeys(COLUMNS, 0))
            for column in COLUMNS:
                total[column] += entry[column]
    if not totals:
        print(f"{args.runs}: no completed PubSwap run with mixed-group counts", file=sys.stderr)
        return 2
    print()
    print("| arm | client | model | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for (arm, client, model), total in totals.items():
        print(f"| {arm} | {client} | {model} | " + " | ".join(str(total[c]) for c in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
