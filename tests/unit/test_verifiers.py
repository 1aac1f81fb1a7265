"""Verifiers: answer extraction, score_completion failure reasons, plain verifiers, and the security of
reasoning-gym scoring (no model or peer text is ever evaluated as code)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import textwrap
import types

import pytest

import pubswap_flwr
from pubswap_flwr.registry import Registry
from pubswap_flwr.tasks import TaskItem, extract_answer, is_correct, reasoning_gym_scoring, score_completion, verifiers
from pubswap_flwr.tasks.reasoning_gym_scoring import SAFE_RG_SCORERS, _int_expression, is_plain_math
from pubswap_flwr.tasks.specs import PRESETS, TaskSpec, generator_dataset
from pubswap_flwr.tasks.splits import rg_item
from pubswap_flwr.tasks.verifiers import DEFAULT_MAX_COMPLETION_CHARS, VERIFIERS, Score, parse_number, register_verifier


def tagged(answer: str) -> str:
    return f"Let me think.\n<answer>{answer}</answer>"


def plain(answer: str | None, verifier: str = "exact", **metadata) -> TaskItem:
    return TaskItem("org/1", "org", "What?", answer, verifier, metadata=metadata)


def rg(generator: str, config: dict | None = None, index: int = 0, seed: int = 1234) -> TaskItem:
    return rg_item("eval", TaskSpec(generator, generator, config or {}), seed, index, f"eval/{generator}/{index}")


def stock_score(item: TaskItem, answer: str | None) -> float:
    """The unmodified reasoning-gym scorer (only ever called here on benign text or in the payload controls)."""
    prov = item.provenance
    dataset = generator_dataset(prov["generator"], prov["config"], prov["seed"])
    return dataset.score_answer(answer, {"question": item.question, "answer": item.answer, "metadata": item.metadata})


# --- extract_answer ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("<answer>42</answer>", "42"),
    ("<answer>1</answer> then <answer> 2 </answer>", "2"),
    ("no tags here", None),
    ("<answer>unterminated", None),
    ("<answer></answer>", ""),
    ("<answer>   </answer>", ""),
    ("<answer>line one\nline two</answer>", "line one\nline two"),
    ("<Answer>5</Answer>", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text,shape", [
    ("<answer>42</answer>", "well-formed"),
    ("I think.\n<answer>42</answer>  \n", "well-formed"),
    ("<answer>1</answer>1</answer>", "stray-close"),
    ("<answer>1</answer> <answer>2</answer>", "several-answers"),
    ("<answer>1</answer> so it is 1", "text-after"),
    ("<answer>unterminated", "no-answer"),
    ("no tags", "no-answer"),
])
def test_completion_shape(text, shape):
    assert verifiers.completion_shape(text) == shape


def test_partial_credit_is_farmable_and_binary_rewards_are_not():
    """reasoning-gym's default scorer pays len(reference)/len(answer) for an answer containing the reference: a
    node can earn reward on every gcd item with answers that are never right (the collapse in docs/results)."""
    item = rg_item("eval", PRESETS["gcd"], 99, 3, "eval/gcd/3")
    padded = score_completion(tagged(item.answer + "1"), item).reward
    assert 0.0 < padded < 1.0
    assert verifiers.training_reward(padded, partial_credit=True) == padded
    assert verifiers.training_reward(padded, partial_credit=False) == 0.0
    assert verifiers.training_reward(1.0, partial_credit=False) == 1.0
    assert verifiers.training_reward(0.0, partial_credit=False) == 0.0


# --- score_completion failure reasons ---------------------------------------------------------------------------


def test_correct_reasoning_gym_answer_scores_one():
    item = rg_item("eval", PRESETS["gcd"], 99, 3, "eval/gcd/3")
    score = score_completion(tagged(item.answer), item)
    assert score == Score(1.0, None)
    assert not score.failed
    wrong = str(int(item.answer) + 1)
    assert score_completion(tagged(wrong), item) == Score(0.0, None)


def test_no_tag_scores_zero_with_reason():
    item = plain("4")
    score = score_completion("the answer is 4", item)
    assert score.reward == 0.0 and score.failed
    assert score.reason == "no <answer>...</answer> in completion"


def test_over_long_completion_scores_zero_naming_the_limit():
    item = plain("4")
    text = tagged("4") + "x" * DEFAULT_MAX_COMPLETION_CHARS
    score = score_completion(text, item)
    assert score.reward == 0.0
    assert score.reason == f"completion has {len(text)} chars, over the {DEFAULT_MAX_COMPLETION_CHARS} limit"
    short = score_completion(tagged("4"), item, max_chars=10)
    assert short.reward == 0.0 and "over the 10 limit" in short.reason
    assert score_completion(tagged("4"), item, max_chars=len(tagged("4"))).reward == 1.0  # the limit is inclusive


def test_unknown_verifier_scores_zero_with_reason():
    score = score_completion(tagged("4"), plain("4", verifier="llm-judge"))
    assert score == Score(0.0, "unknown verifier 'llm-judge'")


@pytest.mark.parametrize("completion,kind", [(None, "NoneType"), (b"<answer>4</answer>", "bytes"), (4, "int")])
def test_non_string_completion_has_reason(completion, kind):
    score = score_completion(completion, plain("4"))
    assert score == Score(0.0, f"completion is {kind}, not text")


def test_scorer_exception_is_reward_zero_with_logged_reason(monkeypatch, caplog):
    def boom(answer, item):
        raise RuntimeError("scorer exploded")

    monkeypatch.setitem(VERIFIERS, "boom", boom)
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr.tasks.verifiers"):
        score = score_completion(tagged("4"), plain("4", verifier="boom"))
    assert score == Score(0.0, "scorer error: RuntimeError: scorer exploded")
    assert any("scorer boom failed on item org/1: RuntimeError: scorer exploded" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("returned,expected", [
    (None, Score(0.0, "scorer error: TypeError: float() argument must be a string or a real number, not 'NoneType'")),
    (float("nan"), Score(0.0, "scorer returned nan")),
    (float("inf"), Score(0.0, "scorer returned inf")),
    (1.7, Score(1.0)),
    (-0.5, Score(0.0)),
    (True, Score(1.0)),
    (0.25, Score(0.25)),
])
def test_scorer_return_values_are_checked_and_clamped(monkeypatch, returned, expected):
    monkeypatch.setitem(VERIFIERS, "odd", lambda answer, item: returned)
    assert score_completion(tagged("x"), plain("x", verifier="odd")) == expected


def test_register_verifier(monkeypatch):
    monkeypatch.setattr(verifiers, "VERIFIERS", Registry("verifier", VERIFIERS, replace=True))
    register_verifier("len3", lambda answer, item: float(len(answer) == 3))
    assert score_completion(tagged("abc"), plain("x", verifier="len3")).reward == 1.0
    assert score_completion(tagged("ab"), plain("x", verifier="len3")).reward == 0.0


def test_rg_item_without_generator_is_a_reason():
    item = dataclasses.replace(rg("gcd"), provenance={})
    score = score_completion(tagged("1"), item)
    assert score == Score(0.0, "scorer error: ValueError: reasoning-gym item has no provenance.generator")


def test_is_correct_threshold():
    assert is_correct(1.0) and not is_correct(0.99)
    assert is_correct(0.5, 0.5) and not is_correct(0.49, 0.5)


# --- exact and numeric verifiers --------------------------------------------------------------------------------


@pytest.mark.parametrize("answer,reference,reward", [
    ("Paris", "paris", 1.0),
    ("  new   york ", "New York", 1.0),
    ("new york city", "New York", 0.0),
    ("", "x", 0.0),
])
def test_exact_verifier(answer, reference, reward):
    assert score_completion(tagged(answer), plain(reference)).reward == reward


def test_exact_without_reference_has_reason():
    score = score_completion(tagged("x"), plain(None))
    assert score == Score(0.0, "scorer error: ValueError: item has no reference answer")


@pytest.mark.parametrize("answer,reference,reward", [
    ("1,000", "1000", 1.0),
    ("1000", "1,000", 1.0),
    ("1/4", "0.25", 1.0),
    ("0.25", "1/4", 1.0),
    ("$5", "5", 1.0),
    ("5.", "5", 1.0),
    ("-2.5", "-5/2", 1.0),
    ("3e2", "300", 1.0),
    ("300.0000001", "300", 1.0),
    ("300.01", "300", 0.0),
    ("1/0", "0", 0.0),
    ("five", "5", 0.0),
    ("2+3", "5", 0.0),
    ("__import__('os')", "5", 0.0),
])
def test_numeric_verifier(answer, reference, reward):
    assert score_completion(tagged(answer), plain(reference, verifier="numeric")).reward == reward


def test_numeric_tolerance_from_metadata():
    item = plain("10", verifier="numeric", tolerance=0.05)
    assert score_completion(tagged("10.4"), item).reward == 1.0
    assert score_completion(tagged("10.6"), item).reward == 0.0
    strict = plain("10", verifier="numeric", tolerance=0)
    assert score_completion(tagged("10.0000001"), strict).reward == 0.0
    assert score_completion(tagged("10"), strict).reward == 1.0


def test_numeric_bad_reference_has_reason():
    score = score_completion(tagged("5"), plain("five", verifier="numeric"))
    assert score == Score(0.0, "scorer error: ValueError: reference answer 'five' is not a number")


@pytest.mark.parametrize("text,value", [
    ("1,000", 1000.0), ("-2.5", -2.5), ("+3", 3.0), (".5", 0.5), ("3e2", 300.0), ("1/4", 0.25), (" 7 ", 7.0),
    ("$1,234.50", 1234.5), ("1/0", None), ("abc", None), ("1/2/3", None), ("", None), ("nan", None), ("inf", None),
    ("1_000", None), ("0x10", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


# --- security: reasoning-gym scorers that eval() ----------------------------------------------------------------

EVAL_ANSWER_GENERATORS = [
    ("binary_matrix", {"max_n": 3}),
    ("spiral_matrix", {"max_n": 3}),
    ("string_insertion", {"max_string_length": 8}),
    ("n_queens", {}),
]
SYMPY_ANSWER_GENERATORS = [
    ("countdown", {}, 0.01),
    ("puzzle24", {}, 0.01),
    ("polynomial_multiplication", {}, 0.0),
    ("simple_integration", {}, 0.0),
    ("intermediate_integration", {}, 0.0),
]


def marker_payload(path) -> str:
    return f"__import__('pathlib').Path({str(path)!r}).write_text('pwned')"


def attribute_payload() -> str:
    return "setattr(__import__('pubswap_flwr'), 'PWNED_BY_VERIFIER_TEST', 1)"


@pytest.fixture(autouse=True)
def _no_leftover_attribute():
    yield
    if hasattr(pubswap_flwr, "PWNED_BY_VERIFIER_TEST"):
        delattr(pubswap_flwr, "PWNED_BY_VERIFIER_TEST")


@pytest.mark.parametrize("generator,config", EVAL_ANSWER_GENERATORS)
def test_eval_scorers_never_execute_the_answer(tmp_path, generator, config):
    item = rg(generator, config)
    marker = tmp_path / "marker"
    score = score_completion(tagged(marker_payload(marker)), item)
    assert score.reward == 0.0
    assert not marker.exists()
    score = score_completion(tagged(attribute_payload()), item)
    assert score.reward == 0.0
    assert not hasattr(pubswap_flwr, "PWNED_BY_VERIFIER_TEST")
    # control: the stock scorer does run this payload, so the assertions above are meaningful
    stock_score(item, marker_payload(marker))
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize("generator,config,no_answer_reward", SYMPY_ANSWER_GENERATORS)
def test_sympy_scorers_never_execute_the_answer(tmp_path, generator, config, no_answer_reward):
    item = rg(generator, config)
    marker = tmp_path / "marker"
    score = score_completion(tagged(marker_payload(marker)), item)
    assert score == Score(no_answer_reward, None)  # scored as no answer: the stock "no answer" reward
    assert not marker.exists()
    assert score_completion(tagged(attribute_payload()), item).reward == no_answer_reward
    assert not hasattr(pubswap_flwr, "PWNED_BY_VERIFIER_TEST")
    assert score_completion(tagged(item.answer), item).reward == 1.0  # the real answer still scores
    stock_score(item, marker_payload(marker))  # control: sympy.parse_expr runs it
    assert marker.exists()


@pytest.mark.parametrize("generator,field", [
    ("number_sorting", "answer"),
    ("bitwise_arithmetic", "metadata.problem"),
    ("polynomial_multiplication", "answer"),
    ("simple_integration", "metadata.integrand"),
    ("intermediate_integration", "metadata.integrand"),
])
def test_forged_reference_fields_are_rejected_not_executed(tmp_path, generator, field):
    """In SAPO a peer supplies the item (answer, metadata): a payload there is refused with a reason."""
    item = rg(generator)
    marker = tmp_path / "marker"
    payload = marker_payload(marker)
    if field == "answer":
        forged = dataclasses.replace(item, answer=payload)
    else:
        key = field.split(".", 1)[1]
        forged = dataclasses.replace(item, metadata={**item.metadata, key: payload})
    score = score_completion(tagged(item.answer), forged)
    assert score.reward == 0.0
    assert score.reason is not None and score.reason.startswith("scorer error: ValueError: ")
    assert not marker.exists()
    stock_score(forged, item.answer)  # control: the stock scorer evaluates the forged field
    assert marker.exists()


def test_number_sorting_reference_as_python_literal_still_scores():
    # reasoning-gym writes number_sorting answers as Python list literals ("['-5.19', '19.0']"), not JSON.
    item = rg("number_sorting")
    assert item.answer.startswith("['")
    assert score_completion(tagged(item.answer), item).reward == 1.0
    as_json = json.dumps(ast.literal_eval(item.answer))
    assert score_completion(tagged(as_json), item).reward == 1.0
    numbers = ast.literal_eval(item.answer)
    shuffled = list(reversed(numbers))
    assert score_completion(tagged(json.dumps(shuffled)), item).reward == 0.0
    json_reference = dataclasses.replace(item, answer=as_json)
    assert score_completion(tagged(item.answer), json_reference).reward == 1.0
    not_a_list = dataclasses.replace(item, answer="{'a': 1}")
    assert score_completion(tagged(item.answer), not_a_list) == Score(
        0.0, "scorer error: ValueError: reference answer is not a list")


def _literal_forms(generator: str, item: TaskItem) -> tuple[str, float]:
    """The right answer written as a Python literal, and the stock partial credit for it."""
    if generator == "binary_matrix":
        return repr([[int(x) for x in row.split()] for row in item.answer.split("\n")]), 0.1
    if generator == "spiral_matrix":
        return repr([int(x) for x in item.answer.split()]), 0.1
    if generator == "string_insertion":
        return repr(list(item.answer)), 0.1
    return repr([row.split(" ") for row in item.metadata["valid_answers"][0].split("\n")]), 0.5


@pytest.mark.parametrize("generator,config", EVAL_ANSWER_GENERATORS)
def test_list_literal_answer_gets_stock_partial_credit(generator, config):
    item = rg(generator, config)
    literal, credit = _literal_forms(generator, item)
    assert score_completion(tagged(literal), item).reward == credit
    assert stock_score(item, literal) == credit


@pytest.mark.parametrize("generator,config", EVAL_ANSWER_GENERATORS)
def test_safe_scorers_agree_with_stock_on_benign_answers(generator, config):
    for index in range(3):
        item = rg(generator, config, index=index)
        literal, _ = _literal_forms(generator, item)
        oracle = item.answer if generator != "n_queens" else item.metadata["valid_answers"][0]
        wrong_literal = literal.replace("1", "7", 1) if "1" in literal else literal[:-1] + ", 9]"
        for answer in [oracle, literal, wrong_literal, "[]", "[[1, 2], [3]]", "not a literal", "", "(1, 2)", "{}",
                       "[" * 200 + "]" * 200, "1" * 5000]:
            ours = score_completion(tagged(answer), item, max_chars=10_000).reward
            assert ours == stock_score(item, answer.strip()), (generator, answer)


def test_bitwise_arithmetic_scores_like_stock():
    for index in range(5):
        item = rg("bitwise_arithmetic", {"difficulty": 3}, index=index)
        value = int(item.answer, 16)
        for answer in [item.answer, str(value), hex(value + 1), "0b" + format(value, "b") if value >= 0 else "x",
                       "garbage", ""]:
            assert score_completion(tagged(answer), item).reward == stock_score(item, answer), answer
        assert score_completion(tagged(item.answer), item).reward == 1.0


@pytest.mark.parametrize("text,value", [
    ("(0x10 + 0x2)", 18), ("(0x3 << 0x2)", 12), ("(0x10 >> 0x1) - 0x20", -24), ("-(0x2 * 0x3)", -6), ("+5", 5),
    ("((0x1 << 0x3) * (0xff - 0x1))", 2032),
])
def test_int_expression_values(text, value):
    assert _int_expression(text) == value


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "x", "1 / 2", "2 ** 10", "1 << 65", "1 >> -1", "True + 1", "1.5 + 1",
    "'a' * 3", "[1][0]", "(1).real", "", "(" * 1000 + "1" + ")" * 1000, "0x7fffffff * " * 3000 + "1",
])
def test_int_expression_rejects_everything_else(text):
    with pytest.raises(ValueError):
        _int_expression(text)


def test_int_expression_bounds_growth():
    squares = "(0xffff << 64)"  # 80 bits; squared 10 times: 81920 bits in about 14k characters
    for _ in range(10):
        squares = f"({squares} * {squares})"
    assert len(squares) < reasoning_gym_scoring.MAX_LITERAL_CHARS
    with pytest.raises(ValueError, match="too large"):
        _int_expression(squares)
    assert _int_expression(" * ".join(["(0xffff << 64)"] * 100)) == (0xffff << 64) ** 100


@pytest.mark.parametrize("text,ok", [
    ("3*x**2 + 2*x - 1", True), ("(25 - 5) * 6 / 3", True), ("exp(x)*sin(x) + C", True), ("2.5*X", True),
    ("Integral(x**3*cos(x), x) + C", True), ("sqrt(x)/2", True),
    ("__import__('os')", False), ("x.y", False), ("(1). real", False), ("1 . conjugate()", False),
    ("x; y", False), ("'a'", False), ("lambda: 1", False), ("test()", False), ("preview(x)", False),
    ("a[0]", False), ("x" * 3000, False), (None, False), (3, False),
])
def test_is_plain_math(text, ok):
    assert is_plain_math(text) is ok


# --- the whole installed package: every scorer that evaluates text has a safe replacement ----------------------

DANGEROUS_CALLS = {"eval", "exec", "compile", "parse_expr", "sympify", "parse_latex"}


def _dangerous_calls(cls, fn, seen: set) -> set[str]:
    """Names of dangerous calls in `fn` and in the reasoning-gym functions/methods it calls, transitively."""
    fn = getattr(fn, "__func__", fn)
    module = inspect.getmodule(fn)
    if module is None or not module.__name__.startswith("reasoning_gym") or fn in seen:
        return set()
    seen.add(fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError):
        return set()
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in DANGEROUS_CALLS:
            found.add(name)
        target = None
        if isinstance(func, ast.Name):
            target = getattr(module, func.id, None)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in ("self", "cls"):
                target = getattr(cls, func.attr, None)
            elif isinstance(getattr(module, owner, None), types.ModuleType):
                target = getattr(getattr(module, owner), func.attr, None)
        if isinstance(target, (types.FunctionType, types.MethodType)):
            found |= _dangerous_calls(cls, target, seen)
    return found


def _scan_reasoning_gym() -> dict[str, set[str]]:
    from reasoning_gym.factory import DATASETS

    out = {}
    for name, (cls, _config) in sorted(DATASETS.items()):
        calls = _dangerous_calls(cls, cls.score_answer, set())
        if calls:
            out[name] = calls
    return out


def test_every_reasoning_gym_scorer_that_evaluates_text_has_a_safe_replacement():
    flagged = _scan_reasoning_gym()
    # the scan is not vacuous: it finds the direct eval() scorers and the one behind a helper (bitwise_arithmetic)
    assert {"binary_matrix", "spiral_matrix", "string_insertion", "n_queens", "number_sorting"} <= {
        name for name, calls in flagged.items() if "eval" in calls}
    assert "eval" in flagged.get("bitwise_arithmetic", set())
    assert "parse_expr" in flagged.get("countdown", set())
    missing = sorted(set(flagged) - set(SAFE_RG_SCORERS))
    assert not missing, f"reasoning-gym scorers that evaluate text without a safe replacement: {missing}"


def test_safe_scorer_names_are_reasoning_gym_datasets():
    from reasoning_gym.factory import DATASETS

    assert set(SAFE_RG_SCORERS) <= set(DATASETS)

