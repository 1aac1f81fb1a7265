"""The modes end to end: through Flower's Ray engine (`run_simulation`) a client failing mid-round, a heterogeneous
SAPO swarm and the golden runs repeated; without Ray (the same ServerApp and ClientApp, nodes one after another),
PubSwap with both swap rules and asynchronous SAPO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate, simulate_in_process
from tests.golden.runs import RUNS, comparable, golden_differences

pytestmark = pytest.mark.slow

TINY = {"train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 8, "seed": 1}


def _fail_partition_one_in_round_two(msg, context):
    if int(context.node_config["partition-id"]) == 1 and int(msg.content["config"]["server-round"]) == 2:
        raise RuntimeError("injected failure in round 2")


def test_a_client_raising_mid_round_is_dropped_and_the_round_completes(tmp_path):
    simulate({**TINY, "num-server-rounds": 3, "train.local-steps": 1, "output.dir": str(tmp_path),
              "run-name": "dropout", "strategy.apply-below-robust": True},  # round 2's 2 replies applied (#54)
             3, client_hook=_fail_partition_one_in_round_two)
    rows = read_metrics(tmp_path / "dropout")
    assert [len(r.get("clients", {})) for r in rows] == [0, 3, 2, 3]
    dropped = rows[2]["dropped"]
    assert len(dropped) == 1 and "injected failure in round 2" in next(iter(dropped.values()))
    assert rows[2]["aggregated"] is True and len(rows[2]["aggregated_clients"]) == 2
    assert {c["node_index"] for c in rows[2]["clients"].values()} == {0, 2}


@pytest.mark.parametrize("rule", ["balanced", "random"])
def test_pubswap_swaps_public_responses_and_records_them(tmp_path, rule):
    simulate_in_process({**TINY, "strategy.mode": "pubswap", "pubswap.swap": rule, "num-server-rounds": 2,
              "train.local-steps": 4, "pubswap.tau-swap": 2, "pubswap.public-prompts": 4,
              "pubswap.public-mix": "gcd:1,count_bits:1", "output.dir": str(tmp_path), "run-name": rule}, 3)
    rows = read_metrics(tmp_path / rule)
    assert [r["round"] for r in rows] == [0, 1, 2]
    steps = [s for r in rows[1:] for s in r["public_steps"]]
    assert len(steps) == 4  # tau = 4, tau_swap = 2: public steps 2 and 4, private steps 1 and 3
    # The private steps of both segments count in each client's train reward (and so in the cumulative reward).
    for r in rows[1:]:
        assert all(c["train_reward"] is not None for c in r["clients"].values())
        assert r["train_reward"] == pytest.approx(sum(c["train_reward"] for c in r["clients"].values()) / 3)
    assert rows[2]["cumulative_reward"] == pytest.approx(rows[1]["train_reward"] + rows[2]["train_reward"])
    assert all(s["clients"] == 3 and len(s["prompts"]) == 4 for s in steps)
    swapped = sum(sum(s["responses_swapped"].values()) for s in steps)
    assert swapped > 0
    assert rows[2]["swap"]["responses_swapped"] == sum(sum(s["responses_swapped"].values())
                                                       for s in rows[2]["public_steps"])
    for s in steps:
        assert 0 <= s["swapped_pair_fraction"] <= 1 and 0 <= s["policy_disagreement"] <= 1
        assert set(s["public_reward_before_swap"]) == set(s["responses_swapped"])
    # Balanced replaces at most ceil(K/2) = 2 of a client's K = 4 responses per prompt; Random may replace all.
    cap = 2 if rule == "balanced" else 4
    assert all(count <= cap * 4 for s in steps for count in s["responses_swapped"].values())
    assert all(r["aggregated"] is True and r["parameter_drift"] > 0 for r in rows[1:])


@pytest.mark.xdist_group("simulation-sapo-two-models")  # shares ray_golden_run's sapo-two-models run
def test_sapo_heterogeneous_swarm_trains_on_external_groups_without_sharing_weights(ray_golden_run):
    """On the golden sapo-two-models run (4 nodes, two architectures, sapo.share = 3), through Flower's Ray engine."""
    config, nodes = RUNS["sapo-two-models"]
    run_dir = ray_golden_run("sapo-two-models")
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert len(rows[0]["node_eval"]) == nodes == 4  # each node's own starting point
    used: dict[int, int] = {}
    models = {}
    for r in rows[1:]:
        assert len(r["clients"]) == nodes and not r["dropped"]
        assert r["bytes"]["array_records"] == 0  # no weights crossed the network in this mode
        for c in r["clients"].values():
            used[c["node_index"]] = used.get(c["node_index"], 0) + c["external_used"]
            models[c["node_index"]] = c["model"]
            # every other node's shared groups, never its own
            assert c["external_received"] == (nodes - 1) * config["sapo.share"]
    assert set(models.values()) == {"embedded:tiny", "embedded:tiny-b"}
    assert all(count > 0 for count in used.values()), used
    assert rows[-1]["cumulative_reward"] > 0
    assert all((run_dir / "nodes" / f"partition-{i}" / "adapter" / "adapter_config.json").is_file()
               for i in range(nodes))


def test_sapo_async_trains_on_the_previous_rounds_pool(tmp_path):
    simulate_in_process({**TINY, "strategy.mode": "sapo", "sapo.async": True, "num-server-rounds": 3, "sapo.local": 2,
              "sapo.external": 2, "sapo.questions": 3, "sapo.completions": 4, "sapo.share": 3, "sapo.sharing": "fixed",
              "eval.every": 0, "output.dir": str(tmp_path), "run-name": "async"}, 3)
    rows = read_metrics(tmp_path / "async")
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    first = rows[1]["clients"].values()
    assert all(c["external_received"] == 0 and c["external_used"] == 0 for c in first)  # no pool yet
    later = [c for r in rows[2:] for c in r["clients"].values()]
    assert all(c["external_received"] == 2 * 3 for c in later)  # the other two nodes' packets of the round before
    assert sum(c["external_used"] for c in later) > 0
    assert all(r["bytes"]["array_records"] == 0 for r in rows[1:])


@pytest.fixture(scope="module")
def ray_golden_run(tmp_path_factory):
    """A golden run through Flower's Ray engine, run once per module whichever tests read it: name -> run dir."""
    import torch

    done: dict[str, Path] = {}

    def run(name: str) -> Path:
        if name not in done:
            config, nodes = RUNS[name]
            out = tmp_path_factory.mktemp(name)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                simulate({**config, "output.dir": str(out), "run-name": name}, nodes)
            finally:
                torch.set_num_threads(threads)
            done[name] = out / name
        return done[name]

    return run


@pytest.mark.parametrize("name", ["pubswap-balanced", pytest.param(
    "sapo-two-models", marks=pytest.mark.xdist_group("simulation-sapo-two-models"))])
def test_flowers_ray_engine_repeats_the_in_process_golden_metrics(ray_golden_run, name):
    """The fast tier runs protocols in process; Flower's Ray engine (clients in parallel, replies in any order,
    random node ids) must give exactly the same metrics."""
    rows = json.loads(json.dumps(comparable(read_metrics(ray_golden_run(name)))))
    assert golden_differences(name, rows) == []


def test_math_sample_preset_runs_on_the_sample_file(tmp_path):
    """configs/math-sample.toml: nodes train on data/samples/math.jsonl (MATH format, math verifier), held out on the
    DeepMath-shaped sample. In process: `flwr run` itself is covered by tests/integration/test_flower_app.py (a run
    through it cost 50 s and checked nothing more of the preset)."""
    from pubswap_flwr.config import load_toml

    from .flower_harness import PROJECT

    preset = load_toml(PROJECT / "configs" / "math-sample.toml")
    # the preset's data, format, template and tokens as shipped; a smaller run of them (one local step of 2 x 2
    # completions, 4 held-out items) reaches the same data path and verifier
    preset.update({"train.local-steps": 1, "train.prompts-per-step": 2, "train.completions-per-prompt": 2,
                   "eval.items-per-task": 4, "eval.sampled": False, "strategy.apply-below-robust": True,
                   "output.dir": str(tmp_path), "run-name": "math"})
    simulate_in_process(preset, 2)
    rows = read_metrics(tmp_path / "math")
    assert [r["round"] for r in rows] == [0, 1]
    assert set(rows[1]["eval"]["per_task"]) == {"deepmath"}
    assert all(c["tasks"] == ["math"] for c in rows[1]["clients"].values())
    assert rows[1]["aggregated"] is True
