"""The suite on pytest-xdist workers: the slow tests longest first on some, the fast ones in their order on another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from xdist.scheduler import LoadGroupScheduling

# Seconds each slow test took on one of two workers (`pytest -m slow --durations=0`, setup + call + teardown, on the
# idle 2-core machine, 2026-12-06 at 7612085). They set the slow tests' order only, so a stale figure costs minutes,
# never a result. A key is a test id, a test id without its parameters, or a module (each of its tests); a slow test
# none names counts DEFAULT_SLOW_SECONDS. The controller takes a test a key names for slow: name no module that holds
# fast tests.
_I = "tests/integration/"
SLOW_SECONDS: dict[str, float] = {
    _I + "test_deployment.py": 52,  # each of 2 (a group): 95 + 9
    _I + "test_front_door.py": 75, _I + "test_warm_worker.py": 44, _I + "test_resume.py": 9,
    _I + "test_real_model.py::test_converted_logits_equal_the_gguf_loaded_models": 40,  # the conversion
    _I + "test_real_model.py": 8,
    _I + "test_simulation.py::test_flowers_ray_engine_repeats_the_in_process_golden_metrics[pubswap-balanced]": 29,
    # a group (simulation-sapo-two-models): the first of the two, in collection order, makes the shared Ray run
    _I + "test_simulation.py::test_sapo_heterogeneous_swarm_trains_on_external_groups_without_sharing_weights": 35,
    _I + "test_simulation.py::test_flowers_ray_engine_repeats_the_in_process_golden_metrics[sapo-two-models]": 1,
    _I + "test_simulation.py::test_a_client_raising_mid_round_is_dropped_and_the_round_completes": 24,
    _I + "test_simulation.py": 6,  # in process
    _I + "test_compare.py::test_sweep_report_matches_metrics_and_names_failed_arms": 34,
    _I + "test_compare.py": 1,
    _I + "test_flower_app.py": 29,  # each of 5 (a group): 145 s in all (AMD EPYC, 2026-12-07)
    _I + "test_ray_cluster.py": 38,  # each of 2 (a group): 48 + 28
    _I + "test_gpu_sweeps.py": 20, _I + "test_learning.py": 12, _I + "test_interrupt.py": 20,
    _I + "test_ctrl_c.py::test_ctrl_c_on_simulate_with_ray_stops_cleanly": 13,
    _I + "test_beyond_papers_runs.py::"
         "test_pubswap_with_every_extension_logs_its_schedule_candidates_and_foreign_weights": 8,
    _I + "test_tiny_builder.py": 3,
    "tests/unit/test_suite_order.py::test_plain_pytest_runs_a_worker_per_cpu_and_a_named_test_in_one_process": 22,
    # torch.compile's first compile in the process (inductor's cache cold in CI), then a second model's shapes
    "tests/unit/test_decode_step.py::"
    "test_compiled_kernels_give_the_eager_steps_tokens_and_logprobs_within_rounding": 15,
    "tests/unit/test_decode_step.py::test_a_compiler_that_fails_leaves_the_eager_kernels_and_says_so": 10,
}
DEFAULT_SLOW_SECONDS = 60.0


def _table_key(nodeid: str) -> str | None:
    test = nodeid.split("@", 1)[0]  # xdist appends @<group> to a grouped test's id
    function = test.split("[", 1)[0]
    for key in (test, function, function.split("::", 1)[0]):
        if key in SLOW_SECONDS:
            return key
    return None


def expected_seconds(nodeid: str) -> float:
    """A slow test's expected duration from SLOW_SECONDS (the most specific key that names it)."""
    key = _table_key(nodeid)
    return DEFAULT_SLOW_SECONDS if key is None else SLOW_SECONDS[key]


def known_slow(unit: str) -> bool:
    """What xdist's controller, which collects nothing, knows of a work unit: an xdist group (a name without
    `::`) or a test SLOW_SECONDS names is slow."""
    return "::" not in unit or _table_key(unit) is not None


@dataclass(frozen=True)
class Planned:
    """A collected test as the order sees it."""

    nodeid: str
    slow: bool
    group: str | None = None  # its xdist_group: tests that share an expensive module fixture, run by one worker


def slow_first(tests: Sequence[Planned]) -> list[int]:
    """Positions of `tests` in run order: the slow units (an xdist group, else one test; a group is slow when one of
    its tests is) by expected seconds, longest first, then the fast tests as collected. A unit keeps its tests in
    collection order."""
    units: dict[str, list[int]] = {}
    for position, test in enumerate(tests):
        units.setdefault(test.group or test.nodeid, []).append(position)
    slow = [unit for unit in units.values() if any(tests[p].slow for p in unit)]
    slow.sort(key=lambda unit: -sum(expected_seconds(tests[p].nodeid) for p in unit))
    fast = sorted(p for unit in units.values() if not any(tests[q].slow for q in unit) for p in unit)
    return [p for unit in slow for p in unit] + fast


def first_fast(queue: Iterable[str]) -> str | None:
    """The first unit of the queue not known to be slow: the fast tests go in collection order, as in one process."""
    return next((unit for unit in queue if not known_slow(unit)), None)


def runs_fast_tests(worker_id: str, workers: int) -> bool:
    """The last worker (`gw<n-1>`, the only one of `-n 1`) runs the fast tests; the others the slow ones. A worker
    started again after a crash is one of the others."""
    return worker_id == f"gw{workers - 1}"


class TwoEndedScheduling(LoadGroupScheduling):
    """`--dist loadgroup` over the queue of `slow_first`: one worker takes the fast tests in their order (progress
    from the start) while the others take the slow tests from the front, longest first; once only slow tests are
    left, every worker takes the longest left.

    A worker runs a test only when it knows the one after it, so it always holds two. A worker of the slow tests
    takes a fast test as its second while there are any (loadgroup would queue a second slow test behind the
    first, on a worker that cannot start it for minutes)."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self.from_front: set[str] = set()  # the units a worker of the slow tests took from the front

    def _next_unit(self, node) -> str:
        front, fast = next(iter(self.workqueue)), first_fast(self.workqueue)
        if fast is None:
            return front
        if runs_fast_tests(node.gateway.id, self.numnodes):
            return fast
        held = [scope for scope, tests in self.assigned_work.get(node, {}).items() if not all(tests.values())]
        return fast if any(scope in self.from_front for scope in held) else front

    def _assign_work_unit(self, node) -> None:
        unit = self._next_unit(node)
        if unit == next(iter(self.workqueue)) and not runs_fast_tests(node.gateway.id, self.numnodes):
            self.from_front.add(unit)
        self.workqueue.move_to_end(unit, last=False)
        super()._assign_work_unit(node)

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) < 2:
            self._assign_work_unit(node)
