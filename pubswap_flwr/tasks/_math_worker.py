"""Math-verify worker process: reads JSON comparison requests on stdin, answers one JSON line each on stdout.

Run as a script by `math_answers.MathChecker` (never imported by the package); the loop, the signal timer and the
memory cap are `_worker_loop.py`'s, shared with the scoring worker. It imports only the standard library and
math-verify, so it starts without torch or Flower. Each request is {"id", "gold", "answer", "timeout_s"} with both
texts already prepared as LaTeX (`$...$`); the reply is {"id", "equal": bool} or {"id", "error", "message"} where
error is "gold_unparsed", "answer_unparsed", "timeout", "memory" or "error".

math-verify's own signal timeouts are switched off: they swallow the timeout into an empty parse / False, while the
loop's timer (fractional seconds) answers "timeout". A huge power or factorial fails with MemoryError under the
loop's memory cap instead of exhausting the machine. Model text is never evaluated as code: only math-verify's LaTeX
extraction (an ANTLR parser) is used, not its sympy `parse_expr` expression path, which calls eval().
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _worker_loop  # noqa: E402 - importing it takes this folder off sys.path again


def setup(args) -> _worker_loop.Handler:
    import logging

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

    def job(request: dict):
        gold_text, answer_text = str(request["gold"]), str(request["answer"])
        return lambda: compare(gold_text, answer_text)

    def failed(err: Exception) -> dict:
        if isinstance(err, MemoryError):
            return {"error": "memory", "message": f"math check ran out of memory (limit {args.memory_mb} MB)"}
        if isinstance(err, RecursionError):
            return {"error": "error", "message": "math check hit the recursion limit"}
        return {"error": "error", "message": f"{type(err).__name__}: {str(err)[:200]}"}

    return _worker_loop.Handler(
        job=job,
        timed_out=lambda timeout_s: {"error": "timeout", "message": f"math check hit the {timeout_s:g} s timeout"},
        failed=failed,
        bad_request=lambda err, request: {"id": None, "error": "error", "message": f"bad request: {err}"},
    )


if __name__ == "__main__":
    sys.exit(_worker_loop.run("math worker", setup))
