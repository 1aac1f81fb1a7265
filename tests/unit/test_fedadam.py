"""FedAdam (strategy.server-optimizer = fedadam): Adam on the round's update, against steps worked out by hand, and a
saved state with a negative second moment refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pubswap_flwr.algorithms.server_optimizers import build
from pubswap_flwr.config import ExperimentConfig


def fedadam(**keys):
    flat = {"strategy.server-optimizer": "fedadam", **{f"strategy.server-{k}": v for k, v in keys.items()}}
    return build(ExperimentConfig.from_flat(flat).strategy)


def arrays(*values):
    return {"a": np.array(values, dtype=np.float32)}


def test_two_steps_match_the_hand_computed_adam_update():
    opt = fedadam(lr=0.1, beta1=0.5, beta2=0.75, tau=0.5)
    # step 1: u = [1, -2]; m = 0.5 u = [0.5, -1]; v = 0.25 u^2 = [0.25, 1]
    # m_hat = m / 0.5 = u; v_hat = v / 0.25 = u^2; x += 0.1 x u / (|u| + 0.5)
    x1 = opt.step(arrays(1.0, 2.0), arrays(2.0, 0.0))
    np.testing.assert_allclose(x1["a"], [1.0 + 0.1 / 1.5, 2.0 - 0.2 / 2.5], rtol=1e-6)
    np.testing.assert_allclose(opt.arrays["m"]["a"], [0.5, -1.0])
    np.testing.assert_allclose(opt.arrays["v"]["a"], [0.25, 1.0])
    # step 2 from x1 with u = [1, 1]: m = 0.5 m + 0.5 u = [0.75, 0]; v = 0.75 v + 0.25 u^2 = [0.4375, 1]
    # m_hat = m / (1 - 0.25) = [1, 0]; v_hat = v / (1 - 0.5625) = [1, 16/7]
    x2 = opt.step(x1, {"a": x1["a"] + 1.0})
    # (x1 + 1 in fp32 is u = 1 within 6e-8)
    np.testing.assert_allclose(opt.arrays["m"]["a"], [0.75, 0.0], atol=1e-6)
    np.testing.assert_allclose(opt.arrays["v"]["a"], [0.4375, 1.0], atol=1e-6)
    np.testing.assert_allclose(x2["a"], [x1["a"][0] + 0.1 * 1.0 / (1.0 + 0.5), x1["a"][1]], atol=1e-6)
    assert opt.steps == 2 and x2["a"].dtype == np.float32


def test_the_first_step_moves_each_value_by_about_eta_where_the_update_dwarfs_tau():
    opt = fedadam()  # eta 0.003 by default, tau 0.001
    assert opt.lr == 0.003
    update = np.array([0.5, -0.2, 1e-6, 0.0], dtype=np.float32)
    x1 = opt.step(arrays(0, 0, 0, 0), {"a": update})
    expected = 0.003 * update.astype(np.float64) / (np.abs(update) + 0.001)  # bias-corrected: m_hat = u, v_hat = u^2
    np.testing.assert_allclose(x1["a"], expected, rtol=1e-5)
    assert math.isclose(x1["a"][0], 0.003, rel_tol=0.01) and x1["a"][3] == 0.0


def test_a_negative_second_moment_is_refused():
    opt = fedadam()
    opt.step(arrays(1.0), arrays(2.0))
    state, saved = opt.state(), opt.saved_arrays()
    saved["server-fedadam-v"] = {"a": np.array([-1.0], dtype=np.float32)}
    with pytest.raises(ValueError, match="server-fedadam-v holds a negative second moment"):
        fedadam().restore(state, saved, 10)
