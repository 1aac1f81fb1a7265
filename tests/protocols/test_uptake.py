"""pubswap.measure-uptake (#35 item 3): on each public step the receiver's mean per-token log-prob of the donors'
responses and of its own kept ones, before and after its update, summed over a round into the clients' rows."""

from __future__ import annotations

import pytest

from pubswap_flwr.protocols.pubswap import uptake
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from pubswap_flwr.wire.counters import UptakeCounts


def test_uptake_splits_donors_responses_from_the_nodes_own():
    groups = [RolloutGroup("p", [Completion("a", (1, 2)), Completion("b", source="peer-3"),
                                 Completion("c", source="peer-4")], [1.0, 0.0, 1.0])]
    counts = uptake(groups, [[-2.0, -3.0, -5.0]], [[-1.5, -2.0, -4.0]])
    assert counts == UptakeCounts(foreign=2, foreign_before=-8.0, foreign_after=-6.0, own=1, own_before=-2.0,
                                  own_after=-1.5)
    assert counts.row() == {"uptake_foreign_before": -4.0, "uptake_foreign_after": -3.0,
                            "uptake_foreign_completions": 2, "uptake_own_before": -2.0, "uptake_own_after": -1.5,
                            "uptake_own_completions": 1}


def test_uptake_travels_in_a_reply_and_is_checked():
    counts = UptakeCounts(2, -8.0, -6.0, 1, -2.0, -1.5)
    assert UptakeCounts.from_metrics(counts.to_metrics()) == counts
    assert UptakeCounts().to_metrics() == {}  # off: nothing on the wire
    from pubswap_flwr.wire.validate import Rejected

    with pytest.raises(Rejected):
        UptakeCounts.from_metrics({**counts.to_metrics(), "uptake-own-after": 3.0})  # a log-prob above 0


def test_a_random_swap_round_reports_the_uptake_of_donors_and_own_responses(tmp_path):
    simulate_in_process({"seed": 2, "num-server-rounds": 1, "train.local-steps": 2, "train.prompts-per-step": 2,
                         "train.completions-per-prompt": 4, "eval.items-per-task": 2, "model.threads": 1,
                         "strategy.mode": "pubswap", "pubswap.swap": "random", "pubswap.tau-swap": 1,
                         "pubswap.public-prompts": 2, "pubswap.measure-uptake": True,
                         "output.dir": str(tmp_path), "run-name": "u"}, 2)
    row = read_metrics(tmp_path / "u")[-1]
    for client in row["clients"].values():
        assert client["uptake_foreign_completions"] > 0 and client["uptake_own_completions"] > 0
        assert client["uptake_foreign_completions"] + client["uptake_own_completions"] == 2 * 2 * 4  # steps x sets
        assert all(client[f"uptake_{k}_{w}"] < 0 for k in ("foreign", "own") for w in ("before", "after"))


def test_uptake_is_off_by_default(tmp_path):
    simulate_in_process({"seed": 2, "num-server-rounds": 1, "train.local-steps": 1, "train.prompts-per-step": 2,
                         "train.completions-per-prompt": 4, "eval.items-per-task": 2, "model.threads": 1,
                         "strategy.mode": "pubswap", "pubswap.tau-swap": 1, "pubswap.public-prompts": 2,
                         "output.dir": str(tmp_path), "run-name": "d"}, 2)
    row = read_metrics(tmp_path / "d")[-1]
    assert not any(key.startswith("uptake_") for client in row["clients"].values() for key in client)


def test_measuring_uptake_changes_nothing_that_is_trained(tmp_path):
    """The measurement is two extra forward passes and nothing else: with it on, a Balanced run trains, scores and
    evaluates exactly as with it off (so the uptake run's numbers are the arm's own)."""
    config = {"seed": 3, "num-server-rounds": 2, "train.local-steps": 2, "train.prompts-per-step": 2,
              "train.completions-per-prompt": 4, "eval.items-per-task": 3, "model.threads": 1,
              "strategy.mode": "pubswap", "pubswap.swap": "balanced", "pubswap.tau-swap": 1,
              "pubswap.public-prompts": 2, "output.dir": str(tmp_path),
              "strategy.apply-below-robust": True}  # 2 nodes: below the robust minimum (#54 class 4)
    simulate_in_process({**config, "run-name": "off"}, 2)
    simulate_in_process({**config, "run-name": "on", "pubswap.measure-uptake": True}, 2)

    def trained(run: str) -> list:
        rows = read_metrics(tmp_path / run)
        return [(r.get("eval"), r.get("cumulative_reward"),
                 sorted((c["node_index"], c.get("train_reward"), c.get("total_steps")) for c in
                        (r.get("clients") or {}).values())) for r in rows]

    on = read_metrics(tmp_path / "on")
    assert any(c.get("uptake_own_completions") for r in on for c in (r.get("clients") or {}).values())
    assert trained("on") == trained("off")
    final = "adapters/final/adapter_model.safetensors"
    assert (tmp_path / "on" / final).read_bytes() == (tmp_path / "off" / final).read_bytes()
