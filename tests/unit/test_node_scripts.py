"""scripts/node_groups.py (own tasks against peers' tasks) and scripts/node_health.py (collapsed nodes) on
hand-made metrics rows."""

from __future__ import annotations

import json

import pytest

from tests.scripts import load_script


def _script(name: str):
    return load_script(f"scripts/{name}.py")


def _eval(sampled: float, per_task: dict[str, float]) -> dict:
    return {"sampled_accuracy": sampled, "greedy_accuracy": sampled,
            "per_task": {t: {"sampled_accuracy": v, "greedy_accuracy": v} for t, v in per_task.items()}}


ROWS = [
    {"round": 0, "node_eval": {"a": _eval(0.3, {"gcd": 0.4, "bits": 0.2}), "b": _eval(0.3, {"gcd": 0.4, "bits": 0.2})}},
    {"round": 1, "clients": {"a": {"node_index": 0, "tasks": ["gcd"], "well_formed": 1.0, "rollout_reward": 0.5},
                             "b": {"node_index": 1, "tasks": ["bits"], "well_formed": 0.4, "rollout_reward": 0.3}}},
    {"round": 2, "node_eval": {"a": _eval(0.35, {"gcd": 0.6, "bits": 0.1}),
                               "b": _eval(0.02, {"gcd": 0.0, "bits": 0.04})},
     "clients": {"a": {"node_index": 0, "tasks": ["gcd"], "well_formed": 0.9, "rollout_reward": 0.6},
                 "b": {"node_index": 1, "tasks": ["bits"], "well_formed": 0.1, "rollout_reward": 0.2}}},
]


def test_own_task_groups_average_each_nodes_own_and_other_tasks_at_the_last_evaluation():
    groups = _script("node_groups").own_task_groups(ROWS)
    # node a: own gcd 0.6, other bits 0.1; node b: own bits 0.04, other gcd 0.0
    assert groups["own tasks"]["sampled_accuracy"] == pytest.approx((0.6 + 0.04) / 2)
    assert groups["other tasks"]["sampled_accuracy"] == pytest.approx((0.1 + 0.0) / 2)


def test_node_health_flags_the_node_whose_accuracy_fell_below_the_threshold():
    health = _script("node_health")
    nodes = health.node_rows(ROWS)
    assert nodes[1]["well_formed"] == [(1, 0.4), (2, 0.1)]
    assert nodes[0]["reward"][-1] == (2, 0.6)
    assert health.collapse_round(nodes[1]["eval"], 0.05) == 2
    assert health.collapse_round(nodes[0]["eval"], 0.05) is None
    assert health.collapse_round([(0, 0.01, 0.0), (10, 0.0, 0.0)], 0.05) is None  # never above: not a collapse


def test_mechanism_sums_each_models_external_groups_and_takes_its_first_and_last_well_formed_share():
    def client(model: str, used: int, well_formed: float) -> dict:
        return {"model": model, "well_formed": well_formed, "external_received": 12, "external_used": used,
                "external_zero_advantage": 12 - used, "external_shortfall": 4 - used}

    rows = [{"round": 0, "node_eval": {}},
            {"round": 1, "clients": {"a": client("warm", 1, 0.9), "b": client("raw", 2, 0.0),
                                     "c": client("raw", 0, 0.1)}},
            {"round": 2, "clients": {"a": client("warm", 3, 1.0), "b": client("raw", 4, 0.2),
                                     "c": client("raw", 1, 0.4)}}]
    out = _script("node_groups").mechanism(rows)
    assert out["raw"]["external_used"] == 7 and out["raw"]["external_shortfall"] == 16 - 7
    assert out["raw"]["external_received"] == 48 and out["raw"]["external_zero_advantage"] == 48 - 7
    assert out["raw"]["well_formed first"] == pytest.approx(0.05)
    assert out["raw"]["well_formed last"] == pytest.approx(0.3)
    assert out["warm"]["external_used"] == 4 and out["warm"]["well_formed last"] == 1.0


def test_only_completed_runs_are_grouped(tmp_path):
    for name, status in (("sapo-8-0-s0", "completed"), ("sapo-8-0-s1", "running"), ("sapo-4-4-s0", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text('{"round": 0}\n')
        if status:
            (tmp_path / name / "status.json").write_text(json.dumps({"status": status}))
    (tmp_path / "notes").mkdir()  # no metrics: not a run
    done, left_out = _script("node_groups").completed_runs(tmp_path)
    assert [p.name for p in done] == ["sapo-8-0-s0"]
    assert left_out == ["left out sapo-4-4-s0: no status", "left out sapo-8-0-s1: running"]
