"""Console logging: one handler for the package's lines, no line printed twice (not even with a root handler such as
logging.basicConfig installs), per-client lines only with --verbose, third-party INFO lines silent."""

from __future__ import annotations

import io
import logging
import warnings

import flwr.common.logger  # noqa: F401  (Flower's handler exists before the fixture records the loggers' state)
import pytest

from pubswap_flwr import logs

TOUCHED = ("", "flwr", logs.PACKAGE, logs.CLIENTS, *logs.QUIET)


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch):
    """setup() changes process-wide logging state: put every logger it touches back as it was."""
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    saved = {name: (logging.getLogger(name), list(logging.getLogger(name).handlers),
                    list(logging.getLogger(name).filters), logging.getLogger(name).level,
                    logging.getLogger(name).propagate) for name in TOUCHED}
    with warnings.catch_warnings():
        yield
    for logger, handlers, filters, level, propagate in saved.values():
        logger.handlers[:], logger.filters[:] = handlers, filters
        logger.setLevel(level)
        logger.propagate = propagate


def _root_handler_like_basic_config() -> io.StringIO:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("ROOT %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    return stream


@pytest.fixture()
def console(monkeypatch):
    """setup() with its handler writing into a buffer (Flower's handler holds the stream of its import time; ours
    writes to sys.stderr as it is when a line is logged)."""

    def configure(**kwargs) -> io.StringIO:
        handler = logs.setup(**kwargs)
        stream = io.StringIO()
        monkeypatch.setattr(*((handler, "stream") if kwargs.get("flower") else ("sys.stderr",)), stream)
        return stream

    return configure


@pytest.mark.parametrize("flower", [False, True])
def test_one_handler_and_each_line_once(console, flower):
    root = _root_handler_like_basic_config()
    first = logs.setup(flower=flower)
    out = console(flower=flower)  # a second setup adds nothing
    assert logging.getLogger(logs.PACKAGE).handlers == [first]
    logging.getLogger("pubswap_flwr.server.runner").info("round 1 done")
    logging.getLogger("flwr").info("flower line")
    assert out.getvalue().count("round 1 done") == 1 and root.getvalue().count("round 1 done") == 0
    if flower:
        assert out.getvalue().count("flower line") == 1 and root.getvalue().count("flower line") == 0


def test_per_client_lines_only_with_verbose(console):
    out = console()
    logging.getLogger(logs.CLIENTS).info("client 0: 1.0 s")
    assert "client 0" not in out.getvalue()
    out = console(verbose=True)
    logging.getLogger(logs.CLIENTS).info("client 0: 1.0 s")
    assert out.getvalue().count("client 0: 1.0 s") == 1


def test_third_party_info_lines_and_ray_future_warning_are_silent(console):
    root = _root_handler_like_basic_config()
    out = console(flower=True)
    logging.getLogger("alembic.runtime.plugins").info("setup plugin alembic.autogenerate.schemas")
    logging.getLogger("transformers.generation").info("generation flags")
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit("Tip: In future versions of Ray ...", FutureWarning, "worker.py", 2051,
                               module="ray._private.worker")
        warnings.warn_explicit("ours", FutureWarning, "x.py", 1, module="pubswap_flwr.x")
    assert [str(w.message) for w in caught] == ["ours"]
    from flwr.common.logger import warn_deprecated_feature

    warn_deprecated_feature("The `run_simulation` function is deprecated and will be removed")
    printed = out.getvalue() + root.getvalue()
    assert "alembic" not in printed and "generation flags" not in printed and "DEPRECATED" not in printed
    for name in logs.QUIET:  # their warnings still pass
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING
    warn_deprecated_feature("something else")
    assert "something else" in out.getvalue()


class _SilentGrid:
    """Two connected nodes that never reply."""

    def get_node_ids(self):
        return [11, 12]

    def send_and_receive(self, messages, timeout=None):
        return []


def _message(node: int, number: int, kind: str):
    from types import SimpleNamespace

    from flwr.app import RecordDict

    return SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node, message_id=f"m{number}-{node}",
                                                    message_type=kind), content=RecordDict())


def test_every_exchange_logs_its_progress_inside_the_round():
    from pubswap_flwr.rounds.exchange import Exchange

    lines: list[str] = []
    collector = logging.Handler()
    collector.emit = lambda record: lines.append(record.getMessage())
    package = logging.getLogger(logs.PACKAGE)
    package.addHandler(collector)
    package.setLevel(logging.INFO)
    exchange = Exchange(_SilentGrid(), timeout=5, min_clients=1, fraction=1.0, seed=0, settle_seconds=0)
    nodes = exchange.select(3)
    for number in (1, 2):
        exchange.send([_message(n, number, "train.segment") for n in nodes], decode=None)
    exchange.select(4)
    exchange.send([_message(11, 3, "query.rollouts")], decode=None)
    progress = [line for line in lines if line.startswith("[round")]
    assert [line.split(" replied in")[0] for line in progress] == [
        "[round 3] train.segment #1: sent to 2 client(s), waiting for replies", "[round 3] train.segment #1: 0 of 2",
        "[round 3] train.segment #2: sent to 2 client(s), waiting for replies", "[round 3] train.segment #2: 0 of 2",
        "[round 4] query.rollouts #1: sent to 1 client(s), waiting for replies", "[round 4] query.rollouts #1: 0 of 1"]
    assert progress[1].endswith(", 2 dropped")


def test_the_console_handler_writes_to_stderr_as_it_is_when_a_line_is_logged(monkeypatch):
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    logs.setup()
    logging.getLogger(logs.PACKAGE).info("one")
    first.close()  # as pytest closes an earlier test's capture
    monkeypatch.setattr("sys.stderr", second)
    logs.setup()  # a second setup finds the same handler again
    logging.getLogger(logs.PACKAGE).info("two")
    assert second.getvalue().rstrip().endswith("two") and "Logging error" not in second.getvalue()
