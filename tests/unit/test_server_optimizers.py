"""What every server optimizer (strategy.server-optimizer) shares: the registry and the config's choices, `none` as
plain FedAvg, refusal where no global adapter exists (sapo), and its state through a real checkpoint: saved, loaded,
restored, then stepping on exactly as the uninterrupted optimizer does; a state that does not fit is refused with a
reason. Each optimizer's own update rule is tested against hand-computed steps in its own test file."""

from __future__ import annotations

import numpy as np
import pytest

from pubswap_flwr.algorithms import server_optimizers as optimizers
from pubswap_flwr.config import ConfigError, ExperimentConfig, key_choices
from pubswap_flwr.protocols import protocol_class
from pubswap_flwr.server import checkpoint

OPTIMIZERS = [name for name in optimizers.names() if name != "none"]


def config(name: str, mode: str = "fedavg", **flat) -> ExperimentConfig:
    return ExperimentConfig.from_flat({"run-name": "x", "num-server-rounds": 5, "strategy.mode": mode,
                                       "strategy.server-optimizer": name, **flat})


def adapter(rng, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"m.lora_A.weight": (scale * rng.normal(size=(2, 3))).astype(np.float32),
            "m.lora_B.weight": (scale * rng.normal(size=(3, 2))).astype(np.float32)}


def test_every_optimizer_module_is_registered_and_a_choice_of_the_config():
    assert optimizers.names()[0] == "none" and set(OPTIMIZERS) <= set(optimizers.OPTIMIZERS)
    assert key_choices()["strategy.server-optimizer"] == optimizers.names()
    for name in optimizers.names():
        assert optimizers.OPTIMIZERS[name].name == name and optimizers.OPTIMIZERS[name].doc
        assert f"{name}: " in optimizers.described()


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="server optimizer 'none' is already registered by Plain"):
        optimizers.register("none")(type("Again", (optimizers.ServerOptimizer,), {}))


def test_none_returns_the_aggregate_itself_and_keeps_no_state():
    opt = optimizers.build(config("none").strategy)
    rng = np.random.default_rng(0)
    aggregate = adapter(rng)
    assert opt.step(adapter(rng), aggregate) is aggregate
    assert opt.state() == {} and opt.saved_arrays() == {} and opt.describe() == ""


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_sapo_keeps_no_global_adapter_so_a_server_optimizer_is_refused(name):
    with pytest.raises(ConfigError, match=f"strategy.server-optimizer = '{name}' moves the global adapter; sapo mode "
                                          "keeps none"):
        config(name, "sapo")


def _steps(opt, rng, current, count: int):
    for _ in range(count):
        current = opt.step(current, {k: v + adapter(rng, 0.1)[k] for k, v in current.items()})
    return current


@pytest.mark.parametrize("mode", ["fedavg", "pubswap"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_state_goes_through_a_checkpoint_and_the_restored_optimizer_steps_on_identically(tmp_path, name, mode):
    cfg = config(name, mode)
    first = protocol_class(mode).from_config(cfg)
    rng = np.random.default_rng(1)
    master = _steps(first.optimizer, rng, adapter(rng), 2)
    checkpoint.save(tmp_path, checkpoint.ServerCheckpoint(round=2, config=cfg.to_flat(), master=master,
                                                          protocol=first.state(), adapters=first.saved_adapters()))
    loaded = checkpoint.load(tmp_path)  # checks the arrays' files, and restores into a fresh protocol on trial
    second = protocol_class(mode).from_config(cfg)
    second.restore(loaded.protocol, loaded.adapters, loaded.node_index)
    assert second.optimizer.steps == first.optimizer.steps == 2
    onwards = [_steps(opt, np.random.default_rng(2), master, 2) for opt in (first.optimizer, second.optimizer)]
    for key in master:
        np.testing.assert_array_equal(onwards[0][key], onwards[1][key])


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_optimizer_state_that_does_not_fit_is_refused_with_its_reason(name):
    cfg = config(name)
    opt = optimizers.build(cfg.strategy)
    rng = np.random.default_rng(3)
    _steps(opt, rng, adapter(rng), 1)
    state, arrays = opt.state(), opt.saved_arrays()
    entry = state[optimizers.STATE_KEY]
    fresh = optimizers.build(cfg.strategy)
    for bad, problem in [({**entry, "steps": 6}, r"steps must be an integer in \[0, 5\]"),
                         ({**entry, "steps": True}, "steps must be an integer"),
                         ({**entry, "name": "other"}, f"must be an object naming '{name}'"),
                         ("text", "must be an object")]:
        with pytest.raises(ValueError, match=problem):
            fresh.restore({optimizers.STATE_KEY: bad}, arrays, cfg.num_server_rounds)
    if arrays:
        with pytest.raises(ValueError, match="took 1 steps but the checkpoint lacks"):
            fresh.restore(state, {}, cfg.num_server_rounds)
    fresh.restore({}, {}, cfg.num_server_rounds)  # a checkpoint without it: a fresh start
    assert fresh.steps == 0 and fresh.arrays == {}
