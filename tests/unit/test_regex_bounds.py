"""Every regex that reads model or peer text in pubswap_flwr/tasks runs in linear time on adversarial text; the
multiple-choice patterns rewritten for that accept exactly what they accepted before."""

from __future__ import annotations

import ast
import contextlib
import re
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubswap_flwr.tasks import TaskItem, choice, extract_answer, math_answers, reasoning_gym_scoring, rewards, verifiers
from pubswap_flwr.tasks.choice import options_of, parse_choice
from pubswap_flwr.tasks.math_answers import last_boxed, math_text
from pubswap_flwr.tasks.reasoning_gym_scoring import is_plain_math
from pubswap_flwr.tasks.verifiers import parse_number

TASKS = Path(verifiers.__file__).parent
HANG_GUARD_S = 3.0  # linear-time matching of these inputs takes milliseconds; a quadratic or exponential pattern
                    # takes far longer (the old _LETTER_LIST took 30 s on 57 characters)


class Hung(AssertionError):
    pass


@contextlib.contextmanager
def hang_guard(what: str, seconds: float = HANG_GUARD_S):
    """Fail (instead of hanging) when the block runs past `seconds`: CPython's regex engine checks for signals, so a
    timer interrupts a backtracking match. Tests run in the main thread, where signal timers work."""

    def on_alarm(signum, frame):
        raise Hung(f"{what} ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- the inventory: every pattern in the package is listed here ------------------------------------------------

# pattern source -> how the package applies it
APPLIED = {
    choice._OPTION_LINE.pattern: lambda text: list(choice._OPTION_LINE.finditer(text)),
    choice._PREFIX.pattern: lambda text: choice._PREFIX.sub("", text, count=1),
    choice._LETTER_LIST.pattern: lambda text: choice._LETTER_LIST.match(text),
    choice._LETTER.pattern: lambda text: choice._LETTER.match(text),
    choice._ANOTHER.pattern: lambda text: choice._ANOTHER.findall(text),
    reasoning_gym_scoring._PLAIN_MATH_RE.pattern: lambda text: reasoning_gym_scoring._PLAIN_MATH_RE.fullmatch(text),
    reasoning_gym_scoring._ATTRIBUTE_RE.pattern: lambda text: reasoning_gym_scoring._ATTRIBUTE_RE.search(text),
    verifiers._NUMBER_RE.pattern: lambda text: verifiers._NUMBER_RE.match(text),
    verifiers._NUMBER.pattern: lambda text: verifiers._NUMBER.findall(text),  # lenient_answer
    verifiers._WORD.pattern: lambda text: verifiers._WORD.findall(text),
    verifiers._NUMERIC_ANSWER.pattern: lambda text: verifiers._NUMERIC_ANSWER.fullmatch(text),
    rewards._MODULE.pattern: lambda text: rewards._MODULE.fullmatch(text),  # tasks.rewards names (config text)
    rewards._FUNCTION.pattern: lambda text: rewards._FUNCTION.fullmatch(text),
    r"[A-Za-z]+": lambda text: re.findall(r"[A-Za-z]+", text),  # is_plain_math's names
    r"\s+([^\s$]+)": lambda text: re.match(r"\s+([^\s$]+)", text),  # last_boxed: "\boxed 5"
    r"(?:\\text\{)?([A-Za-z]+)\}?\.?": lambda text: re.fullmatch(r"(?:\\text\{)?([A-Za-z]+)\}?\.?", text),
}


def _patterns_in_source() -> set[str]:
    """Regex sources in pubswap_flwr/tasks: module-level compiled patterns and literal patterns of re.* calls."""
    found = set()
    for module in (choice, verifiers, reasoning_gym_scoring, math_answers, rewards):
        found |= {value.pattern for value in vars(module).values() if isinstance(value, re.Pattern)}
    for path in sorted(TASKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
    return found


def _modules_using_re() -> set[str]:
    return {path.name for path in TASKS.glob("*.py")
            if re.search(r"^import re$|^from re import", path.read_text(), re.MULTILINE)}


def test_every_pattern_in_the_tasks_package_is_checked_here():
    assert _modules_using_re() == {"choice.py", "verifiers.py", "reasoning_gym_scoring.py",
                                   "math_answers.py", "rewards.py"}, "a new module uses re: list it"
    assert _patterns_in_source() == set(APPLIED), "a regex was added or changed: add it to APPLIED"


# --- adversarial text --------------------------------------------------------------------------------------------

PIECES = ["A B ", "A) ", "(A) ", "A, ", "A or ", "A and ", ", or ", "a", " ", "\t", " \t", "\n", "A. x ", "(A)x ",
          "answer ", "answer is ", "the ", ": ", "- ", "or ", "9", "9.", "1e", "x.", ". ", "\\text{", "}", "{",
          "\\boxed ", "<answer>", "</answer>", "*", "9**", "(", ")", "[", "]", "A\n", "B. text  \t"]
LENGTH = 40_000


def adversarial_texts():
    for piece in PIECES:
        body = piece * (LENGTH // len(piece))
        yield body
        yield body + "!"
        yield "A. " + body + "!"
        yield "A. x" + body + "!"
        yield "answer " + body


@pytest.mark.parametrize("source", sorted(APPLIED))
def test_pattern_is_linear_on_adversarial_text(source):
    apply = APPLIED[source]
    for text in adversarial_texts():
        with hang_guard(f"pattern {source!r} on {text[:20]!r}... ({len(text)} chars)"):
            apply(text)


def test_the_reported_exponential_case_and_larger():
    for count in (14, 30, 1000):
        text = "A B " * count + "!"
        with hang_guard(f"parse_choice on {count} letters"):
            assert parse_choice(text, {}, "ABCDE") is None
            assert parse_choice(text[:-1], {}, "ABCDE") is None  # "A B A B ...": several options
            assert parse_choice(text, {"A": "x", "B": "y"}) is None


def test_package_functions_are_linear_on_adversarial_text():
    options = {"A": "alpha", "B": "beta"}
    for text in adversarial_texts():
        with hang_guard(f"text functions on {text[:20]!r}..."):
            parse_choice(text[:choice.MAX_CHOICE_CHARS], options)
            options_of(TaskItem("q/1", "mc", text, "A", "mc"))  # SAPO peers send the question too
            extract_answer(text)
            extract_answer("<answer>" + text)
            is_plain_math(text[:reasoning_gym_scoring.MAX_EXPRESSION_CHARS])
            parse_number(text)
            last_boxed("\\boxed" + text)
            with contextlib.suppress(ValueError):
                math_text(text[:math_answers.MAX_MATH_CHARS])


def test_extract_answer_many_unclosed_tags_is_linear():
    text = "<answer>" * 50_000 + "x"
    with hang_guard("extract_answer on 50k unclosed tags"):
        assert extract_answer(text) is None
        assert extract_answer(text + "</answer>") == "<answer>" * 49_999 + "x"


# --- the rewritten multiple-choice patterns accept what the old ones did -------------------------------------------

_OLD_TOKEN = r"\(?[A-Za-z](?![A-Za-z0-9])\)?[.):]?"
OLD_LETTER_LIST = re.compile(
    rf"^{_OLD_TOKEN}(?:\s*(?:,|/|&|;|\+|\bor\b|\band\b|,\s*or\b|,\s*and\b)?\s*{_OLD_TOKEN})+$", re.IGNORECASE)
OLD_PREFIX = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|final\s+|best\s+)?(?:answer|option|choice)(?:\s+is)?\s*[:\-]?\s*)(?=\S)",
    re.IGNORECASE)
OLD_OPTION_LINE = re.compile(r"^[ \t]*(?:\(([A-J])\)|([A-J])[.):])[ \t]+(\S.*?)[ \t]*$", re.MULTILINE)

TOKENS = ["A", "b", "(C)", "(d", "E)", "F.", "G:", "H).", "I))", "J):", "x1", "or", "and", "answer", "the", "is",
          "correct", "Option"]
SEPARATORS = ["", " ", "  ", "\t", ",", ", ", " , ", "/", "&", ";", "+", " or ", ", or ", ",and ", " and ", ": ",
              "- ", "\n", ". ", "\r"]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(SEPARATORS), st.sampled_from(TOKENS)), min_size=1, max_size=6))
def test_rewritten_choice_patterns_match_exactly_as_before(parts):
    text = "".join(separator + token for separator, token in parts).lstrip()
    assert bool(choice._LETTER_LIST.match(text)) == bool(OLD_LETTER_LIST.match(text))
    assert choice._PREFIX.sub("", text, count=1) == OLD_PREFIX.sub("", text, count=1)
    old = [(m.group(1), m.group(2), m.group(3)) for m in OLD_OPTION_LINE.finditer(text)]
    new = [(m.group(1), m.group(2), m.group(3).rstrip(" \t")) for m in choice._OPTION_LINE.finditer(text)]
    assert new == old


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(alphabet="AB(). :,\t\nor", max_size=12))
def test_rewritten_choice_patterns_match_as_before_on_any_short_text(text):
    assert bool(choice._LETTER_LIST.match(text)) == bool(OLD_LETTER_LIST.match(text))
    assert choice._PREFIX.sub("", text, count=1) == OLD_PREFIX.sub("", text, count=1)
    old = [(m.group(1), m.group(2), m.group(3)) for m in OLD_OPTION_LINE.finditer(text)]
    new = [(m.group(1), m.group(2), m.group(3).rstrip(" \t")) for m in choice._OPTION_LINE.finditer(text)]
    assert new == old


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.text(alphabet="<>/answer x\n", max_size=60))
def test_extract_answer_equals_the_regex_it_replaces(text):
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert extract_answer(text) == (matches[-1].strip() if matches else None)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["<answer>", "</answer>", "x", " ", "\n", "<", "answer>"]), max_size=12))
def test_extract_answer_equals_the_regex_on_tag_soup(parts):
    text = "".join(parts)
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert extract_answer(text) == (matches[-1].strip() if matches else None)


def test_hang_guard_interrupts_a_backtracking_match():
    """The guard is a signal timer: check that it fires inside the regex engine, so the tests above would fail
    rather than hang."""
    start = time.monotonic()
    with pytest.raises(Hung):
        with hang_guard("the control", 0.2):
            OLD_LETTER_LIST.match("A B " * 40 + "!")  # 2^40 ways to split the blanks: never finishes
    assert time.monotonic() - start < HANG_GUARD_S
