"""train.dynamic-sampling in a served run (#53 item 3): each client's row records the groups its private steps
sampled and trained, the filled share and the extra sampling factor; off (the golden runs), nothing is recorded."""

from __future__ import annotations

import json

from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from tests.golden.runs import GOLDEN_DIR

FIELDS = {"dynamic_groups_sampled", "dynamic_groups_trained", "dynamic_filled_share", "dynamic_sampling_factor",
          "dynamic_steps_skipped"}


def test_a_dynamic_sampling_run_records_what_each_client_sampled_and_trained(tmp_path):
    steps, prompts, k = 2, 2, 4
    simulate_in_process({"seed": 3, "num-server-rounds": 2, "train.local-steps": steps,
                         "train.prompts-per-step": prompts, "train.completions-per-prompt": k,
                         "train.dynamic-sampling": True, "train.dynamic-sampling-max-factor": 2.0,
                         "tasks.partial-credit": True, "strategy.aggregation": "mean", "eval.items-per-task": 2,
                         "eval.samples": 1, "model.threads": 1, "output.dir": str(tmp_path), "run-name": "d"}, 2)
    rows = read_metrics(tmp_path / "d")[1:]
    assert [r["round"] for r in rows] == [1, 2]
    wanted = steps * prompts
    seen = []
    for row in rows:
        for client in row["clients"].values():
            assert FIELDS <= set(client)
            sampled, trained = client["dynamic_groups_sampled"], client["dynamic_groups_trained"]
            assert wanted <= sampled <= steps * 2 * prompts  # the usual prompts at least, the cap at most
            assert trained <= wanted
            assert client["dynamic_filled_share"] == trained / wanted
            assert client["dynamic_sampling_factor"] == sampled / wanted
            assert client["num_examples"] == trained * k  # only the groups whose rewards differ are trained
            assert 0 <= client["dynamic_steps_skipped"] <= steps
            seen.append((sampled, trained, client["dynamic_steps_skipped"]))
    assert any(sampled > wanted for sampled, _, _ in seen)  # some step sampled beyond its prompts


def test_off_by_default_no_run_records_dynamic_sampling():
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        rows = json.loads(path.read_text())
        assert not any(key in FIELDS for row in rows for client in row.get("clients", {}).values()
                       for key in client), path.name


def test_a_client_whose_steps_were_all_skipped_is_left_out_of_the_aggregate_not_dropped(tmp_path):
    """Seed 0: node 0's one step finds no group whose rewards differ and is skipped, so it trained on nothing. That is
    no bad reply: it stays in the row (its dynamic sampling recorded), the row names it in `untrained_clients`, and
    the aggregate is the other client's adapter."""
    simulate_in_process({"seed": 0, "num-server-rounds": 1, "train.local-steps": 1, "train.prompts-per-step": 2,
                         "train.completions-per-prompt": 4, "train.dynamic-sampling": True,
                         "strategy.aggregation": "mean", "strategy.min-clients": 1, "eval.items-per-task": 2,
                         "eval.samples": 1, "model.threads": 1, "output.dir": str(tmp_path), "run-name": "s"}, 2)
    row = read_metrics(tmp_path / "s")[-1]
    assert row["dropped"] == {}
    assert sorted(c["node_index"] for c in row["clients"].values()) == [0, 1]
    (idle_node, idle), = [(n, c) for n, c in row["clients"].items() if c["dynamic_steps_skipped"]]
    (trained_node, _), = [(n, c) for n, c in row["clients"].items() if n != idle_node]
    assert idle["node_index"] == 0 and idle["dynamic_steps_skipped"] == 1 and idle["dynamic_groups_trained"] == 0
    assert idle["dynamic_groups_sampled"] == 4 and idle["num_examples"] == 0  # the cap: 2 x 2 prompts
    assert [str(n) for n in row["untrained_clients"]] == [idle_node]
    assert row["aggregated"] is True and [str(n) for n in row["aggregated_clients"]] == [trained_node]


def test_skipping_equal_prompts_records_the_prompts_skipped_and_keeps_each_steps_prompts(tmp_path):
    """train.skip-equal-prompts = 1 (seed 3): once a task's last 2 groups at a node agreed, its prompts are skipped
    unsampled while the stream has others within 4 x prompts-per-step; every step still trains on its 2 prompts."""
    simulate_in_process({"seed": 3, "num-server-rounds": 2, "train.local-steps": 3, "train.prompts-per-step": 2,
                         "train.completions-per-prompt": 4, "train.skip-equal-prompts": 1.0,
                         "strategy.aggregation": "mean", "eval.items-per-task": 2, "eval.samples": 1,
                         "model.threads": 1, "output.dir": str(tmp_path), "run-name": "k"}, 2)
    rows = read_metrics(tmp_path / "k")[1:]
    clients = [c for row in rows for c in row["clients"].values()]
    assert all(c["num_examples"] == 3 * 2 * 4 for c in clients)
    assert sorted(c.get("prompts_skipped", 0) for c in clients) == [0, 0, 1, 17]
    assert not any(key in FIELDS for c in clients for key in c)  # dynamic sampling stays off
