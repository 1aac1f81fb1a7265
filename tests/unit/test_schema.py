"""The schema layer (schema.py, and the payloads declared with it in wire/payloads.py): declarations check types and
bounds strictly and errors name the field."""

from __future__ import annotations

import pytest

from pubswap_flwr.schema import SchemaError, parse
from pubswap_flwr.tasks.verifiers import VERIFIERS
from pubswap_flwr.wire.payloads import EvalResult, Limits, item_schema, packet_schema, responses_schema

ITEM = {"uid": "gcd/1", "task": "gcd", "question": "What is gcd(4, 6)?", "answer": "2", "verifier": "exact"}


def reason(value, schema, what="x") -> str:
    with pytest.raises(SchemaError) as caught:
        parse(value, schema, what)
    return str(caught.value)


def test_parse_is_strict_and_names_the_field_path():
    packet = packet_schema(Limits(), 4)
    assert reason({"item": {**ITEM, "uid": 7}, "completions": ["a"]}, packet, "packet 3") == \
        "packet 3.item.uid: expected `str`, got `int`"
    assert reason({"item": ITEM, "completions": ["a", 5]}, packet) == "x.completions[1]: expected `str`, got `int`"
    assert reason([ITEM], packet) == "x: expected `object`, got `array`"
    # a number given as text is refused, not coerced; so is a bool where a number belongs
    assert reason({"greedy_accuracy": "0.5"}, EvalResult, "eval") == \
        "eval.greedy_accuracy: expected `float`, got `str`"
    assert reason({"greedy_accuracy": True}, EvalResult, "eval") == \
        "eval.greedy_accuracy: expected `float`, got `bool`"


def test_a_failed_parse_raises_the_callers_error_type():
    class Refused(ValueError):
        pass

    with pytest.raises(Refused, match=r"^eval: object missing required field `greedy_accuracy`$"):
        parse({}, EvalResult, "eval", Refused)


def test_bounds_follow_the_limits_and_each_declaration_is_built_once_per_limits():
    small = Limits(max_completion_chars=5, max_question_chars=30, max_answer_chars=3)
    packet = packet_schema(small, 2)
    assert packet is packet_schema(Limits(max_completion_chars=5, max_question_chars=30, max_answer_chars=3), 2)
    assert packet is not packet_schema(small, 3)
    assert reason({"item": ITEM, "completions": ["abcdef"]}, packet) == \
        "x.completions[0]: expected `str` of length <= 5"
    assert reason({"item": ITEM, "completions": ["a", "b", "c"]}, packet) == \
        "x.completions: expected `array` of length <= 2"
    assert reason({"item": ITEM, "completions": []}, packet) == "x.completions: expected `array` of length >= 1"
    assert reason({**ITEM, "question": "q" * 31}, item_schema(small)) == "x.question: expected `str` of length <= 30"
    assert reason({**ITEM, "answer": "1234"}, item_schema(small)) == "x.answer: expected `str` of length <= 3"
    assert reason(["a"], responses_schema(2, small)) == "x: expected `array` of length >= 2"
    assert parse(["a", "bcdef"], responses_schema(2, small), "x") == ["a", "bcdef"]


def test_an_item_is_checked_across_its_fields():
    item = item_schema(Limits(max_depth=3, max_metadata_chars=40))
    assert reason({**ITEM, "question": " \n"}, item) == "x: 'question' is empty"
    assert reason({**ITEM, "answer": None}, item) == "x: 'answer' is missing"
    assert parse({**ITEM, "answer": None, "verifier": "rg"}, item, "x").answer is None  # reasoning-gym scores it
    assert reason({**ITEM, "verifier": "astrology"}, item) == "x: unknown verifier 'astrology'"
    assert reason({**ITEM, "metadata": {"a": [[[1]]]}}, item) == "x: 'metadata' is nested more than 3 levels deep"
    assert reason({**ITEM, "metadata": {"a": "b" * 40}}, item) == "x: 'metadata' is over the 40-char limit"
    assert reason({**ITEM, "provenance": {"seed": "7"}}, item) == \
        "x: provenance.seed: expected `int | null`, got `str`"
    assert reason({**ITEM, "family": "\ud800"}, item).startswith("x: 'family' is not valid Unicode text")
    assert reason({**ITEM, "provenance": {"a": ["\udc00"]}}, item).startswith("x: 'provenance' is not valid Unicode")
    kept = parse({**ITEM, "provenance": {"seed": 7, "note": "kept"}}, item, "x")
    assert kept.provenance == {"seed": 7, "note": "kept"}  # keys beyond the four typed ones pass through


def test_a_verifier_registered_after_the_schema_was_built_is_known(monkeypatch):
    item = item_schema(Limits())
    assert reason({**ITEM, "verifier": "late"}, item) == "x: unknown verifier 'late'"
    monkeypatch.setitem(VERIFIERS, "late", lambda text, task_item: 0.0)
    assert parse({**ITEM, "verifier": "late"}, item, "x").verifier == "late"


def test_a_packets_behaviour_lists_one_entry_per_completion():
    packet = packet_schema(Limits(), 4)
    assert reason({"item": ITEM, "completions": ["a", "b"], "behaviour": [None]}, packet) == \
        "x: behaviour must list one entry per completion (2)"
    assert reason({"item": ITEM, "completions": ["a"], "tokenizer": "t" * 65}, packet) == \
        "x.tokenizer: expected `str` of length <= 64"


def test_an_evaluation_keeps_the_numbers_given_in_declared_order():
    result = parse({"sampled_accuracy": 0.25, "greedy_accuracy": 1, "unknown": "ignored", "samples": 4,
                    "per_task": {"gcd": {"greedy_accuracy": 0.5, "constant_accuracy": 0}},
                    "greedy_shortcut_tasks": ["gcd", "gcd"],
                    "item_results": {"uids": ["a", "b"], "tasks": ["gcd", "gcd"], "sampled": [4, 0]}},
                   EvalResult, "eval")
    out = result.to_dict()
    assert list(out) == ["greedy_accuracy", "sampled_accuracy", "samples", "per_task", "greedy_shortcut_tasks",
                         "item_results"]
    assert out["greedy_accuracy"] == 1.0 and isinstance(out["greedy_accuracy"], float)
    assert out["per_task"] == {"gcd": {"greedy_accuracy": 0.5, "constant_accuracy": 0.0}}
    assert out["greedy_shortcut_tasks"] == ["gcd"]
    assert out["item_results"] == {"uids": ["a", "b"], "tasks": ["gcd", "gcd"], "sampled": [4, 0], "samples": 4}


@pytest.mark.parametrize("change, expected", [
    ({"greedy_accuracy": 1.5}, "eval.greedy_accuracy: expected `float` <= 1.0"),
    ({"samples": 0}, "eval.samples: expected `int` >= 1"),
    ({"per_task": {"gcd": {"sampled_accuracy": 0.5}}},
     "eval.per_task[...]: object missing required field `greedy_accuracy`"),
    ({"per_task": {"g" * 129: {"greedy_accuracy": 0.5}}}, "eval.per_task (a key): expected `str` of length <= 128"),
    ({"per_task": {"\udc00": {"greedy_accuracy": 0.5}}}, "eval: a task name is not valid Unicode text"),
    ({"sampled_shortcut_tasks": ["gcd"]}, "eval: sampled_shortcut_tasks names tasks the evaluation does not report"),
    ({"item_results": {"uids": ["a"], "tasks": ["gcd", "gcd"]}}, "eval.item_results: 'tasks' lists 2 entries for 1"),
    ({"item_results": {"uids": [], "tasks": []}}, "eval.item_results.uids: expected `array` of length >= 1"),
    ({"item_results": {"uids": ["a"], "tasks": ["t"], "greedy": [2]}},
     "eval.item_results.greedy[0]: expected `int` <= 1"),
    ({"samples": 2, "item_results": {"uids": ["a"], "tasks": ["t"], "sampled": [3]}},
     "eval: item_results counts 3 right of 2 samples for item 'a'"),
])
def test_an_evaluation_out_of_bounds_is_refused_naming_the_field(change, expected):
    assert reason({"greedy_accuracy": 0.5, **change}, EvalResult, "eval").startswith(expected)


@pytest.mark.parametrize("value", [
    {"greedy_accuracy": "\ud800"},  # a lone surrogate (a JSON escape allows one) where a number belongs
    {"greedy_accuracy\udfff": 0.5},  # ... or in a key
])
def test_text_that_is_not_unicode_is_refused_with_the_callers_error(value):
    class Refused(ValueError):
        pass

    with pytest.raises(Refused, match=r"^eval: text that is not valid Unicode \(a lone surrogate\)$"):
        parse(value, EvalResult, "eval", Refused)
    assert reason(value, EvalResult, "") == "text that is not valid Unicode (a lone surrogate)"
