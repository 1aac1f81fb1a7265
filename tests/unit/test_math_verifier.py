"""The "math" verifier: equivalence via math-verify, malformed LaTeX, boxed answers, timeouts off the main thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pubswap_flwr.tasks import TaskItem, score_completion
from pubswap_flwr.tasks.math_answers import (
    MathChecker,
    MathTimeout,
    last_boxed,
    math_text,
    set_default_checker,
)

SLOW = "9^{9^{9}}"  # sympy tries to evaluate 9**387420489 when comparing: far beyond any timeout


@pytest.fixture(scope="module", autouse=True)
def checker():
    """One worker for the module, made the verifier's checker so score_completion uses it."""
    checker = MathChecker(timeout_s=3.0, grace_s=3.0)
    previous = set_default_checker(checker)
    yield checker
    set_default_checker(previous)
    checker.close()


def item(gold: str | None) -> TaskItem:
    return TaskItem(uid="t/1", task="math", question="q", answer=gold, verifier="math", family="math")


def run_in_thread(fn):
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except Exception as err:  # noqa: BLE001 - handed back to the test thread to assert on
            box["error"] = err

    thread = threading.Thread(target=target, name="not-main")
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    return box


EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"),
    ("0.5", "\\frac{1}{2}"),
    ("\\frac{1}{2}", "1/2"),
    ("\\frac{1}{2}", "\\boxed{\\frac12}"),
    ("\\frac{1}{2}", "The answer is $\\dfrac{1}{2}$."),
    ("\\frac{1}{2}", "so \\boxed{3} no wait \\boxed{0.5}"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("2, 3", "3, 2"),
    ("[2, 5)", "[2,5)"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("5\\sqrt{2}", "\\sqrt{50}"),
    ("x^2 + 5x + 6", "(x+2)(x+3)"),
    ("6", "x = 6"),
    ("50\\%", "0.5"),
    ("\\frac{3}{2}", "1.5"),
    ("-7", "-7.0"),
    ("1024", "2^{10}"),
    ("(5, 2)", "(5,2)"),
    ("\\frac{\\pi}{2}", "\\pi/2"),
    ("1250", "1,250"),
    ("Yes", "yes"),
    ("\\frac{1}{3}", "0.333333"),
]


@pytest.mark.parametrize(("gold", "answer"), EQUIVALENT)
def test_equivalent_forms_score_one(gold, answer):
    score = score_completion(f"<answer>{answer}</answer>", item(gold))
    assert score == score.__class__(1.0, None)


NEAR_MISSES = [
    ("\\frac{1}{2}", "0.51"),
    ("\\frac{1}{3}", "0.33"),
    ("(1, 2]", "(1, 2)"),
    ("[2, 5)", "[2, 5]"),
    ("(5, 2)", "(2, 5)"),
    ("2, 3", "2"),
    ("5\\sqrt{2}", "5\\sqrt{3}"),
    ("x^2 + 5x + 6", "x^2 + 5x + 5"),
    ("-7", "7"),
    ("\\pi", "3.14159"),
    ("Yes", "No"),
    ("\\frac{1}{2}", "\\boxed{0.5} no wait \\boxed{3}"),
]


@pytest.mark.parametrize(("gold", "answer"), NEAR_MISSES)
def test_near_misses_score_zero_without_failure(gold, answer):
    score = score_completion(f"<answer>{answer}</answer>", item(gold))
    assert score.reward == 0.0
    assert score.reason is None  # a wrong answer, not a failure


MALFORMED = [
    ("\\frac{1}{2}", "\\frac{1}{", "could not parse answer"),
    ("3", "\\sqrt{", "could not parse answer"),
    ("3", "}{", "could not parse answer"),
    ("3", "\\boxed{3", "unclosed \\boxed"),
    ("3", "\\boxed{ }", "empty \\boxed"),
    ("3", "x" * 2500, "over the 2000 limit"),
    ("\\frac{1}{", "3", "could not parse reference answer"),
]


@pytest.mark.parametrize(("gold", "answer", "reason"), MALFORMED)
def test_malformed_latex_scores_zero_with_reason(gold, answer, reason):
    score = score_completion(f"<answer>{answer}</answer>", item(gold), max_chars=10_000)
    assert score.reward == 0.0
    assert score.reason is not None and reason in score.reason


def test_item_without_reference_is_a_failure():
    score = score_completion("<answer>3</answer>", item(None))
    assert score.reward == 0.0 and "no reference answer" in score.reason


LAST_BOXED = [
    ("so the answer is $\\boxed{45}$.", "45"),
    ("$\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
    ("first \\boxed{1}, finally \\boxed{2}", "2"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("$56 \\div 8 = \\boxed 7$.", "7"),
    ("\\fbox{x+1}", "x+1"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("no box here", None),
    ("\\boxed{1} and \\boxed{2", None),
    ("\\boxed", None),
]


@pytest.mark.parametrize(("text", "expected"), LAST_BOXED)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("0.5", "$0.5$"),
    (" \\boxed{ \\frac12 } ", "$\\frac12$"),
    ("it is $3$", "it is $3$"),
    ("\\(x+1\\)", "\\(x+1\\)"),
])
def test_math_text(text, expected):
    assert math_text(text) == expected


def test_reference_with_box_is_read_from_the_box(checker):
    assert checker.equivalent("$\\boxed{\\frac{3}{4}}$", "0.75") is True


def test_soft_timeout_returns_quickly_with_reason(checker):
    short = MathChecker(timeout_s=1.0, grace_s=3.0)
    previous = set_default_checker(short)
    try:
        start = time.monotonic()
        score = score_completion(f"<answer>{SLOW}</answer>", item("1"))
        elapsed = time.monotonic() - start
    finally:
        set_default_checker(previous)
    try:
        assert score.reward == 0.0
        assert "timeout" in score.reason and "MathTimeout" in score.reason
        assert elapsed < 10
        assert short.restarts == 0  # the signal in the worker stopped it; the worker stays up
        assert short.equivalent("\\frac{1}{2}", "0.5") is True
    finally:
        short.close()


def test_soft_timeout_from_a_non_main_thread():
    short = MathChecker(timeout_s=1.0, grace_s=3.0)
    previous = set_default_checker(short)
    try:
        start = time.monotonic()
        box = run_in_thread(lambda: score_completion(f"<answer>{SLOW}</answer>", item("1")))
        elapsed = time.monotonic() - start
        ok = run_in_thread(lambda: score_completion("<answer>0.5</answer>", item("\\frac{1}{2}")))
    finally:
        set_default_checker(previous)
        short.close()
    assert "error" not in box
    assert box["value"].reward == 0.0 and "timeout" in box["value"].reason
    assert elapsed < 10
    assert ok["value"].reward == 1.0


def test_hard_deadline_kills_worker_and_recovers_off_main_thread():
    """Without the worker's signal timer, the caller's deadline kills the worker; the next check restarts it."""
    hard = MathChecker(timeout_s=1.0, grace_s=0.5, soft_timeout=False)
    try:
        start = time.monotonic()
        box = run_in_thread(lambda: hard.equivalent("1", SLOW))
        elapsed = time.monotonic() - start
        assert isinstance(box.get("error"), MathTimeout)
        assert "hard timeout" in str(box["error"])
        assert elapsed < 10
        assert hard.restarts == 1
        again = run_in_thread(lambda: hard.equivalent("\\frac{1}{2}", "0.5"))
        assert again == {"value": True}
    finally:
        hard.close()


def test_concurrent_threads_get_their_own_results(checker):
    cases = [("\\frac{1}{2}", "0.5", 1.0), ("3", "4", 0.0), ("\\sqrt{8}", "2\\sqrt{2}", 1.0), ("(1, 2]", "(1, 2)", 0.0)]
    results: dict[int, float] = {}

    def work(index, gold, answer):
        results[index] = score_completion(f"<answer>{answer}</answer>", item(gold)).reward

    threads = [threading.Thread(target=work, args=(i, *case[:2])) for i, case in enumerate(cases * 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {i: case[2] for i, case in enumerate(cases * 3)}


def test_worker_never_uses_the_eval_based_expression_parser():
    source = (Path(__file__).parents[2] / "pubswap_flwr" / "tasks" / "_math_worker.py").read_text()
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    body = code.split('"""', 2)[2]  # after the module docstring, which names what is avoided
    for forbidden in ("ExprExtractionConfig", "parse_expr", "sympify", "eval("):
        assert forbidden not in body


def test_dead_worker_is_restarted_on_next_check():
    fresh = MathChecker(timeout_s=3.0)
    try:
        assert fresh.equivalent("2", "4/2") is True
        process = fresh._worker.process
        process.kill()
        process.wait(10)
        assert fresh.equivalent("3", "6/2") is True
        assert fresh.restarts == 1
        assert fresh._worker.process.pid != process.pid
    finally:
        fresh.close()
    assert process.poll() is not None
