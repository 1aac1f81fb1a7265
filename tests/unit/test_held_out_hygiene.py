"""Held-out hygiene: no held-out question, compared as normalized text, appears in any source of training text (a
warm-up's source items, public prompts, private streams and so SAPO's questions, an organization's own file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.config.keys import load_toml
from pubswap_flwr.policy.model import data_dir
from pubswap_flwr.shared import supervised_questions, task_universe
from pubswap_flwr.tasks import HeldOutSet, ItemListStream, MixtureStream, StreamCursor, TaskItem, node_mixes, parse_mix
from pubswap_flwr.tasks.splits import question_key
from pubswap_flwr.warmup import source_items

ROOT = Path(__file__).resolve().parents[2]
WARM_BUILD = data_dir() / "models" / "smollm2-warm" / "build.json"


def test_question_keys_ignore_case_and_whitespace():
    assert question_key("  Calculate 5 +\n 5. ") == question_key("calculate 5 + 5.") == "calculate 5 + 5."


def test_the_old_warm_up_source_did_share_questions_with_the_real_held_out_set():
    """What the audit found (21 of 200): without the exclusion the real config's held-out set repeats warm-up
    source questions, so the test below is not vacuous."""
    cfg = ExperimentConfig.from_flat({**load_toml(ROOT / "configs" / "real.toml"),
                                      "tasks.mix": "basic_arithmetic:1,gcd:1,chain_sum:1,products:1"})
    tasks = parse_mix(cfg.tasks.mix)
    plain = HeldOutSet.build(tasks, cfg.eval.items_per_task, cfg.tasks.data_seed)
    assert len(plain.questions & supervised_questions(("smollm2-135m-warm",))) > 0


@pytest.mark.parametrize("overrides", [{}, {"strategy.mode": "pubswap", "pubswap.tau-swap": 2},
                                       {"strategy.mode": "sapo"},
                                       {"tasks.mix": "basic_arithmetic:1,gcd:1,chain_sum:1,products:1"}])
def test_no_held_out_question_is_in_any_training_source_of_the_real_config(overrides):
    cfg = ExperimentConfig.from_flat({**load_toml(ROOT / "configs" / "real.toml"), **overrides})
    universe = task_universe(cfg)
    held_out = universe.held_out.questions
    assert len(universe.held_out.items) == len(held_out)  # distinct questions, none dropped silently
    warm = supervised_questions(("smollm2-135m-warm",))
    assert len(warm) > 0 and not held_out & warm
    assert not held_out & {question_key(i.question) for i in universe.public.items}
    base = parse_mix(cfg.tasks.mix)
    for node in range(4):  # private streams; a SAPO node's questions are drawn from its stream
        mix = node_mixes(base, node + 1, cfg.tasks.per_node)[node]
        stream = MixtureStream(mix, universe.tasks, node, universe.training_exclude, cfg.tasks.data_seed)
        drawn = {question_key(i.question) for i in stream.take(300, StreamCursor())}
        assert not drawn & held_out


def test_the_warm_up_source_is_regenerated_as_built():
    """build.json's recorded examples come from the regenerated source list: the exclusion removes what the model
    was actually fine-tuned on."""
    import json

    build = json.loads(WARM_BUILD.read_text())
    source = {question_key(i.question) for i in source_items(build["tasks"], build["items_per_task"])}
    assert len(source) == 4 * build["items_per_task"]
    assert all(question_key(e["question"]) in source for e in build["examples"])


def test_an_organization_file_drops_held_out_questions_whatever_their_spacing_or_case():
    items = [TaskItem("a", "t", "What is 2 + 2?", "4", "exact"), TaskItem("b", "t", "what is  3 + 3?", "6", "exact")]
    stream = ItemListStream(items, {question_key("WHAT IS 2 + 2?")})
    assert [i.uid for i in stream.items] == ["b"] and stream.dropped == 1


def test_a_public_set_never_repeats_a_held_out_question():
    tasks = parse_mix("gcd:1,basic_arithmetic:1")
    held_out = HeldOutSet.build(tasks, 40)
    from pubswap_flwr.tasks import PublicSet

    public = PublicSet.build(tasks, tasks, 200, held_out.questions)
    assert not held_out.questions & {question_key(i.question) for i in public.items}


CONSTANT_BOUND = 0.15  # configs/real.toml's stated bound


def test_no_task_of_the_real_preset_has_a_constant_answer_over_its_stated_bound():
    from pubswap_flwr.tasks.shortcuts import check_task

    cfg = ExperimentConfig.from_flat(load_toml(ROOT / "configs" / "real.toml"))
    golds: dict[str, list] = {}
    for item in task_universe(cfg).held_out.items:
        golds.setdefault(item.task, []).append(item.answer)
    assert sorted(golds) == ["basic_arithmetic", "chain_sum", "products"]
    for task, answers in golds.items():
        assert check_task(answers, []).constant_accuracy <= CONSTANT_BOUND, task
