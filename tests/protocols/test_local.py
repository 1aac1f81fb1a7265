"""The local mode, served in process: no adapter travels either way, each node's own adapter carries over from one
round to the next in its node state, a node's training does not depend on the other nodes, and the row's held-out
result is the mean of the nodes' own self-reported ones."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load_file

from pubswap_flwr.node_runtime.state import ADAPTER_FILE
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from pubswap_flwr.wire.codecs import ADAPTER_KEY

TINY = {"seed": 5, "strategy.mode": "local", "num-server-rounds": 2, "train.local-steps": 2,
        "train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 3, "eval.samples": 1,
        "eval.sampled": False}


def _adapter(run_dir, partition: int) -> dict[str, np.ndarray] | None:
    path = run_dir / "nodes" / f"partition-{partition}" / ADAPTER_FILE
    return load_file(str(path)) if path.is_file() else None


def test_no_adapter_travels_and_each_node_continues_from_its_own(tmp_path):
    run_dir = tmp_path / "local"
    seen = []  # (round, partition, adapter before the handler, adapter after, adapter in the message or reply)

    def deliver(msg, context, call):
        partition = int(context.node_config["partition-id"])
        before = _adapter(run_dir, partition)
        reply = call(msg, context)
        carried = ADAPTER_KEY in msg.content or (not reply.has_error() and ADAPTER_KEY in reply.content)
        seen.append((int(msg.content["config"]["server-round"]), partition, before, _adapter(run_dir, partition),
                     carried))
        return reply

    simulate_in_process({**TINY, "output.dir": str(tmp_path), "run-name": "local"}, 2, deliver=deliver)
    assert [(r, p) for r, p, *_ in seen] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert not any(carried for *_, carried in seen)
    by_round = {(r, p): (before, after) for r, p, before, after, _ in seen}
    for partition in (0, 1):
        assert by_round[1, partition][0] is None  # a fresh node: no state yet
        end_of_one, (start_of_two, end_of_two) = by_round[1, partition][1], by_round[2, partition]
        assert end_of_one.keys() == start_of_two.keys()
        assert all(np.array_equal(end_of_one[k], start_of_two[k]) for k in end_of_one)  # kept, not replaced
        assert any(not np.array_equal(start_of_two[k], end_of_two[k]) for k in end_of_one)  # and trained on
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(r["bytes"]["array_records"] == 0 for r in rows[1:])
    for row in rows:  # every round: both nodes' own results, and the row's eval their mean
        assert sorted(row["node_eval"]) == sorted(rows[1]["clients"])
        accuracies = [e["greedy_accuracy"] for e in row["node_eval"].values()]
        assert row["eval"]["greedy_accuracy"] == np.mean(accuracies)
    assert all(r["train_reward"] is not None and len(r["clients"]) == 2 for r in rows[1:])


def test_a_nodes_training_does_not_depend_on_the_other_nodes(tmp_path):
    """Nothing is shared: node 0 trains the same alone among 2 nodes as among 3."""
    node0 = {}
    for nodes in (2, 3):
        name = f"n{nodes}"
        simulate_in_process({**TINY, "eval.every": 0, "output.dir": str(tmp_path), "run-name": name}, nodes)
        rows = read_metrics(tmp_path / name)
        node0[nodes] = [next(c["train_reward"] for c in r["clients"].values() if c["node_index"] == 0)
                        for r in rows[1:]]
        node0[nodes].append({k: v.tolist() for k, v in _adapter(tmp_path / name, 0).items()})
    assert node0[2] == node0[3]
