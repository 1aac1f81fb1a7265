"""Dataset adapters: sample files load, render as prompts and score hand-written completions; bad rows are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pubswap_flwr.tasks import TaskError, load_items, score_completion, user_message
from pubswap_flwr.tasks.adapters import deepmath_row, math_row, medmcqa_1based_row, medmcqa_row, medqa_row
from pubswap_flwr.tasks.files import ADAPTERS, BadRow
from pubswap_flwr.tasks.prompts import INSTRUCTIONS

SAMPLES = Path(__file__).parents[2] / "data" / "samples"

# fmt, file, items, task, verifier, family
SAMPLE_FILES = [
    ("math", "math.jsonl", 32, "math", "math", "math"),
    ("deepmath", "deepmath.jsonl", 27, "deepmath", "math", "math"),
    ("medqa", "medqa.jsonl", 24, "medqa", "mc", "mc"),
    ("medmcqa", "medmcqa.jsonl", 24, "medmcqa", "mc", "mc"),
    ("generic", "org.jsonl", 30, None, None, "plain"),
]


def load(fmt: str, name: str):
    return load_items(SAMPLES / name, fmt=fmt)


def test_formats_are_registered():
    assert {"generic", "math", "deepmath", "medqa", "medmcqa", "medmcqa-1based"} <= set(ADAPTERS)


def test_sample_files_are_small():
    for path in SAMPLES.iterdir():
        assert path.stat().st_size < 50_000, path


@pytest.mark.parametrize(("fmt", "name", "count", "task", "verifier", "family"), SAMPLE_FILES)
def test_sample_file_loads(fmt, name, count, task, verifier, family):
    items = load(fmt, name)
    assert len(items) == count
    assert [it.uid for it in items] == [f"org/{n}" for n in range(1, count + 1)]
    assert len({it.question for it in items}) == count
    for it in items:
        assert it.answer and it.answer.strip() == it.answer
        assert it.family == family
        assert it.provenance["file"] == name
        if task is not None:
            assert it.task == task and it.verifier == verifier
        if family == "mc":
            options = it.metadata["options"]
            assert it.answer in options and len(options) >= 4
            for letter, text in options.items():
                assert f"\n{letter}. {text}" in it.question


def wrong_answer(it) -> str:
    if it.verifier == "mc":
        return next(letter for letter in it.metadata["options"] if letter != it.answer)
    return "987654321" if it.verifier in {"math", "numeric"} else "certainly not this"


@pytest.mark.parametrize(("fmt", "name"), [(fmt, name) for fmt, name, *_ in SAMPLE_FILES])
def test_round_trip_prompt_to_reward(fmt, name):
    for it in load(fmt, name):
        prompt = user_message(it.question, it.family)
        assert prompt.startswith(it.question) and prompt.endswith(INSTRUCTIONS[it.family])
        right = score_completion(f"Let me think.\n<answer>{it.answer}</answer>", it)
        wrong = score_completion(f"<answer>{wrong_answer(it)}</answer>", it)
        assert (right.reward, right.reason) == (1.0, None), (it.uid, it.answer, right)
        assert (wrong.reward, wrong.reason) == (0.0, None), (it.uid, it.answer, wrong)


def test_math_references_parse_as_math():
    """Every sample reference parses and equals itself without the string fast path (not just string equality)."""
    from pubswap_flwr.tasks.math_answers import default_checker

    checker = default_checker()
    for fmt, name in (("math", "math.jsonl"), ("deepmath", "deepmath.jsonl")):
        for it in load(fmt, name):
            assert checker.equivalent(it.answer, it.answer, fast_path=False) is True, (name, it.answer)


# (fmt, file, 1-based line, completion answer, reward)
HAND_WRITTEN = [
    ("math", "math.jsonl", 2, "0.75", 1.0),                # \frac{3}{4}
    ("math", "math.jsonl", 2, "\\boxed{\\frac{6}{8}}", 1.0),
    ("math", "math.jsonl", 2, "0.7", 0.0),
    ("math", "math.jsonl", 6, "3, 2", 1.0),                # 2, 3
    ("math", "math.jsonl", 6, "2", 0.0),
    ("math", "math.jsonl", 7, "(3, \\infty)", 1.0),
    ("math", "math.jsonl", 7, "[3, \\infty)", 0.0),
    ("math", "math.jsonl", 9, "x^2+5x+6", 1.0),
    ("math", "math.jsonl", 9, "(x+2)(x+3)", 1.0),
    ("math", "math.jsonl", 19, "(5,2)", 1.0),
    ("math", "math.jsonl", 19, "(2, 5)", 0.0),
    ("math", "math.jsonl", 30, "[-1,3]", 1.0),
    ("math", "math.jsonl", 30, "(-1, 3)", 0.0),
    ("math", "math.jsonl", 32, "7", 1.0),                  # "\boxed 7" without braces
    ("deepmath", "deepmath.jsonl", 4, "no", 1.0),
    ("deepmath", "deepmath.jsonl", 4, "Yes", 0.0),
    ("deepmath", "deepmath.jsonl", 16, "0.333333", 1.0),
    ("deepmath", "deepmath.jsonl", 21, "0.5", 1.0),        # \dfrac{1}{2}
    ("deepmath", "deepmath.jsonl", 25, "\\pi/2", 1.0),
    ("deepmath", "deepmath.jsonl", 25, "\\pi", 0.0),
    ("deepmath", "deepmath.jsonl", 27, "10", 1.0),         # numeric final_answer
    ("medqa", "medqa.jsonl", 1, "Vitamin C", 1.0),
    ("medqa", "medqa.jsonl", 1, "(C)", 1.0),
    ("medqa", "medqa.jsonl", 1, "C or E", 0.0),
    ("medqa", "medqa.jsonl", 21, "b. nephron", 1.0),       # options given as a list
    ("medqa", "medqa.jsonl", 24, "Iron", 1.0),             # reference from the answer text only
    ("medmcqa", "medmcqa.jsonl", 1, "B", 1.0),             # cop 1 (0-based) -> B, 7.4
    ("medmcqa", "medmcqa.jsonl", 1, "7.4", 1.0),
    ("medmcqa", "medmcqa.jsonl", 1, "A", 0.0),
    ("generic", "org.jsonl", 9, "pacific  ocean", 1.0),    # exact: case and spaces ignored
    ("generic", "org.jsonl", 21, "1,250", 1.0),            # numeric
    ("generic", "org.jsonl", 27, "3.141", 1.0),            # numeric with tolerance 0.01
    ("generic", "org.jsonl", 29, "1.42", 0.0),             # numeric with tolerance 0.001
]


@pytest.mark.parametrize(("fmt", "name", "line", "answer", "reward"), HAND_WRITTEN)
def test_hand_written_completions(fmt, name, line, answer, reward):
    it = next(it for it in load(fmt, name) if it.provenance["row"] == line)
    assert score_completion(f"<answer>{answer}</answer>", it).reward == reward


def test_sample_values_are_read_as_documented():
    math_items = load("math", "math.jsonl")
    assert math_items[0].answer == "45"
    assert math_items[0].metadata == {"type": "Prealgebra", "level": "Level 1"}
    assert math_items[31].answer == "7"
    deep = load("deepmath", "deepmath.jsonl")
    assert deep[0].metadata["difficulty"] == 3.0 and deep[0].metadata["topic"].startswith("Mathematics ->")
    assert deep[26].answer == "10"
    medqa = load("medqa", "medqa.jsonl")
    assert medqa[0].answer == "C" and medqa[0].metadata["options"]["C"] == "Vitamin C"
    assert medqa[0].metadata["meta_info"] == "step2&3"
    assert medqa[22].metadata["options"] == {"A": "IgA", "B": "IgE", "C": "IgG", "D": "IgM"}  # key/value list
    assert medqa[23].answer == "B"
    medmcqa = load("medmcqa", "medmcqa.jsonl")
    assert medmcqa[0].answer == "B" and medmcqa[0].metadata["options"]["B"] == "7.4"
    assert medmcqa[7].answer == "D" and medmcqa[7].metadata["options"]["D"] == "SA node"
    assert medmcqa[0].metadata["subject_name"] == "Physiology" and medmcqa[0].metadata["id"] == "sample-001"


def test_parquet_copy_matches_jsonl():
    def view(items):
        return [(it.question, it.answer, it.verifier, it.task, it.metadata) for it in items]

    from_parquet = load_items(SAMPLES / "org.parquet")
    assert view(from_parquet) == view(load("generic", "org.jsonl"))
    assert from_parquet[26].metadata == {"tolerance": 0.01}
    assert score_completion("<answer>3.141</answer>", from_parquet[26]).reward == 1.0


# --- bad rows -----------------------------------------------------------------------------------------------------


def test_bad_rows_are_named_by_line():
    with pytest.raises(TaskError) as caught:
        load_items(SAMPLES / "bad_rows.jsonl", fmt="medqa")
    message = str(caught.value)
    assert "5 malformed row(s)" in message
    for where in ("line 2: not valid JSON", "row 3: missing 'options'", "row 5: 'answer_idx' 'F'",
                  "row 6: 'answer_idx' A does not match", "line 8: not a JSON object"):
        assert where in message
    for good in ("row 1", "row 4", "row 9", "line 7"):
        assert good not in message


def test_bad_rows_skipped_on_request(caplog):
    items = load_items(SAMPLES / "bad_rows.jsonl", fmt="medqa", on_bad_row="skip")
    assert [it.uid for it in items] == ["org/1", "org/4", "org/9"]
    assert [it.answer for it in items] == ["B", "C", "A"]
    assert "skipped row 3: missing 'options'" in caplog.text


def test_bad_row_in_a_math_file(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"problem": "1+1?", "solution": "$\\boxed{2}$"}, {"problem": "no box", "solution": "It is 3."},
            {"problem": "2+2?", "solution": "$\\boxed{4}$"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(TaskError, match=r"row 2: 'solution' has no closed \\boxed"):
        load_items(path, fmt="math")
    assert [it.answer for it in load_items(path, fmt="math", on_bad_row="skip")] == ["2", "4"]


BAD = [
    (math_row, {"solution": "\\boxed{1}"}, "missing or empty 'problem'"),
    (math_row, {"problem": "p"}, "missing 'answer' and 'solution'"),
    (math_row, {"problem": "p", "solution": "\\boxed{3"}, "no closed \\boxed"),
    (math_row, {"problem": "p", "solution": "\\boxed{  }"}, "empty \\boxed{}"),
    (math_row, {"problem": ["p"], "solution": "\\boxed{1}"}, "'problem' must be text"),
    (deepmath_row, {"question": "q"}, "missing or empty 'final_answer'"),
    (deepmath_row, {"question": "q", "final_answer": float("nan")},
     "'final_answer' must be text or a finite number, got nan"),
    (deepmath_row, {"question": "q", "final_answer": float("-inf")},
     "'final_answer' must be text or a finite number, got -inf"),
    (deepmath_row, {"question": "q", "final_answer": True}, "'final_answer' must be text, got bool"),
    (deepmath_row, {"question": "q", "final_answer": {"x": 1}}, "'final_answer' must be text, got dict"),
    (math_row, {"problem": "p", "answer": False}, "'answer' must be text, got bool"),
    (medqa_row, {"question": "q", "options": {"A": "x", "B": float("nan")}, "answer_idx": "A"},
     "option B is empty or not text: nan"),
    (medqa_row, {"question": "q", "options": ["x", True], "answer_idx": "A"}, "option B is empty or not text: True"),
    (medqa_row, {"question": "q", "answer_idx": "A"}, "missing 'options'"),
    (medqa_row, {"question": "q", "options": "A. x", "answer_idx": "A"}, "must be an object or a list"),
    (medqa_row, {"question": "q", "options": {"A": "x"}, "answer_idx": "A"}, "need at least 2 options"),
    (medqa_row, {"question": "q", "options": {"A": "x", "C": "y"}, "answer_idx": "A"}, "not consecutive"),
    (medqa_row, {"question": "q", "options": {"A": "x", "B": ""}, "answer_idx": "A"}, "option B is empty"),
    (medqa_row, {"question": "q", "options": {"A": "x", "1": "y"}, "answer_idx": "A"}, "not a letter"),
    (medqa_row, {"question": "q", "options": {"A": "x", "B": "y"}}, "missing 'answer_idx' and 'answer'"),
    (medqa_row, {"question": "q", "options": {"A": "x", "B": "y"}, "answer": "z"}, "not the text of any option"),
    (medqa_row, {"question": "q", "options": {"A": "x", "B": "x"}, "answer": "x"}, "matches several options"),
    (medqa_row, {"question": "q", "options": [{"key": "A"}, {"key": "B", "value": "y"}], "answer_idx": "A"},
     "need 'key' and 'value'"),
    (medmcqa_row, {"question": "q", "opa": "a", "opb": "b", "opc": "c", "cop": 0}, "missing or empty 'opd'"),
    (medmcqa_row, {"question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": -1}, "unlabelled"),
    (medmcqa_row, {"question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": 4}, "outside 0-3"),
    (medmcqa_row, {"question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": None}, "option index"),
    (medmcqa_row, {"question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": True}, "option index"),
    (medmcqa_1based_row, {"question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": 0}, "outside 1-4"),
]


@pytest.mark.parametrize(("adapter", "row", "reason"), BAD)
def test_adapter_rejects_bad_rows(adapter, row, reason):
    with pytest.raises(BadRow) as caught:
        adapter(row, 7, "exact")
    assert reason in str(caught.value)


MC_ROW = {"question": "Which is a fruit?", "opa": "Carrot", "opb": "Apple", "opc": "Potato", "opd": "Onion"}


@pytest.mark.parametrize(("adapter", "cop", "letter"), [
    (medmcqa_row, 0, "A"), (medmcqa_row, 1, "B"), (medmcqa_row, 3, "D"), (medmcqa_row, "2", "C"),
    (medmcqa_row, 1.0, "B"), (medmcqa_row, "b", "B"), (medmcqa_row, "D", "D"),
    (medmcqa_1based_row, 1, "A"), (medmcqa_1based_row, 2, "B"), (medmcqa_1based_row, 4, "D"),
])
def test_medmcqa_cop_conventions(adapter, cop, letter):
    it = adapter({**MC_ROW, "cop": cop}, 3, "exact")
    assert it.answer == letter
    assert it.question == "Which is a fruit?\nA. Carrot\nB. Apple\nC. Potato\nD. Onion"
    assert (it.verifier, it.family, it.task) == ("mc", "mc", "medmcqa")


def test_medqa_option_shapes_and_parquet_struct_gaps():
    base = {"question": "Which is a fruit?", "answer": "Apple"}
    as_dict = medqa_row({**base, "options": {"a": "Carrot", "b": "Apple", "E": None}}, 1, "exact")
    as_list = medqa_row({**base, "options": ["Carrot", "Apple"]}, 1, "exact")
    as_pairs = medqa_row({**base, "options": [{"key": "A", "value": "Carrot"}, {"key": "B", "value": "Apple"}]}, 1,
                         "exact")
    for it in (as_dict, as_list, as_pairs):
        assert it.answer == "B"
        assert it.metadata["options"] == {"A": "Carrot", "B": "Apple"}
        assert it.question == "Which is a fruit?\nA. Carrot\nB. Apple"
        assert score_completion("<answer>apple</answer>", it).reward == 1.0


def test_math_answer_field_wins_over_solution():
    it = math_row({"problem": "p", "solution": "so \\boxed{2}", "answer": "\\frac{1}{2}", "subject": "Algebra",
                   "level": 3}, 5, "exact")
    assert it.answer == "\\frac{1}{2}"
    assert it.metadata == {"subject": "Algebra", "level": 3}
    assert (it.verifier, it.family, it.task) == ("math", "math", "math")


def test_numeric_answers_stay_exact_and_a_missing_optional_number_is_absent():
    big = deepmath_row({"question": "q", "final_answer": 123456789012345678901234567890}, 1, "exact")
    assert big.answer == "123456789012345678901234567890"
    assert deepmath_row({"question": "q", "final_answer": 0.1}, 1, "exact").answer == "0.1"
    # pandas writes a missing float as NaN: an absent 'answer' falls back to the solution's \boxed{}
    it = math_row({"problem": "p", "answer": float("nan"), "solution": "so \\boxed{7}", "level": float("nan")}, 2,
                  "exact")
    assert it.answer == "7" and "level" not in it.metadata


def test_bad_answers_in_a_deepmath_file_are_named_by_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "q", "final_answer": "1"}\n{"question": "q", "final_answer": true}\n'
                    '{"question": "q", "final_answer": NaN}\n{"question": "q", "final_answer": 12}\n')
    with pytest.raises(TaskError) as info:
        load_items(path, fmt="deepmath")
    assert str(info.value) == (f"{path}: 2 malformed row(s): row 2: 'final_answer' must be text, got bool; "
                               "row 3: 'final_answer' must be text or a finite number, got nan")
    assert [it.answer for it in load_items(path, fmt="deepmath", on_bad_row="skip")] == ["1", "12"]
