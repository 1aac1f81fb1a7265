"""A node's learner across messages: FedProx's reference (the last global adapter) survives a fresh Learner, as a
PubSwap round's later segments need; without FedProx none is kept."""

from __future__ import annotations

import torch

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_runtime.learner import Learner, NodeSettings
from pubswap_flwr.node_runtime.state import REFERENCE_FILE, NodeIdentity

CFG = ExperimentConfig.from_flat({"eval.items-per-task": 2, "model.lora-r": 4})


def test_the_proximal_reference_survives_a_new_learner_on_the_same_state(tmp_path):
    identity = NodeIdentity(0, tmp_path / "node", "embedded:tiny")
    first = Learner(NodeSettings.of(CFG), identity, proximal_mu=0.1)
    assert first.proximal_reference is None  # no global adapter received yet
    global_adapter = {k: torch.full_like(v, 0.01) for k, v in first.policy.adapter().items()}
    first.receive_global(global_adapter)
    first.save()
    with torch.no_grad():  # the node trains on: its adapter moves away from the reference
        for p in first.policy.learner.params.values():
            p.add_(1.0)
    first.save()
    second = Learner(NodeSettings.of(CFG), identity, proximal_mu=0.1)
    assert second.proximal_reference is not None
    assert set(second.proximal_reference) == set(first.proximal_reference)
    assert all(torch.equal(second.proximal_reference[n], first.proximal_reference[n])
               for n in first.proximal_reference)
    assert all(torch.all(v == 0.01) for v in second.proximal_reference.values())
    plain = Learner(NodeSettings.of(CFG), NodeIdentity(1, tmp_path / "plain", "embedded:tiny"), proximal_mu=0.0)
    plain.receive_global(global_adapter)
    assert plain.proximal_reference is None and not (tmp_path / "plain" / REFERENCE_FILE).exists()


def test_rollouts_train_on_graded_or_binary_rewards_and_count_answer_shapes(tmp_path):
    """The same seeded rollouts: with tasks.partial-credit = false every reward is 0 or 1 and equals the graded
    reward where that is 1; the learner counts the shapes of the completions it sampled."""
    rewards = {}
    for partial in (True, False):
        cfg = CFG.with_overrides({"tasks.partial-credit": partial, "tasks.mix": "spell_backward:1",
                                  "tasks.per-node": 0})
        learner = Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / str(partial), "embedded:tiny"))
        items = learner.stream.take(4, learner.state.cursor)
        groups, _seconds = learner.rollout(items, 8)
        rewards[partial] = [r for g in groups for r in g.rewards]
        assert sum(learner.sampled_shapes.values()) == 32
    graded, binary = rewards[True], rewards[False]
    assert any(0 < r < 1 for r in graded)  # spell_backward pays partial credit for a partly right spelling
    assert set(binary) <= {0.0, 1.0}
    assert binary == [float(r >= 1.0) for r in graded]
