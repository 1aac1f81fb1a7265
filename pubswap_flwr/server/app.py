"""ServerApp main: read the config once, set up the run directory, the global evaluator and the mode's protocol,
and run the rounds."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context
from flwr.serverapp import Grid
from flwr.supercore.exit import add_exit_handler

from .. import metrics_schema as schema
from .. import provenance
from ..config import ConfigError, ExperimentConfig
from ..evaluation import ProgressLog, duration, evaluate
from ..interruption import INTERRUPTED_DETAIL, check_interrupted
from ..logs import route_logs_to_flower
from ..policy import Policy
from ..policy.threads import apply_threads
from ..protocols import run_protocol
from ..shared import derive_seed, eval_settings, policy_spec, task_universe
from ..tasks.rewards import parse_rewards
from . import checkpoint, preflight
from .metrics import STOPPED, RunRecorder, final_adapters, write_status
from .runner import Runner

log = logging.getLogger("pubswap_flwr")


class GlobalEvaluator:
    """The server's copy of the base model: initialises, evaluates and saves the global adapter (PEFT format)."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        apply_threads(cfg.model.threads)  # evaluation runs between rounds, while the clients wait
        started = time.monotonic()
        log.info("preparing the server's model %s (a packaged model converts once on first use)", cfg.model.name)
        self.policy = Policy(policy_spec(cfg))
        universe = task_universe(cfg)
        self.items = universe.held_out.items
        self.harder_items = universe.harder.items if universe.harder is not None else []  # eval.harder-tier
        log.info("server's model ready in %s; held-out evaluation: %d items%s", duration(time.monotonic() - started),
                 len(self.items), f" and {len(self.harder_items)} of the harder tier" if self.harder_items else "")

    def initial_adapter(self) -> dict[str, np.ndarray]:
        """A fresh adapter from the run seed, rounded through fp16: the global adapter starts as exactly what the
        clients receive (adapters travel as fp16)."""
        self.policy.reset(derive_seed(self.cfg.seed, "global-init"))
        return {k: v.numpy().astype(np.float16).astype(np.float32) for k, v in self.policy.adapter().items()}

    def _load(self, master: dict[str, np.ndarray]) -> None:
        self.policy.load_adapter({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in master.items()})

    def evaluate(self, master: dict[str, np.ndarray]) -> dict:
        """The held-out metrics; with eval.harder-tier the harder tier's beside them under HARDER_TIER, each with its
        per-item results (ITEM_RESULTS, which the runner moves to eval_items.jsonl)."""
        self._load(master)
        result = self._evaluate(self.items, "held-out evaluation")
        if self.harder_items:
            result[schema.HARDER_TIER] = self._evaluate(self.harder_items, "harder-tier evaluation")
        return result

    def _evaluate(self, items, what: str) -> dict:
        return evaluate(self.policy, items, eval_settings(self.cfg.eval, self.cfg.generation, self.cfg.seed),
                        rewards=parse_rewards(self.cfg.tasks.rewards), progress=self._progress(what))

    @staticmethod
    def _progress(what: str = "held-out evaluation"):
        """Progress lines with an ETA; each batch also checks for a Ctrl-C (an evaluation may take many minutes)."""
        lines = ProgressLog(what)

        def progress(evaluation_pass: str, done: int, total: int) -> None:
            check_interrupted()
            lines(evaluation_pass, done, total)

        return progress

    def save(self, master: dict[str, np.ndarray], directory: Path, tokenizer: bool = False) -> None:
        """adapter_config.json (portable base-model reference) + adapter_model.safetensors, loadable with
        PeftModel.from_pretrained(base, dir); with `tokenizer`, the tokenizer too (export.save_adapter)."""
        from ..export import save_adapter

        self._load(master)
        save_adapter(self.policy, directory, tokenizer=tokenizer)


def _checked_config(flat) -> ExperimentConfig:
    try:
        return preflight.check(flat, run_dir=False).config  # as `pubswap run | simulate` check it
    except ConfigError as err:
        log.error("%s", preflight.one_line(err))  # one line above Flower's traceback of the failed ServerApp
        raise


def run(grid: Grid, context: Context, settle_seconds: float = 1.0) -> None:
    """The whole run: config → run dir → protocol rounds → final status."""
    route_logs_to_flower()
    # First, as `pubswap run | simulate` do before starting Flower: the config and the run directory.
    cfg = _checked_config(context.run_config)
    run_dir = cfg.run_dir(context.run_id)
    try:
        saved = preflight.check_run_dir(cfg, run_dir)
    except Exception as err:  # re-raised: logged as one line, and a failed resume marks its run failed
        log.error("%s", preflight.one_line(err))
        if cfg.resume and run_dir.is_dir():  # the interrupted run's status.json still says "running"
            write_status(run_dir, "failed", f"resume: {type(err).__name__}: {err}")
        raise
    finished = preflight.already_finished(cfg, run_dir, saved)
    if finished:
        log.info("%s", finished)
        return
    claim = None
    if cfg.run_name:  # its own claim when `pubswap run | simulate` made it (their token), else one of its own
        try:
            claim = preflight.claim_run_dir(run_dir, cfg.run_claim or None)
        except preflight.RunClaimedError as err:
            log.error("%s", preflight.one_line(err))
            raise
    try:
        _run_claimed(grid, context, cfg, run_dir, saved, settle_seconds)
    finally:
        preflight.release_claim(run_dir, claim)


def _run_claimed(grid: Grid, context: Context, cfg: ExperimentConfig, run_dir: Path,
                 saved: checkpoint.ServerCheckpoint | None, settle_seconds: float) -> None:
    torch.manual_seed(cfg.seed)
    recorder = RunRecorder(run_dir, cfg, context.run_id, resume_after=saved.round if saved else None)
    # `flwr stop` ends the ServerApp's process through Flower's exit handlers (a SIGINT from its heartbeat thread,
    # then flwr_exit), not through this function: the run is marked stopped there
    add_exit_handler(recorder.stopped_on_exit, run_before_force_exit=True)
    made_by = provenance.write(run_dir, resumed=saved is not None)
    log.info("pubswap-flwr run %s: mode %s, outputs in %s; code %s from %s", context.run_id, cfg.strategy.mode,
             run_dir, provenance.code_label(provenance.start_of(made_by)), made_by["code_dir"])
    started = time.time()
    try:
        protocol_class = run_protocol(cfg)
        protocol = protocol_class.from_config(cfg, task_universe(cfg).public)
        evaluator = GlobalEvaluator(cfg) if protocol_class.holds_global_adapter else None
        initial = evaluator.initial_adapter() if evaluator else None
        runner = Runner(cfg, recorder, protocol, evaluator, resume_from=saved, settle_seconds=settle_seconds)
        runner.run(grid, initial)
    except KeyboardInterrupt:  # Ctrl-C: in this thread (no Ray), or RunInterrupted at the run's next check
        recorder.write_status(STOPPED, INTERRUPTED_DETAIL)
        raise
    except BaseException as err:
        recorder.write_status("failed", f"{type(err).__name__}: {err}")
        raise
    status, detail = runner.outcome(time.time() - started)
    recorder.write_status(status, detail)
    if status != "completed":
        log.error("run %s: %s", status, detail)
    log.info("run finished in %.1f s; metrics: %s; %s", time.time() - started, recorder.metrics_path,
             final_adapters(run_dir, protocol_class.holds_global_adapter))
