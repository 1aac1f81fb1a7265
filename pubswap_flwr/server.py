"""ServerApp main: read the config once, set up the run directory and the global evaluator, run the strategy."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid

from . import checkpoint
from .config import ExperimentConfig
from .evaluation import evaluate
from .metrics import RunRecorder, route_logs_to_flower
from .node import derive_seed, policy_spec, task_universe
from .policy import Policy
from .strategy import PubSwapStrategy
from .wire import adapter_record

log = logging.getLogger("pubswap_flwr")


class GlobalEvaluator:
    """The server's copy of the base model: initialises, evaluates and saves the global adapter (PEFT format)."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        self.policy = Policy(policy_spec(cfg))
        self.items = task_universe(cfg).held_out.items

    def initial_adapter(self) -> dict[str, np.ndarray]:
        self.policy.reset(derive_seed(self.cfg.seed, "global-init"))
        return {k: v.numpy() for k, v in self.policy.adapter().items()}

    def _load(self, master: dict[str, np.ndarray]) -> None:
        self.policy.load_adapter({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in master.items()})

    def evaluate(self, master: dict[str, np.ndarray]) -> dict:
        self._load(master)
        e = self.cfg.eval
        return evaluate(self.policy, self.items, sampled=e.sampled, batch_size=e.batch_size, seed=self.cfg.seed,
                        max_chars=self.cfg.generation.max_completion_chars)

    def save(self, master: dict[str, np.ndarray], directory: Path) -> None:
        """adapter_config.json + adapter_model.safetensors, loadable with PeftModel.from_pretrained(base, dir)."""
        self._load(master)
        self.policy.model.save_pretrained(str(directory))


def run(grid: Grid, context: Context) -> None:
    """The whole run: config → run dir → strategy rounds → final status."""
    route_logs_to_flower()
    cfg = ExperimentConfig.from_flat(context.run_config)  # stops the run at start on a bad key or value
    torch.manual_seed(cfg.seed)
    run_dir = cfg.run_dir(context.run_id)
    saved = None
    if cfg.resume:
        saved = checkpoint.load(run_dir)
        if saved is None:
            raise FileNotFoundError(f"resume = true but {run_dir} has no checkpoint to continue from")
        checkpoint.check_compatible(saved, cfg)
    recorder = RunRecorder(run_dir, cfg, context.run_id, resume_after=saved.round if saved else None)
    log.info("pubswap-flwr run %s: mode %s, outputs in %s", context.run_id, cfg.strategy.mode, run_dir)
    started = time.time()
    try:
        universe = task_universe(cfg)
        evaluator = None if cfg.strategy.mode == "sapo" else GlobalEvaluator(cfg)
        initial = adapter_record(evaluator.initial_adapter()) if evaluator else ArrayRecord()
        strategy = PubSwapStrategy(cfg, recorder, evaluator, universe.public, resume_from=saved)
        strategy.start(grid, initial, num_rounds=cfg.num_server_rounds, timeout=cfg.strategy.timeout)
    except BaseException as err:
        recorder.write_status("failed", f"{type(err).__name__}: {err}")
        raise
    recorder.write_status("completed", f"{cfg.num_server_rounds} rounds in {time.time() - started:.1f} s")
    log.info("run finished in %.1f s; metrics: %s", time.time() - started, recorder.metrics_path)

