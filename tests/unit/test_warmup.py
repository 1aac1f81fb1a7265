"""The answer-format warm-up: targets are the model's own right answers put in the tags; a build writes a portable
fp16 adapter and its record."""

from __future__ import annotations

import json
import logging
import re

import pytest
from safetensors import safe_open

from pubswap_flwr.tasks import TaskItem
from pubswap_flwr.warmup import distilled_target, main

ITEM = TaskItem("u", "basic_arithmetic", "Calculate 28 - 64.", "-36", "rg")


@pytest.mark.parametrize("text,expected", [
    ("28 - 64 = -36. That is all.", "28 - 64 = -36\n<answer>-36</answer>"),  # cut after its answer, then tagged
    ("So <answer>-36</answer>", "So <answer>-36</answer>"),  # already right in the tags: kept as it is
    ("28 - 64 = 36.", None),  # wrong: never taught
    ("I cannot help with that.", None),
    ("It is -36, or maybe 12.", None),  # the lenient answer is the last number, which is wrong
])
def test_targets_keep_only_the_models_own_right_answers(text, expected):
    from pubswap_flwr.tasks import score_completion

    ITEM_RG = TaskItem("u", "basic_arithmetic", ITEM.question, ITEM.answer, "exact")
    assert distilled_target(text, ITEM_RG) == expected
    if expected is not None:
        assert score_completion(expected, ITEM_RG).reward == 1.0


def test_a_base_models_target_stops_where_it_starts_a_question_of_its_own():
    item = TaskItem("u", "basic_arithmetic", ITEM.question, ITEM.answer, "exact")
    rambling = " 28 - 64 = -36.\nAnswer: -36.\nQuestion: Calculate 5 + 7.\nAnswer: 12."
    # the space after the prompt's "Answer:" is the model's own and stays
    assert distilled_target(rambling, item, "\nQuestion:") == " 28 - 64 = -36.\nAnswer: -36\n<answer>-36</answer>"
    assert distilled_target(rambling, item) is None  # uncut, its last number (12) is the lenient answer
    tagged_later = " -36\nQuestion: Calculate 1 + 1.\n<answer>2</answer>"
    assert distilled_target(tagged_later, item, "\nQuestion:") == " -36\n<answer>-36</answer>"
    tagged = " <answer>-36</answer>\nQuestion: Calculate 1 + 1."
    assert distilled_target(tagged, item, "\nQuestion:") == " <answer>-36</answer>"


def test_a_small_build_writes_a_portable_fp16_adapter_and_its_record(tmp_path, capsys, caplog):
    out = tmp_path / "warm"
    caplog.set_level(logging.INFO, logger="pubswap_flwr")
    main(["build", "--model", "embedded:tiny", "--tasks", "gcd:1", "--items", "4", "--samples", "2", "--epochs", "1",
          "--check-items", "3", "--check-samples", "1", "--lora-r", "4", "--max-new-tokens", "12", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors", "build.json"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "embedded:tiny" and config["r"] == 4
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as handle:
        assert {str(handle.get_tensor(k).dtype) for k in handle.keys()} == {"torch.float16"}
    record = json.loads((out / "build.json").read_text())
    assert record["command"].startswith("python -m pubswap_flwr.warmup build --model embedded:tiny")
    assert set(record["targets"]) == {"gcd"} and 0 < record["targets"]["gcd"] <= 4
    assert len(record["loss_per_epoch"]) == 1 and record["before"]["overall"]["greedy_well_formed"] >= 0
    assert {"greedy_lenient_accuracy", "sampled_accuracy"} <= set(record["after"]["overall"])
    assert oct(out.joinpath("build.json").stat().st_mode & 0o777) == "0o644"
    # the fine-tune says how far it is, with an ETA (an epoch on the real model takes minutes)
    assert any(re.fullmatch(r"fine-tune: epoch 1/1 \d+/\d+ items, .* elapsed, ETA .*", r.getMessage())
               for r in caplog.records)


def test_shots_take_the_tasks_in_turn_never_a_source_question_and_count_as_supervised(tmp_path):
    from pubswap_flwr.tasks.splits import question_key
    from pubswap_flwr.warmup import shot_items, source_items, supervised_questions

    tasks = "basic_arithmetic:1,gcd:1"
    items = source_items(tasks, 20)
    shots = shot_items(tasks, 3, items)
    assert [item.task for item in shots] == ["basic_arithmetic", "gcd", "basic_arithmetic"]
    assert shots == shot_items(tasks, 3, items) and shot_items(tasks, 0, items) == []
    source = {question_key(item.question) for item in items}
    assert not source & {question_key(item.question) for item in shots}
    record = tmp_path / "build.json"
    record.write_text(json.dumps({"tasks": tasks, "items_per_task": 20, "shots": 3}))
    assert supervised_questions(record) == source | {question_key(item.question) for item in shots}
    record.write_text(json.dumps({"tasks": tasks, "items_per_task": 20}))  # a build from before --shots
    assert supervised_questions(record) == source


@pytest.mark.parametrize("shots,message", [("2", "embedded:tiny has a chat template"),
                                           ("-1", "--shots must be 0 or more, got -1")])
def test_shots_are_refused_for_a_chat_model_or_below_zero(tmp_path, shots, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["build", "--model", "embedded:tiny", "--tasks", "gcd:1", "--items", "2", "--shots", shots,
              "--out", str(tmp_path / "warm")])
    assert not (tmp_path / "warm").exists()


def test_the_warm_up_table_puts_the_best_constant_beside_before_and_after(tmp_path, capsys, monkeypatch):
    import importlib.util
    import sys
    from pathlib import Path

    from pubswap_flwr.tasks.shortcuts import check_task

    path = Path(__file__).resolve().parents[2] / "scripts" / "warmup_table.py"
    spec = importlib.util.spec_from_file_location("warmup_table", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    row = {"greedy_accuracy": 0.25, "greedy_lenient_accuracy": 0.5, "sampled_accuracy": 0.125,
           "sampled_accuracy_se": 0.05, "sampled_lenient_accuracy": 0.375, "sampled_well_formed": 0.75}
    build = {"model": "m", "command": "python -m pubswap_flwr.warmup build", "tasks": "gcd:1", "items_per_task": 4,
             "shots": 1, "check_items_per_task": 6, "check_samples": 2, "temperature": 0.7, "max_new_tokens": 16,
             "before": {"per_task": {"gcd": row}, "overall": row}, "after": {"per_task": {"gcd": row}, "overall": row}}
    items = script.check_items(build)
    assert len(items) == 6 and {item.task for item in items} == {"gcd"}
    best = check_task([item.answer for item in items], [])
    record = tmp_path / "build.json"
    record.write_text(json.dumps(build))
    monkeypatch.setattr(sys, "argv", ["warmup_table.py", str(record)])
    script.main()
    out = capsys.readouterr().out
    assert "code version not recorded" in out
    assert (f"| gcd | before | 0.250 | 0.500 | 0.125 ± 0.050 | 0.375 | 0.750 | "
            f"{best.constant_accuracy:.3f} (`{best.constant_answer}`) |") in out
    assert "|  | after | 0.250 | 0.500 | 0.125 ± 0.050 | 0.375 | 0.750 |  |" in out
    record.write_text("{}")
    with pytest.raises(SystemExit, match="not a warm-up record with its check"):
        script.main()
