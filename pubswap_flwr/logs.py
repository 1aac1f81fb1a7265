"""Console logging: one handler for this package's lines (Flower's own where Flower runs), nothing printed twice,
third-party libraries quiet below WARNING, and per-client lines only when asked for (`--verbose`)."""

from __future__ import annotations

import logging
import os
import sys
import warnings

PACKAGE = "pubswap_flwr"
CLIENTS = f"{PACKAGE}.clients"  # one line per client reply in every exchange: shown with --verbose
FORMAT = "%(asctime)s %(message)s"
# Libraries whose INFO lines (alembic's "setup plugin ..." from Flower's state database, Ray's start-up, HTTP
# clients) say nothing about the run.
QUIET = ("alembic", "sqlalchemy", "ray", "transformers", "httpx", "httpcore", "urllib3", "filelock", "fsspec",
         "huggingface_hub", "datasets", "matplotlib", "PIL")


class _DropRunSimulationDeprecation(logging.Filter):
    """`pubswap simulate` calls Flower's run_simulation on purpose (it runs the apps in this process); Flower's
    seven-line notice that it is deprecated is addressed to the caller's code, not to the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith("DEPRECATED FEATURE")
                    and any("run_simulation" in str(arg) for arg in (record.args or ())))


def _quiet_third_parties() -> None:
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    # transformers configures its own logger on first use from this variable (also read by Ray workers).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Ray's tip about a future default for accelerator variables; docs/guide.md's Models section (GPUs) describes
    # today's behaviour.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray(\.|$)")


def _use_only(logger: logging.Logger, handler: logging.Handler) -> None:
    for other in list(logger.handlers):
        if other is not handler:
            logger.removeHandler(other)
    if handler not in logger.handlers:
        logger.addHandler(handler)
    logger.propagate = False


def setup(*, verbose: bool = False, flower: bool = False) -> logging.Handler:
    """Configure the console for a `pubswap` command and return the one handler this package's lines go to.

    `flower`: Flower runs in this process (simulate), so its console handler prints our lines too, in its format;
    otherwise a plain stderr handler with a time stamp. The root logger gets no handler: a library logging at INFO
    through it prints nothing, and nothing reaches the console twice."""
    _quiet_third_parties()
    package = logging.getLogger(PACKAGE)
    if flower:
        from flwr.common.logger import console_handler

        handler: logging.Handler = console_handler
        flwr_logger = logging.getLogger("flwr")
        flwr_logger.propagate = False
        if not any(isinstance(f, _DropRunSimulationDeprecation) for f in flwr_logger.filters):
            flwr_logger.addFilter(_DropRunSimulationDeprecation())
    else:
        handler = next((h for h in package.handlers if getattr(h, "_pubswap", False)), None) or _stderr_handler()
    _use_only(package, handler)
    package.setLevel(logging.INFO)
    logging.getLogger(CLIENTS).setLevel(logging.INFO if verbose else logging.WARNING)
    return handler


class _CurrentStderr(logging.StreamHandler):
    """A handler that writes to sys.stderr as it is when a line is logged: one bound at setup kept writing to a stream
    a caller had replaced and closed since (pytest's capture of an earlier test: '--- Logging error ---')."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ and setStream assign it: sys.stderr is always used
        pass


def _stderr_handler() -> logging.Handler:
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter(FORMAT, datefmt="%H:%M:%S"))
    handler._pubswap = True  # type: ignore[attr-defined]  # found again by a second setup()
    return handler


def route_logs_to_flower() -> None:
    """Under `flwr run` (no `pubswap` command configured the console): send this package's lines through Flower's
    console handler, so `flwr run --stream` and `flwr log` show the per-round progress (a logger without a handler
    would only print warnings). Per-client lines stay off; third parties are quieted as under `pubswap`."""
    _quiet_third_parties()  # before Flower's simulation engine starts Ray in this process (its FutureWarning)
    package = logging.getLogger(PACKAGE)
    flower = logging.getLogger("flwr")
    if flower.handlers and not package.handlers:
        for handler in flower.handlers:
            package.addHandler(handler)
        package.setLevel(logging.INFO)
        package.propagate = False
        clients = logging.getLogger(CLIENTS)
        if clients.level == logging.NOTSET:
            clients.setLevel(logging.WARNING)
