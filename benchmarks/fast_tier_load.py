"""Benchmark (#36 item 4): the fast tier's wall time on the machine as it is and beside busy single-threaded loaders
(`python -c "while True: pass"`, two by default), side by side in one run, with the load average before each arm.

    python benchmarks/fast_tier_load.py [--loaders 2] [--arms idle loaded] [--log LOG] [-- PYTEST ARGS]

The tests run as the README says (`-m "not slow" -n 2`, plus `-p no:cacheprovider` so nothing is written into the
checkout); everything after `--` replaces those arguments. Prints each arm's wall time, pytest's summary line, and
the loaded/idle ratio. Goals: <= 3 min idle, <= 6 min beside two loaders.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST_TIER = ["-m", "not slow", "-n", "2", "-q", "-p", "no:cacheprovider"]
LOADER = "while True: pass"


def run_tier(pytest_args: list[str], log: Path | None) -> tuple[float, int, str]:
    """(wall seconds, pytest's exit code, its summary line) of one fast-tier run in a fresh process; its whole output
    goes to `log` when given."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    seconds = time.perf_counter() - start
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return seconds, done.returncode, lines[-1].strip("= ") if lines else done.stdout[-300:]


def with_loaders(count: int, pytest_args: list[str], log: Path | None) -> tuple[float, int, str]:
    loaders = [subprocess.Popen([sys.executable, "-c", LOADER]) for _ in range(count)]
    try:
        time.sleep(2)  # the loaders are spinning before the tier starts
        return run_tier(pytest_args, log)
    finally:
        for loader in loaders:
            loader.kill()
            loader.wait()


def minutes_and_seconds(seconds: float) -> str:
    """`seconds` as "M min SS s" (whole minutes: before 2026-12-03 the minutes were rounded, so 651 s read as
    "11 min 51 s")."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else None
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loaders", type=int, default=2, help="busy single-threaded processes beside the loaded arm")
    parser.add_argument("--arms", nargs="+", choices=["idle", "loaded"], default=["idle", "loaded"])
    parser.add_argument("--log", type=Path, help="write each arm's whole pytest output to LOG.<arm>.txt")
    args = parser.parse_args(own)
    if args.loaders < 1:
        parser.error("--loaders must be at least 1")
    pytest_args = extra if extra else FAST_TIER
    print(f"fast tier: python -m pytest {' '.join(pytest_args)}; {os.cpu_count()} CPUs", flush=True)
    results: dict[str, float] = {}
    failed = False
    for arm in args.arms:
        print(f"{arm}: load average before {os.getloadavg()[0]:.2f}", flush=True)
        log = args.log.with_name(f"{args.log.name}.{arm}.txt") if args.log else None
        seconds, code, summary = (run_tier(pytest_args, log) if arm == "idle"
                                  else with_loaders(args.loaders, pytest_args, log))
        results[arm] = seconds
        failed |= code != 0
        label = arm if arm == "idle" else f"beside {args.loaders} loaders"
        print(f"{label}: {minutes_and_seconds(seconds)} (exit {code}): {summary}", flush=True)
    if len(results) == 2:
        print(f"loaded / idle: {results['loaded'] / results['idle']:.2f}x")
    print("goals: <= 3 min idle, <= 6 min beside two loaders")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
