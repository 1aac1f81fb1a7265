"""The Flower floor of benchmarks/deployment.py: its ServerApp sends each node as many `train.segment` messages per
round as the benchmark's PubSwap config does, and its ClientApp answers at once with an empty record or the bytes
asked for."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from pubswap_flwr.simulation import simulate_in_process

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "floor_app"))

import deployment  # noqa: E402
from floor_client import app as floor_client  # noqa: E402


def test_the_floor_sends_pubswaps_messages_per_round(tmp_path):
    seen = Counter()
    config = {**deployment.CONFIG, "num-server-rounds": 1, "eval.items-per-task": 1,
              "output.dir": str(tmp_path), "run-name": "count"}
    simulate_in_process(config, 2, client_hook=lambda msg, context: seen.update(
        [(msg.metadata.message_type, msg.content["config"]["server-round"], context.node_id)]))
    assert {kind for kind, _, _ in seen} == {"train.segment"}  # the floor's message type
    assert set(seen.values()) == {deployment.segments(config)} and len(seen) == 2  # per node


def _ask(reply_bytes: int, arrays: int = 1, node: int = 5) -> Message:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, node, 1
    msg = Message(RecordDict({"config": ConfigRecord({"server-round": 3, "segment": 1, "reply-bytes": reply_bytes,
                                                      "arrays": arrays})}), dst_node_id=node,
                  message_type="train.segment")
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return floor_client(msg, Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={}))


def test_the_floor_client_replies_empty_or_with_the_bytes_asked_for():
    assert not _ask(0).has_error() and len(_ask(0).content) == 0
    payload = _ask(1000, arrays=7).content["payload"]
    parts = payload.to_numpy_ndarrays()
    assert len(parts) == 7 and sum(p.size for p in parts) == 1000
    assert len({p.tobytes() for p in parts}) == 7  # distinct arrays: Flower would store equal ones once
    other = _ask(1000, arrays=7, node=6).content["payload"].to_numpy_ndarrays()
    assert not np.array_equal(parts[0], other[0])  # and other nodes' replies differ
