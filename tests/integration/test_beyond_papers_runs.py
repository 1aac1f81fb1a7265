"""#16's extensions in whole (small, in-process) runs: every signal they act on is in metrics.jsonl."""

from __future__ import annotations

import pytest

from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from tests.golden.runs import COMMON, PUBSWAP, SAPO


# one 3-node run with 4 public steps a round (13 s); each extension alone: tests/protocols/test_beyond_papers.py
@pytest.mark.slow
def test_pubswap_with_every_extension_logs_its_schedule_candidates_and_foreign_weights(tmp_path):
    config = {**COMMON, **PUBSWAP, "train.local-steps": 4, "num-server-rounds": 2, "train.foreign-correction": "is",
              "pubswap.donor": "likely", "pubswap.schedule": "adaptive", "pubswap.max-public-steps": 4,
              "pubswap.disagreement-low": 0.1, "pubswap.disagreement-high": 0.9}
    simulate_in_process({**config, "output.dir": str(tmp_path), "run-name": "x"}, 3)
    rows = [r for r in read_metrics(tmp_path / "x") if r.get("round", 0) >= 1]
    assert [r["schedule"]["signal"] for r in rows][0] is None  # round 1: no signal yet, tau / tau-swap steps
    assert rows[0]["schedule"]["public_steps"] == 4
    signal = rows[0]["swap"]["policy_disagreement"]
    assert rows[1]["schedule"]["signal"] == signal
    assert rows[1]["schedule"]["public_steps"] == 1 + round(min(max((signal - 0.1) / 0.8, 0), 1) * 3)
    assert len(rows[1]["public_steps"]) == rows[1]["schedule"]["public_steps"]
    assert all("mean_donor_candidates" in step for r in rows for step in r["public_steps"])
    clients = [c for r in rows for c in r["clients"].values()]
    weighted = [c for c in clients if "foreign_weight_mean" in c]
    assert weighted, "some client trained on donated text"
    assert all(0 < c["foreign_weight_mean"] <= 2.0 and c["foreign_fallbacks"] == 0 for c in weighted)


def test_sapo_is_falls_back_to_the_weight_between_nodes_with_different_tokenizers(tmp_path):
    config = {**COMMON, **SAPO, "num-server-rounds": 1, "train.foreign-correction": "is",
              "train.foreign-weight": 0.5, "model.node-models": "embedded:tiny,embedded:tiny-b"}
    simulate_in_process({**config, "output.dir": str(tmp_path), "run-name": "x"}, 4)
    clients = [c for r in read_metrics(tmp_path / "x") for c in r.get("clients", {}).values()
               if c.get("external_used")]
    assert clients
    for c in clients:
        assert c["foreign_fallbacks"] > 0  # every node has a peer with the other tokenizer
        assert 0 < c["foreign_weight_mean"] <= 2.0
