"""The Ctrl-C flag of the command that runs a run in this process: set by its SIGINT handler, checked by the run at
each exchange's wait and evaluation batch (RunInterrupted), so the run stops and records `stopped`."""

from __future__ import annotations

import threading

INTERRUPTED_DETAIL = "interrupted (Ctrl-C)"

# Set when the command that runs a run in this process is interrupted (Ctrl-C reaches the main thread, while with
# Ray the ServerApp runs in a thread of its own): the run stops at its next check and records `stopped`.
_INTERRUPTED = threading.Event()


class RunInterrupted(KeyboardInterrupt):
    """Raised in the run's thread at its next check (an exchange's wait, an evaluation batch) after `interrupt()`."""


def interrupt() -> None:
    _INTERRUPTED.set()


def clear_interrupt() -> None:
    _INTERRUPTED.clear()


def interrupted() -> bool:
    """Whether the command running a run in this process was interrupted (and not cleared since)."""
    return _INTERRUPTED.is_set()


def check_interrupted() -> None:
    """RunInterrupted when the command running this run was interrupted."""
    if _INTERRUPTED.is_set():
        raise RunInterrupted(INTERRUPTED_DETAIL)
