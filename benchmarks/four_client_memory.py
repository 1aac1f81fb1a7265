"""Benchmark (#36 item 1): memory of a 4-client SmolLM2 simulation round with the server's evaluator: one round of
configs/real.toml (4 simulated clients on Flower's Ray engine, held-out evaluation at rounds 0 and 1) while a
sampler reads every process of the run's tree from /proc twice a second.

    python benchmarks/four_client_memory.py [--nodes 4] [--cpus-per-client 1] [--rounds 1] [--interval 0.5]

Prints each process's peak RSS (named by role: the simulate driver with the ServerApp and its evaluator, each Ray
actor, Ray's own daemons) and the peak of the sum over the tree, both as RSS (shared library pages counted once per
process) and as PSS (shared pages split between the processes that map them: what the machine really gives the
run). With 1 CPU per client (what `pubswap simulate` gives) a 2-core machine runs 2 Ray client actors that serve
the 4 nodes in turn; on 4 cores all 4 run at once. Goal: the whole round under 14 GB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def tree(root: int) -> list[int]:
    """`root` and every process below it (Ray's raylet and its workers are descendants of the driver)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += _children(pid)
    return pids


def role(pid: int) -> str:
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [p.decode(errors="replace") for p in parts if p]
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0]
    if "simulate" in words:
        return "pubswap simulate (ServerApp, evaluator)"
    names = [Path(w).name for w in words[:3]]
    return " ".join(n for n in names if n)[:60]


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB of one process; (0, 0) once it is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        return 0, 0
    return rss, pss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpus-per-client", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.rounds < 1 or args.interval <= 0:
        parser.error("--nodes and --rounds must be at least 1 and --interval positive")
    out = Path(tempfile.mkdtemp(prefix="four-client-memory-"))
    command = [sys.executable, "-m", "pubswap_flwr.cli", "simulate", "-c", str(ROOT / "configs" / "real.toml"),
               "-c", f"num-server-rounds={args.rounds}", "--nodes", str(args.nodes),
               "--cpus-per-client", str(args.cpus_per_client), "--run-name", "four-client-memory", "--out", str(out)]
    print("command:", " ".join(command[1:]), flush=True)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    start = time.perf_counter()
    log = (out / "simulate.log").open("w")
    child = subprocess.Popen(command, cwd=tempfile.gettempdir(), stdout=log, stderr=subprocess.STDOUT)
    peaks: dict[tuple[int, str], int] = {}
    peak_rss = peak_pss = 0
    peak_at = 0.0
    while child.poll() is None:
        rss_sum = pss_sum = 0
        for pid in tree(child.pid):
            rss, pss = memory_kib(pid)
            rss_sum += rss
            pss_sum += pss
            key = (pid, role(pid))
            peaks[key] = max(peaks.get(key, 0), rss)
        if pss_sum > peak_pss:
            peak_pss, peak_at = pss_sum, time.perf_counter() - start
        peak_rss = max(peak_rss, rss_sum)
        time.sleep(args.interval)
    log.close()
    seconds = time.perf_counter() - start
    print(f"run exit code {child.returncode} after {seconds:.0f} s; log and run directory in {out}")
    print("peak RSS per process (MiB):")
    for (pid, name), kib in sorted(peaks.items(), key=lambda item: -item[1]):
        if kib * 1024 >= 50 * MIB:
            print(f"  {kib * 1024 / MIB:8.0f}  {name} (pid {pid})")
    print(f"peak of the tree's sum: RSS {peak_rss * 1024 / MIB:.0f} MiB, PSS {peak_pss * 1024 / MIB:.0f} MiB "
          f"(at {peak_at:.0f} s); goal: under 14 GB ({14 * 1024} MiB)")
    return 0 if child.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
