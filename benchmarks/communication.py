"""Benchmark: bytes on the wire per client per round (against the fp16 LoRA minimum and full-model FedAvg) and
the communication + orchestration share of round time, from FedAvg-GRPO simulations through Flower's engine, one
per `strategy.compression` setting, side by side in one run.

    python benchmarks/communication.py [--rounds 4] [--nodes 4] [--local-steps 10] [--compression none,int8,int4]
        [--engine ray|inprocess] [--learning --seeds 3 --learning-rounds 10]

--learning adds held-out pass@1 after --learning-rounds rounds per setting and seed, with the paired difference
against none (mean and standard error over seeds); it is a long run (settings x seeds x rounds), off by default.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from pubswap_flwr.policy import Policy, PolicySpec
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate, simulate_in_process


def run(config: dict, nodes: int, engine: str, out: str, name: str) -> list[dict]:
    # --nodes 2 (docs/results/compression): apply their rounds, which a robust rule keeps by default (#54)
    flat = {**config, "output.dir": out, "run-name": name, "strategy.apply-below-robust": True}
    if engine == "ray":
        simulate(flat, nodes)
    else:
        simulate_in_process(flat, nodes)
    return read_metrics(Path(out) / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--compression", default="none,int8,int4", help="comma-separated strategy.compression values")
    parser.add_argument("--engine", choices=("ray", "inprocess"), default="ray")
    parser.add_argument("--learning", action="store_true", help="also held-out pass@1 vs none over seeds (long)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learning-rounds", type=int, default=10)
    args = parser.parse_args()
    settings = [c.strip() for c in args.compression.split(",") if c.strip()]
    policy = Policy(PolicySpec())
    lora_values = sum(v.numel() for v in policy.adapter().values())
    model_values = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" not in n)
    minimum = 2 * lora_values
    print(f"LoRA adapter: {lora_values} values -> fp16 minimum {minimum} bytes; base model {model_values} values "
          f"(full-model FedAvg in fp16: {2 * model_values} bytes, fp32: {4 * model_values})")
    measured = {}
    with tempfile.TemporaryDirectory() as out:
        for setting in settings:
            rows = [r for r in run({"num-server-rounds": args.rounds, "train.local-steps": args.local_steps,
                                    "eval.every": 0, "strategy.compression": setting}, args.nodes, args.engine, out,
                                   f"bench-{setting}") if r["round"] > 0]
            measured[setting] = rows
    print(f"bytes per client per round, median over client-rounds ({args.nodes} clients, {args.rounds} rounds; "
          "server -> client also after round 1, when compressed globals go as deltas):")
    print(f"  {'compression':<12}{'client->server':>16}{'x fp16 min':>12}{'server->client':>16}{'x fp16 min':>12}"
          f"{'rounds 2+':>12}")
    for setting, rows in measured.items():
        up = statistics.median(c["bytes_sent"] for r in rows for c in r["clients"].values())
        down = statistics.median(c["bytes_received"] for r in rows for c in r["clients"].values())
        later = [c["bytes_received"] for r in rows if r["round"] > 1 for c in r["clients"].values()]
        later_ratio = f"{statistics.median(later) / minimum:.3f}" if later else "-"
        print(f"  {setting:<12}{up:16.0f}{up / minimum:12.3f}{down:16.0f}{down / minimum:12.3f}{later_ratio:>12}")
    print("goals (issue 18): none <= 1.10, int8 <= 0.52, int4 <= 0.27 x the fp16 minimum")
    rows = measured[settings[0]]
    shares = [r["time"]["comm_orchestration_s"] / r["time"]["round_s"] for r in rows]
    print(f"communication + orchestration share of round time ({settings[0]}, simulation, {args.nodes} clients, tau = "
          f"{args.local_steps}): median {statistics.median(shares):.3%} over {len(shares)} rounds, "
          f"per round {', '.join(f'{s:.2%}' for s in shares)} (goal <= 5%)")
    print("round time split (median s): " + ", ".join(
        f"{k} {statistics.median(r['time'][k] for r in rows):.2f}" for k in rows[0]["time"]))
    if args.learning:
        learning(args, settings)


def learning(args, settings: list[str]) -> None:
    """Held-out pass@1 (greedy, and sampled over eval.samples) after --learning-rounds, per setting and seed."""
    final: dict[str, dict[int, dict]] = {s: {} for s in settings}
    with tempfile.TemporaryDirectory() as out:
        for seed in range(args.seeds):
            for setting in settings:
                rows = run({"num-server-rounds": args.learning_rounds, "train.local-steps": args.local_steps,
                            "seed": seed, "eval.every": args.learning_rounds, "strategy.compression": setting},
                           args.nodes, args.engine, out, f"learn-{setting}-s{seed}")
                final[setting][seed] = rows[-1]["eval"]
    print(f"held-out after {args.learning_rounds} rounds, mean over {args.seeds} seeds (paired difference vs "
          f"{settings[0]} with its standard error over seeds):")
    for metric in ("greedy_accuracy", "sampled_accuracy"):
        for setting in settings:
            values = [final[setting][s].get(metric) for s in range(args.seeds)]
            if any(v is None for v in values):
                continue
            diffs = [v - final[settings[0]][s][metric] for s, v in enumerate(values)]
            se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
            print(f"  {metric:<18}{setting:<8}{statistics.mean(values):.3f}  diff {statistics.mean(diffs):+.3f} "
                  f"(se {se:.3f})")


if __name__ == "__main__":
    main()
