"""Scoring worker process: runs scorers that can blow up on requests read from stdin, one JSON reply line each.

Run as a script by `isolation.IsolatedScorer` (never imported by the package). It imports this package's verifiers
(the same code that scores in the caller's process: the safe reasoning-gym replacements, the sympy guard), so
rewards are the same as in-process scoring. Each request is {"id", "verifier", "answer", "item", "timeout_s"} with
`item` a `TaskItem.to_dict()`; the reply is {"id", "reward": float} or {"id", "error", "type", "message"} where error
is "timeout" or "exception" (`type` names the exception the scorer raised, so the caller's reason reads as it would
in-process).

This process's main thread is the only thread that runs scorers, so a signal timer (setitimer) interrupts a slow
Python-level computation (most sympy work) and the worker stays up for the next request. The timer's exception is a
BaseException, which `except Exception` in third-party scorers does not catch; some reasoning-gym scorers use a bare
`except:` and would turn it into reward 0, so the handler also sets a flag and a request during which the timer
fired always answers "timeout". The parent enforces a hard deadline too and kills this process when a C-level
computation ignores the signal. Address space is capped (--memory-mb) so a huge number fails with MemoryError.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Running a script puts its folder first on sys.path; this package's modules must not shadow anything here.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402


class Deadline(BaseException):
    """Raised by the timer signal; a BaseException so a scorer's `except Exception` cannot swallow it."""


_fired = False


def _on_alarm(signum, frame):
    global _fired
    _fired = True
    raise Deadline()


def _limit_memory(megabytes: int) -> None:
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
        print(f"scoring worker: memory limit not set: {err}", file=sys.stderr)


def main() -> int:
    global _fired
    parser = argparse.ArgumentParser()
    parser.add_argument("--package-root", required=True, help="folder holding the pubswap_flwr package")
    parser.add_argument("--memory-mb", type=int, default=2048)
    args = parser.parse_args()
    sys.path.insert(0, args.package_root)

    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries (reasoning-gym generators print) must not corrupt replies

    import pubswap_flwr.tasks  # noqa: F401 - registers every verifier, as in the caller's process
    from pubswap_flwr.tasks.items import TaskItem
    from pubswap_flwr.tasks.verifiers import VERIFIERS

    import reasoning_gym  # noqa: F401 - imported now so that the first request does not pay for it
    import sympy  # noqa: F401

    can_time = hasattr(signal, "setitimer")
    if can_time:
        signal.signal(signal.SIGALRM, _on_alarm)
    _limit_memory(args.memory_mb)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        request = None
        try:
            request = json.loads(line)
            request_id = request["id"]
            scorer = VERIFIERS[str(request["verifier"])]
            answer = str(request["answer"])
            item = TaskItem.from_dict(request["item"])
            timeout_s = float(request.get("timeout_s") or 0)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            reply = {"id": request.get("id") if isinstance(request, dict) else None, "error": "exception",
                     "type": "BadRequest", "message": f"{type(err).__name__}: {err}"}
        else:
            _fired = False
            try:
                try:
                    if can_time and timeout_s > 0:
                        signal.setitimer(signal.ITIMER_REAL, timeout_s)
                    reply = {"reward": float(scorer(answer, item))}
                finally:
                    if can_time:
                        signal.setitimer(signal.ITIMER_REAL, 0)
            except Deadline:
                reply = {}
            except Exception as err:  # noqa: BLE001 - third-party scorer failure, returned with its type and reason
                reply = {"error": "exception", "type": type(err).__name__, "message": str(err)[:500]}
            if _fired:  # also when a scorer's bare `except:` swallowed the timer's exception
                reply = {"error": "timeout", "message": f"hit the {timeout_s:g} s timeout"}
            reply["id"] = request_id
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
