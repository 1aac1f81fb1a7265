"""Local GRPO on the shipped model raises held-out reward (small, seeded; about half a minute)."""

from __future__ import annotations

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.evaluation import evaluate
from pubswap_flwr.node_runtime.learner import Learner, NodeSettings, WorkReport
from pubswap_flwr.node_runtime.state import NodeIdentity
from pubswap_flwr.settings import EvalSettings
from pubswap_flwr.shared import task_universe

pytestmark = pytest.mark.slow


def test_local_grpo_raises_held_out_sampled_reward(tmp_path):
    # gcd + count_bits: tasks the warmed-up model partly solves, so groups carry signal both ways. At this scale RL
    # sharpens sampling first (docs/results/README.md), so the measure is held-out *sampled* reward (T=1, fixed seed).
    cfg = ExperimentConfig.from_flat({"tasks.mix": "gcd:1,count_bits:1", "tasks.per-node": 0,
                                      "eval.items-per-task": 200, "train.learning-rate": 2e-3, "seed": 0})
    node = Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / "node", "embedded:tiny"))
    held_out = task_universe(cfg).held_out.items
    before = evaluate(node.policy, held_out, EvalSettings(seed=0))
    report = WorkReport()
    node.private_steps(40, report)
    after = evaluate(node.policy, held_out, EvalSettings(seed=0))
    assert len(report.steps) == 40 and report.num_examples == 40 * 8 * 8
    # Measured on this machine with graded training rewards (the default then): 0.351 -> 0.410 for seed 0 (seeds
    # 1-3: +0.028, +0.082, +0.074); it also passes with the 0/1 rewards that are the default now.
    assert after["sampled_reward"] >= before["sampled_reward"] + 0.02, (before, after)
