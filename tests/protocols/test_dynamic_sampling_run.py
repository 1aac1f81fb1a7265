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
