"""Experiment trackers for `output.report-to`: every metrics row under the names metrics.jsonl uses, clients by
index."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .. import metrics_schema as schema
from ..config import ConfigError, ExperimentConfig
from ..config.sections import REPORT_TO
from ..registry import Registry

log = logging.getLogger("pubswap_flwr")

SEPARATOR = "/"  # eval.greedy_accuracy in metrics.jsonl is "eval/greedy_accuracy" in a tracker
SKIPPED = (schema.ROUND, schema.MODE)  # the step, and a label


class TrackerUnavailable(ConfigError):
    """output.report-to names a backend whose package is not installed."""


def scalars(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The row's finite numbers, keyed by their path in the JSON row joined with "/" (booleans, text, lists and
    nulls are left out; `round` is the step)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if not prefix and key in SKIPPED:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, name + SEPARATOR))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


def by_node_index(row: Any, node_index: Mapping[int, int]) -> Any:
    """The row with every per-node table (clients, dropped, node_eval) keyed `node-<index>` instead of by Flower's
    node id: Flower draws new random ids for every run, so a client's curves line up across runs only by its index.
    `node_index` maps Flower node ids to indices (the exchange's); a client entry's own `node_index` also counts."""
    names = {str(node): f"node-{index}" for node, index in node_index.items()}
    if isinstance(row, dict) and isinstance(row.get(schema.CLIENTS), dict):
        names.update({str(node): f"node-{entry[schema.NODE_INDEX]}" for node, entry in row[schema.CLIENTS].items()
                      if isinstance(entry, dict) and isinstance(entry.get(schema.NODE_INDEX), int)})
    return _renamed(row, names)


def _renamed(value: Any, names: dict[str, str]) -> Any:
    if not isinstance(value, dict):
        return value
    keyed_by_node = bool(value) and all(str(key) in names for key in value)
    return {names[str(k)] if keyed_by_node else k: _renamed(v, names) for k, v in value.items()}


class Tracker:
    """`output.report-to = "none"`: logs nothing. Backends override `log` and `close`."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Metrics of round `step`."""

    def close(self, status: str) -> None:
        """The run ended `completed` or `failed`; called once."""


@dataclass(frozen=True)
class Backend:
    module: str  # what must be importable
    extra: str  # the project's pip extra that installs it
    make: Callable[[Path, ExperimentConfig], Tracker]


BACKENDS: Registry[Backend] = Registry("tracker backend")


def backend(name: str, module: str, extra: str):
    """Registers a tracker class under an `output.report-to` value."""

    def wrap(cls):
        BACKENDS.add(name, Backend(module, extra, cls))
        return cls

    return wrap


def check(name: str) -> None:
    """Raises TrackerUnavailable (a one-line ConfigError) when `name`'s package is not installed. Run it where the
    server's config is checked: nodes never track, so they need none of these packages."""
    if name == "none":
        return
    if name not in BACKENDS:
        raise ConfigError(f"output.report-to = {name!r}: must be one of {', '.join(map(repr, REPORT_TO))}")
    entry = BACKENDS[name]
    if importlib.util.find_spec(entry.module) is None:
        raise TrackerUnavailable(f"output.report-to = {name!r} needs the {entry.module} package, which is not "
                                 f"installed: pip install -e '.[{entry.extra}]' (the project's {entry.extra} extra)")


def open_tracker(cfg: ExperimentConfig, run_dir: Path) -> Tracker:
    """The configured tracker for the run in `run_dir` (a no-op one for "none")."""
    name = cfg.output.report_to
    check(name)
    if name == "none":
        return Tracker()
    tracker = BACKENDS[name].make(run_dir, cfg)
    log.info("reporting metrics to %s (%s)", name, tracker)
    return tracker


@backend("tensorboard", module="tensorboard", extra="tensorboard")
class TensorBoardTracker(Tracker):
    """Event files in <run dir>/tensorboard (`tensorboard --logdir runs`); the config as a text summary."""

    def __init__(self, run_dir: Path, cfg: ExperimentConfig):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        table = "\n".join(f"| {k} | {v!r} |" for k, v in cfg.to_flat().items())
        self.writer.add_text("config", f"run {run_dir.name}\n\n| key | value |\n|---|---|\n{table}", global_step=0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.add_text("status", status, global_step=0)
        self.writer.close()

    def __str__(self) -> str:
        return f"event files in {self.log_dir}"


@backend("wandb", module="wandb", extra="wandb")
class WandbTracker(Tracker):
    """A W&B run named after the run directory, its files under <run dir>/wandb. W&B's own environment applies:
    WANDB_MODE=offline writes an offline run (`wandb sync` uploads it later), WANDB_PROJECT names the project
    (default pubswap-flwr), WANDB_ENTITY, WANDB_RUN_GROUP."""

    def __init__(self, run_dir: Path, cfg: ExperimentConfig):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "pubswap-flwr", name=run_dir.name,
                              dir=str(run_dir), config=cfg.to_flat(),
                              tags=[cfg.strategy.mode], settings=wandb.Settings(console="off", silent=True))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)
        self.wandb.teardown()  # stops W&B's service process, which is when the run file is complete on disk

    def __str__(self) -> str:
        return f"W&B run {self.run.id} in {self.run.dir}"


MLFLOW_CONFIGURES = ("alembic", "sqlalchemy.engine", "huey")  # loggers `import mlflow` gives handlers of its own


@contextlib.contextmanager
def _loggers_kept(*names: str) -> Iterator[None]:
    """Restores these loggers' level, handlers and propagation afterwards: importing MLflow gives alembic's and
    SQLAlchemy's loggers handlers of its own that would bypass the process's logging setup."""
    loggers = [logging.getLogger(name) for name in names]
    saved = [(lg.level, list(lg.handlers), lg.propagate) for lg in loggers]
    try:
        yield
    finally:
        for lg, (level, handlers, propagate) in zip(loggers, saved):
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate


MLFLOW_PARAM_CHARS = 6000  # MLflow refuses longer parameter values
MLFLOW_BATCH_METRICS = 1000  # and more metrics or parameters per log_batch call
MLFLOW_BATCH_PARAMS = 100


@backend("mlflow", module="mlflow", extra="mlflow")
class MlflowTracker(Tracker):
    """An MLflow run named after the run directory. The store is $MLFLOW_TRACKING_URI, else the local SQLite file
    <output.dir>/mlflow.db shared by every run under output.dir (`mlflow ui --backend-store-uri sqlite:///...`;
    MLflow 3 refuses its old ./mlruns file store unless told to); the experiment is $MLFLOW_EXPERIMENT_NAME, else
    pubswap-flwr."""

    def __init__(self, run_dir: Path, cfg: ExperimentConfig):
        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir.parent / 'mlflow.db'}"
        with warnings.catch_warnings(), _loggers_kept(*MLFLOW_CONFIGURES):
            warnings.simplefilter("ignore", DeprecationWarning)  # SQLAlchemy deprecations inside MLflow's store
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # schema creation notes
            self.client = MlflowClient(tracking_uri=self.uri)
            experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "pubswap-flwr"
            experiment = self.client.get_experiment_by_name(experiment_name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
            self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name, tags={
                "mode": cfg.strategy.mode, "run-dir": str(run_dir)}).info.run_id
        params = [Param(k, str(v)[:MLFLOW_PARAM_CHARS]) for k, v in cfg.to_flat().items()]
        for start in range(0, len(params), MLFLOW_BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=params[start:start + MLFLOW_BATCH_PARAMS])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(key, value, stamp, step) for key, value in metrics.items()]
        for start in range(0, len(batch), MLFLOW_BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=batch[start:start + MLFLOW_BATCH_METRICS])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if status == "completed" else "FAILED")

    def __str__(self) -> str:
        return f"MLflow run {self.run_id} in {self.uri}"

