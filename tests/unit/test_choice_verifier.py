"""The "mc" verifier: which answers name the reference option, and which name none or several."""

from __future__ import annotations

import pytest

from pubswap_flwr.tasks import TaskItem, score_completion
from pubswap_flwr.tasks.choice import options_of, parse_choice

OPTIONS = {"A": "Liver", "B": "Pancreas", "C": "Spleen", "D": "Kidney", "E": "Vitamin C deficiency"}
QUESTION = "Which organ secretes insulin?\n" + "\n".join(f"{k}. {v}" for k, v in OPTIONS.items())


def item(gold: str | None = "B", *, options: dict | list | None = OPTIONS, question: str = QUESTION) -> TaskItem:
    metadata = {} if options is None else {"options": options}
    return TaskItem(uid="mc/1", task="medqa", question=question, answer=gold, verifier="mc", metadata=metadata,
                    family="mc")


ACCEPTED = [
    "B", "b", "(B)", "(b)", "B.", "B)", "B:", "(B).", "Option B", "option b", "Answer: B", "The answer is (B)",
    "The correct answer is B.", "B. Pancreas", "B) Pancreas", "(B) Pancreas", "B: pancreas", "B Pancreas",
    "Pancreas", "  pancreas  ", "PANCREAS.", "**B**", "`B`", "B. The pancreas makes it",
    "(B) A gland behind the stomach", "Answer: Pancreas", "The answer is pancreas.",
]


@pytest.mark.parametrize("answer", ACCEPTED)
def test_accepted_forms(answer):
    score = score_completion(f"<answer>{answer}</answer>", item())
    assert score.reward == 1.0, answer
    assert score.reason is None


REJECTED = [
    "B or C", "A, B", "A,B", "A and B", "B/C", "B, C", "A B", "(B) or (C)", "B or C.", "A, B, and C",
    "B. Pancreas or C. Spleen", "B. Spleen", "Both A and B", "C", "c", "Spleen", "F", "Bc", "BC", "Pancrea",
    "B because it makes insulin", "None of the above", "pancreas or spleen", "Z",
]


@pytest.mark.parametrize("answer", REJECTED)
def test_rejected_forms(answer):
    score = score_completion(f"<answer>{answer}</answer>", item())
    assert score.reward == 0.0, answer
    assert score.reason is None  # a wrong or hedged answer, not a scorer failure


@pytest.mark.parametrize(("answer", "expected"), [
    ("Vitamin C deficiency", "E"),
    ("E. Vitamin C deficiency", "E"),
    ("E Vitamin C deficiency", "E"),
    ("(E)", "E"),
    ("A. Liver", "A"),
    ("Liver or Kidney", None),
    ("D. Kidney or E. Vitamin C deficiency", None),
    ("", None),
])
def test_parse_choice_letters(answer, expected):
    assert parse_choice(answer, OPTIONS) == expected


def test_options_parsed_from_question_when_metadata_has_none():
    bare = item(options=None)
    assert options_of(bare) == OPTIONS
    assert score_completion("<answer>pancreas</answer>", bare).reward == 1.0
    assert score_completion("<answer>(B)</answer>", bare).reward == 1.0
    assert score_completion("<answer>C</answer>", bare).reward == 0.0


def test_options_given_as_a_list():
    listed = item("C", options=["Liver", "Pancreas", "Spleen"], question="Which organ?")
    assert options_of(listed) == {"A": "Liver", "B": "Pancreas", "C": "Spleen"}
    assert score_completion("<answer>spleen</answer>", listed).reward == 1.0
    assert score_completion("<answer>D</answer>", listed).reward == 0.0  # not an option here


def test_without_any_options_letters_a_to_e():
    plain = item("D", options=None, question="Pick one.")
    assert options_of(plain) == {}
    assert score_completion("<answer>d.</answer>", plain).reward == 1.0
    assert score_completion("<answer>D or E</answer>", plain).reward == 0.0
    assert score_completion("<answer>F</answer>", plain).reward == 0.0


def test_question_lines_with_parenthesized_letters():
    question = "Pick the mammal.\n(A) Trout\n(B) Whale\n(C) Eagle"
    parsed = item("B", options=None, question=question)
    assert options_of(parsed) == {"A": "Trout", "B": "Whale", "C": "Eagle"}
    assert score_completion("<answer>Whale</answer>", parsed).reward == 1.0


@pytest.mark.parametrize(("gold", "reason"), [
    ("Z", "not one of the options"),
    ("BC", "not an option letter"),
    ("Pancreas", "not an option letter"),
    (None, "no reference answer"),
])
def test_malformed_reference_is_a_failure_with_reason(gold, reason):
    score = score_completion("<answer>B</answer>", item(gold))
    assert score.reward == 0.0
    assert score.reason is not None and reason in score.reason


def test_reference_letter_in_parentheses_is_read():
    assert score_completion("<answer>B</answer>", item("(B)")).reward == 1.0
