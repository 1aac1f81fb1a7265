"""output.report-to: the metric names, a missing package's one-line error, and each backend's files read back."""

from __future__ import annotations

import glob
import importlib.util
import struct

import pytest

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.config.sections import REPORT_TO
from pubswap_flwr.server import trackers

ROWS = [
    {"round": 0, "mode": "fedavg", "eval": {"greedy_accuracy": 0.25, "per_task": {"gcd": {"greedy_accuracy": 0.5}}}},
    {"round": 1, "mode": "fedavg", "train_reward": 0.375, "cumulative_reward": 0.375,
     "eval": {"greedy_accuracy": 0.5, "sampled_accuracy": 0.25, "per_task": {"gcd": {"greedy_accuracy": 0.75}}},
     "clients": {"17": {"train_reward": 0.5, "model": "embedded:tiny", "tasks": ["gcd"]}},
     "dropped": {"18": "timeout"}, "aggregated": True, "parameter_drift": None, "time": {"round_s": 2.0}},
    {"round": 2, "mode": "fedavg", "train_reward": 0.5, "cumulative_reward": 0.875,
     "eval": {"greedy_accuracy": 0.625, "sampled_accuracy": 0.5, "per_task": {"gcd": {"greedy_accuracy": 1.0}}},
     "time": {"round_s": 3.0}},
]


def test_scalars_are_the_rows_numbers_under_their_json_paths():
    assert trackers.scalars(ROWS[1]) == {
        "train_reward": 0.375, "cumulative_reward": 0.375, "eval/greedy_accuracy": 0.5, "eval/sampled_accuracy": 0.25,
        "eval/per_task/gcd/greedy_accuracy": 0.75, "clients/17/train_reward": 0.5, "time/round_s": 2.0}


def test_clients_are_named_by_node_index_not_by_flowers_random_node_id():
    row = {**ROWS[1], "clients": {"8812734": {"train_reward": 0.5, "node_index": 1},
                                  "553": {"train_reward": 0.25, "node_index": 0}},
           "dropped": {"90210": "timeout"}, "node_eval": {"8812734": {"greedy_accuracy": 0.5}}}
    named = trackers.scalars(trackers.by_node_index(row, {90210: 2}))
    assert named["clients/node-1/train_reward"] == 0.5 and named["clients/node-0/train_reward"] == 0.25
    assert named["node_eval/node-1/greedy_accuracy"] == 0.5
    assert not any(part.isdigit() for key in named for part in key.split("/"))
    # SAPO's round 0 (the nodes' starting points) lists no clients: the exchange's ids -> indices name them
    row0 = {"round": 0, "mode": "sapo", "node_eval": {"8812734": {"greedy_accuracy": 0.25}}}
    assert trackers.scalars(trackers.by_node_index(row0, {8812734: 1})) == {"node_eval/node-1/greedy_accuracy": 0.25}
    # a table that is not keyed by nodes keeps its keys, even ones that look like ids
    assert trackers.by_node_index({"round": 1, "per_task": {"553": 1.0, "gcd": 0.5}}, {553: 0})["per_task"] == {
        "553": 1.0, "gcd": 0.5}


def test_the_registry_serves_every_configured_backend():
    assert set(trackers.BACKENDS) | {"none"} == set(REPORT_TO)
    assert ExperimentConfig().output.report_to == "none"


def test_an_unknown_backend_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^output.report-to = 'comet': must be one of 'none', 'tensorboard'"):
        ExperimentConfig.from_flat({"output.report-to": "comet"})


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow"])
def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch, name):
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda module: None)
    with pytest.raises(trackers.TrackerUnavailable) as info:
        trackers.check(name)
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == (f"output.report-to = {name!r} needs the {name} package, which is not installed: "
                               f"pip install -e '.[{name}]' (the project's {name} extra)")
    cfg = ExperimentConfig.from_flat({"output.report-to": name})  # nodes check no tracker: they never track
    with pytest.raises(trackers.TrackerUnavailable):
        trackers.open_tracker(cfg, None)


def test_none_tracks_nothing(tmp_path):
    tracker = trackers.open_tracker(ExperimentConfig(), tmp_path)
    tracker.log(1, {"train_reward": 1.0})
    tracker.close("completed")
    assert list(tmp_path.iterdir()) == []


def _log_rows(tmp_path, name):
    run_dir = tmp_path / "runs" / "fedavg-s0-x"
    run_dir.mkdir(parents=True)
    cfg = ExperimentConfig.from_flat({"output.report-to": name, "train.local-steps": 3})
    tracker = trackers.open_tracker(cfg, run_dir)
    for row in ROWS:
        tracker.log(row["round"], trackers.scalars(row))
    tracker.close("completed")
    return run_dir


def test_tensorboard_event_files_hold_every_round(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _log_rows(tmp_path, "tensorboard")
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    greedy = [(e.step, e.value) for e in events.Scalars("eval/greedy_accuracy")]
    assert greedy == [(0, 0.25), (1, 0.5), (2, 0.625)]
    assert [(e.step, e.value) for e in events.Scalars("eval/per_task/gcd/greedy_accuracy")] == \
        [(0, 0.5), (1, 0.75), (2, 1.0)]
    assert [(e.step, e.value) for e in events.Scalars("cumulative_reward")] == [(1, 0.375), (2, 0.875)]
    assert "clients/17/train_reward" in events.Tags()["scalars"]
    assert not any(tag.startswith(("round", "mode", "aggregated", "dropped")) for tag in events.Tags()["scalars"])


def _wandb_records(path):
    """The records of a W&B run file: a LevelDB-style log (7-byte header, 32 KiB blocks of CRC/length/type-framed
    chunks); W&B 0.31 ships no reader for it in Python."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    position, pending, block = 7, b"", 32768
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + 7])
        position += 7
        chunk, position = data[position:position + length], position + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def test_wandb_offline_run_folder_holds_every_round(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from wandb.proto import wandb_internal_pb2

    for variable, value in {"WANDB_MODE": "offline", "WANDB_PROJECT": "pubswap-test", "WANDB_SILENT": "true",
                            "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                            "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
                            "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}.items():
        monkeypatch.setenv(variable, value)
    run_dir = _log_rows(tmp_path, "wandb")
    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config, exit_code = [], {}, None
    for data in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = record.history.item  # W&B 0.31 files every key as nested_key
            history.append({item.key or "/".join(item.nested_key): item.value_json for item in items})
        elif kind == "run":
            config.update({item.key: item.value_json for item in record.run.config.update})
            assert record.run.display_name == "fedavg-s0-x" and record.run.project == "pubswap-test"
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert [int(h["_step"]) for h in history] == [0, 1, 2]
    assert [float(h["eval/greedy_accuracy"]) for h in history] == [0.25, 0.5, 0.625]
    assert float(history[2]["cumulative_reward"]) == 0.875 and "cumulative_reward" not in history[0]
    assert config["train.local-steps"] == "3" and config["strategy.mode"] == '"fedavg"'
    assert exit_code == 0


def _needs_mlflow():
    if importlib.util.find_spec("mlflow") is None:  # not importorskip: importing MLflow reconfigures logging
        pytest.skip("the mlflow extra is not installed")


def test_mlflow_store_holds_every_round_and_the_config(tmp_path, monkeypatch):
    _needs_mlflow()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    run_dir = _log_rows(tmp_path, "mlflow")
    store = run_dir.parent / "mlflow.db"
    assert store.is_file()
    with trackers._loggers_kept(*trackers.MLFLOW_CONFIGURES):  # as the tracker keeps them
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{store}")
        (run,) = client.search_runs([client.get_experiment_by_name("pubswap-flwr").experiment_id])
    assert run.info.run_name == "fedavg-s0-x" and run.info.status == "FINISHED"
    assert run.data.params["train.local-steps"] == "3" and run.data.params["output.report-to"] == "mlflow"
    history = client.get_metric_history(run.info.run_id, "eval/greedy_accuracy")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.25), (1, 0.5), (2, 0.625)]
    per_task = client.get_metric_history(run.info.run_id, "eval/per_task/gcd/greedy_accuracy")
    assert sorted((m.step, m.value) for m in per_task) == [(0, 0.5), (1, 0.75), (2, 1.0)]


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_pubswap_stops_on_a_missing_tracker_package_with_one_line_before_flower_starts(monkeypatch, capsys, command):
    from pubswap_flwr.cli import main

    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    assert main([command, "-c", "output.report-to='wandb' num-server-rounds=1"]) == 2
    assert capsys.readouterr().err == ("error: output.report-to = 'wandb' needs the wandb package, which is not "
                                       "installed: pip install -e '.[wandb]' (the project's wandb extra)\n")


def test_mlflow_leaves_the_processs_logging_of_alembic_and_sqlalchemy_as_it_was(tmp_path, monkeypatch):
    _needs_mlflow()
    import logging

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = {name: (lg.level, list(lg.handlers), lg.propagate)
              for name, lg in ((n, logging.getLogger(n)) for n in ("alembic", "sqlalchemy.engine"))}
    _log_rows(tmp_path, "mlflow")
    assert {name: (lg.level, list(lg.handlers), lg.propagate)
            for name, lg in ((n, logging.getLogger(n)) for n in before)} == before
