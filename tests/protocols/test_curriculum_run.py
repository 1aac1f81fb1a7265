"""tasks.curriculum in a run served in process: each node's levels are recorded per round in its client row, moved
by the frontier rule between rounds (here a band no node reaches, so every full window lowers a level)."""

from __future__ import annotations

import pytest

from pubswap_flwr.metrics_schema import CURRICULUM_LEVELS
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process

TINY = {"seed": 5, "strategy.mode": "fedavg", "num-server-rounds": 3, "train.local-steps": 2,
        "train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 3, "eval.samples": 1,
        "eval.sampled": False, "eval.every": 0, "tasks.mix": "gcd:1,spell_backward:1", "tasks.per-node": 1,
        "tasks.curriculum": True, "tasks.curriculum-start": 2, "tasks.curriculum-window": 4,
        "tasks.curriculum-low": 0.99, "tasks.curriculum-high": 1.0}


def test_each_nodes_levels_are_recorded_per_round_and_follow_the_rule(tmp_path):
    simulate_in_process({**TINY, "output.dir": str(tmp_path), "run-name": "cur"}, 2)
    rows = read_metrics(tmp_path / "cur")
    levels = {row["round"]: {client["node_index"]: client[CURRICULUM_LEVELS] for client in row["clients"].values()}
              for row in rows[1:]}
    # 4 groups a round fill the window; success below 0.99 lowers the level at the next round's start
    assert levels == {1: {0: {"gcd": 2}, 1: {"spell_backward": 2}},
                      2: {0: {"gcd": 1}, 1: {"spell_backward": 1}},
                      3: {0: {"gcd": 0}, 1: {"spell_backward": 0}}}


def test_without_the_controller_no_levels_are_recorded(tmp_path):
    simulate_in_process({**TINY, "tasks.curriculum": False, "num-server-rounds": 1, "output.dir": str(tmp_path),
                         "run-name": "off"}, 2)
    rows = read_metrics(tmp_path / "off")
    assert all(CURRICULUM_LEVELS not in client for row in rows[1:] for client in row["clients"].values())


def test_the_harder_tier_is_recorded_beside_the_held_out_figures_with_its_items(tmp_path):
    from pubswap_flwr.metrics_schema import HARDER_TIER
    from pubswap_flwr.report import summarize_run
    from pubswap_flwr.server.metrics import read_eval_items

    simulate_in_process({**TINY, "num-server-rounds": 1, "eval.harder-tier": True, "tasks.curriculum-start": 0,
                         "output.dir": str(tmp_path), "run-name": "harder"}, 2)
    rows = read_metrics(tmp_path / "harder")
    for row in rows:  # round 0 and the last round
        harder = row["eval"][HARDER_TIER]
        assert sorted(harder["per_task"]) == ["gcd", "spell_backward"] == sorted(row["eval"]["per_task"])
        assert 0 <= harder["greedy_accuracy"] <= 1 and "item_results" not in harder
    items = read_eval_items(tmp_path / "harder")
    assert [row["round"] for row in items] == [0, 1]
    for row, metrics in zip(items, rows):
        held, tier = row["global"], row["harder_tier"]
        assert len(tier["uids"]) == 6 and not set(tier["uids"]) & set(held["uids"])  # 3 per task, disjoint items
        assert sum(tier["greedy"]) / 6 == pytest.approx(metrics["eval"][HARDER_TIER]["greedy_accuracy"])
    run = summarize_run(tmp_path / "harder")
    assert set(run.harder_items) == {0, 1} and set(run.harder_items[1]["greedy_accuracy"]) == set(tier["uids"])
    assert set(run.items[1]["greedy_accuracy"]) == set(held["uids"])  # the held-out tier's stay its own


class ServerDied(BaseException):
    """Stands for the server process being killed: not an Exception, so nothing on the way catches it."""


def _die_in_round_three(msg, context, call):
    reply = call(msg, context)  # the node has done (and saved) its part of round 3 ...
    if int(msg.content["config"]["server-round"]) == 3 and int(context.node_config["partition-id"]) == 1:
        raise ServerDied()  # ... when the server dies
    return reply


def test_a_resumed_run_with_every_node_state_of_53_repeats_the_uninterrupted_metrics(tmp_path):
    """The curriculum levels and windows, the skip-before-rollout streaks and dynamic sampling's draws all live in a
    node's state: a run whose server died in round 3 and resumed from its round-2 checkpoint (the nodes restoring
    their round-start state) repeats the uninterrupted run's rows, levels included."""
    import json

    from tests.golden.runs import comparable

    config = {**TINY, "train.dynamic-sampling": True, "train.skip-equal-prompts": 0.5,
              "strategy.apply-below-robust": True, "output.dir": str(tmp_path)}
    simulate_in_process({**config, "run-name": "full"}, 2)
    with pytest.raises(ServerDied):
        simulate_in_process({**config, "run-name": "cut"}, 2, deliver=_die_in_round_three)
    assert json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())["round"] == 2
    simulate_in_process({**config, "run-name": "cut", "resume": True}, 2)
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["round"] for r in cut] == [0, 1, 2, 3]
    assert comparable(full) == comparable(cut)
    assert [c[CURRICULUM_LEVELS] for c in cut[3]["clients"].values()] == [{"gcd": 0}, {"spell_backward": 0}]
