"""Benchmark: what train.foreign-correction = "is" adds to SAPO's bytes, with the sampling behaviours encoded as
base64 uint16/uint32 ids + fp16 log-probs (rollouts.Behaviour, the wire format) against JSON number lists (the
format before it, defined here only), side by side in one in-process run each.

    python benchmarks/behaviour_bytes.py [--nodes 4] [--rounds 3] [--seed 0]

Prints bytes per client per round for correction none, is with JSON numbers, and is with the wire format, and the
ratios to none: in round 1 (every arm samples the same completions from the same initial model, so the difference
is the behaviours alone) and the median over all client-rounds (later rounds' completions differ between arms).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from pubswap_flwr.rollouts import MAX_BEHAVIOUR_TOKENS, Behaviour
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process

SAPO = {"strategy.mode": "sapo", "tasks.per-node": 0, "sapo.sharing": "fixed", "sapo.questions": 8,
        "sapo.completions": 8, "sapo.share": 8, "sapo.local": 4, "sapo.external": 4, "eval.every": 0}


def json_numbers_to_wire(self: Behaviour) -> dict:
    """The earlier encoding: ids and log-probs (5 decimals) as JSON number lists."""
    return {"ids": list(self.ids), "logps": [round(x, 5) for x in self.logprobs]}


def json_numbers_from_wire(cls, data, max_tokens: int = MAX_BEHAVIOUR_TOKENS) -> Behaviour:
    if not isinstance(data, dict) or not isinstance(data.get("ids"), list) or not isinstance(data.get("logps"), list):
        raise ValueError("behaviour needs 'ids' and 'logps' lists")
    return cls(tuple(int(i) for i in data["ids"]), tuple(min(float(x), 0.0) for x in data["logps"]))


def run(config: dict, nodes: int, out: str, name: str) -> list[dict]:
    simulate_in_process({**config, "output.dir": out, "run-name": name}, nodes)
    return [r for r in read_metrics(Path(out) / name) if r["round"] > 0]


def median_bytes(rows: list[dict], field: str) -> float:
    return statistics.median(c[field] for r in rows for c in r["clients"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = {**SAPO, "num-server-rounds": args.rounds, "seed": args.seed}
    measured = {}
    wire = (Behaviour.to_wire, Behaviour.__dict__["from_wire"])
    with tempfile.TemporaryDirectory() as out:
        measured["none"] = run(config, args.nodes, out, "none")
        Behaviour.to_wire, Behaviour.from_wire = json_numbers_to_wire, classmethod(json_numbers_from_wire)
        try:
            measured["is, JSON numbers"] = run({**config, "train.foreign-correction": "is"}, args.nodes, out, "json")
        finally:
            Behaviour.to_wire, Behaviour.from_wire = wire
        measured["is, base64 + fp16"] = run({**config, "train.foreign-correction": "is"}, args.nodes, out, "wire")
    print(f"SAPO 4/4, {args.nodes} nodes, 8 questions x 8 completions shared per node per round, {args.rounds} "
          f"rounds (seed {args.seed}); bytes per client per round:")
    print(f"  {'train.foreign-correction':<26}{'round 1 up':>12}{'x none':>8}{'down':>10}{'x none':>8}"
          f"{'median up':>12}{'x none':>8}{'down':>10}{'x none':>8}")
    first = {name: [r for r in rows if r["round"] == 1] for name, rows in measured.items()}
    columns = [(first, "bytes_sent"), (first, "bytes_received"), (measured, "bytes_sent"),
               (measured, "bytes_received")]
    base = [median_bytes(table["none"], field) for table, field in columns]
    for name in measured:
        cells = [median_bytes(table[name], field) for table, field in columns]
        print(f"  {name:<26}" + "".join(f"{value:{12 if i % 2 == 0 else 10}.0f}{value / b:8.2f}"
                                         for i, (value, b) in enumerate(zip(cells, base))))

if __name__ == "__main__":
    main()
