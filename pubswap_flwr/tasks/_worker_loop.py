"""Worker side of the worker processes: a timed, memory-capped loop answering JSON-line requests, one reply line each.

Imported by the worker scripts `_score_worker.py` and `_math_worker.py` when they run as scripts (never by the
package): a script puts this folder first on sys.path to import this module, and the import takes the folder off
sys.path again before anything else is imported, so the package's modules cannot shadow what the worker imports.

`run` parses --memory-mb, --reply-fd (and the script's own arguments) and answers on the private reply channel
--reply-fd, a pipe the parent made for this process alone: it is made non-inheritable before anything else runs, so
a child process the computation starts never holds it, and file descriptors 1 and 2 (where libraries, a reward's
prints and its children write) lead to the parent's bounded output capture, never to the replies. It points
sys.stdout at stderr, lets the script import its libraries and build its `Handler`, arms the signal timer, caps the
address space, writes {"ready": true} and then answers each request {"id", ..., "timeout_s"} with one reply line
carrying the same id (a request that cannot be read gets the script's bad-request reply). This process's main thread
is the only thread that computes, so a signal timer (setitimer, fractional seconds) of the request's `timeout_s`
interrupts slow Python-level work and the worker stays up for the next request. The timer's exception is a
BaseException, which a library's `except Exception` does not catch; a bare `except:` would, so the signal handler
also sets a flag, and a request during which the timer fired always gets the script's timeout reply. The parent
enforces a hard deadline too and kills this process when C-level work ignores the signal. Address space is capped
(--memory-mb) so a huge number fails fast with MemoryError instead of exhausting the machine.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Running a script puts its folder first on sys.path; this package's modules must not shadow anything here.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable  # noqa: E402


class Deadline(BaseException):
    """Raised by the timer signal; a BaseException so a library's `except Exception` cannot swallow it."""


_fired = False


def _on_alarm(signum, frame):
    global _fired
    _fired = True
    raise Deadline()


def _limit_memory(megabytes: int, name: str) -> None:
    if megabytes <= 0:
        return
    try:
        import resource

        limit = megabytes * 1024 * 1024
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError) as err:  # no `resource` (Windows) or a lower hard limit
        print(f"{name}: memory limit not set: {err}", file=sys.stderr)


@dataclass(frozen=True)
class Handler:
    """What a worker computes and how it words its replies (each a dict; `run` adds the id)."""

    job: Callable[[dict], Callable[[], dict]]  # a request -> its computation; KeyError/TypeError/ValueError when bad
    timed_out: Callable[[float], dict]  # the reply when the timer of this many seconds fired
    failed: Callable[[Exception], dict]  # the reply when the computation raised
    bad_request: Callable[[Exception, Any], dict]  # the whole reply, id included, to a request that cannot be read


def _write(out: Any, reply: dict) -> None:
    out.write(json.dumps(reply) + "\n")
    out.flush()


def _timed(handler: Handler, work: Callable[[], dict], timeout_s: float, can_time: bool) -> dict:
    global _fired
    _fired = False
    try:
        try:
            if can_time and timeout_s > 0:
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
            reply = work()
        finally:
            if can_time:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except Deadline:
        reply = {}
    except Exception as err:  # noqa: BLE001 - third-party failure, returned as the reason
        reply = handler.failed(err)
    if _fired:  # also when a bare `except:` swallowed the timer's exception
        reply = handler.timed_out(timeout_s)
    return reply


def run(name: str, setup: Callable[[argparse.Namespace], Handler],
        add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """Serve requests from stdin until it closes (module docstring); `setup` imports what the worker needs (stdout
    already points at stderr) and returns its handler. `name` is the worker's name in messages on stderr."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-mb", type=int, default=2048)
    parser.add_argument("--reply-fd", type=int, required=True, help="the private pipe the replies go to")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args()

    os.set_inheritable(args.reply_fd, False)  # a child of the computation must never hold the reply channel
    out = os.fdopen(args.reply_fd, "w", encoding="utf-8")
    sys.stdout = sys.stderr  # prints go to the captured output, never to the replies
    handler = setup(args)

    can_time = hasattr(signal, "setitimer")
    if can_time:
        signal.signal(signal.SIGALRM, _on_alarm)
    _limit_memory(args.memory_mb, name)
    _write(out, {"ready": True})

    for line in sys.stdin:
        if not line.strip():
            continue
        request = None
        try:
            request = json.loads(line)
            request_id = request["id"]
            work = handler.job(request)
            timeout_s = float(request.get("timeout_s") or 0)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            reply = handler.bad_request(err, request)
        else:
            reply = _timed(handler, work, timeout_s, can_time)
            reply["id"] = request_id
        _write(out, reply)
    return 0
