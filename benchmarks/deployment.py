"""Benchmark: round time of a real localhost deployment with and without the warm worker (`deploy.warm-worker`)
against Flower's simulation engine, on the same small PubSwap config, side by side in one run.

    python benchmarks/deployment.py [--rounds 5] [--keep DIR]

Deployed: a TLS SuperLink with node authentication and two SuperNodes on loopback (tests/integration/flower_harness),
each organization with its sample file (data/samples/org-a.jsonl, org-b.jsonl), runs submitted with `flwr run`.
Simulated: `pubswap_flwr.simulation.simulate` (Ray, one CPU per client) with the same two files as
`tasks.data-paths`. Every process uses one torch thread. Prints each setting's round times (`time.round_s` of
metrics.jsonl), the median over rounds 2..N (round 1 also starts Ray's actors, or the warm workers), the ratios
deployed / simulated, and the load average when each setting started (the cores may be shared with other jobs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.integration.flower_harness: the localhost deployment the tests use

from pubswap_flwr.cli import submit, wait  # noqa: E402
from pubswap_flwr.metrics import read_metrics  # noqa: E402
from tests.integration.flower_harness import CONNECTION, ORGS, PROJECT, Deployment  # noqa: E402

# the deployment test's config (tests/integration/test_deployment.py), PubSwap with two messages per node per round
CONFIG = {"strategy.mode": "pubswap", "train.local-steps": 2, "pubswap.tau-swap": 2, "pubswap.public-prompts": 2,
          "pubswap.public-size": 20, "train.prompts-per-step": 2, "train.completions-per-prompt": 4,
          "eval.items-per-task": 5, "eval.sampled": False, "strategy.min-clients": 2, "strategy.timeout": 600.0,
          "seed": 5}


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    return repr(value)


def round_times(run_dir: Path) -> list[float]:
    return [row["time"]["round_s"] for row in read_metrics(run_dir) if row["round"] > 0]


def deployed(dep: Deployment, config: dict, out: Path, name: str, timeout: float) -> list[float]:
    flat = {**config, "output.dir": str(out), "run-name": name}
    run_id = submit(PROJECT, [" ".join(f"{k}={_toml(v)}" for k, v in flat.items())], "", dep.cli_env, CONNECTION)
    row = wait(run_id, dep.cli_env, CONNECTION, poll=1.0, timeout=timeout)
    if row["status"] != "finished:completed":
        raise RuntimeError(f"deployed run {name} ended {row['status']}: {row.get('status-details')}\n"
                           f"{dep.log('org-a')}")
    return round_times(out / name)


def simulated(config: dict, out: Path, name: str) -> list[float]:
    from pubswap_flwr.simulation import simulate

    data = ",".join(str(path) for path in ORGS.values())  # partition n trains on organization n's file
    simulate({**config, "tasks.data-paths": data, "output.dir": str(out), "run-name": name}, len(ORGS))
    return round_times(out / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="write everything here (logs, runs) instead of a temp dir")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # as the deployment's processes (and Ray's one-CPU actors) run
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    import torch

    torch.set_num_threads(1)
    config = {**CONFIG, "num-server-rounds": args.rounds}
    timeout = 600.0 + 240.0 * args.rounds
    print(f"config: {' '.join(f'{k}={_toml(v)}' for k, v in config.items())}")
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    times: dict[str, list[float]] = {}
    load: dict[str, float] = {}  # the 1-minute load average when each setting started (other jobs share the cores)
    with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
        root = Path(tmp)
        started = time.time()
        load["simulated"] = os.getloadavg()[0]
        times["simulated"] = simulated(config, root / "runs", "simulated")
        dep = Deployment(root / "dep")
        (root / "dep").mkdir()
        try:
            dep.launch()
            load["deployed cold"] = os.getloadavg()[0]
            times["deployed cold"] = deployed(dep, {**config, "deploy.warm-worker": False}, root / "runs", "cold",
                                              timeout)
            load["deployed warm"] = os.getloadavg()[0]
            times["deployed warm"] = deployed(dep, {**config, "deploy.warm-worker": True}, root / "runs", "warm",
                                              timeout)
            workers = len(list((root / "dep" / "w").glob("*.log")))
        finally:
            left = dep.close()
        if left:
            print(f"warning: processes left after teardown: {left}")
        print(f"load average after: {os.getloadavg()[0]:.2f}; whole benchmark {time.time() - started:.0f} s; "
              f"warm workers started: {workers}")
    print(f"\nround time (s), {args.rounds} rounds, 2 nodes; median over rounds 2..{args.rounds}:")
    print(f"  {'setting':<16}{'load':>6}{'round 1':>9}{'median':>9}{'x simulated':>13}   rounds")
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    for name, values in times.items():
        ratio = medians[name] / medians["simulated"]
        print(f"  {name:<16}{load[name]:>6.1f}{values[0]:>9.1f}{medians[name]:>9.1f}{ratio:>13.2f}   "
              f"{', '.join(f'{v:.1f}' for v in values)}")
    print(f"\nwarm / simulated {medians['deployed warm'] / medians['simulated']:.2f}x (goal <= 1.5x); "
          f"cold / simulated {medians['deployed cold'] / medians['simulated']:.2f}x; "
          f"cold / warm {medians['deployed cold'] / medians['deployed warm']:.2f}x")


if __name__ == "__main__":
    main()
