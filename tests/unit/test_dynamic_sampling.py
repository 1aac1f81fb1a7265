"""train.dynamic-sampling (#53 item 3): a private step keeps only the groups whose rewards differ, samples further
prompts until it has prompts-per-step of them or its cap, and reports what it sampled and trained; and
train.skip-equal-prompts, which skips prompts of tasks whose recent groups all agreed (scripted rewards, no model)."""

from __future__ import annotations

import json
import random

import pytest

from pubswap_flwr.algorithms.dynamic_sampling import (
    RECENT_EQUAL,
    SamplingBudget,
    equal_streaks,
    fill_step,
    next_draw,
    skips,
)
from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.node_runtime.state import NodeState
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.wire.counters import SamplingCounts
from pubswap_flwr.wire.validate import Rejected

MIXED, FLAT = [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]


def scripted(rewards: list[list[float]]):
    """A draw that hands out groups with these rewards, in order (uid gN), and records the sizes asked for."""
    queue = [RolloutGroup(f"p{i}", [Completion(str(r)) for r in group], group, item_uid=f"g{i}")
             for i, group in enumerate(rewards)]
    asked: list[int] = []

    def draw(count: int) -> list[RolloutGroup]:
        asked.append(count)
        taken, queue[:] = queue[:count], queue[count:]
        return taken

    return draw, asked


def test_only_groups_whose_rewards_differ_are_trained_in_sampling_order():
    draw, asked = scripted([MIXED, FLAT, [0.0, 0.0, 0.5, 0.0], FLAT] + [FLAT, MIXED, MIXED, FLAT])
    filled = fill_step(SamplingBudget(wanted=4, max_factor=2.0), draw)
    # 2 of the first 4 differ: the shortfall of 2 at a share of 1/2 asks for 4 more, which bring 2 (g5, g6)
    assert asked == [4, 4]
    assert [g.item_uid for g in filled.trained] == ["g0", "g2", "g5", "g6"]
    assert len(filled.sampled) == 8 and filled.zero_advantage == 4 and filled.draws == 2


def test_a_full_first_draw_samples_nothing_more():
    draw, asked = scripted([MIXED] * 3 + [FLAT] * 10)
    filled = fill_step(SamplingBudget(wanted=3, max_factor=4.0), draw)
    assert asked == [3] and len(filled.sampled) == 3 and len(filled.trained) == 3


def test_the_cap_bounds_what_is_sampled_and_a_step_with_no_signal_trains_nothing():
    draw, asked = scripted([FLAT] * 20)
    filled = fill_step(SamplingBudget(wanted=4, max_factor=2.5), draw)
    assert asked == [4, 6] and len(filled.sampled) == 10  # floor(4 x 2.5); nothing informative: all the cap leaves
    assert filled.trained == [] and filled.zero_advantage == 10
    draw, asked = scripted([FLAT] * 20)
    assert len(fill_step(SamplingBudget(wanted=4, max_factor=1.0), draw).sampled) == 4 and asked == [4]


def test_more_informative_groups_than_wanted_keep_the_first_ones():
    draw, asked = scripted([FLAT, MIXED, FLAT, FLAT] + [MIXED] * 8)
    filled = fill_step(SamplingBudget(wanted=4, max_factor=3.0), draw)
    assert asked == [4, 8]  # shortfall 3 x 4 sampled / 1 kept = 12, beyond the 8 the cap (12) leaves
    assert [g.item_uid for g in filled.trained] == ["g1", "g4", "g5", "g6"] and len(filled.sampled) == 12


@pytest.mark.parametrize("sampled, kept, expected", [
    (0, 0, 8),  # the step's usual prompts first
    (8, 8, 0),  # full
    (8, 2, 8),  # shortfall 6 at a share of 1/4 would be 24: the cap (16) leaves 8
    (8, 6, 3),  # shortfall 2 at 3/4: ceil(2.67)
    (8, 0, 8),  # nothing informative yet: all the cap leaves
    (16, 3, 0),  # the cap reached
])
def test_next_draw(sampled, kept, expected):
    assert next_draw(SamplingBudget(8, 2.0), sampled, kept) == expected


def test_a_budget_below_one_prompt_or_factor_is_refused():
    with pytest.raises(ValueError, match="max_factor >= 1"):
        SamplingBudget(4, 0.5)
    with pytest.raises(ValueError, match="wanted >= 1"):
        SamplingBudget(0, 2.0)
    assert SamplingBudget(3, 1.5).cap == 4 and SamplingBudget(8, 1.0).cap == 8


def test_the_keys_default_off_and_bad_values_are_config_errors_naming_the_key():
    cfg = ExperimentConfig()
    assert cfg.train.dynamic_sampling is False and cfg.train.dynamic_sampling_max_factor == 2.0
    on = ExperimentConfig.from_flat({"train.dynamic-sampling": True, "train.dynamic-sampling-max-factor": 3})
    assert on.train.dynamic_sampling and on.train.dynamic_sampling_max_factor == 3.0
    for bad in (0.5, 0.0, -1.0, 101.0):
        with pytest.raises(ConfigError, match=rf"^train.dynamic-sampling-max-factor = {bad}: must be >= 1 and "
                                              r"<= 100$"):
            ExperimentConfig.from_flat({"train.dynamic-sampling-max-factor": bad})
    with pytest.raises(ConfigError, match="^train.dynamic-sampling-max-factor = 'x': must be a number$"):
        ExperimentConfig.from_flat({"train.dynamic-sampling-max-factor": "x"})
    with pytest.raises(ConfigError, match="^train.dynamic-sampling = 'yes': must be true or false$"):
        ExperimentConfig.from_flat({"train.dynamic-sampling": "yes"})
    big = {"train.prompts-per-step": 512, "train.completions-per-prompt": 64, "train.dynamic-sampling-max-factor": 3}
    assert ExperimentConfig.from_flat(big)  # off: the cap is not used
    with pytest.raises(ConfigError, match=r"^train.dynamic-sampling-max-factor = 3: up to 1536 prompts x "
                                          r"train.completions-per-prompt = 64 is more than 65536 completions"):
        ExperimentConfig.from_flat({**big, "train.dynamic-sampling": True})


def test_the_counts_travel_in_a_reply_checked_and_give_the_clients_row():
    counts = SamplingCounts(wanted=8, sampled=13, trained=6, skipped=1)
    assert SamplingCounts.from_metrics(counts.to_metrics()) == counts
    assert counts.row() == {"dynamic_groups_sampled": 13, "dynamic_groups_trained": 6, "dynamic_filled_share": 0.75,
                            "dynamic_sampling_factor": 1.625, "dynamic_steps_skipped": 1}
    assert SamplingCounts().to_metrics() == {} and SamplingCounts().row() == {}  # off: nothing on the wire
    assert counts + counts == SamplingCounts(16, 26, 12, 2)
    with pytest.raises(Rejected, match="dynamic-groups-trained exceeds dynamic-groups-wanted"):
        SamplingCounts.from_metrics({**counts.to_metrics(), "dynamic-groups-trained": 9})
    with pytest.raises(Rejected, match="dynamic-groups-trained exceeds dynamic-groups-sampled"):
        SamplingCounts.from_metrics({**counts.to_metrics(), "dynamic-groups-sampled": 5})
    with pytest.raises(Rejected, match="dynamic-groups-sampled"):
        SamplingCounts.from_metrics({**counts.to_metrics(), "dynamic-groups-sampled": -1})


# -- train.skip-equal-prompts --------------------------------------------------------------------------------------
def _group(task: str, rewards: list[float]) -> RolloutGroup:
    return RolloutGroup("p", [Completion(str(r)) for r in rewards], rewards, task=task)


def test_equal_streaks_count_each_tasks_latest_groups_whose_rewards_agree():
    streaks = equal_streaks({"gcd": 1}, [_group("gcd", FLAT), _group("lcm", FLAT), _group("gcd", FLAT),
                                         _group("lcm", MIXED), _group("sum", [0.0, 0.0, 0.0, 0.0])])
    assert streaks == {"gcd": 3, "lcm": 0, "sum": 1}
    assert equal_streaks(streaks, [_group("gcd", MIXED)])["gcd"] == 0


def test_prompts_of_tasks_whose_recent_groups_agreed_are_skipped_with_the_probability():
    streaks = {"gcd": RECENT_EQUAL, "lcm": RECENT_EQUAL - 1}
    rng = random.Random(0)
    assert all(skips("gcd", streaks, 1.0, rng) for _ in range(50))
    assert not any(skips(task, streaks, p, rng) for task in ("lcm", "sum") for p in (0.5, 1.0) for _ in range(50))
    assert not any(skips("gcd", streaks, 0.0, rng) for _ in range(50))
    rng_a, rng_b = random.Random(7), random.Random(7)  # the learner seeds it from the run seed, node and call
    draws = [skips("gcd", streaks, 0.3, rng_a) for _ in range(2000)]
    assert draws == [skips("gcd", streaks, 0.3, rng_b) for _ in range(2000)]
    assert 0.27 < sum(draws) / 2000 < 0.33


def test_the_streaks_are_node_state_that_a_restart_reads_back_and_checks():
    state = NodeState(model_name="m", equal_streaks={"gcd": 3, "lcm": 0})
    assert NodeState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert NodeState.from_dict({"model_name": "m"}).equal_streaks == {}  # a node.json from before the key
    with pytest.raises(ValueError, match=r"equal_streaks"):
        NodeState.from_dict({"model_name": "m", "equal_streaks": {"gcd": -1}})


def test_skip_equal_prompts_is_a_probability_or_a_config_error_naming_the_key():
    assert ExperimentConfig().train.skip_equal_prompts == 0.0
    assert ExperimentConfig.from_flat({"train.skip-equal-prompts": 0.5}).train.skip_equal_prompts == 0.5
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match=rf"^train.skip-equal-prompts = {bad}: must be >= 0 and <= 1$"):
            ExperimentConfig.from_flat({"train.skip-equal-prompts": bad})
    counts = SamplingCounts(prompts_skipped=3)
    assert counts.to_metrics() == {"prompts-skipped": 3} and counts.row() == {"prompts_skipped": 3}
    assert SamplingCounts.from_metrics(counts.to_metrics()) == counts


@pytest.mark.parametrize("key, value", [("train.dynamic-sampling", True), ("train.skip-equal-prompts", 0.5)])
def test_sapo_which_has_no_private_steps_refuses_the_sampling_keys_naming_them(key, value):
    """SAPO's nodes sample their own groups in its rollout phase, not in private steps: the keys would do nothing."""
    with pytest.raises(ConfigError, match=rf"^{key} = {value}: a node's private steps only; strategy.mode = 'sapo' "
                                          r"has none"):
        ExperimentConfig.from_flat({"strategy.mode": "sapo", key: value})
    for mode in ("fedavg", "fedprox", "pubswap", "local"):
        assert ExperimentConfig.from_flat({"strategy.mode": mode, key: value})
