"""Math answers: the last \\boxed{} of a text, and the "math" verifier comparing answers by equivalence (math-verify).

The reference and the model's answer (the text inside the last <answer> tag; a \\boxed{...} inside it is used when
present) are parsed as LaTeX by math-verify and compared by mathematical equivalence: 1/2 = 0.5 = \\frac{1}{2},
{1, 2} = {2, 1}, [2, 5) intervals, 2\\sqrt{2} = \\sqrt{8}, x = 3 against 3, 50\\% = 0.5, and so on. Text that is
not LaTeX math (a broken \\frac{1}{, an empty box) is reward 0 with a reason (a ValueError that `score_completion`
records). Only math-verify's LaTeX extraction is used, never its sympy `parse_expr` path (which calls eval()), so no
model text is evaluated as code.

Timeouts. math-verify's own timeouts use signal.alarm, which only works in the main thread, and Flower runs client
code in worker threads and Ray actors. So parsing and comparison never run in the caller's process: a `MathChecker`
keeps one long-lived worker process (`_math_worker.py`, a `workers.WorkerProcess`: started with subprocess, so it
works from any thread, from Ray actors and from daemonic processes, and forks nothing that holds the caller's locks)
and talks to it over JSON lines on pipes; that handling, on both sides, is shared with the isolated scorer
(`workers.WorkerClient`, `_worker_loop.py`). Each check has two bounds:

* soft: the worker's main thread arms a signal timer of `timeout_s` around parse + verify (or less: what is left of
  the completion's scoring budget, `verifiers.remaining_seconds`); when it fires the check
  answers "timeout" and the worker stays up for the next check;
* hard: the caller waits at most `timeout_s + grace_s` for the reply; a computation that ignores the signal (a long
  C-level big-integer operation, a library that catches everything) gets the worker killed and restarted on the next
  check.

Either way the caller gets a `MathTimeout` (a `workers.ScoringTimeout`, so `score_completion` gives reward 0 with a
"scoring timeout: " reason) within the hard bound, from any thread. The worker's address space is capped
(`memory_mb`) so a huge power or factorial fails fast with an out-of-memory reason. Checks are serialized per checker
(a lock); repeated (reference, answer) pairs are answered from a small cache, which matters for GRPO groups where
many completions give the same answer. Timeouts are never cached: a pair that timed out is checked again next time.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .items import TaskItem
from .verifiers import register_verifier, remaining_seconds
from .workers import LazyDefault, ScoringTimeout, WorkerClient

WORKER_SCRIPT = Path(__file__).with_name("_math_worker.py")
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_GRACE_S = 2.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_STARTUP_TIMEOUT_S = 120.0
MAX_MATH_CHARS = 2000  # longer answers are refused before any parsing
PLAIN_WORDS = frozenset({"yes", "no", "true", "false"})  # compared as text: LaTeX would read "Yes" as Y*e*s

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_DELIMITERS = ("$", "\\(", "\\[")


class MathTimeout(ScoringTimeout):
    """A math check did not finish within its timeout (a ValueError, like every ScoringTimeout)."""


# --- text ---------------------------------------------------------------------------------------------------------


def _braced(text: str, start: int) -> str | None:
    """Content of the brace group opening at text[start] ("{"), or None when it is not closed; skips \\{ and \\}."""
    depth = 0
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5") in `text`, or None when there is none.

    An unclosed last box gives None rather than an earlier box: the last box is the final answer.
    """
    position, command = max((text.rfind(name), name) for name in _BOX_COMMANDS)
    if position < 0:
        return None
    i = position + len(command)
    if i < len(text) and text[i] == "{":
        return _braced(text, i)
    match = re.match(r"\s+([^\s$]+)", text[i:])  # "\boxed 5" (no braces) as in some MATH solutions
    return match.group(1) if match else None


def math_text(text: str) -> str:
    """`text` as math-verify input: the last box's content in $...$, text with its own delimiters as is, else $text$."""
    text = text.strip()
    if not text:
        raise ValueError("empty math answer")
    if len(text) > MAX_MATH_CHARS:
        raise ValueError(f"math answer has {len(text)} chars, over the {MAX_MATH_CHARS} limit")
    if any(command in text for command in _BOX_COMMANDS):
        boxed = last_boxed(text)
        if boxed is None:
            raise ValueError("unclosed \\boxed{ in math answer")
        if not boxed.strip():
            raise ValueError("empty \\boxed{} in math answer")
        return f"${boxed.strip()}$"
    if any(delimiter in text for delimiter in _DELIMITERS):
        return text
    return f"${text}$"


def _fast_key(latex: str) -> str:
    return "".join(latex.strip().strip("$").split())


def _plain_word(latex: str) -> str | None:
    inner = _fast_key(latex)
    match = re.fullmatch(r"(?:\\text\{)?([A-Za-z]+)\}?\.?", inner)
    word = match.group(1).casefold() if match else None
    return word if word in PLAIN_WORDS else None


# --- the checker --------------------------------------------------------------------------------------------------

class MathChecker(WorkerClient):
    """Equivalence of two math answers, computed in a worker process with soft and hard timeouts (module docstring;
    the worker handling is `workers.WorkerClient`'s)."""

    script = WORKER_SCRIPT
    name = "math worker"

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, *, grace_s: float = DEFAULT_GRACE_S,
                 memory_mb: int = DEFAULT_MEMORY_MB, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 soft_timeout: bool = True, cache_size: int = 4096):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        super().__init__(grace_s=grace_s, memory_mb=memory_mb, startup_timeout_s=startup_timeout_s,
                         soft_timeout=soft_timeout)
        self.timeout_s = float(timeout_s)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], tuple[str, Any]] = OrderedDict()

    def equivalent(self, gold: str, answer: str, *, fast_path: bool = True, timeout_s: float | None = None) -> bool:
        """Whether `answer` equals `gold` mathematically. Raises ValueError (MathTimeout on timeout) with the reason
        when either cannot be parsed or the check does not finish; RuntimeError when the worker cannot start.

        `timeout_s` lowers this check's soft timeout below the checker's own (`score_completion` passes what is left
        of the completion's budget); the hard bound is that plus `grace_s`."""
        gold_latex, answer_latex = math_text(gold), math_text(answer)
        if fast_path:
            if _fast_key(gold_latex) == _fast_key(answer_latex):
                return True
            word = _plain_word(gold_latex)
            if word is not None:
                return _plain_word(answer_latex) == word
        limit = self.timeout_s if timeout_s is None else min(self.timeout_s, float(timeout_s))
        if limit <= 0:
            raise MathTimeout("no time left in the scoring budget for a math check")
        outcome, value = self._check(gold_latex, answer_latex, limit)
        if outcome == "equal":
            return bool(value)
        if outcome == "timeout":
            raise MathTimeout(value)
        raise ValueError(value)

    def _check(self, gold_latex: str, answer_latex: str, timeout_s: float) -> tuple[str, Any]:
        key = (gold_latex, answer_latex)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            outcome = self._ask(gold_latex, answer_latex, timeout_s)
            # A timeout says how long the check was given, not what the answer is: it is not cached, so the pair is
            # checked again next time (perhaps with more time, on a less busy machine).
            if self.cache_size > 0 and outcome[0] != "timeout":
                self._cache[key] = outcome
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            return outcome

    def _ask(self, gold_latex: str, answer_latex: str, timeout_s: float) -> tuple[str, Any]:
        reply = self._request({"gold": gold_latex, "answer": answer_latex}, timeout_s)
        if reply is None:
            return ("timeout", f"math check hit the {timeout_s + self.grace_s:g} s hard timeout; worker killed")
        if "equal" in reply:
            return ("equal", bool(reply["equal"]))
        error, message = reply.get("error"), str(reply.get("message"))
        if error == "timeout":
            return ("timeout", message)
        if error == "gold_unparsed":
            return ("error", f"could not parse reference answer {gold_latex[:80]!r} as math")
        if error == "answer_unparsed":
            return ("error", f"could not parse answer {answer_latex[:80]!r} as math")
        return ("error", f"math check failed: {message}")


# --- the verifier -------------------------------------------------------------------------------------------------

_default: LazyDefault[MathChecker] = LazyDefault(MathChecker)


def default_checker() -> MathChecker:
    """The checker the "math" verifier uses (created on first use)."""
    return _default.get()


def set_default_checker(checker: MathChecker | None) -> MathChecker | None:
    """Replace the verifier's checker (None: a default one on next use); returns the previous one (not closed)."""
    return _default.replace(checker)


def score_math(answer: str, item: TaskItem) -> float:
    """1.0 when `answer` is mathematically equal to the item's reference answer, else 0.0; ValueError with a reason
    when either does not parse or the check times out."""
    if item.answer is None:
        raise ValueError("item has no reference answer")
    return 1.0 if default_checker().equivalent(item.answer, answer, timeout_s=remaining_seconds()) else 0.0


register_verifier("math", score_math)
