"""The skilled donor: worked solutions written by code from each item's own fields, source items that no held-out
set shares, and a build that records how its epochs were chosen."""

from __future__ import annotations

import json
import re

import pytest
from safetensors import safe_open

from pubswap_flwr.donor import (
    PROBE_ITEMS,
    PROBE_SEED,
    PROBE_SLOTS,
    SKILL_TASKS,
    main,
    reserved_items,
    skill_task,
    source_items,
)
from pubswap_flwr.donor import supervised_questions as donor_questions
from pubswap_flwr.tasks import HeldOutSet, TaskError, TaskItem, TaskSpec
from pubswap_flwr.tasks.splits import question_key
from pubswap_flwr.tasks.worked import worked_solution

STEP = re.compile(r"^(-?\d+) ([+-]) (\d+) = (-?\d+)$")


@pytest.mark.parametrize("task", sorted(SKILL_TASKS))
def test_worked_solutions_add_up_step_by_step_to_the_items_answer(task):
    items = HeldOutSet.build([skill_task(task)], per_task=300, data_seed=31).items
    for item in items:
        text = worked_solution(item)
        *steps, last = text.split("\n")
        assert last == f"<answer>{item.answer}</answer>", text
        terms = item.metadata["expression"].split(" ")
        assert len(steps) == len(terms) // 2 == item.metadata["num_terms"] - 1, text
        running = terms[0]
        for step, op, term in zip(steps, terms[1::2], terms[2::2]):
            left, step_op, right, result = STEP.match(step).groups()
            assert (left, step_op, right) == (running, op, term), text
            assert int(result) == (int(left) + int(right) if op == "+" else int(left) - int(right)), text
            running = result
        assert running == item.answer


def test_a_worked_solution_is_refused_for_what_it_cannot_write():
    other = TaskItem("u", "gcd", "Find the GCD of 4, 6.", "2", "rg", metadata={"source_dataset": "gcd"})
    with pytest.raises(ValueError, match="no worked solution for generator 'gcd'"):
        worked_solution(other)
    times = TaskItem("u", "basic_arithmetic", "Calculate 3 * 4 + 1.", "13", "rg",
                     metadata={"source_dataset": "basic_arithmetic", "expression": "3 * 4 + 1"})
    with pytest.raises(ValueError, match=r"operator '\*'"):
        worked_solution(times)
    wrong = TaskItem("u", "chain_sum", "State ... 10 + 20 =", "31", "rg",
                     metadata={"source_dataset": "chain_sum", "expression": "10 + 20"})
    with pytest.raises(ValueError, match="gives 30, not the item's answer '31'"):
        worked_solution(wrong)


def test_donor_source_never_uses_held_out_items():
    """The source leaves out the probe's items (scripts/zero_shot.py's data seed), the build's validation and check
    items, and a run at any data seed then leaves the source out of its held-out set (supervised_questions)."""
    spec = skill_task("chain_sum_3x2")
    reserved = reserved_items(spec, validation=40, check=50)
    source = source_items(spec, 300, validation=40, check=50)
    keys = {question_key(item.question) for item in source}
    assert len(source) == len(keys) == 300
    assert len(reserved["probe"]) == PROBE_ITEMS * PROBE_SLOTS and len(reserved["validation"]) == 40
    other = TaskSpec("products_3x1", "products", {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1})
    for probe_tasks in ([spec], [other, spec]):  # the probe as scripts/zero_shot.py builds it (warm-middle: slot 1)
        probe = HeldOutSet.build(probe_tasks, per_task=50, data_seed=PROBE_SEED).items
        assert not keys & {question_key(item.question) for item in probe if item.task == spec.name}
    for name, items in reserved.items():
        assert not keys & {question_key(item.question) for item in items}, name
    assert not ({question_key(i.question) for i in reserved["validation"]}
                & {question_key(i.question) for i in reserved["check"]})
    assert source == source_items(spec, 300, validation=40, check=50)  # regenerated as built


def test_a_bad_task_name_is_a_clear_error(tmp_path):
    with pytest.raises(TaskError, match="unknown skill task 'gcd'; a donor can be built for: "
                                        "basic_arithmetic_3x12, chain_sum_3x2"):
        main(["build", "--model", "embedded:tiny", "--task", "gcd", "--out", str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()


def test_a_small_donor_build_writes_its_adapter_and_record(tmp_path):
    out = tmp_path / "donor"
    main(["build", "--model", "embedded:tiny", "--task", "chain_sum_3x2", "--items", "6", "--epochs", "2",
          "--validation-items", "3", "--check-items", "3", "--samples", "2", "--lora-r", "4", "--max-new-tokens", "8",
          "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors", "build.json"]
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as handle:
        assert {str(handle.get_tensor(k).dtype) for k in handle.keys()} == {"torch.float16"}
    record = json.loads((out / "build.json").read_text())
    assert record["command"].startswith("python -m pubswap_flwr.donor build --model embedded:tiny --task chain_sum_3x2")
    assert record["builder"] == "donor" and record["task"] == "chain_sum_3x2"
    assert record["generator"] == "chain_sum" and record["config"] == dict(skill_task("chain_sum_3x2").config)
    assert record["items"] == 6 and record["seed"] == 0 and record["code"]
    assert record["seeds"] == {"source": 711, "validation": 712, "check": 713}
    assert len(record["examples"]) > 0 and all(e["target"].endswith(f"<answer>{e['answer']}</answer>")
                                               for e in record["examples"])
    validation = record["validation"]
    assert [row["epoch"] for row in validation] == [1, 2] and len(record["loss_per_epoch"]) == 2
    assert record["rule"].startswith("the epoch whose validation sampled strict pass@1 is nearest 0.5")
    nearest = min(validation, key=lambda row: (abs(row["sampled_accuracy"] - 0.5), row["epoch"]))
    assert record["chosen_epoch"] == nearest["epoch"]
    for key in ("before", "after"):
        check = record[key]
        assert {"greedy_accuracy", "sampled_accuracy", "sampled_well_formed"} <= set(check["overall"])
        assert sum(check["solved_of_samples"].values()) == 3 and set(check["solved_of_samples"]) <= {"0", "1", "2"}
    assert oct(out.joinpath("build.json").stat().st_mode & 0o777) == "0o644"
    assert donor_questions(out / "build.json") == frozenset(
        question_key(i.question) for i in source_items(skill_task("chain_sum_3x2"), 6, validation=3, check=3))


def test_the_probe_seed_is_the_zero_shot_scripts():
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "scripts" / "zero_shot.py").read_text()
    assert f"\nDATA_SEED = {PROBE_SEED}  #" in script


def test_a_run_leaves_out_what_a_donor_and_its_base_were_fine_tuned_on(monkeypatch, tmp_path):
    """A packaged donor (its adapter merged on the warm model) supervised on the donor's source and the warm-up's:
    shared.supervised_questions, which every run's held-out set leaves out, holds both."""
    from pubswap_flwr import shared
    from pubswap_flwr.policy import packaged
    from pubswap_flwr.policy.data import data_dir
    from pubswap_flwr.warmup import supervised_questions as warm_questions

    warm_build = data_dir() / "models" / "smollm2-warm" / "build.json"
    (tmp_path / "models" / "smollm2-warm").mkdir(parents=True)
    (tmp_path / "models" / "smollm2-warm" / "build.json").write_text(warm_build.read_text())
    (tmp_path / "models" / "d").mkdir()
    spec = skill_task("chain_sum_3x2")
    (tmp_path / "models" / "d" / "build.json").write_text(json.dumps(
        {"builder": "donor", "task": spec.name, "generator": spec.generator, "config": dict(spec.config),
         "items": 20, "validation_items": 5, "check_items": 5}))
    warm = packaged.PACKAGED["smollm2-135m-warm"]
    monkeypatch.setitem(packaged.PACKAGED, "donor-x", packaged.PackagedModel(
        "donor-x", warm.package, warm.distribution, warm.gguf_file, "test donor", base=warm.name, adapter="d",
        builder="donor"))
    monkeypatch.setattr(shared, "data_dir", lambda: tmp_path)
    shared.supervised_questions.cache_clear()
    try:
        found = shared.supervised_questions(("donor-x",))
    finally:
        shared.supervised_questions.cache_clear()
    donor = frozenset(question_key(i.question) for i in source_items(spec, 20, validation=5, check=5))
    assert found == donor | warm_questions(warm_build) and len(donor) == 20


def test_the_packaged_donor_is_regenerated_as_built_and_left_out_of_runs():
    """The committed donor's build.json: its examples are worked solutions of its regenerated source, and a run of
    the packaged donor leaves that source (and the warm-up's) out of its held-out set."""
    from pubswap_flwr.policy.data import data_dir
    from pubswap_flwr.policy.packaged import PACKAGED
    from pubswap_flwr.shared import supervised_questions

    model = PACKAGED["smollm2-135m-donor-chain-sum"]
    record = json.loads((data_dir() / "models" / str(model.adapter) / "build.json").read_text())
    source = source_items(skill_task(record["task"]), record["items"], validation=record["validation_items"],
                          check=record["check_items"])
    by_question = {item.question: item for item in source}
    assert record["examples"] and all(worked_solution(by_question[e["question"]]) == e["target"]
                                      for e in record["examples"])
    assert model.base == "smollm2-135m-warm" and record["model"] == model.base
    assert {question_key(item.question) for item in source} <= supervised_questions((model.name,))
