"""tasks.curriculum on a node: its private items are drawn at its levels (held-out items are not), the frontier rule
moves the levels at a round's start, and the levels survive a save and a reload; a saved state someone edited is
refused naming what is wrong."""

from __future__ import annotations

import json

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_runtime.learner import Learner, NodeSettings
from pubswap_flwr.node_runtime.state import STATE_FILE, NodeIdentity
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.shared import task_universe
from pubswap_flwr.tasks import PRESETS
from pubswap_flwr.tasks.curriculum import TaskLevel, level_config

FLAT = {"eval.items-per-task": 2, "model.lora-r": 4, "tasks.mix": "gcd:1,spell_backward:1", "tasks.per-node": 0,
        "tasks.curriculum": True, "tasks.curriculum-window": 2, "tasks.curriculum-start": 1}


def learner(tmp_path, **flat) -> Learner:
    cfg = ExperimentConfig.from_flat({**FLAT, **flat})
    return Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / "node", "embedded:tiny"))


def groups(task: str, successes: list[float]) -> list[RolloutGroup]:
    """One group of 4 completions per entry, that share of them correct."""
    return [RolloutGroup("p", [Completion("c")] * 4, [1.0] * round(4 * s) + [0.0] * (4 - round(4 * s)), "u", task)
            for s in successes]


def test_private_items_are_drawn_at_the_nodes_levels_and_held_out_items_at_the_tasks_own_configs(tmp_path):
    node = learner(tmp_path)
    assert node.curriculum_levels == {"gcd": 1, "spell_backward": 1}
    items = node.stream.take(12, node.state.cursor)
    assert {item.task for item in items} == {"gcd", "spell_backward"}
    for item in items:
        assert item.provenance["config"] == level_config(PRESETS[item.task], 1)
    off = ExperimentConfig.from_flat({**FLAT, "tasks.curriculum": False})
    on = ExperimentConfig.from_flat(FLAT)
    assert task_universe(on).held_out.items == task_universe(off).held_out.items
    assert all(item.provenance["config"] == dict(PRESETS[item.task].config)
               for item in task_universe(on).held_out.items)
    plain = Learner(NodeSettings.of(off), NodeIdentity(1, tmp_path / "off", "embedded:tiny"))
    assert plain.curriculum_levels == {} and plain.state.curriculum == {}
    assert all(item.provenance["config"] == dict(PRESETS[item.task].config)
               for item in plain.stream.take(4, plain.state.cursor))


def test_a_rounds_start_moves_each_tasks_level_by_its_own_window(tmp_path):
    node = learner(tmp_path)
    node.observe_groups(groups("gcd", [1.0, 0.75]) + groups("spell_backward", [0.0, 0.25]))
    node.begin_round(2)
    assert node.curriculum_levels == {"gcd": 2, "spell_backward": 0}
    assert node.state.curriculum["gcd"] == TaskLevel(2)  # the window starts over at the new level
    item = next(i for i in node.stream.take(12, node.state.cursor) if i.task == "spell_backward")
    assert item.provenance["config"] == level_config(PRESETS["spell_backward"], 0)
    node.observe_groups(groups("gcd", [0.5]))
    node.begin_round(3)  # half a window: held
    assert node.curriculum_levels == {"gcd": 2, "spell_backward": 0}


def test_the_curriculum_state_survives_a_save_and_a_reload(tmp_path):
    node = learner(tmp_path)
    node.observe_groups(groups("gcd", [1.0, 1.0]) + groups("spell_backward", [0.5]))
    node.begin_round(2)
    node.observe_groups(groups("gcd", [0.25]))
    node.save()
    saved = dict(node.state.curriculum)
    assert saved == {"gcd": TaskLevel(2, (0.25,)), "spell_backward": TaskLevel(1, (0.5,))}
    again = learner(tmp_path)
    assert again.state.curriculum == saved
    assert again.curriculum_levels == {"gcd": 2, "spell_backward": 1}
    assert {i.provenance["config"]["max_value"] for i in again.stream.take(12, again.state.cursor)
            if i.task == "gcd"} == {level_config(PRESETS["gcd"], 2)["max_value"]}
    again.begin_round(2)  # a repeated round restores its start: the levels it had then
    assert again.state.curriculum == {"gcd": TaskLevel(2), "spell_backward": TaskLevel(1, (0.5,))}


@pytest.mark.parametrize(("curriculum", "message"), [
    ({"gcd": {"level": -1}}, r"node.json: curriculum\[...\].level: expected `int` >= 0"),
    ({"gcd": {"level": 1, "recent": [1.5]}}, r"node.json: curriculum\[...\].recent\[0\]: expected `float` <= 1.0"),
    ({"gcd": {"level": "2"}}, r"node.json: curriculum\[...\].level: expected `int`, got `str`"),
    ([1, 2], r"node.json: curriculum: expected `object`, got `array`"),
    ({"gcd": {"level": 4}}, r"node.json: curriculum level 4 of task 'gcd' is above its top level 3"),
])
def test_an_edited_curriculum_state_is_refused_naming_the_field(tmp_path, curriculum, message):
    learner(tmp_path).save()
    path = tmp_path / "node" / STATE_FILE
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "curriculum": curriculum}))
    with pytest.raises(ValueError, match=message):
        learner(tmp_path)


def test_saved_levels_of_a_task_the_node_does_not_train_are_refused(tmp_path):
    learner(tmp_path).save()
    path = tmp_path / "node" / STATE_FILE
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "curriculum": {**state["curriculum"], "count_bits": {"level": 0}}}))
    with pytest.raises(ValueError, match=r"curriculum names tasks this node does not train: \['count_bits'\]"):
        learner(tmp_path).begin_round(1)


# -- SAPO: a peer's private items are at its own levels ------------------------------------------------------------
def _sapo_node(tmp_path, curriculum: bool):
    from pubswap_flwr.protocols.sapo import SapoNode

    cfg = ExperimentConfig.from_flat({**FLAT, "strategy.mode": "sapo", "sapo.completions": 4,
                                      "tasks.curriculum": curriculum})
    return SapoNode(Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / str(curriculum), "embedded:tiny")),
                    cfg.sapo)


def _peer_item_at(node, level: int):
    from pubswap_flwr.tasks import MixtureStream, StreamCursor
    from pubswap_flwr.tasks.curriculum import at_level

    spec = next(t for t in node.learner.universe.tasks if t.name == "gcd")
    stream = MixtureStream([at_level(spec, level)], node.learner.universe.tasks, node=5, exclude=set())
    return stream.take(1, StreamCursor())[0]


def test_a_sapo_receiver_with_the_controller_verifies_a_peers_item_at_any_level_of_its_tasks(tmp_path):
    from dataclasses import replace

    from pubswap_flwr.algorithms.sapo_selection import Packet

    node = _sapo_node(tmp_path, curriculum=True)
    item = _peer_item_at(node, 3)  # the receiver itself trains gcd at level 1
    assert node.rescore(Packet("peer", item, (f"<answer>{item.answer}</answer>", "<answer>0</answer>"))) == [1.0, 0.0]
    wrong = str(int(item.answer) + 1)
    with pytest.raises(ValueError, match="answer does not match its provenance"):
        node.rescore(Packet("peer", replace(item, answer=wrong), (f"<answer>{wrong}</answer>",)))
    beyond = {**item.provenance["config"], "max_value": 10**9}  # no level of gcd: a generator config of the peer's
    with pytest.raises(ValueError, match="provenance names a task this node does not run"):
        node.rescore(Packet("peer", replace(item, provenance={**item.provenance, "config": beyond}), ("<answer>1",)))
    off = _sapo_node(tmp_path, curriculum=False)  # without the controller only the tasks' own configs are run
    with pytest.raises(ValueError, match="provenance names a task this node does not run"):
        off.rescore(Packet("peer", item, (f"<answer>{item.answer}</answer>",)))


def test_reported_levels_are_a_checked_metric_of_the_reply():
    from pubswap_flwr.wire.records import ClientReport
    from pubswap_flwr.wire.validate import Rejected

    report = ClientReport.from_records({"node-index": 3}, {"model": "m", "curriculum": {"gcd": 2}})
    assert dict(report.curriculum) == {"gcd": 2} and report.payload()["curriculum"] == {"gcd": 2}
    assert "curriculum" not in ClientReport.from_records({"node-index": 3}, {"model": "m"}).payload()
    for bad, why in (({"gcd": -1}, r"expected `int` >= 0"), ({"gcd": 1001}, r"expected `int` <= 1000"),
                     ({"gcd": "2"}, r"expected `int`, got `str`"), (["gcd"], r"expected `object`, got `array`")):
        with pytest.raises(Rejected, match=rf"payload.curriculum.*{why}"):
            ClientReport.from_records({"node-index": 3}, {"model": "m", "curriculum": bad})
