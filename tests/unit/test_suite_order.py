"""The full suite on xdist workers (tests/scheduling.py): the slow tests longest first on one worker while another runs
the fast ones in their order, a group kept on one worker, and `-n auto` a worker per CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import scheduling
from tests.scheduling import Planned, TwoEndedScheduling, first_fast, slow_first

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def seconds(monkeypatch):
    table = {"tests/i/test_a.py::test_long": 300.0, "tests/i/test_a.py::test_p": 20.0,
             "tests/i/test_b.py": 50.0, "tests/i/test_c.py::test_p[x]": 400.0}
    monkeypatch.setattr(scheduling, "SLOW_SECONDS", table)
    return table


def test_expected_seconds_takes_the_most_specific_key_and_the_default_for_none(seconds):
    assert scheduling.expected_seconds("tests/i/test_c.py::test_p[x]") == 400.0
    assert scheduling.expected_seconds("tests/i/test_a.py::test_p[y]") == 20.0  # the function without parameters
    assert scheduling.expected_seconds("tests/i/test_b.py::test_any") == 50.0  # the module
    assert scheduling.expected_seconds("tests/i/test_d.py::test_new") == scheduling.DEFAULT_SLOW_SECONDS


def test_expected_seconds_of_a_grouped_parametrized_test_takes_its_own_key(seconds):
    """xdist appends `@<group>` to a grouped test's id: a key naming the test with its parameters still applies."""
    assert scheduling.expected_seconds("tests/i/test_c.py::test_p[x]@grp") == 400.0
    assert scheduling.expected_seconds("tests/i/test_a.py::test_p[y]@grp") == 20.0


def test_slow_units_come_first_longest_first_then_the_fast_tests_as_collected(seconds):
    tests = [Planned("tests/u/test_f.py::test_1", False),
             Planned("tests/i/test_a.py::test_p[y]", True),  # 20 s
             Planned("tests/i/test_b.py::test_1", True, "flower"),  # 50 + 50 s together
             Planned("tests/u/test_f.py::test_2", False),
             Planned("tests/i/test_b.py::test_2", True, "flower"),
             Planned("tests/i/test_a.py::test_long", True),  # 300 s
             Planned("tests/i/test_c.py::test_p[x]", True),  # 400 s
             Planned("tests/i/test_b.py::test_fast", False, "flower")]  # with its group, though fast itself
    order = [tests[p].nodeid for p in slow_first(tests)]
    assert order == ["tests/i/test_c.py::test_p[x]", "tests/i/test_a.py::test_long",
                     "tests/i/test_b.py::test_1", "tests/i/test_b.py::test_2", "tests/i/test_b.py::test_fast",
                     "tests/i/test_a.py::test_p[y]", "tests/u/test_f.py::test_1", "tests/u/test_f.py::test_2"]


def test_the_fast_worker_takes_the_first_unit_no_key_names_slow(seconds):
    queue = ["flower", "tests/i/test_a.py::test_long", "tests/i/test_new.py::test_unlisted",
             "tests/u/test_f.py::test_1", "tests/u/test_f.py::test_2"]
    assert first_fast(queue) == "tests/i/test_new.py::test_unlisted"  # a slow test no key names counts as fast
    assert first_fast(queue[3:]) == "tests/u/test_f.py::test_1"
    assert first_fast(queue[:2]) is None  # a group and a named test


class _Node:
    def __init__(self, worker: str):
        self.gateway = SimpleNamespace(id=worker)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _run(collection: list[str], workers: int, durations: dict[str, float]) -> dict[str, list[tuple[float, str]]]:
    """The scheduler driven as xdist's controller drives it, each worker running its tests one after the other
    in `durations` seconds each (1 s when not named): worker -> [(start, test id)]."""
    config = SimpleNamespace(getvalue=lambda name: {"tx": ["popen"] * workers}[name],
                             option=SimpleNamespace(loadscopereorder=False), getoption=lambda name: "loadgroup")
    sched = TwoEndedScheduling(config)
    nodes = [_Node(f"gw{n}") for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    started: dict[str, list[tuple[float, str]]] = {node.gateway.id: [] for node in nodes}
    taken = {node.gateway.id: 0 for node in nodes}  # tests each worker started
    running: dict[str, tuple[float, int]] = {}  # worker -> (end, index)
    now = 0.0
    while True:
        for node in nodes:  # xdist starts a test only when the one after it is known, or the worker is shut down
            worker = node.gateway.id
            if worker not in running and taken[worker] < len(node.sent) and \
                    (taken[worker] + 1 < len(node.sent) or node.shutting_down):
                index = node.sent[taken[worker]]
                started[worker].append((now, collection[index]))
                running[worker] = (now + durations.get(collection[index], 1.0), index)
                taken[worker] += 1
        if not running:
            break
        worker = min(running, key=lambda w: running[w][0])
        now, index = running.pop(worker)
        sched.mark_test_complete(next(n for n in nodes if n.gateway.id == worker), index)
    assert sorted(t for runs in started.values() for _, t in runs) == sorted(collection), "every test once"
    return started


def test_one_worker_starts_the_slow_tests_longest_first_while_the_other_runs_the_fast_ones(monkeypatch):
    slow = {"tests/i/test_s.py::test_400": 400.0, "tests/i/test_s.py::test_300": 300.0,
            "tests/i/test_s.py::test_200": 200.0, "tests/i/test_s.py::test_100": 100.0}
    monkeypatch.setattr(scheduling, "SLOW_SECONDS", slow)
    fast = [f"tests/u/test_{m}.py::test_{n}" for m in "fgh" for n in range(50)]  # 150 s of 1 s tests
    started = _run([*slow, *fast], 2, slow)
    assert started["gw0"][0] == (0.0, "tests/i/test_s.py::test_400")
    # the other worker begins with the first fast test; each worker runs the fast tests in their order (the slow
    # worker takes one now and then)
    assert started["gw1"][0] == (0.0, "tests/u/test_f.py::test_0")
    for runs in started.values():
        ran = [t for _, t in runs if t not in slow]
        assert ran == sorted(ran, key=fast.index)
    # the slow worker holds a fast test, not the 300 s one, behind the 400 s one: the fast worker starts it
    assert [t for _, t in started["gw1"] if t in slow][0] == "tests/i/test_s.py::test_300"
    ends = {w: runs[-1][0] + slow.get(runs[-1][1], 1.0) for w, runs in started.items()}
    # 1150 s of work on two workers: they end within the shortest slow test of an even split
    assert max(ends.values()) <= 1150 / 2 + 100, ends


def test_a_group_runs_on_one_worker_in_its_order():
    collection = ["tests/i/test_a.py::test_1@flower", "tests/i/test_a.py::test_2@flower",
                  "tests/i/test_a.py::test_3@flower", "tests/i/test_s.py::test_x",
                  *[f"tests/u/test_f.py::test_{n}" for n in range(6)]]
    started = _run(collection, 2, {"tests/i/test_s.py::test_x": 30.0})
    group = [(w, t) for w, runs in started.items() for _, t in runs if t.endswith("@flower")]
    assert [t for _, t in group] == collection[:3] and len({w for w, _ in group}) == 1


def _pytest(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # two pytest runs, one with its workers
def test_plain_pytest_runs_a_worker_per_cpu_and_a_named_test_in_one_process():
    from pubswap_flwr.policy.threads import machine_cpus

    workers = machine_cpus()
    out = _pytest("tests/unit/test_tiers.py")
    assert re.search(rf"^(created: {workers}/{workers} workers|{workers} workers \[3 items\])", out, re.M), out
    out = _pytest("tests/unit/test_tiers.py::test_tuples_are_spread_over_the_arguments_and_dicts_kept_whole")
    assert "worker" not in out and "1 passed" in out, out
