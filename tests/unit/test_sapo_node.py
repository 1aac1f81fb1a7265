"""A SAPO receiver checks peers' packets: regenerated from provenance (forged answers and tampered metadata are
dropped), never evaluates code in shared completions, and can weight senders by their verification record."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from pubswap_flwr.algorithms.sapo_selection import Packet, reputation, select_external, weighted_sample
from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_runtime.learner import Learner, NodeSettings, WorkReport
from pubswap_flwr.node_runtime.state import NodeIdentity
from pubswap_flwr.protocols.sapo import SapoNode

MIX = "gcd:1,rg:binary_matrix:1"


@pytest.fixture()
def node(tmp_path):
    cfg = ExperimentConfig.from_flat({"strategy.mode": "sapo", "tasks.mix": MIX, "tasks.per-node": 0,
                                      "eval.items-per-task": 5, "sapo.completions": 4})
    return SapoNode(Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / "node", "embedded:tiny")), cfg.sapo)


def _peer_item(node, task: str):
    """An item a peer would have drawn from its own private stream (another node's seed range)."""
    from pubswap_flwr.tasks import MixtureStream, StreamCursor

    universe = node.learner.universe
    spec = next(t for t in universe.tasks if t.name == task)
    stream = MixtureStream([spec], universe.tasks, node=5, exclude=set())
    return stream.take(1, StreamCursor())[0]


def test_honest_packet_is_rescored_with_the_regenerated_entry(node):
    item = _peer_item(node, "gcd")
    packet = Packet("peer", item, (f"<answer>{item.answer}</answer>", "<answer>nope</answer>"))
    assert node.rescore(packet) == [1.0, 0.0]


def test_forged_answer_and_foreign_task_specs_are_rejected(node):
    item = _peer_item(node, "gcd")
    wrong = str(int(item.answer) + 1)
    forged = Packet("peer", replace(item, answer=wrong), (f"<answer>{wrong}</answer>",) * 2)
    with pytest.raises(ValueError, match="answer does not match its provenance"):
        node.rescore(forged)
    other_config = replace(item, provenance={**item.provenance, "config": {"max_value": 10**9}})
    with pytest.raises(ValueError, match="provenance names a task this node does not run"):
        node.rescore(Packet("peer", other_config, ("<answer>1</answer>",)))
    moved = replace(item, provenance={**item.provenance, "index": item.provenance["index"] + 1})
    with pytest.raises(ValueError, match="question does not match its provenance"):
        node.rescore(Packet("peer", moved, ("<answer>1</answer>",)))


def test_tampered_metadata_does_not_change_the_score(node):
    item = _peer_item(node, "rg:binary_matrix")
    lying = replace(item, metadata={**item.metadata, "solution": [[0]]})
    packet = Packet("peer", lying, (f"<answer>{item.answer}</answer>",))
    assert node.rescore(packet) == [1.0]


def test_eval_payload_in_a_shared_completion_is_never_executed(node, tmp_path):
    item = _peer_item(node, "rg:binary_matrix")
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    packet = Packet("peer", item, (f"<answer>{payload}</answer>", f"<answer>{item.answer}</answer>"))
    assert node.rescore(packet) == [0.0, 1.0]
    assert not marker.exists()


def test_rejections_feed_reputation_and_weighted_sampling(node):
    good = _peer_item(node, "gcd")
    honest = [Packet("honest", good, (f"<answer>{good.answer}</answer>", "<answer>x</answer>"))] * 3
    forged = [Packet("liar", replace(good, answer="1234"), ("<answer>1234</answer>", "<answer>x</answer>"))] * 3
    selection = select_external(honest + forged, 2, lambda p: node.rescore(p), random.Random(0))
    assert selection.rejected == 3 and all(s.packet.sender == "honest" for s in selection.chosen)
    assert all("liar/" in r and "forged" in r for r in selection.rejections)
    assert reputation(10, 0) > 0.9 and reputation(0, 10) < 0.1 and reputation(0, 0) == 0.5
    picks = [weighted_sample(["a", "b"], [1000.0, 1e-6], 1, random.Random(s))[0] for s in range(50)]
    assert picks.count("a") == 50
    assert sorted(weighted_sample(["a", "b", "c"], [1, 1, 1], 3, random.Random(1))) == ["a", "b", "c"]


def test_reputation_is_recorded_per_sender_in_node_state(node):
    good = _peer_item(node, "gcd")
    pool = [Packet("honest", good, (f"<answer>{good.answer}</answer>", "<answer>x</answer>")),
            Packet("liar", replace(good, answer="999"), ("<answer>999</answer>",) * 2)]
    node.generate_rollouts(1, WorkReport())
    node.train_on_pool(pool, 1, WorkReport())
    assert node.saved.peers == {"honest": (1, 0), "liar": (0, 1)}
    node.learner.save()  # kept in node.json's "mode", as the family declares it, and read back by a new learner
    again = SapoNode(Learner(node.learner.settings, node.learner.identity), node.sapo)
    assert again.saved.peers == {"honest": (1, 0), "liar": (0, 1)} and again.saved.pending == []


def test_a_family_state_that_breaks_its_declaration_is_refused_naming_the_field(node):
    node.learner.save()
    path = node.learner.state_dir / "node.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "mode": {"peers": {"n1": [1]}}}))  # edited by hand
    learner = Learner(node.learner.settings, node.learner.identity)
    with pytest.raises(ValueError, match=r"node state\.mode\.peers\[\.\.\.\]: expected `array` of length 2, got 1"):
        SapoNode(learner, node.sapo)
    assert node.learner.universe.tasks[1].generator == "binary_matrix"


def test_a_nodes_pending_groups_survive_its_state_file(node):
    node.generate_rollouts(1, WorkReport())
    before = node.pending_groups()
    assert len(before) == node.sapo.local and all(len(g.completions) == node.sapo.completions for g in before)
    node.learner.save()
    again = SapoNode(Learner(node.learner.settings, node.learner.identity), node.sapo)
    after = again.pending_groups()
    assert [(g.prompt, g.rewards, g.item_uid, [(c.text, c.token_ids) for c in g.completions]) for g in after] == \
        [(g.prompt, g.rewards, g.item_uid, [(c.text, c.token_ids) for c in g.completions]) for g in before]
