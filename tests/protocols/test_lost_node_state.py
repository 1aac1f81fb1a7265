"""A node whose saved state is behind the last round the server accepted from it (lost, or another machine's stale
copy on a Ray cluster without a shared run dir): a simulated node refuses to go on and its reply is dropped with
the reason; a deployed node warns and continues; the server's record survives a resume."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pubswap_flwr.node_runtime.serving import NodeStateError, check_state_continues
from pubswap_flwr.node_runtime.state import NodeIdentity
from pubswap_flwr.server import checkpoint
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from pubswap_flwr.wire.codecs import CONFIG_KEY, NODE_ROUND_KEY, NODE_ROUNDS_KEY
from pubswap_flwr.wire.records import Header

# a round of 2 replies (2 nodes, or 3 with one dropped) is applied: a robust rule keeps it by default (#54)
TINY = {"seed": 5, "train.prompts-per-step": 1, "train.completions-per-prompt": 2, "eval.items-per-task": 1,
        "eval.sampled": False, "train.local-steps": 1, "tasks.mix": "gcd:1", "tasks.per-node": 0,
        "strategy.apply-below-robust": True}


def _learner(last_round: int, simulated: bool, tmp_path: Path):
    identity = NodeIdentity(3, tmp_path / "node-3", "tiny", simulated=simulated)
    return SimpleNamespace(state=SimpleNamespace(last_round=last_round), identity=identity)


@pytest.mark.parametrize("last_round, accepted", [(0, 0), (4, 4), (5, 4)])
def test_state_that_reaches_the_accepted_round_continues(tmp_path, last_round, accepted):
    check_state_continues(_learner(last_round, True, tmp_path), Header(5, "run", node_round=accepted))


def test_a_simulated_node_behind_the_accepted_round_refuses_naming_its_state_dir(tmp_path):
    with pytest.raises(NodeStateError, match=r"node 3's saved state is behind the server's record \(round 2 < 4\): "
                                             r"lost, .*filesystem every machine shares. State dir: .*node-3$"):
        check_state_continues(_learner(2, True, tmp_path), Header(5, "run", node_round=4))
    with pytest.raises(NodeStateError, match=r"\(round 2 < 3\)"):  # the map, for a node id the server did not know
        check_state_continues(_learner(2, True, tmp_path), Header(5, "run", node_rounds={3: 3, 4: 9}))
    check_state_continues(_learner(2, True, tmp_path), Header(5, "run", node_rounds={4: 9}))  # none for index 3


def test_a_deployed_node_behind_the_accepted_round_warns_and_continues(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        check_state_continues(_learner(0, False, tmp_path), Header(5, "run", node_round=4))
    assert "node 3's saved state in" in caplog.text and "continuing from the state it holds" in caplog.text


def test_the_header_reads_the_stamped_round_or_map_and_defaults_to_none():
    config = {"server-round": 3, "run-name": "r", "round-start": True}
    assert Header.from_config(config).accepted_round(7) == 0
    assert Header.from_config({**config, NODE_ROUND_KEY: 2}).accepted_round(7) == 2
    mapped = Header.from_config({**config, NODE_ROUNDS_KEY: '{"7": 2, "8": 3}'})
    assert (mapped.accepted_round(7), mapped.accepted_round(8), mapped.accepted_round(9)) == (2, 3, 0)
    for bad, reason in (('{"7": -1}', r"node-rounds\[...\]: expected `int` >= 0"),
                        ('{"x": 1}', r"node-rounds \(a key\): expected `str` matching regex"),
                        ('{"3\\n": 1, "3": 2}', r"node-rounds \(a key\): expected `str` matching regex"),
                        ('[1]', "node-rounds: expected `object`, got `array`"),
                        ('{"7": true}', r"node-rounds\[...\]: expected `int`, got `bool`"),
                        ('{"7": 4}', r"must map node indices < 10000 to rounds in \[0, 3\]"),
                        ('{"10000": 1}', r"must map node indices < 10000 to rounds in \[0, 3\]")):
        with pytest.raises(ValueError, match=reason):
            Header.from_config({**config, NODE_ROUNDS_KEY: bad})
    with pytest.raises(ValueError, match="node-rounds is not JSON"):
        Header.from_config({**config, NODE_ROUNDS_KEY: "{"})


def _stale_copy(partition: int, saved_in: int, put_back_in: int, store: Path):
    """After round `saved_in`, copy the node's state dir aside; after round `put_back_in`, put that copy back (what
    a machine that ran the node earlier would hold)."""

    def hook(msg, context, reply):
        config = msg.content[CONFIG_KEY]
        state_dir = Path(config["run-dir"]) / "nodes" / f"partition-{partition}"
        if int(context.node_config["partition-id"]) != partition:
            return reply
        if int(config["server-round"]) == saved_in:
            shutil.copytree(state_dir, store, dirs_exist_ok=True)
        elif int(config["server-round"]) == put_back_in:
            shutil.rmtree(state_dir)
            shutil.copytree(store, state_dir)
        return reply

    return hook


def test_a_stale_node_state_drops_that_node_with_the_reason_and_the_round_goes_on(tmp_path):
    config = {**TINY, "num-server-rounds": 4, "strategy.min-clients": 1, "output.dir": str(tmp_path),
              "run-name": "stale"}
    simulate_in_process(config, 2, reply_hook=_stale_copy(1, 1, 2, tmp_path / "copy"))
    rows = read_metrics(tmp_path / "stale")
    assert not rows[1]["dropped"] and not rows[2]["dropped"]
    for row in rows[3:]:  # the server accepted round 2 from node 1; its state says round 1, every round after
        (reason,) = row["dropped"].values()
        assert "node 1's saved state is behind the server's record (round 1 < 2)" in reason
        assert "output.dir must be on a filesystem every machine shares" in reason  # within the 300 kept characters
        assert len(row["clients"]) == 1 and row["aggregated"]
    assert checkpoint.load(tmp_path / "stale").node_rounds == {0: 4, 1: 2}  # by node index


def test_a_lost_node_state_after_a_resume_is_caught_from_the_checkpoints_record(tmp_path):
    config = {**TINY, "output.dir": str(tmp_path), "run-name": "lost"}
    simulate_in_process({**config, "num-server-rounds": 2}, 2)
    shutil.rmtree(tmp_path / "lost" / "nodes" / "partition-0")
    simulate_in_process({**config, "num-server-rounds": 3, "resume": True}, 2)
    (reason,) = read_metrics(tmp_path / "lost")[3]["dropped"].values()
    assert "node 0's saved state is behind the server's record (round 0 < 2)" in reason
