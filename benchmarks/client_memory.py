"""Benchmark (#36): memory of one SmolLM2-135M client through a round, side by side in one run, each arm in a fresh
process: peak RSS while loading, sampling (4 prompts x 8, 64 new tokens, bf16 sampling copy) and updating (every row
trained, train.micro-batch-size 16 as configs/real.toml), and the RSS it holds after the update, between rounds.

    python benchmarks/client_memory.py [--micro-batch 16] [--repeats 1]

Arms: the plain log-probs (full-vocabulary logits of the micro-batch) against the chunked ones
(policy/grpo_loss.py), each with the allocator as it is (PUBSWAP_ALLOCATOR=default), trimmed after loading and
after each update (=trim), and trimmed with large allocations mapped on their own (policy/memory.py); and the
default: chunked with the completion pass's decoder layers recomputed in the backward pass instead of kept.
Prints MiB per stage, the update's wall time, and ratios against the plain arm. Goal: peak <= 2.5 GB, held <= 1.5 GB.
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

ARMS = [  # (label, log-probs path, PUBSWAP_ALLOCATOR)
    ("plain, allocator as is", "plain", "default"),
    ("chunked, allocator as is", "chunked", "default"),
    ("plain, trim", "plain", "trim"),
    ("chunked, trim", "chunked", "trim"),
    ("plain, trim + mmap threshold", "plain", ""),
    ("chunked, trim + mmap threshold", "chunked", ""),
    ("chunked + layers recomputed, trim + mmap (default)", "checkpointed", ""),
]
PATHS = ("plain", "chunked", "checkpointed")


def _use_path(policy, path: str) -> None:
    """plain: full-vocabulary logits; chunked: the LM head a few positions at a time; checkpointed: chunked, and the
    completion pass's decoder layers recomputed in the backward pass (policy/grpo_loss.py, train.recompute-layers)."""
    import dataclasses

    from pubswap_flwr.policy import grpo_loss

    grpo_loss.CHUNK_ABOVE = 1 << 62 if path == "plain" else grpo_loss.CHUNKED_ABOVE
    learner = policy.learner
    learner.settings = dataclasses.replace(learner.settings, recompute_layers=path == "checkpointed")


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def _arm(path: str, allocator: str, micro_batch: int, model: str, queue) -> None:
    os.environ["PUBSWAP_ALLOCATOR"] = allocator
    import real_model
    import torch
    from real_model import _groups, _items, _policy

    real_model.MODEL = model

    from pubswap_flwr.rollouts import RolloutGroup

    torch.set_num_threads(1)
    out = {}
    _reset_peak()
    policy = _policy(dtype="auto", micro_batch=micro_batch)
    _use_path(policy, path)
    out["load peak"], out["after load"] = _status("VmHWM"), _status("VmRSS")
    items = _items(4)
    torch.manual_seed(0)
    _reset_peak()
    groups = _groups(policy, items, policy.sample(items, 8))
    out["sample peak"] = _status("VmHWM")
    every_row = [RolloutGroup(g.prompt, g.completions, [float(i % 2) for i in range(len(g.completions))])
                 for g in groups]
    _reset_peak()
    started = time.perf_counter()
    policy.update(every_row)
    out["update s"] = time.perf_counter() - started
    out["update peak"], out["held after update"] = _status("VmHWM"), _status("VmRSS")
    queue.put(out)


def _update_times(model: str, micro_batch: int, repeats: int, queue) -> None:
    """One process, the same sampled batch: updates with each log-prob path interleaved, each from the same adapter
    and a fresh optimizer, so all see the same machine load (like for like)."""
    import real_model
    import torch
    from real_model import _groups, _items, _policy

    from pubswap_flwr.rollouts import RolloutGroup

    real_model.MODEL = model
    torch.set_num_threads(1)
    policy = _policy(dtype="auto", micro_batch=micro_batch)
    items = _items(4)
    torch.manual_seed(0)
    groups = [RolloutGroup(g.prompt, g.completions, [float(i % 2) for i in range(len(g.completions))])
              for g in _groups(policy, items, policy.sample(items, 8))]
    start = policy.adapter()
    times: dict[str, list] = {path: [] for path in PATHS}
    losses: dict[str, list] = {path: [] for path in PATHS}
    for _ in range(repeats):
        for mode in PATHS:
            _use_path(policy, mode)
            policy.load_adapter(start)
            policy.learner.reset_optimizer()
            began = time.perf_counter()
            stats = policy.update(groups)
            times[mode].append(time.perf_counter() - began)
            losses[mode].append((stats.loss, stats.grad_norm))
    queue.put((times, losses))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="processes per arm (medians are printed)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model.name (embedded:tiny to try it)")
    parser.add_argument("--time-repeats", type=int, default=3,
                        help="interleaved updates of each path in one process for the time ratio (0: skip)")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    print(f"One {args.model} client (generation.dtype auto, micro-batch {args.micro_batch}, 1 thread), MiB; "
          f"{args.repeats} process(es) per arm, medians:")
    keys = ["load peak", "after load", "sample peak", "update peak", "held after update", "update s"]
    print(f"  {'arm':<42}" + "".join(f"{k:>19}" for k in keys))
    results = {}
    for label, path, allocator in ARMS:
        runs = []
        for _ in range(args.repeats):
            queue = context.Queue()
            proc = context.Process(target=_arm, args=(path, allocator, args.micro_batch, args.model, queue))
            proc.start()
            proc.join()
            if proc.exitcode != 0 or queue.empty():
                sys.exit(f"arm {label!r}: its process ended with exit code {proc.exitcode} and no result")
            runs.append(queue.get())
        results[label] = {k: statistics.median(r[k] for r in runs) for k in keys}
        row = results[label]
        print(f"  {label:<42}" + "".join(f"{row[k]:>19.1f}" if k == "update s" else f"{row[k]:>19.0f}"
                                          for k in keys), flush=True)
    base = results[ARMS[0][0]]
    for label, _, _ in ARMS[1:]:
        row = results[label]
        peak = max(row["load peak"], row["sample peak"], row["update peak"])
        base_peak = max(base["load peak"], base["sample peak"], base["update peak"])
        held = row["held after update"]
        print(f"  {label}: round peak {peak:.0f} MiB ({peak / base_peak:.2f}x plain), held {held:.0f}"
              f" MiB ({held / base['held after update']:.2f}x), update time "
              f"{row['update s'] / base['update s']:.2f}x")
    print("  goal: round peak <= 2560 MiB, held <= 1536 MiB")
    if args.time_repeats:
        queue = context.Queue()
        proc = context.Process(target=_update_times, args=(args.model, args.micro_batch, args.time_repeats, queue))
        proc.start()
        proc.join()
        if proc.exitcode != 0 or queue.empty():
            sys.exit(f"the timing process ended with exit code {proc.exitcode} and no result")
        times, losses = queue.get()
        median = {path: statistics.median(times[path]) for path in PATHS}
        print(f"Update time, one process, the paths interleaved x {args.time_repeats} (same batch, adapter and "
              f"optimizer state): " + ", ".join(f"{path} {median[path]:.1f} s" for path in PATHS)
              + "; ratios to plain: " + ", ".join(f"{path} {median[path] / median['plain']:.2f}" for path in PATHS[1:]))
        for path in PATHS:
            print(f"  loss and grad norm, {path}: {losses[path][0]}")


if __name__ == "__main__":
    main()
