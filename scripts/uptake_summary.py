"""Is a swapped-in response learned? Per round and client, and over a PubSwap run with `pubswap.measure-uptake`: the
receiving client's mean per-token log-prob of the donors' responses it was given and of its own kept ones, just
before and just after each public step's update (the clients' uptake_* fields of metrics.jsonl).

    python scripts/uptake_summary.py docs/results/uptake-pubswap/runs/pubswap-balanced-uptake-s0
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pubswap_flwr.server.metrics import read_metrics  # noqa: E402

KINDS = ("foreign", "own")


def uptake_rows(rows: list[dict]) -> list[dict]:
    """One entry per (round, client, kind) with responses measured: n, log-prob before and after."""
    out = []
    for row in rows:
        clients = sorted((row.get("clients") or {}).values(), key=lambda c: c.get("node_index", 0))
        for client in clients:
            for kind in KINDS:
                count = client.get(f"uptake_{kind}_completions", 0)
                if count:
                    out.append({"round": row["round"], "client": client.get("node_index"), "kind": kind, "n": count,
                                "before": client[f"uptake_{kind}_before"], "after": client[f"uptake_{kind}_after"]})
    return out


def totals(entries: list[dict]) -> dict[str, dict]:
    """Per kind: client-rounds, responses, the response-weighted mean log-prob before and after, the median change
    per client-round and how many changes were positive."""
    out = {}
    for kind in KINDS:
        mine = [e for e in entries if e["kind"] == kind]
        if not mine:
            continue
        n = sum(e["n"] for e in mine)
        changes = [e["after"] - e["before"] for e in mine]
        out[kind] = {"client_rounds": len(mine), "responses": n,
                     "before": sum(e["n"] * e["before"] for e in mine) / n,
                     "after": sum(e["n"] * e["after"] for e in mine) / n,
                     "median_change": statistics.median(changes), "positive": sum(c > 0 for c in changes)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a pubswap run directory made with pubswap.measure-uptake")
    args = parser.parse_args(argv)
    entries = uptake_rows(read_metrics(args.run))
    if not entries:
        print(f"{args.run}: no uptake_* fields (was pubswap.measure-uptake on?)", file=sys.stderr)
        return 2
    print("| round | client | kind | responses | log-prob before | after | change |\n|---|---|---|---|---|---|---|")
    for e in entries:
        print(f"| {e['round']} | {e['client']} | {e['kind']} | {e['n']} | {e['before']:.3f} | {e['after']:.3f} | "
              f"{e['after'] - e['before']:+.3f} |")
    print()
    for kind, t in totals(entries).items():
        print(f"{kind}: {t['client_rounds']} client-rounds, {t['responses']} responses; mean per-token log-prob "
              f"{t['before']:.3f} -> {t['after']:.3f} ({t['after'] - t['before']:+.3f}, weighted by responses); "
              f"median change per client-round {t['median_change']:+.3f}, {t['positive']}/{t['client_rounds']} "
              "positive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
