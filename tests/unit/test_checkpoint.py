"""Server checkpoints: a round trip, the previous checkpoint kept, every corrupted file refused with its name, the
fall back to the previous checkpoint, and status.json after a failed resume."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.server import checkpoint
from pubswap_flwr.server.checkpoint import CheckpointError, ServerCheckpoint

FEDAVG = ExperimentConfig.from_flat({"run-name": "x"}).to_flat()
SAPO = ExperimentConfig.from_flat({"run-name": "x", "strategy.mode": "sapo"}).to_flat()


def adapter(value: float = 0.5) -> dict[str, np.ndarray]:
    return {"a.lora_A.weight": np.full((2, 3), value, dtype=np.float32),
            "a.lora_B.weight": np.full((3, 2), -value, dtype=np.float32)}


def saved(round_number: int = 1, config: dict = FEDAVG, master=None, **kwargs) -> ServerCheckpoint:
    if master is None and config is FEDAVG:
        master = adapter(round_number)
    return ServerCheckpoint(round=round_number, config=config, master=master, **kwargs)


def state_path(run: Path, directory: str = checkpoint.CHECKPOINT_DIR) -> Path:
    return run / directory / checkpoint.STATE_FILE


def adapter_path(run: Path, directory: str = checkpoint.CHECKPOINT_DIR) -> Path:
    return run / directory / checkpoint.ADAPTER_FILE


def edit_state(run: Path, **changes) -> None:
    path = state_path(run)
    state = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            state.pop(key, None)
        else:
            state[key] = value
    path.write_text(json.dumps(state))


def test_round_trip_records_the_adapters_hash_and_shapes(tmp_path):
    checkpoint.save(tmp_path, saved(3, cumulative_reward=1.25, node_index={123: 0, 456: 1},
                                    node_rounds={0: 3, 1: 2}, protocol={"public_cursor": 7}))
    loaded = checkpoint.load(tmp_path)
    assert (loaded.round, loaded.cumulative_reward, loaded.node_index, loaded.node_rounds, loaded.protocol) == (
        3, 1.25, {123: 0, 456: 1}, {0: 3, 1: 2}, {"public_cursor": 7})
    assert loaded.source == tmp_path / "checkpoint"
    assert {k: v.tolist() for k, v in loaded.master.items()} == {k: v.tolist() for k, v in adapter(3).items()}
    manifest = json.loads(state_path(tmp_path).read_text())["adapter"]
    assert manifest["shapes"] == {"a.lora_A.weight": [2, 3], "a.lora_B.weight": [3, 2]}
    assert len(manifest["sha256"]) == 64


def test_a_new_checkpoint_keeps_the_previous_one(tmp_path):
    for number in (1, 2, 3):
        checkpoint.save(tmp_path, saved(number))
    assert json.loads(state_path(tmp_path).read_text())["round"] == 3
    assert json.loads(state_path(tmp_path, "checkpoint.prev").read_text())["round"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint.prev"]


def test_no_checkpoint_is_none(tmp_path):
    assert checkpoint.load(tmp_path) is None


def test_a_kill_between_the_renames_leaves_a_checkpoint_to_resume_from(tmp_path):
    checkpoint.save(tmp_path, saved(1))
    checkpoint.save(tmp_path, saved(2))
    (tmp_path / "checkpoint.prev").rename(tmp_path / ".checkpoint.old")  # saving round 3: first rename done
    assert checkpoint.load(tmp_path).round == 2
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.prev")  # second rename done, round 3 not in place
    assert checkpoint.load(tmp_path).round == 2
    (tmp_path / "checkpoint.prev").rename(tmp_path / "elsewhere")  # only the older version's swap directory
    assert checkpoint.load(tmp_path).round == 1


@pytest.mark.parametrize("content, message", [
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'{"round": 1, "config": \xff}', "not UTF-8 text"),
    (b"[1, 2]", "state.json: expected `object`, got `array`"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_state_file_that_is_not_a_json_object_is_refused_by_name(tmp_path, content, message):
    checkpoint.save(tmp_path, saved(1))
    state_path(tmp_path).write_bytes(content)
    with pytest.raises(CheckpointError, match=message) as err:
        checkpoint.load(tmp_path)
    assert str(state_path(tmp_path)) in str(err.value)


@pytest.mark.parametrize("changes, message", [
    ({"round": "3"}, "round: expected `int`, got `str`"),
    ({"round": True}, "round: expected `int`, got `bool`"),
    ({"round": 0}, "round: expected `int` >= 1"),
    ({"round": ...}, "object missing required field `round`"),
    ({"round": 11}, "'round' = 11 is beyond the run's num-server-rounds = 10"),
    ({"config": ["x"]}, "config: expected `object`, got `array`"),
    ({"config": {"train.local-steps": "many"}},
     "'config' is not a valid run config: train.local-steps = 'many': must be an integer"),
    ({"config": {"no-such-key": 1}}, "'config' is not a valid run config: unknown config key 'no-such-key'"),
    ({"cumulative_reward": "x"}, "cumulative_reward: expected `float`, got `str`"),
    ({"cumulative_reward": float("nan")}, "cumulative_reward: expected `float` >= -1000000000000000.0"),
    ({"cumulative_reward": 1.5}, "'cumulative_reward' = 1.5 is more than 1 rounds of rewards in [0, 1] add up to"),
    ({"cumulative_reward": -0.5}, "'cumulative_reward' = -0.5 is less than 1 rounds of rewards in [0, 1] add up to"),
    ({"node_index": [1]}, "node_index: expected `object`, got `array`"),
    ({"node_index": {"abc": 0}}, "node_index (a key): expected `str` matching regex '^[0-9]{1,20}\\\\Z'"),
    ({"node_index": {"99999999999999999999": 0}}, "'node_index' maps a node id of more than 64 bits"),
    ({"node_index": {"7\n": 0}}, "node_index (a key): expected `str` matching regex '^[0-9]{1,20}\\\\Z'"),
    ({"node_index": {"12": -1}}, "node_index[...]: expected `int` >= 0"),
    ({"node_index": {"12": 10_000}}, "node_index[...]: expected `int` <= 9999"),
    ({"node_rounds": {"12": True}}, "node_rounds[...]: expected `int`, got `bool`"),
    ({"node_rounds": {"12": 2}}, "'node_rounds' must map node indices < 10000 to rounds <= 1, got 12: 2"),
    ({"protocol": "cursor"}, "protocol: expected `object`, got `str`"),
    ({"adapter": {"sha256": 1}}, "adapter.sha256: expected `str`, got `int`"),
    ({"adapter": {"sha256": "ab", "shapes": {}}}, "adapter.sha256: expected `str` matching regex '^[0-9a-f]{64}\\\\Z'"),
])
def test_state_fields_of_the_wrong_type_are_refused_by_name(tmp_path, changes, message):
    checkpoint.save(tmp_path, saved(1))
    edit_state(tmp_path, **changes)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(tmp_path)
    assert str(err.value).endswith(f"{state_path(tmp_path)}: {message}")


def test_a_trl_reward_runs_checkpoint_keeps_its_negative_cumulative_reward_within_the_trl_bound(tmp_path):
    """tasks.trl-rewards train on values of any sign within +-1e6, so the round's mean reward is too."""
    config = {**FEDAVG, "tasks.trl-rewards": "examples.trl_reward:reward_len"}
    checkpoint.save(tmp_path, saved(2, config=config, master=adapter(2), cumulative_reward=-30.5))
    assert checkpoint.load(tmp_path).cumulative_reward == -30.5
    edit_state(tmp_path, cumulative_reward=2.5e6)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(tmp_path)
    assert str(err.value).endswith("'cumulative_reward' = 2500000.0 is more than 2 rounds of rewards in "
                                   "[-1e+06, 1e+06] add up to")


def test_missing_state_file_is_refused_by_name(tmp_path):
    checkpoint.save(tmp_path, saved(1))
    state_path(tmp_path).unlink()
    with pytest.raises(CheckpointError, match="state.json: missing"):
        checkpoint.load(tmp_path)


def test_truncated_adapter_fails_its_recorded_hash(tmp_path):
    checkpoint.save(tmp_path, saved(1))
    path = adapter_path(tmp_path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(CheckpointError, match="does not match the SHA-256 recorded in") as err:
        checkpoint.load(tmp_path)
    assert str(err.value).startswith(f"no usable checkpoint in {tmp_path}: {path}: ")


@pytest.mark.parametrize("content", [b"", b"garbage", b"\x08\x00\x00\x00\x00\x00\x00\x00{}", b"\xff" * 64])
def test_garbage_adapter_without_a_recorded_hash_is_refused_by_name(tmp_path, content):
    checkpoint.save(tmp_path, saved(1))
    edit_state(tmp_path, adapter=...)  # as older versions wrote it
    adapter_path(tmp_path).write_bytes(content)
    with pytest.raises(CheckpointError, match="not a readable safetensors file|holds no tensors") as err:
        checkpoint.load(tmp_path)
    assert f"{adapter_path(tmp_path)}: " in str(err.value)


def test_missing_adapter_is_refused_where_the_mode_keeps_one(tmp_path):
    checkpoint.save(tmp_path, saved(1))
    adapter_path(tmp_path).unlink()
    with pytest.raises(CheckpointError, match="global.safetensors: missing; strategy.mode = 'fedavg' needs the "
                                              "global adapter"):
        checkpoint.load(tmp_path)


def test_sapo_keeps_no_adapter_and_refuses_one(tmp_path):
    checkpoint.save(tmp_path, saved(1, config=SAPO, protocol={"sapo_pool": []}))
    assert checkpoint.load(tmp_path).master is None
    save_file(adapter(), str(adapter_path(tmp_path)))
    with pytest.raises(CheckpointError, match="global.safetensors: unexpected; strategy.mode = 'sapo' keeps no "
                                              "global adapter"):
        checkpoint.load(tmp_path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_adapter_is_refused(tmp_path, bad):
    master = adapter()
    master["a.lora_B.weight"][1, 1] = bad
    checkpoint.save(tmp_path, saved(1, master=master))
    with pytest.raises(CheckpointError, match="tensor a.lora_B.weight holds non-finite values"):
        checkpoint.load(tmp_path)


def test_adapter_with_a_missing_key_or_other_shape_is_refused(tmp_path):
    checkpoint.save(tmp_path, saved(1))
    path = adapter_path(tmp_path)
    save_file({"a.lora_A.weight": np.zeros((2, 3), np.float32)}, str(path))
    edit_state(tmp_path, adapter={"sha256": checkpoint._sha256(path),  # consistent hash, one key short
                                  "shapes": {"a.lora_A.weight": [2, 3], "a.lora_B.weight": [3, 2]}})
    with pytest.raises(CheckpointError, match=r"adapter keys differ from the model's: missing \['a.lora_B.weight'\]"):
        checkpoint.load(tmp_path)
    save_file({"a.lora_A.weight": np.zeros((2, 3), np.float32), "a.lora_B.weight": np.zeros((2, 2), np.float32)},
              str(path))
    edit_state(tmp_path, adapter={"sha256": checkpoint._sha256(path),
                                  "shapes": {"a.lora_A.weight": [2, 3], "a.lora_B.weight": [3, 2]}})
    with pytest.raises(CheckpointError, match=r"tensor a.lora_B.weight has shape \(2, 2\), expected \(3, 2\)"):
        checkpoint.load(tmp_path)


def test_corrupt_latest_falls_back_to_the_previous_checkpoint_with_a_warning(tmp_path, caplog):
    checkpoint.save(tmp_path, saved(1))
    checkpoint.save(tmp_path, saved(2))
    adapter_path(tmp_path).write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        loaded = checkpoint.load(tmp_path)
    assert loaded.round == 1 and loaded.source == tmp_path / "checkpoint.prev"
    assert float(loaded.master["a.lora_A.weight"][0, 0]) == 1.0
    text = caplog.text
    assert f"{adapter_path(tmp_path)}: content does not match the SHA-256" in text
    assert "resuming from the older checkpoint" in text and "(round 1)" in text


def test_every_checkpoint_corrupt_names_each_file(tmp_path):
    checkpoint.save(tmp_path, saved(1))
    checkpoint.save(tmp_path, saved(2))
    state_path(tmp_path).write_text("{")
    state_path(tmp_path, "checkpoint.prev").write_text('{"round": "one"}')
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(tmp_path)
    assert f"{state_path(tmp_path)}: not valid JSON" in str(err.value)
    assert f"{state_path(tmp_path, 'checkpoint.prev')}: round: expected `int`, got `str`" in str(err.value)


def _runner(cfg, model_adapter=None):
    from pubswap_flwr.protocols import protocol_class
    from pubswap_flwr.server.runner import Runner

    evaluator = (None if model_adapter is None
                 else SimpleNamespace(policy=SimpleNamespace(adapter=lambda: model_adapter)))
    protocol = protocol_class(cfg.strategy.mode).from_config(cfg)
    runner = Runner(cfg, recorder=None, protocol=protocol, evaluator=evaluator)
    runner.exchange = SimpleNamespace(node_index={}, accepted_round={})
    return runner


def test_restore_checks_the_adapter_against_the_model_and_names_the_file(tmp_path):

    cfg = ExperimentConfig.from_flat(FEDAVG)
    checkpoint.save(tmp_path, saved(2, node_index={9: 0}, node_rounds={0: 2}))
    loaded = checkpoint.load(tmp_path)
    model = {k: np.zeros_like(v) for k, v in adapter().items()}
    runner = _runner(cfg, model)
    assert runner._restore(loaded) == 2
    assert (runner.exchange.node_index, runner.exchange.accepted_round) == ({9: 0}, {0: 2})
    model["a.lora_C.weight"] = np.zeros(1)
    with pytest.raises(CheckpointError, match=rf"{adapter_path(tmp_path)}: adapter keys differ from the model's: "
                                              r"missing \['a.lora_C.weight'\]"):
        _runner(cfg, model)._restore(loaded)


def test_bad_protocol_state_is_refused_on_load_and_on_restore_naming_the_file(tmp_path):
    """load tries the protocol's restore, so a checkpoint.prev can still be used; the runner's restore says the same
    of a checkpoint that got past it."""

    flat = ExperimentConfig.from_flat({"run-name": "x", "strategy.mode": "sapo"}).to_flat()
    bad = {"sapo_pool": [{"sender": "00000-7"}]}
    checkpoint.save(tmp_path, saved(1, config=flat, protocol=bad, node_index={7: 0}))
    with pytest.raises(CheckpointError, match=rf"{state_path(tmp_path)}: 'protocol' state cannot be restored "
                                              r"\(ValueError: sapo_pool packet 0: object missing required field "
                                              r"`item`"):
        checkpoint.load(tmp_path)
    loaded = ServerCheckpoint(1, flat, node_index={7: 0}, protocol=bad, source=tmp_path / "checkpoint")
    with pytest.raises(CheckpointError, match=rf"{state_path(tmp_path)}: 'protocol' state cannot be restored "
                                              r"\(ValueError"):
        _runner(ExperimentConfig.from_flat(flat))._restore(loaded)


def _context(run_config: dict):
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


def test_a_failed_resume_marks_the_run_failed_in_status_json(tmp_path):
    from pubswap_flwr.server import app as server

    config = {"output.dir": str(tmp_path), "run-name": "cut", "resume": True}
    run = tmp_path / "cut"
    flat = ExperimentConfig.from_flat(config).to_flat()
    checkpoint.save(run, saved(1, config={**flat, "resume": False}, master=adapter()))
    adapter_path(run).write_bytes(b"garbage")
    (run / "status.json").write_text(json.dumps({"status": "running", "detail": ""}))
    with pytest.raises(CheckpointError):
        server.run(None, _context(config))
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed"
    assert status["detail"].startswith(f"resume: CheckpointError: no usable checkpoint in {run}: "
                                       f"{adapter_path(run)}: content does not match")


def test_a_resume_with_another_config_or_no_checkpoint_marks_the_run_failed(tmp_path):
    from pubswap_flwr.server import app as server

    config = {"output.dir": str(tmp_path), "run-name": "cut", "resume": True}
    run = tmp_path / "cut"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": "running", "detail": ""}))
    with pytest.raises(FileNotFoundError):
        server.run(None, _context(config))
    assert json.loads((run / "status.json").read_text())["detail"].startswith(
        f"resume: FileNotFoundError: resume = true but {run} has no checkpoint")
    checkpoint.save(run, saved(1, config=ExperimentConfig.from_flat({**config, "seed": 4}).to_flat(),
                               master=adapter()))
    with pytest.raises(ValueError, match="changed keys: seed"):
        server.run(None, _context(config))
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "changed keys: seed" in status["detail"]


def test_a_run_resumed_from_a_corrupt_checkpoint_repeats_the_uninterrupted_metrics(tmp_path):
    from pubswap_flwr.server.metrics import read_metrics
    from pubswap_flwr.simulation import simulate_in_process
    from tests.golden.runs import comparable

    config = {"seed": 5, "train.prompts-per-step": 1, "train.completions-per-prompt": 2, "eval.items-per-task": 1,
              "train.local-steps": 1, "num-server-rounds": 3, "eval.sampled": False, "tasks.mix": "gcd:1",
              "tasks.per-node": 0, "output.dir": str(tmp_path),
              "strategy.apply-below-robust": True}  # 2 nodes: below the robust minimum (#54 class 4)
    simulate_in_process({**config, "run-name": "full"}, 2)
    simulate_in_process({**config, "run-name": "cut"}, 2)
    adapter_path(tmp_path / "cut").write_bytes(b"\x00" * 100)  # the round-3 checkpoint is lost
    simulate_in_process({**config, "run-name": "cut", "resume": True}, 2)  # round 3 again, from round 2's
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["round"] for r in cut] == [0, 1, 2, 3]
    assert comparable(full) == comparable(cut)
    assert json.loads((tmp_path / "cut" / "status.json").read_text())["status"] == "completed"
    assert checkpoint.load(tmp_path / "cut").round == 3


def test_a_checkpoint_older_than_a_key_resumes_only_with_that_keys_first_default():
    """tasks.partial-credit was added with default true and later defaulted to false: a checkpoint written before the
    key existed trained on graded rewards, so it resumes with true and is refused with the new default."""
    from pubswap_flwr.config import ConfigError

    old = {k: v for k, v in FEDAVG.items() if k != "tasks.partial-credit"}
    saved_old = checkpoint.ServerCheckpoint(1, old)
    checkpoint.check_compatible(saved_old, ExperimentConfig.from_flat({**old, "tasks.partial-credit": True}))
    with pytest.raises(ConfigError, match="changed keys: tasks.partial-credit"):
        checkpoint.check_compatible(saved_old, ExperimentConfig.from_flat(old))


def test_a_protocols_other_adapters_round_trip_with_their_manifest(tmp_path):
    checkpoint.save(tmp_path, saved(2, adapters={"downlink": adapter(0.25)}))
    loaded = checkpoint.load(tmp_path)
    assert list(loaded.adapters) == ["downlink"]
    assert {k: v.tolist() for k, v in loaded.adapters["downlink"].items()} == {
        k: v.tolist() for k, v in adapter(0.25).items()}
    manifest = json.loads(state_path(tmp_path).read_text())["adapters"]["downlink"]
    assert manifest["shapes"] == {"a.lora_A.weight": [2, 3], "a.lora_B.weight": [3, 2]}
    assert (tmp_path / "checkpoint" / "downlink.safetensors").is_file()


@pytest.mark.parametrize("name", ["global", "../x", "Downlink", ""])
def test_an_other_adapter_needs_a_plain_name_that_is_not_the_globals(tmp_path, name):
    with pytest.raises(ValueError, match="adapter's name must match"):
        checkpoint.save(tmp_path, saved(1, adapters={name: adapter()}))
    assert not (tmp_path / "checkpoint").exists()


def test_a_corrupt_other_adapter_is_refused_naming_its_file(tmp_path):
    checkpoint.save(tmp_path, saved(1, adapters={"downlink": adapter()}))
    path = tmp_path / "checkpoint" / "downlink.safetensors"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="downlink.safetensors: content does not match the SHA-256"):
        checkpoint.load(tmp_path)
    path.unlink()
    with pytest.raises(CheckpointError, match="downlink.safetensors: missing"):
        checkpoint.load(tmp_path)


def test_an_other_adapter_must_fit_the_global(tmp_path):
    other = {"a.lora_A.weight": np.zeros((2, 3), dtype=np.float32)}  # lora_B missing
    checkpoint.save(tmp_path, saved(1, adapters={"downlink": other}))
    with pytest.raises(CheckpointError, match=r"downlink.safetensors: adapter keys differ from the global's: "
                                              r"missing \['a.lora_B"):
        checkpoint.load(tmp_path)


@pytest.mark.parametrize("listed, message", [
    ([], "adapters: expected `object`, got `array`"),
    ({"../global": {}}, "adapters (a key): expected `str` matching regex '^[a-z][a-z0-9_-]{0,31}\\\\Z'"),
    ({"global": {"sha256": "0" * 64, "shapes": {}}}, "'adapters' names 'global', not an adapter name"),
    ({"downlink": None}, "adapters[...]: expected `object`, got `null`"),
    ({"downlink": {"sha256": 1}}, "adapters[...].sha256: expected `str`, got `int`"),
])
def test_a_bad_adapters_listing_is_refused(tmp_path, listed, message):
    checkpoint.save(tmp_path, saved(1, adapters={"downlink": adapter()}))
    edit_state(tmp_path, adapters=listed)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(tmp_path)
    assert str(err.value).endswith(f"{state_path(tmp_path)}: {message}")


def test_the_downlink_is_restored_from_the_latest_checkpoint_only(tmp_path, caplog):
    """From checkpoint.prev nodes may hold a later global than the saved downlink's: it restarts with whole globals."""

    cfg = ExperimentConfig.from_flat({**FEDAVG, "strategy.compression": "int8"})
    for number in (1, 2):
        checkpoint.save(tmp_path, saved(number, config=cfg.to_flat(), master=adapter(number),
                                        protocol={"downlink_holders": [7]}, adapters={"downlink": adapter(0.25)}))
    model = {k: np.zeros_like(v) for k, v in adapter().items()}
    latest = _runner(cfg, model)
    latest._restore(checkpoint.load(tmp_path))
    assert latest.protocol.broadcast.holders == {7} and latest.protocol.broadcast.current is not None
    adapter_path(tmp_path).write_bytes(b"\x00" * 10)  # the latest is lost: checkpoint.prev
    older = _runner(cfg, model)
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        assert older._restore(checkpoint.load(tmp_path)) == 1
    assert older.protocol.broadcast.current is None  # whole globals next round
    assert "the compressed downlink restarts with whole globals" in caplog.text


def test_a_resume_may_change_the_decode_step_but_not_how_evaluation_batches_are_split():
    from pubswap_flwr.config import ConfigError

    saved_run = checkpoint.ServerCheckpoint(1, {k: v for k, v in FEDAVG.items() if k != "generation.decode-step"})
    checkpoint.check_compatible(saved_run, ExperimentConfig.from_flat({**FEDAVG, "generation.decode-step": False}))
    with pytest.raises(ConfigError, match="changed keys: eval.batch-size, eval.workers"):  # bf16 draws depend on both
        checkpoint.check_compatible(saved_run, ExperimentConfig.from_flat({**FEDAVG, "eval.batch-size": 8,
                                                                          "eval.workers": 2}))
