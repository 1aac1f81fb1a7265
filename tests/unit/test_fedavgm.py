"""FedAvgM (strategy.server-optimizer = fedavgm): server momentum on the round's update, against updates worked out
by hand, and FedAvg when the momentum is 0 and the step 1."""

from __future__ import annotations

import numpy as np
import pytest

from pubswap_flwr.algorithms.server_optimizers import build
from pubswap_flwr.config import ExperimentConfig


def fedavgm(**keys):
    flat = {"strategy.server-optimizer": "fedavgm", **{f"strategy.server-{k}": v for k, v in keys.items()}}
    return build(ExperimentConfig.from_flat(flat).strategy)


def arrays(*values):
    return {"a": np.array(values, dtype=np.float32)}


def test_two_steps_match_the_hand_computed_momentum():
    opt = fedavgm(lr=1.0, momentum=0.5)
    # step 1: u = [2, 0] - [1, 2] = [1, -2]; v = u; x = [1, 2] + 1 x [1, -2] = [2, 0]
    x1 = opt.step(arrays(1.0, 2.0), arrays(2.0, 0.0))
    np.testing.assert_array_equal(x1["a"], [2.0, 0.0])
    np.testing.assert_array_equal(opt.arrays["velocity"]["a"], [1.0, -2.0])
    # step 2: u = [3, 1] - [2, 0] = [1, 1]; v = 0.5 x [1, -2] + [1, 1] = [1.5, 0]; x = [2, 0] + [1.5, 0]
    x2 = opt.step(x1, arrays(3.0, 1.0))
    np.testing.assert_array_equal(x2["a"], [3.5, 0.0])
    np.testing.assert_array_equal(opt.arrays["velocity"]["a"], [1.5, 0.0])
    assert opt.steps == 2 and x2["a"].dtype == np.float32


def test_the_default_step_is_one_minus_the_momentum():
    opt = fedavgm(momentum=0.75)  # server-lr = 0: eta = 0.25
    assert opt.lr == 0.25
    x1 = opt.step(arrays(1.0, 2.0), arrays(2.0, 0.0))  # [1, 2] + 0.25 x [1, -2]
    np.testing.assert_allclose(x1["a"], [1.25, 1.5])
    x2 = opt.step(x1, x1)  # no update: the velocity alone moves it, 0.25 x 0.75 x [1, -2]
    np.testing.assert_allclose(x2["a"], [1.4375, 1.125])


@pytest.mark.parametrize("rounds", [1, 3])
def test_no_momentum_and_a_step_of_one_is_fedavg(rounds):
    opt = fedavgm(lr=1.0, momentum=0.0)
    rng = np.random.default_rng(0)
    current = {"a": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32)}
    for _ in range(rounds):
        aggregate = {k: (v + rng.normal(scale=0.01, size=v.shape)).astype(np.float32) for k, v in current.items()}
        current = opt.step(current, aggregate)
        for key in aggregate:
            np.testing.assert_allclose(current[key], aggregate[key], rtol=0, atol=1e-7)
