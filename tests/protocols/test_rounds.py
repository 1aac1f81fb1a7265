"""Each mode's round protocol, served in process: the message types and counts per round, a client that raises
mid-round, a message of another mode, and resume after the server died mid-round."""

from __future__ import annotations

import json
from collections import Counter

import msgspec
import pytest

from pubswap_flwr.config import catalog
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from tests.golden.runs import comparable
from tests.tiers import fast_only

# a round of 2 replies (2 nodes, or 3 with one dropped) is applied: a robust rule keeps it by default (#54)
TINY = {"seed": 5, "train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 3,
        "eval.samples": 1, "eval.sampled": False,
        "train.local-steps": 2, "strategy.apply-below-robust": True}
NODES = 3
# each mode's smoke runs, as its catalog entry declares them: name -> {"config": overrides, "flow": message types}
SMOKE = catalog.smoke_runs()
SAPO = SMOKE["sapo"]["config"]


def _partition(context) -> int:
    return int(context.node_config["partition-id"])


def _round(msg) -> int:
    return int(msg.content["config"]["server-round"])


def _record(seen: list):
    def deliver(msg, context, call):
        seen.append((_round(msg), msg.metadata.message_type, _partition(context)))
        return call(msg, context)

    return deliver


@pytest.mark.parametrize("name", fast_only(SMOKE, fast=["pubswap", "sapo"]))
def test_each_round_sends_the_modes_message_types(tmp_path, name):
    seen: list = []
    simulate_in_process({**TINY, **SMOKE[name]["config"], "num-server-rounds": 2, "output.dir": str(tmp_path),
                         "run-name": name}, NODES, deliver=_record(seen))
    for number in (1, 2):  # each message type of the flow goes to every node before the next one is sent
        assert [t for r, t, _ in seen if r == number] == [t for t in SMOKE[name]["flow"] for _ in range(NODES)]
    rows = read_metrics(tmp_path / name)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(len(r["clients"]) == NODES and not r["dropped"] for r in rows[1:])
    weights = sum(r["bytes"]["array_records"] for r in rows[1:])
    family = catalog.protocol(SMOKE[name]["config"]["strategy.mode"])
    assert (weights == 0) == (not family.averages_adapters)  # no weights cross the network in a mode averaging none
    # each node keeps its family's own state, as the catalog declares it, and nothing else (node.json's "mode")
    kind = catalog.load(family.node_state) if family.node_state else None
    for node in sorted((tmp_path / name / "nodes").iterdir()):
        saved = json.loads((node / "node.json").read_text())["mode"]
        assert (msgspec.convert(saved, kind, strict=True) is not None) if kind else saved == {}


def _raise_in_round_one(message_type: str, partition: int):
    def hook(msg, context):
        if msg.metadata.message_type == message_type and _partition(context) == partition and _round(msg) == 1:
            raise RuntimeError(f"injected failure in {message_type}")

    return hook


# fedavg's drops: tests/integration and the hostile-reply tests
@pytest.mark.parametrize("mode,message_type", fast_only([("pubswap", "train.segment"), ("sapo", "query.rollouts"),
                                                          ("sapo", "train.sapo")], fast=[("pubswap", "train.segment")]))
def test_a_client_raising_is_dropped_and_the_round_goes_on(tmp_path, mode, message_type):
    simulate_in_process({**TINY, **SMOKE[mode]["config"], "num-server-rounds": 2, "output.dir": str(tmp_path),
                         "run-name": "drop"}, 3, client_hook=_raise_in_round_one(message_type, 1))
    rows = read_metrics(tmp_path / "drop")
    (reason,) = rows[1]["dropped"].values()
    assert f"injected failure in {message_type}" in reason and "client error (code 2)" in reason
    assert {c["node_index"] for c in rows[1]["clients"].values()} == {0, 2}
    assert {c["node_index"] for c in rows[2]["clients"].values()} == {0, 1, 2}  # back in the next round
    if not mode.startswith("sapo"):
        assert rows[1]["aggregated"] is True and len(rows[1]["aggregated_clients"]) == 2


def test_a_message_of_another_mode_is_refused_by_the_client(tmp_path):
    from flwr.app import ConfigRecord, Message, RecordDict

    from pubswap_flwr.inprocess import InProcessGrid, server_context
    from pubswap_flwr.simulation import build_apps

    config = {**TINY, "output.dir": str(tmp_path), "run-name": "x"}
    _, client = build_apps(config)
    grid = InProcessGrid(client, 1, config)
    server_context(grid)
    message = Message(RecordDict({"config": ConfigRecord({"server-round": 1, "run-name": "x", "k": 4})}),
                      dst_node_id=next(iter(grid.get_node_ids())), message_type="train.segment")
    (reply,) = grid.send_and_receive([message])
    assert reply.has_error() and "belongs to another mode than this run's strategy.mode = 'fedavg'" in \
        reply.error.reason


class ServerDied(BaseException):
    """Stands for the server process being killed: not an Exception, so nothing on the way catches it."""


def _die_in_round_three(msg, context, call):
    reply = call(msg, context)  # the node has done (and saved) its part of round 3 ...
    if _round(msg) == 3 and _partition(context) == 1:
        raise ServerDied()  # ... when the server dies
    return reply


@pytest.mark.parametrize("mode", fast_only(["pubswap", "sapo-async"], fast=["pubswap"]))
def test_a_run_resumed_after_the_server_died_mid_round_repeats_the_uninterrupted_metrics(tmp_path, mode):
    config = {**TINY, **SMOKE[mode]["config"], "num-server-rounds": 3, "eval.every": 0, "output.dir": str(tmp_path)}
    simulate_in_process({**config, "run-name": "full"}, 2)
    with pytest.raises(ServerDied):
        simulate_in_process({**config, "run-name": "cut"}, 2, deliver=_die_in_round_three)
    assert json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())["round"] == 2
    assert json.loads((tmp_path / "cut" / "status.json").read_text())["status"] == "failed"
    simulate_in_process({**config, "run-name": "cut", "resume": True}, 2)
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["round"] for r in cut] == [0, 1, 2, 3]
    assert comparable(full) == comparable(cut)
    assert json.loads((tmp_path / "cut" / "status.json").read_text())["status"] == "completed"
    types = Counter(r["mode"] for r in cut)
    assert types == Counter({SMOKE[mode]["config"]["strategy.mode"]: 4})


def _count_shared(counts: dict):
    def hook(msg, context, reply):
        if msg.metadata.message_type == "query.rollouts" and not reply.has_error():
            from pubswap_flwr.wire.codecs import PAYLOAD_KEY, payload_from_record

            counts[_partition(context)] = len(payload_from_record(reply.content[PAYLOAD_KEY])["packets"])
        return reply

    return hook


@pytest.mark.parametrize("sharing,local,shared", [("local", 2, 2), ("local", 0, 0), ("fixed", 2, 3)])
def test_sapo_nodes_share_their_own_i_groups_as_in_the_paper_unless_told_otherwise(tmp_path, sharing, local, shared):
    counts: dict = {}
    config = {**TINY, **SAPO, "sapo.sharing": sharing, "sapo.local": local, "sapo.external": 2, "num-server-rounds": 1,
              "eval.every": 0, "eval.sampled": False, "output.dir": str(tmp_path), "run-name": "share"}
    simulate_in_process(config, 3, reply_hook=_count_shared(counts))
    assert counts == {0: shared, 1: shared, 2: shared}  # sapo.questions = 3, sapo.share = 3 only count when fixed
    row = read_metrics(tmp_path / "share")[-1]
    assert all(c["external_received"] == 2 * shared for c in row["clients"].values())
