"""How many torch threads a process that runs the model uses: the CPUs it was given, never more.

OpenMP threads that outnumber the free cores spin against each other (a batch-8 decode step of SmolLM2 took 0.126 s
with one thread and 3.66 s with two while other work held the second core), and torch starts as many threads as the
machine has cores in every process. Two simulated clients or two SuperNodes on a 2-core machine would each start 2.
So each process that runs a model takes, in this order:
1. `model.threads` when > 0 (the run config: every process of the run);
2. a deployed node's node-config `num-cpus` (what its organization gives the SuperNode);
3. the CPUs Ray assigned to this simulated client (Flower's `client-resources-num-cpus`; Ray also sets
   OMP_NUM_THREADS to it, unless the driver's environment already had one);
4. OMP_NUM_THREADS when set (an explicit choice for this process);
5. the CPUs this process may run on (its affinity mask, capped by a cgroup CPU quota).
Fractions round down, never below 1.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("pubswap_flwr")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str


def _whole(cpus: float) -> int:
    return max(1, math.floor(cpus))


def choose_threads(setting: int = 0, node_cpus: float | None = None, ray_cpus: float | None = None,
                   omp_env: str | None = None, machine_cpus: int = 1) -> ThreadChoice:
    """The thread count for a process (pure; see the module docstring for the order)."""
    if setting > 0:
        return ThreadChoice(setting, f"model.threads = {setting}")
    if node_cpus is not None and node_cpus > 0:
        return ThreadChoice(_whole(node_cpus), f"node-config num-cpus = {node_cpus:g}")
    if ray_cpus is not None and ray_cpus > 0:
        return ThreadChoice(_whole(ray_cpus), f"Ray gave this client {ray_cpus:g} CPU")
    if omp_env:
        try:
            value = int(omp_env)
        except ValueError:
            value = 0
        if value > 0:
            return ThreadChoice(value, f"OMP_NUM_THREADS = {value}")
    return ThreadChoice(max(1, machine_cpus), f"{machine_cpus} CPUs available to this process")


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup (v2 `cpu.max`, v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`), or None."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def machine_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(cpus, math.floor(limit))) if limit else max(1, cpus)


def ray_assigned_cpus() -> float | None:
    """The CPUs Ray assigned to this worker (a simulated client's actor), or None outside a Ray worker."""
    import sys

    if "ray" not in sys.modules:  # never import Ray just to ask
        return None
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.worker.mode != ray._private.worker.WORKER_MODE:
        return None
    return context.get_assigned_resources().get("CPU")


_applied: set[ThreadChoice] = set()


def apply_threads(setting: int = 0, node_cpus: float | None = None) -> ThreadChoice:
    """Set torch's thread count for this process from the CPUs it was given; log each new choice once."""
    import torch

    choice = choose_threads(setting, node_cpus, ray_assigned_cpus(), os.environ.get("OMP_NUM_THREADS"),
                            machine_cpus())
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    if choice not in _applied:
        _applied.add(choice)
        log.info("torch threads: %d (%s)", choice.threads, choice.reason)
    return choice
