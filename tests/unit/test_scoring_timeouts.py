"""Scoring time limits: answers that hang a scorer give reward 0 with a timeout reason within the limit, the worker
survives or is replaced, timeouts are not cached, and every verifier returns within its limit on arbitrary text."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubswap_flwr.tasks import Score, ScoringTimeout, TaskItem, score_completion
from pubswap_flwr.tasks.isolation import IsolatedScorer, set_default_isolated_scorer
from pubswap_flwr.tasks.math_answers import MathChecker, MathTimeout, set_default_checker
from pubswap_flwr.tasks.reasoning_gym_scoring import INLINE_RG_GENERATORS, SAFE_RG_SCORERS, scored_in_worker
from pubswap_flwr.tasks.specs import PRESETS, TaskSpec
from pubswap_flwr.tasks.splits import rg_item
from pubswap_flwr.tasks.verifiers import TIMEOUT_REASON_PREFIX, VERIFIERS

LIMIT_S = 1.0
GRACE_S = 1.0
SLACK_S = 1.5  # scheduling and pipes on a loaded 2-core machine; far below the 40 s these cases used to take
BIG_PRODUCT = "*".join(f"sin(x**{i}+{i})" for i in range(1, 60))  # its derivative does not simplify in minutes

HANGING = [
    ("countdown", "9**9**9"),
    ("puzzle24", "9**9**9"),
    ("polynomial_multiplication", "9**9**9"),
    ("simple_integration", "9**9**9"),  # its scorer's bare `except:` swallows the timer: the worker's flag says so
    ("intermediate_integration", BIG_PRODUCT),
]


@pytest.fixture(scope="module", autouse=True)
def isolated():
    """One started worker for the module, made score_completion's isolated scorer."""
    scorer = IsolatedScorer(grace_s=GRACE_S)
    previous = set_default_isolated_scorer(scorer)
    assert score_completion("<answer>3+4</answer>", rg("countdown")).reward >= 0  # start it outside any timing
    yield scorer
    set_default_isolated_scorer(previous)
    scorer.close()


def rg(generator: str, index: int = 0) -> TaskItem:
    return rg_item("eval", TaskSpec(generator, generator, {}), 1234, index, f"eval/{generator}/{index}")


def tagged(answer: str) -> str:
    return f"<answer>{answer}</answer>"


def timed(fn):
    start = time.monotonic()
    value = fn()
    return value, time.monotonic() - start


# --- what runs where ---------------------------------------------------------------------------------------------


def test_cheap_scorers_run_in_the_caller_and_the_rest_in_the_worker():
    for name in PRESETS:
        assert not scored_in_worker(rg(PRESETS[name].generator)), name
    for generator, _ in HANGING:
        assert scored_in_worker(rg(generator)), generator
    assert scored_in_worker(rg("leg_counting"))  # any generator not vetted as cheap
    assert not scored_in_worker(TaskItem("o/1", "o", "q", "4", "exact"))
    assert not scored_in_worker(TaskItem("o/1", "o", "q", "4", "math"))
    assert not scored_in_worker(dataclasses.replace(rg("countdown"), provenance={}))  # fails at once, in the caller
    sympy_based = {"countdown", "puzzle24", "polynomial_multiplication", "simple_integration",
                   "intermediate_integration"}
    assert sympy_based <= set(SAFE_RG_SCORERS) and not sympy_based & INLINE_RG_GENERATORS


@pytest.mark.parametrize("generator", ["countdown", "puzzle24", "polynomial_multiplication", "simple_integration",
                                       "intermediate_integration", "leg_counting", "word_sorting"])
def test_worker_gives_the_rewards_scoring_in_the_caller_gives(generator):
    for index in range(3):
        item = rg(generator, index)
        for answer in [item.answer, "1", "x + C", "", "garbage ((", "3*x**2 + 2"]:
            try:
                expected = Score(min(1.0, max(0.0, float(VERIFIERS["rg"](answer, item)))))
            except ValueError as err:  # the reason the caller would give
                expected = Score(0.0, f"scorer error: {type(err).__name__}: {err}")
            assert score_completion(tagged(answer), item) == expected, (generator, answer)


def test_scorer_errors_in_the_worker_read_as_in_the_caller():
    item = rg("polynomial_multiplication")
    forged = dataclasses.replace(item, answer="__import__('os')")
    assert score_completion(tagged("x"), forged) == Score(
        0.0, "scorer error: ValueError: reference answer is not a plain math expression")


# --- the worker scripts ---------------------------------------------------------------------------------------------

TASKS_DIR = Path(__file__).resolve().parents[2] / "pubswap_flwr" / "tasks"


def test_worker_script_runs_from_anywhere_and_keeps_the_package_folder_off_sys_path(tmp_path):
    """The scripts find their shared loop without the script folder on sys.path (PYTHONSAFEPATH), from another
    folder, and the loop takes that folder off sys.path again so the package's modules shadow nothing."""
    probe = ("import sys, os; sys.path.insert(0, {0!r}); import _worker_loop; "
             "print(any(os.path.abspath(p or os.curdir) == {0!r} for p in sys.path))").format(str(TASKS_DIR))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=TASKS_DIR, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    request = json.dumps({"id": 7, "gold": "$1$", "answer": "$2/2$", "timeout_s": 5}) + "\n"
    reply_read, reply_write = os.pipe()
    out = subprocess.run([sys.executable, str(TASKS_DIR / "_math_worker.py"), "--memory-mb", "0",
                          "--reply-fd", str(reply_write)], input=request, capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONSAFEPATH": "1"}, timeout=120,
                         pass_fds=(reply_write,))
    os.close(reply_write)
    with os.fdopen(reply_read) as replies:
        assert [json.loads(line) for line in replies] == [{"ready": True}, {"equal": True, "id": 7}], out.stderr
    assert out.stdout == ""  # replies never go to stdout


# --- hanging answers -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("generator,answer", HANGING)
def test_hanging_answer_times_out_with_reason(isolated, generator, answer):
    item = rg(generator)
    score, elapsed = timed(lambda: score_completion(tagged(answer), item, timeout_s=LIMIT_S))
    assert score.reward == 0.0 and score.timed_out
    assert score.reason.startswith(TIMEOUT_REASON_PREFIX) and generator in score.reason
    assert elapsed < LIMIT_S + GRACE_S + SLACK_S
    assert score_completion(tagged(item.answer), item, timeout_s=LIMIT_S).reward == 1.0  # the worker is still good


def test_hard_deadline_kills_the_worker_and_a_replacement_scores_next(isolated):
    """Without the worker's signal timer (as for C-level work), the caller's deadline kills the worker."""
    hard = IsolatedScorer(grace_s=0.5, soft_timeout=False)
    previous = set_default_isolated_scorer(hard)
    try:
        item = rg("countdown")
        _, start_s = timed(lambda: score_completion(tagged(item.answer), item))  # started (a restart costs as much)
        box: dict = {}
        worker = threading.Thread(target=lambda: box.update(
            timed=timed(lambda: score_completion(tagged("9**9**9"), item, timeout_s=0.5))))
        worker.start()  # from a thread that is not the main thread, as in Flower
        worker.join(30)
        score, elapsed = box["timed"]
        assert score.timed_out and "hard timeout; worker killed" in score.reason
        assert elapsed < 0.5 + 0.5 + SLACK_S + 2 * start_s  # the replacement's start is charged to this call
        assert hard.restarts == 1 and hard.timeouts == 1
        assert score_completion(tagged(item.answer), item).reward == 1.0
    finally:
        set_default_isolated_scorer(previous)
        hard.close()


def test_dead_worker_is_replaced(isolated):
    item = rg("puzzle24")
    assert score_completion(tagged(item.answer), item).reward == 1.0
    process = isolated._worker.process
    process.kill()
    process.wait(10)
    assert score_completion(tagged(item.answer), item).reward == 1.0
    assert isolated._worker.process.pid != process.pid


def test_no_time_left_is_a_timeout_without_scoring(isolated):
    for item in (rg("countdown"), rg("gcd"), TaskItem("o/1", "o", "q", "4", "exact")):
        score = score_completion(tagged(item.answer), item, timeout_s=0)
        assert score.timed_out and score.reward == 0.0 and "no time left" in score.reason
    with pytest.raises(ScoringTimeout, match="no time left"):
        isolated.score("3+4", rg("countdown"), 0.0)
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite"):
            score_completion(tagged("4"), TaskItem("o/1", "o", "q", "4", "exact"), timeout_s=bad)


def test_timed_out_property():
    assert Score(0.0, TIMEOUT_REASON_PREFIX + "x").timed_out
    assert not Score(0.0, "scorer error: ValueError: timeout").timed_out
    assert not Score(1.0).timed_out and not Score(0.0).timed_out
    assert issubclass(MathTimeout, ScoringTimeout) and issubclass(ScoringTimeout, ValueError)


# --- math: the budget is passed on, and a timeout is not remembered -----------------------------------------------


class ScriptedChecker(MathChecker):
    """A checker whose worker answers from a script (no process): records each question it is asked."""

    def __init__(self, outcomes):
        super().__init__(timeout_s=5.0)
        self.outcomes = list(outcomes)
        self.asked: list[tuple[str, str, float]] = []

    def _ask(self, gold_latex, answer_latex, timeout_s):
        self.asked.append((gold_latex, answer_latex, timeout_s))
        return self.outcomes.pop(0)


def test_math_timeout_is_not_cached_and_the_pair_is_tried_again():
    checker = ScriptedChecker([("timeout", "math check hit the 5 s timeout"), ("equal", True)])
    with pytest.raises(MathTimeout):
        checker.equivalent("\\frac{1}{2}", "0.5")
    assert checker.equivalent("\\frac{1}{2}", "0.5") is True  # asked again, not answered "timeout" from the cache
    assert checker.equivalent("\\frac{1}{2}", "0.5") is True  # now cached
    assert len(checker.asked) == 2


def test_math_errors_and_results_are_still_cached():
    checker = ScriptedChecker([("error", "could not parse answer"), ("equal", False)])
    for _ in range(2):
        with pytest.raises(ValueError, match="could not parse"):
            checker.equivalent("1", "\\frac{")
        assert checker.equivalent("1", "2") is False
    assert len(checker.asked) == 2


def test_score_completion_passes_its_limit_to_the_math_check():
    checker = ScriptedChecker([("equal", True), ("timeout", "math check hit the 0.25 s timeout")])
    previous = set_default_checker(checker)
    try:
        item = TaskItem("m/1", "math", "q", "\\frac{1}{2}", "math", family="math")
        assert score_completion(tagged("0.5"), item, timeout_s=0.25).reward == 1.0
        score = score_completion(tagged("0.6"), item, timeout_s=60)
    finally:
        set_default_checker(previous)
    assert 0.2 < checker.asked[0][2] <= 0.25  # what was left of 0.25 s
    assert checker.asked[1][2] == 5.0  # never more than the checker's own timeout
    assert score.timed_out and "MathTimeout" in score.reason


def test_real_math_check_stops_at_the_completion_limit():
    checker = MathChecker(timeout_s=60.0, grace_s=GRACE_S)
    previous = set_default_checker(checker)
    try:
        item = TaskItem("m/1", "math", "q", "1", "math", family="math")
        assert score_completion(tagged("2/2"), item).reward == 1.0  # started outside the timing
        score, elapsed = timed(lambda: score_completion(tagged("9^{9^{9}}"), item, timeout_s=LIMIT_S))
        assert score.timed_out and score.reward == 0.0
        assert elapsed < LIMIT_S + GRACE_S + SLACK_S
    finally:
        set_default_checker(previous)
        checker.close()


# --- any text, any verifier: within the limit ----------------------------------------------------------------------

PROPERTY_LIMIT_S = 0.5
PIECES = ["9", "**", "9**", "x", "+", "*", "(", ")", "sin(", "exp(", " ", "A", "B ", ") ", "\\frac{", "}", "{",
          "^{", "1/", ".", ",", "or ", "<answer>", "e9", "C"]
PROPERTY_ITEMS = {
    "exact": TaskItem("p/1", "p", "q", "Paris", "exact"),
    "numeric": TaskItem("p/2", "p", "q", "2.5", "numeric"),
    "mc": TaskItem("p/3", "p", "Pick:\nA. alpha\nB. beta\nC. gamma", "B", "mc"),
    **{f"rg:{generator}": rg(generator) for generator in [
        "gcd", "spell_backward", "fraction_simplification", "number_sorting", "countdown", "puzzle24",
        "polynomial_multiplication", "simple_integration", "intermediate_integration", "leg_counting"]},
}
answers = st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(PIECES), max_size=40).map("".join),
    st.tuples(st.sampled_from(PIECES), st.integers(1, 400)).map(lambda pair: pair[0] * pair[1]),
)


@pytest.mark.parametrize("name", sorted(PROPERTY_ITEMS))
def test_every_verifier_returns_within_its_limit_on_any_text(name):
    item = PROPERTY_ITEMS[name]

    @settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(answers)
    def check(answer):
        score, elapsed = timed(lambda: score_completion(tagged(answer), item, timeout_s=PROPERTY_LIMIT_S))
        assert 0.0 <= score.reward <= 1.0
        assert not score.timed_out or score.reward == 0.0
        assert elapsed < PROPERTY_LIMIT_S + GRACE_S + SLACK_S, (answer, score)

    check()


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(answers)
def test_math_verifier_returns_within_its_limit_on_any_text(answer):
    score, elapsed = timed(lambda: score_completion(tagged(answer), MATH_ITEM, timeout_s=PROPERTY_LIMIT_S))
    assert 0.0 <= score.reward <= 1.0
    assert elapsed < PROPERTY_LIMIT_S + GRACE_S + SLACK_S, (answer, score)


MATH_ITEM = TaskItem("p/4", "math", "q", "\\frac{1}{2}", "math", family="math")


@pytest.fixture(scope="module", autouse=True)
def math_checker():
    """A started math worker for the module (the default checker's grace is 2 s; this one's is GRACE_S)."""
    checker = MathChecker(timeout_s=5.0, grace_s=GRACE_S)
    previous = set_default_checker(checker)
    assert checker.equivalent("1", "2/2") is True
    yield checker
    set_default_checker(previous)
    checker.close()
