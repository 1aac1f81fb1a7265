"""Benchmark: bytes on the wire per client per round (against the fp16 LoRA minimum and full-model FedAvg) and
the communication + orchestration share of round time, from one FedAvg-GRPO simulation through Flower's engine.

    python benchmarks/communication.py [--rounds 4] [--nodes 4] [--local-steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from pubswap_flwr.metrics import read_metrics
from pubswap_flwr.policy import Policy, PolicySpec
from pubswap_flwr.simulation import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--local-steps", type=int, default=10)
    args = parser.parse_args()
    policy = Policy(PolicySpec())
    lora_values = sum(v.numel() for v in policy.adapter().values())
    model_values = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" not in n)
    with tempfile.TemporaryDirectory() as out:
        simulate({"num-server-rounds": args.rounds, "train.local-steps": args.local_steps, "output.dir": out,
                  "run-name": "bench", "eval.every": 0}, args.nodes)
        rows = [r for r in read_metrics(Path(out) / "bench") if r["round"] > 0]
    per_client = [c["bytes_sent"] for r in rows for c in r["clients"].values()]
    per_client_in = [c["bytes_received"] for r in rows for c in r["clients"].values()]
    minimum = 2 * lora_values
    print(f"LoRA adapter: {lora_values} values -> fp16 minimum {minimum} bytes; base model {model_values} values "
          f"(full-model FedAvg in fp16: {2 * model_values} bytes, fp32: {4 * model_values})")
    print(f"bytes per client per round, median over {len(per_client)} client-rounds:")
    up, down = statistics.median(per_client), statistics.median(per_client_in)
    print(f"  client -> server {up:10.0f}  = {up / minimum:.3f} x fp16 LoRA minimum (goal <= 1.10); "
          f"{up / (2 * model_values):.3f} x full-model fp16 FedAvg")
    print(f"  server -> client {down:10.0f}  = {down / minimum:.3f} x fp16 LoRA minimum")
    shares = [r["time"]["comm_orchestration_s"] / r["time"]["round_s"] for r in rows]
    print(f"communication + orchestration share of round time (simulation, {args.nodes} clients, tau = "
          f"{args.local_steps}): median {statistics.median(shares):.3%} over {len(shares)} rounds, "
          f"per round {', '.join(f'{s:.2%}' for s in shares)} (goal <= 5%)")
    print("round time split (median s): " + ", ".join(
        f"{k} {statistics.median(r['time'][k] for r in rows):.2f}" for k in rows[0]["time"]))


if __name__ == "__main__":
    main()
