"""eval.harder-tier: a second held-out tier one curriculum level above tasks.curriculum-start, disjoint from the
held-out tier and from every training source; config errors name the key."""

from __future__ import annotations

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.config.keys import ConfigError
from pubswap_flwr.shared import task_universe
from pubswap_flwr.tasks import PRESETS
from pubswap_flwr.tasks.curriculum import level_config
from pubswap_flwr.tasks.splits import question_key

FLAT = {"tasks.mix": "gcd:1,spell_backward:1", "eval.items-per-task": 6, "pubswap.public-size": 8}


def test_the_harder_tier_is_one_level_up_disjoint_and_left_out_of_training():
    plain = task_universe(ExperimentConfig.from_flat(FLAT))
    universe = task_universe(ExperimentConfig.from_flat({**FLAT, "eval.harder-tier": True,
                                                         "tasks.curriculum-start": 1}))
    assert plain.harder is None
    assert universe.held_out.items == plain.held_out.items  # the configured tier is untouched
    harder = universe.harder.items
    assert [i.task for i in harder] == ["gcd"] * 6 + ["spell_backward"] * 6
    assert all(i.provenance["config"] == level_config(PRESETS[i.task], 2) for i in harder)
    assert all(i.uid.startswith(f"harder/{i.task}/") and i.provenance["split"] == "harder" for i in harder)
    keys = {question_key(i.question) for i in harder}
    assert not keys & universe.held_out.questions
    assert keys <= universe.training_exclude
    assert not keys & {question_key(i.question) for i in universe.public.items}


@pytest.mark.parametrize(("flat", "message"), [
    ({"strategy.mode": "sapo"}, r"^eval.harder-tier = true: sapo mode has no global adapter"),
    ({"strategy.mode": "local"}, r"^eval.harder-tier = true: local mode has no global adapter"),
    ({"eval.data-path": "data/samples/deepmath.jsonl"}, r"^eval.harder-tier = true needs generated held-out items"),
    ({"tasks.curriculum-start": 3},
     r"^eval.harder-tier at tasks.curriculum-start \+ 1 = 4: above the top curriculum level 3 of task 'gcd'$"),
    ({"tasks.mix": "gcd:1,rg:list_functions:1"}, r"^eval.harder-tier = true: .* no curriculum for rg:list_functions"),
])
def test_bad_harder_tier_settings_are_config_errors_naming_the_key(flat, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig.from_flat({**FLAT, "eval.harder-tier": True, **flat})
