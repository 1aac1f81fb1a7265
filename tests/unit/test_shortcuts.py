"""The shortcut check's pure parts: answer normalization, the modal answer and its share, the flag rule."""

from __future__ import annotations

import pytest

from pubswap_flwr.tasks.shortcuts import SHORTCUT_SHARE, check_task, modal, normalize_answer


def test_answers_are_compared_stripped_lower_cased_with_whitespace_collapsed():
    assert normalize_answer("  Olleh \n") == "olleh"
    assert normalize_answer("a   b") == "a b"
    assert normalize_answer("   ") is None and normalize_answer(None) is None


def test_modal_share_counts_missing_answers_in_the_denominator():
    assert modal(["1", "1", None, "2"]) == ("1", 0.5)
    assert modal([None, None]) == (None, 0.0)
    assert modal([]) == (None, 0.0)


def test_modal_ties_go_to_the_first_answer_seen():
    assert modal(["2", "1", "1", "2"]) == ("2", 0.5)


@pytest.mark.parametrize("model_share, gold_share, flagged", [
    (0.9, 0.3, True),    # the gcd "1" case
    (0.8, 0.3, False),   # at the bound: not over it
    (0.95, 0.9, False),  # the gold answers are this concentrated too
    (0.5, 0.1, False),
])
def test_the_flag_needs_a_collapsed_model_and_gold_answers_that_are_not(model_share, gold_share, flagged):
    golds = ["1"] * int(gold_share * 100) + [str(i) for i in range(2, 2 + 100 - int(gold_share * 100))]
    answers = ["1"] * int(model_share * 100) + ["7"] * (100 - int(model_share * 100))
    check = check_task(golds, answers)
    assert check.constant_accuracy == pytest.approx(gold_share)
    assert check.modal_share == pytest.approx(model_share)
    assert check.flagged is flagged
    assert SHORTCUT_SHARE == 0.8


def test_long_answers_are_cut_for_the_metrics_row():
    check = check_task(["x" * 100], ["y" * 100])
    assert check.constant_answer == "x" * 32 and check.modal_answer == "y" * 32
