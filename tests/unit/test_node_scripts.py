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


def _swarm_run(root, arm: str, seed: int, receiver_counts: dict[str, list[int]], donor: str = "donor") -> None:
    """A finished 3-node run: node d runs the donor, w1 and w2 the warm model; 4 held-out items x 4 samples; the
    receivers solve nothing at round 0 and `receiver_counts` (samples right per item) at round 1."""
    run = root / f"{arm}-s{seed}"
    run.mkdir()
    uids, tasks = ["u0", "u1", "u2", "u3"], ["chain"] * 4
    clients = {"d": {"model": donor, "node_index": 0}, "w1": {"model": "warm", "node_index": 1},
               "w2": {"model": "warm", "node_index": 2}}
    evaluation = {"sampled_accuracy": 0.1, "greedy_accuracy": 0.1}
    rows = [{"round": 0, "eval": evaluation, "node_eval": {n: evaluation for n in clients}},
            {"round": 1, "eval": evaluation, "node_eval": {n: evaluation for n in clients}, "clients": clients}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "status.json").write_text(json.dumps({"status": "completed"}))

    def record(counts: list[int]) -> dict:
        return {"uids": uids, "tasks": tasks, "samples": 4, "greedy": [min(c, 1) for c in counts], "sampled": counts}

    items = [{"round": 0, "d": record([2, 2, 2, 2]), "w1": record([0] * 4), "w2": record([0] * 4)},
             {"round": 1, "d": record([4, 4, 4, 4]), **{n: record(c) for n, c in receiver_counts.items()}}]
    (run / "eval_items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))


def test_model_groups_resolve_by_item_over_the_model_s_nodes_only(tmp_path, capsys):
    """The receivers' per-item values are the mean over the warm nodes, not over every node; their gain and their
    difference from the baseline come over seeds x items."""
    script = _script("node_groups")
    for seed in (0, 1, 2):
        _swarm_run(tmp_path, "sapo-4-4", seed, {"w1": [1, 0, 2, 0], "w2": [1, 2, 0, seed]})
        _swarm_run(tmp_path, "sapo-8-0", seed, {"w1": [0] * 4, "w2": [0] * 4})
    runs = [script.summarize_run(d) for d in script.completed_runs(tmp_path)[0]]
    seen = script.model_runs(next(r for r in runs if r.arm == "sapo-4-4" and r.seed == 2))
    assert sorted(seen) == ["donor", "warm"]
    assert seen["warm"].items[1]["sampled_accuracy"] == {"u0": 0.25, "u1": 0.25, "u2": 0.25, "u3": 0.25}
    assert seen["warm"].items[0]["sampled_accuracy"] == dict.fromkeys(["u0", "u1", "u2", "u3"], 0.0)
    assert seen["donor"].items[1]["sampled_accuracy"] == dict.fromkeys(["u0", "u1", "u2", "u3"], 1.0)
    script.print_item_intervals(runs, "sapo-8-0")
    lines = capsys.readouterr().out.splitlines()
    # seeds 0, 1, 2: the warm nodes' mean per item at round 1 is 0.75/4, 0.875/4 and 1/4 of an item: +0.1875, +0.2188
    # and +0.25; their mean +0.219 is both the gain since round 0 and the difference from sapo-8-0 (which gains 0)
    (warm,) = [line for line in lines if line.startswith("| warm | sapo-4-4") and "sampled_accuracy" in line]
    gain, paired = warm.split(" | ")[3:5]
    assert float(gain.split(" [")[0]) == float(paired.split(" [")[0]) == pytest.approx(0.21875, abs=5e-4)
    (base,) = [line for line in lines if line.startswith("| warm | sapo-8-0") and "sampled_accuracy" in line]
    assert base.split(" | ")[3] == "0.000 [0.000, 0.000]" and base.rstrip().endswith("|  |")
    (donor,) = [line for line in lines if line.startswith("| donor | sapo-4-4") and "sampled_accuracy" in line]
    assert float(donor.split(" | ")[3].split(" [")[0]) == pytest.approx(0.5)


def test_swap_groups_counts_each_client_s_mixed_public_groups_before_and_after_the_swap(tmp_path, capsys):
    step = {"prompts": ["p0", "p1"], "responses_swapped": {"a": 0, "b": 3},
            "mixed_groups_before_swap": {"a": 1, "b": 0}, "mixed_groups_after_swap": {"a": 1, "b": 2}}
    rows = [{"round": 0},
            {"round": 1, "clients": {"b": {"node_index": 1, "model": "warm"}, "a": {"node_index": 0, "model": "donor"}},
             "public_steps": [step, step],
             "swap": {"mixed_groups_before_swap": {"a": 2, "b": 0}, "mixed_groups_after_swap": {"a": 2, "b": 4}}}]
    script = _script("swap_groups")
    entries = script.swap_rows(rows)
    assert [(e["client"], e["model"]) for e in entries] == [(0, "donor"), (1, "warm")]
    assert entries[1] == {"round": 1, "client": 1, "model": "warm", "public groups": 4, "mixed before": 0,
                          "mixed after": 4, "swapped in": 6}
    run = tmp_path / "pubswap-balanced-s0"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "status.json").write_text(json.dumps({"status": "completed"}))
    assert script.main([str(tmp_path)]) == 0
    assert "| pubswap-balanced | 1 | warm | 4 | 0 | 4 | 6 |" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert script.main([str(tmp_path / "empty")]) == 2
    assert "no completed PubSwap run with mixed-group counts" in capsys.readouterr().err


def test_a_model_that_only_some_arms_run_is_left_out_of_the_pairing(tmp_path, monkeypatch, capsys):
    """Arms whose donors run different models (transfer-sapo-format): the receivers pair, the donors do not."""
    import sys

    script = _script("node_groups")
    for seed in (0, 1):
        _swarm_run(tmp_path, "sapo-4-4-half", seed, {"w1": [1, 1, 0, 0], "w2": [0] * 4}, donor="half")
        _swarm_run(tmp_path, "sapo-4-4-warm", seed, {"w1": [0] * 4, "w2": [0] * 4}, donor="warm-donor")
    monkeypatch.setattr(sys, "argv", ["node_groups.py", str(tmp_path), "--baseline", "sapo-4-4-warm"])
    script.main()
    out = capsys.readouterr().out
    (header,) = [line for line in out.splitlines() if line.startswith("| arm − sapo-4-4-warm |")]
    assert header == "| arm − sapo-4-4-warm | warm greedy_accuracy | warm sampled_accuracy |"
    (pair,) = [line for line in out.splitlines() if line.startswith("| sapo-4-4-half (seeds 0, 1) |")]
    assert pair.count(" | ") == 2  # the arm and the receivers' two metrics (node_eval: 0.1 in every run here)
    (items,) = [line for line in out.splitlines() if line.startswith("| warm | sapo-4-4-half")
                and "sampled_accuracy" in line]
    assert float(items.split(" | ")[4].split(" [")[0]) == pytest.approx(1 / 16, abs=1e-3)  # (1/4 + 1/4) / 2 / 4
