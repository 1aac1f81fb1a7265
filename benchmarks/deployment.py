"""Benchmark: round time of a real localhost deployment with and without the warm worker (`deploy.warm-worker`)
against Flower's simulation engine and against the Flower floor (the same messages, no work), side by side in one run.

    python benchmarks/deployment.py [--model tiny|smollm2] [--rounds 5] [--keep DIR]

Deployed: a TLS SuperLink with node authentication and two SuperNodes on loopback (tests/integration/flower_harness),
each organization with its sample file (data/samples/org-a.jsonl, org-b.jsonl), runs submitted with `flwr run`.
Simulated: `pubswap_flwr.simulation.simulate` (Ray, one CPU per client) with the same two files as
`tasks.data-paths`. Floor: benchmarks/floor_app, run with `flwr run` in the same deployment, sends each node the
PubSwap round's messages (`train.segment`, one exchange after another), which its ClientApp answers at once with an
empty record. `floor + bytes` and `floor + tensors` also carry, in each node's first message and last reply of a
round, as many random bytes as a PubSwap node received and sent per round (measured in the simulated run): in one
array, or in as many arrays as the adapter has tensors (Flower moves each array as its own object). Every process
uses one torch thread.

`--model tiny` (default) is the embedded tiny model; `--model smollm2` the packaged SmolLM2-135M-Instruct, with
32 new tokens and two held-out items per task, so that a round takes tens of seconds. Prints each setting's round
times (`time.round_s` of metrics.jsonl), round 1 and the median over rounds 2..N (round 1 also starts Ray's actors,
or the warm workers), the ratios to the simulated round, the time above the floor, the goal of issue #24 (a warm
round within the floor plus 20% of the simulated round), and the load average when each setting started (the cores
may be shared with other jobs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.integration.flower_harness: the localhost deployment the tests use

from pubswap_flwr.algorithms.public_schedule import fixed_positions  # noqa: E402
from pubswap_flwr.cli import submit, wait  # noqa: E402
from pubswap_flwr.server.metrics import read_metrics  # noqa: E402
from tests.integration.flower_harness import CONNECTION, ORGS, PROJECT, Deployment  # noqa: E402

FLOOR_APP = ROOT / "benchmarks" / "floor_app"
# the deployment test's config (tests/integration/test_deployment.py), PubSwap with two messages per node per round
CONFIG = {"strategy.mode": "pubswap", "train.local-steps": 2, "pubswap.tau-swap": 2, "pubswap.public-prompts": 2,
          "pubswap.public-size": 20, "train.prompts-per-step": 2, "train.completions-per-prompt": 4,
          "eval.items-per-task": 5, "eval.sampled": False, "strategy.min-clients": 2, "strategy.timeout": 600.0,
          "seed": 5}
MODELS = {"tiny": {}, "smollm2": {"model.name": "smollm2-135m-instruct", "generation.max-new-tokens": 32,
                                  "eval.items-per-task": 2}}
ROUND_BUDGET = {"tiny": 240.0, "smollm2": 600.0}  # seconds per round before a deployed run counts as hung
GOAL_SHARE = 0.2  # #24: a deployed warm round at most the Flower floor plus 20% of the simulated round's compute


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    return repr(value)


def round_times(run_dir: Path) -> list[float]:
    return [row["time"]["round_s"] for row in read_metrics(run_dir) if row["round"] > 0]


def later_rounds(run_dir: Path) -> list[dict]:
    """Metrics rows of rounds 2..N (round 1 alone if there is no other)."""
    rows = [row for row in read_metrics(run_dir) if row["round"] > 0]
    return rows[1:] or rows


def node_bytes(run_dir: Path) -> tuple[int, int]:
    """Bytes one node received and sent per round: the median over nodes and rounds 2..N."""
    clients = [c for row in later_rounds(run_dir) for c in row["clients"].values()]
    return (int(statistics.median(c["bytes_received"] for c in clients)),
            int(statistics.median(c["bytes_sent"] for c in clients)))


def adapter_tensors(run_dir: Path) -> int:
    """Tensors of the run's final adapter: the Arrays of the ArrayRecord it travels in (`wire.adapter_record`)."""
    from safetensors import safe_open

    with safe_open(str(run_dir / "adapters" / "final" / "adapter_model.safetensors"), "np") as tensors:
        return len(list(tensors.keys()))


def phases(run_dir: Path) -> str:
    rows = later_rounds(run_dir)
    parts = [f"{key.removesuffix('_s').replace('_', ' ')} {statistics.median(r['time'][key] for r in rows):.1f} s"
             for key in ("sampling_s", "update_s", "client_busy_s", "evaluation_s")]
    rewards = [r["train_reward"] for r in rows if r.get("train_reward") is not None]
    return ", ".join(parts) + (f", train reward {statistics.mean(rewards):.3f}" if rewards else "")


def segments(config: dict) -> int:
    """Messages per node in a PubSwap round of `config` (fixed schedule): one per public step, plus the last."""
    return len(fixed_positions(config["train.local-steps"], config["pubswap.tau-swap"])) + 1


def run_app(dep: Deployment, app: Path, flat: dict, run_dir: Path, timeout: float) -> list[float]:
    run_id = submit(app, [" ".join(f"{k}={_toml(v)}" for k, v in flat.items())], "", dep.cli_env, CONNECTION)
    row = wait(run_id, dep.cli_env, CONNECTION, poll=1.0, timeout=timeout)
    if row["status"] != "finished:completed":
        raise RuntimeError(f"deployed run {run_dir.name} ended {row['status']}: {row.get('status-details')}\n"
                           f"{dep.log('org-a')}")
    return round_times(run_dir)


def deployed(dep: Deployment, config: dict, out: Path, name: str, timeout: float) -> list[float]:
    return run_app(dep, PROJECT, {**config, "output.dir": str(out), "run-name": name}, out / name, timeout)


def floor(dep: Deployment, config: dict, out: Path, name: str, timeout: float, down: int = 0, up: int = 0,
          arrays: int = 1) -> list[float]:
    flat = {"num-server-rounds": config["num-server-rounds"], "segments": segments(config),
            "min-nodes": config["strategy.min-clients"], "down-bytes": down, "up-bytes": up, "arrays": arrays,
            "output-dir": str(out), "run-name": name}
    return run_app(dep, FLOOR_APP, flat, out / name, timeout)


def simulated(config: dict, out: Path, name: str) -> list[float]:
    from pubswap_flwr.simulation import simulate

    data = ",".join(str(path) for path in ORGS.values())  # partition n trains on organization n's file
    simulate({**config, "tasks.data-paths": data, "output.dir": str(out), "run-name": name}, len(ORGS))
    return round_times(out / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="keep everything (logs, runs) in a new folder here")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # as the deployment's processes (and Ray's one-CPU actors) run
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    import torch

    torch.set_num_threads(1)
    config = {**CONFIG, **MODELS[args.model], "num-server-rounds": args.rounds}
    timeout = 600.0 + ROUND_BUDGET[args.model] * args.rounds
    print(f"model: {args.model}; config: {' '.join(f'{k}={_toml(v)}' for k, v in config.items())}")
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    times: dict[str, list[float]] = {}
    load: dict[str, float] = {}  # the 1-minute load average when each setting started (other jobs share the cores)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    keep = contextlib.nullcontext(tempfile.mkdtemp(dir=args.keep)) if args.keep else tempfile.TemporaryDirectory()
    with keep as tmp:
        root = Path(tmp)
        if args.keep:
            print(f"logs and runs kept in {root}")
        runs = root / "runs"
        started = time.time()
        load["simulated"] = os.getloadavg()[0]
        times["simulated"] = simulated(config, runs, "simulated")
        down, up = node_bytes(runs / "simulated")
        tensors = adapter_tensors(runs / "simulated")
        dep = Deployment(root / "dep")
        (root / "dep").mkdir()
        try:
            dep.launch()
            load["floor"] = os.getloadavg()[0]
            times["floor"] = floor(dep, config, runs, "floor", timeout)
            load["floor + bytes"] = os.getloadavg()[0]
            times["floor + bytes"] = floor(dep, config, runs, "floor-bytes", timeout, down, up)
            load["floor + tensors"] = os.getloadavg()[0]
            times["floor + tensors"] = floor(dep, config, runs, "floor-tensors", timeout, down, up, tensors)
            load["per-message"] = os.getloadavg()[0]
            times["per-message"] = deployed(dep, {**config, "deploy.warm-worker": False}, runs, "cold", timeout)
            load["warm"] = os.getloadavg()[0]
            times["warm"] = deployed(dep, {**config, "deploy.warm-worker": True}, runs, "warm", timeout)
            workers = len(list((root / "dep" / "w").glob("*.log")))
        finally:
            left = dep.close()
        if left:
            print(f"warning: processes left after teardown: {left}")
        print(f"load average after: {os.getloadavg()[0]:.2f}; whole benchmark {time.time() - started:.0f} s; "
              f"warm workers started: {workers}")
        print(f"medians over rounds 2..{args.rounds} (s; sampling and update summed over the 2 clients):")
        for name, run in (("simulated", "simulated"), ("per-message", "cold"), ("warm", "warm")):
            print(f"  {name}: {phases(runs / run)}")
    print(f"\nround time (s), {args.rounds} rounds, 2 nodes, {segments(config)} messages per node per round; "
          f"median over rounds 2..{args.rounds}. A PubSwap node receives {down / 1e6:.3f} MB and sends "
          f"{up / 1e6:.3f} MB per round, the adapter's {tensors} tensors packed in one array; the floor's first "
          f"message and last reply carry as many random bytes, in one array (floor + bytes) or in {tensors} "
          "(floor + tensors):")
    print(f"  {'setting':<17}{'load':>6}{'round 1':>9}{'median':>9}{'x simulated':>13}{'above floor':>13}   rounds")
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    for name, values in times.items():
        ratio = medians[name] / medians["simulated"]
        above = f"{medians[name] - medians['floor']:.1f}" if name != "simulated" else "-"
        print(f"  {name:<17}{load[name]:>6.1f}{values[0]:>9.1f}{medians[name]:>9.1f}{ratio:>13.2f}{above:>13}   "
              f"{', '.join(f'{v:.1f}' for v in values)}")
    warm, sim = medians["warm"], medians["simulated"]
    print(f"\nwarm / simulated {warm / sim:.2f}x; per-message / simulated {medians['per-message'] / sim:.2f}x; "
          f"per-message / warm {medians['per-message'] / warm:.2f}x; warm / floor {warm / medians['floor']:.2f}x")
    goal = medians["floor"] + GOAL_SHARE * sim
    print(f"goal (#24): deployed warm round <= Flower floor + {GOAL_SHARE:g} x simulated round = "
          f"{medians['floor']:.1f} + {GOAL_SHARE * sim:.1f} = {goal:.1f} s; warm median {warm:.1f} s: "
          f"{'holds' if warm <= goal else 'does not hold'} ({warm - goal:+.1f} s, {warm / goal:.2f}x the bound)")
    for name in ("floor + bytes", "floor + tensors"):  # the same bound over a floor that also moves the adapter's bytes
        bound = medians[name] + GOAL_SHARE * sim
        print(f"  with {name} as the floor: {medians[name]:.1f} + {GOAL_SHARE * sim:.1f} = {bound:.1f} s: "
              f"{'holds' if warm <= bound else 'does not hold'} ({warm - bound:+.1f} s)")
    # the node's own work runs after Flower delivered the message, so it adds to the floor rather than hiding in it
    print(f"warm above the floor: {warm - medians['floor']:.1f} s = {(warm - medians['floor']) / sim:.2f} x the "
          f"simulated round (1.00 would be the node's work with no cost of its own above Flower's)")


if __name__ == "__main__":
    main()
