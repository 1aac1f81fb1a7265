"""Shared fixtures: the shipped embedded model, small policies, hermetic environment variables, and the suite's
workers, order and processes (pytest-xdist: tests/scheduling.py; Ctrl-C: tests/processes.py)."""

from __future__ import annotations

import os
import signal
import socket
import threading

import pytest

from tests.processes import MARK, marked, stop_pids
from tests.scheduling import Planned, TwoEndedScheduling, slow_first

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
# One OpenMP / MKL / BLAS thread for the test process and everything it starts (Flower and Ray processes, scorers,
# warm workers inherit the environment): the models under test are small, and threads that outnumber free cores
# spin (the fast tier did not finish in 15 min beside a sweep with torch's default threads; 4 min with one). A
# test that checks the thread policy itself sets or removes these variables with monkeypatch. Set here, before any
# test module imports torch; PUBSWAP_TEST_THREADS overrides the count.
_THREADS = os.environ.get("PUBSWAP_TEST_THREADS", "1")
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    if not os.environ.get(_variable):
        os.environ[_variable] = _THREADS


# After Ctrl-C, a process that runs tests exits within this many seconds whatever its fixtures' finalizers do, and
# the xdist controller (which waits for its workers) within the second figure
INTERRUPT_EXIT_SECONDS = 2.5
CONTROLLER_EXIT_SECONDS = 3.5
_WAKEUP = socket.socketpair()  # kept open for the whole process: the signal's C handler writes into it


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker per CPU this process may use (its affinity and cgroup quota, as
    the model's threads), none for a run of named tests (`pytest tests/x.py::test_y`) or with `-s` (output that
    xdist's workers would swallow). PYTEST_XDIST_AUTO_NUM_WORKERS, pytest-xdist's own override, still wins."""
    from pubswap_flwr.policy.threads import machine_cpus

    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    if config.args and all("::" in arg for arg in config.args) or config.getoption("capture") == "no":
        return 0
    return machine_cpus()


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (pyproject's addopts) takes the queue from both ends (tests/scheduling.py)."""
    return TwoEndedScheduling(config, log) if config.getoption("dist") == "loadgroup" else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """On xdist's workers (whose collections the scheduler reads in order), the slow tests first, longest first;
    a run in one process keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    plan = []
    for item in items:
        group = item.get_closest_marker("xdist_group")
        name = None if group is None else str(group.args[0] if group.args else group.kwargs.get("name", "default"))
        plan.append(Planned(item.nodeid, item.get_closest_marker("slow") is not None, name))
    items[:] = [items[position] for position in slow_first(plan)]


def pytest_runtest_setup(item):
    """On xdist's workers, a grouped test fails where `xdist_group` would not keep its group on one worker:
    pytest-xdist 3.8 groups by the "@<group>" it appends to a test's id, which pytest 9.2 ignores (its ids are
    computed), so every grouped test became a unit of its own and the shared module fixtures (a Flower run, a
    deployment) were made again for each test: the full suite took 1001 s instead of about 650 on 2026-12-07.
    pyproject pins pytest for this."""
    if hasattr(item.config, "workerinput") and item.config.getvalue("loadgroup") and "@" not in item.nodeid \
            and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(f"xdist_group has no effect with pytest {pytest.__version__} and this pytest-xdist (the test id "
                    "has no @<group> suffix): install the pytest that pyproject.toml's test extras pin (bash "
                    "scripts/setup.sh)", pytrace=False)


def pytest_configure(config):
    """Marks this process's children (tests/processes.py MARK) and makes Ctrl-C end the run within seconds."""
    worker = getattr(config, "workerinput", None)
    outer = os.environ.get(MARK)
    own = f"pytest-{os.getpid()}" if worker is None else str(worker["workerid"])
    os.environ[MARK] = f"{outer}/{own}" if outer else own
    runs_tests = worker is not None or config.getoption("dist", "no") == "no"
    _watch_for_ctrl_c(INTERRUPT_EXIT_SECONDS if runs_tests else CONTROLLER_EXIT_SECONDS, kill_at_once=runs_tests)


def _kill_marked() -> None:
    for pid in marked(os.environ[MARK]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _watch_for_ctrl_c(exit_seconds: float, kill_at_once: bool) -> None:
    """On SIGINT, from a thread of its own (the main thread may sit in Ray's or torch's C++ for long, and Python
    runs signal handlers there only): SIGKILL every process the tests started (Ray, Flower's processes, scorers,
    runs of `pubswap`) at once where tests run, then, after `exit_seconds` for the usual KeyboardInterrupt's
    finalizers and reports, whatever is left of them and this process (exit 130)."""
    if threading.current_thread() is not threading.main_thread():
        return
    reader, writer = _WAKEUP
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)  # C's handler writes the signal's number

    def finish() -> None:
        _kill_marked()
        os._exit(130)

    def watch() -> None:
        while signal.SIGINT not in (received := reader.recv(64)):
            if not received:
                return
        if kill_at_once:
            _kill_marked()
        deadline = threading.Timer(exit_seconds, finish)
        deadline.daemon = True  # a run that ends sooner exits with its own status
        deadline.start()

    threading.Thread(target=watch, name="ctrl-c", daemon=True).start()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """In the process that started pytest, after xdist's workers are down: stop and name any process the tests
    left running."""
    if hasattr(session.config, "workerinput"):
        return
    left = marked(os.environ[MARK])
    if left:
        stop_pids(sorted(left), grace=2.0)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"the tests left {len(left)} process(es) running, now stopped:"]
        lines += [f"  {pid} {command[:200]}" for pid, command in left.items()]
        if reporter is not None:
            reporter.write_line("\n".join(lines), yellow=True)


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    """torch's intra-op threads as the environment above says (torch may have been imported before conftest)."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    yield


# The smallest valid PNG (1x1, grey): what a report's figure file holds in tests that do not render figures
UNRENDERED_PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010800000000"
                               "3a7e9b550000000a49444154789c63680000008200816cc96d4a0000000049454e44ae426082")


@pytest.fixture(autouse=True)
def _figures_unrendered(request, monkeypatch):
    """Reports build every figure (tests read their artists, ticks and titles) but do not lay out and draw them:
    rendering was most of a report test's time, and no test compares pixels. A test marked `rendered_figures`
    renders them for real (tests/unit/test_report_files.py checks the PNG itself)."""
    if request.node.get_closest_marker("rendered_figures") is None:
        from pubswap_flwr.report import plots

        monkeypatch.setattr(plots, "render_png", lambda fig: UNRENDERED_PNG)


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """A test that runs a `pubswap` command configures the package's console logging for the whole process; each test
    starts from the same logging state instead (a command's INFO lines otherwise reached the next tests' stderr)."""
    import logging

    names = ("", "flwr", "pubswap_flwr", "pubswap_flwr.clients")
    saved = [(logger, list(logger.handlers), logger.level, logger.propagate)
             for logger in map(logging.getLogger, names)]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture(scope="session")
def tiny_location() -> str:
    from pubswap_flwr.policy.model import resolve_model

    return resolve_model("embedded:tiny")


@pytest.fixture()
def tiny_policy():
    """A fresh Policy on the shipped model (LoRA r=8 so tests stay quick)."""
    import torch

    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec

    torch.manual_seed(0)
    return Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16)))


def perturbed_tiny_policies() -> dict:
    """Both embedded models with a non-trivial adapter (LoRA B not zero), so merged weights matter: name -> Policy."""
    import torch

    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec

    torch.manual_seed(0)
    out = {}
    for name in ("embedded:tiny", "embedded:tiny-b"):
        policy = Policy(PolicySpec(model_name=name, lora=LoraSettings(r=8, alpha=16)))
        with torch.no_grad():
            for param in policy.model.parameters():
                if param.requires_grad:
                    param.add_(0.05 * torch.randn_like(param))
        out[name] = policy
    return out
