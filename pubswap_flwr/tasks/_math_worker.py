"""Math-verify worker process: reads JSON comparison requests on stdin, answers one JSON line each on stdout.

Run as a script by `math_answers.MathChecker` (never imported by the package): it imports only the standard library
and math-verify, so it starts without torch or Flower. Each request is {"id", "gold", "answer", "timeout_s"} with
both texts already prepared as LaTeX (`$...$`); the reply is {"id", "equal": bool} or {"id", "error", "message"}
where error is "gold_unparsed", "answer_unparsed", "timeout", "memory" or "error".

This process's main thread is the only thread that runs math-verify, so a signal timer (setitimer, fractional
seconds) can interrupt a slow parse or comparison; math-verify's own signal timeouts are switched off because they
swallow the timeout into an empty parse / False. The parent also enforces a hard deadline and kills this process
when a C-level computation ignores the signal. Address space is capped (--memory-mb) so a huge power or factorial
fails with MemoryError instead of exhausting the machine. Model text is never evaluated as code: only math-verify's
LaTeX extraction (an ANTLR parser) is used, not its sympy `parse_expr` expression path, which calls eval().
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Running a script puts its folder first on sys.path; this package's modules must not shadow anything here.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402


class Deadline(BaseException):
    """Raised by the timer signal; a BaseException so math-verify's `except Exception` cannot swallow it."""


def _on_alarm(signum, frame):
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
        print(f"math worker: memory limit not set: {err}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-mb", type=int, default=2048)
    args = parser.parse_args()

    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the reply stream

    from math_verify import LatexExtractionConfig, parse, verify

    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    extraction = [LatexExtractionConfig(boxed_match_priority=0)]

    def parsed(text: str) -> list:
        return parse(text, extraction_config=extraction, fallback_mode="no_fallback", parsing_timeout=None,
                     raise_on_error=False)

    def compare(gold_text: str, answer_text: str) -> dict:
        gold = parsed(gold_text)
        if not gold:
            return {"error": "gold_unparsed", "message": "reference answer could not be parsed as math"}
        answer = parsed(answer_text)
        if not answer:
            return {"error": "answer_unparsed", "message": "answer could not be parsed as math"}
        return {"equal": bool(verify(gold, answer, timeout_seconds=None, raise_on_error=False))}

    signal.signal(signal.SIGALRM, _on_alarm)
    _limit_memory(args.memory_mb)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            request_id = request["id"]
            gold_text, answer_text = str(request["gold"]), str(request["answer"])
            timeout_s = float(request.get("timeout_s") or 0)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            reply = {"id": None, "error": "error", "message": f"bad request: {err}"}
        else:
            try:
                try:
                    if timeout_s > 0:
                        signal.setitimer(signal.ITIMER_REAL, timeout_s)
                    reply = compare(gold_text, answer_text)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except Deadline:
                reply = {"error": "timeout", "message": f"math check hit the {timeout_s:g} s timeout"}
            except MemoryError:
                reply = {"error": "memory", "message": f"math check ran out of memory (limit {args.memory_mb} MB)"}
            except RecursionError:
                reply = {"error": "error", "message": "math check hit the recursion limit"}
            except Exception as err:  # noqa: BLE001 - third-party parser/sympy failure, returned as the reason
                reply = {"error": "error", "message": f"{type(err).__name__}: {str(err)[:200]}"}
            reply["id"] = request_id
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
