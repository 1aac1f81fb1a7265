"""The round loop: round 0's evaluation, each round's protocol exchange, the evaluation schedule, the metrics row,
adapters saved in PEFT format, and a checkpoint after every round (resume continues from it).

The loop is ours rather than Flower's `Strategy.start`: a PubSwap round holds several exchanges and SAPO keeps no
global model, so no mode fits Flower's one-train-one-evaluate round; Flower stays behind the Grid (rounds/exchange.py).
"""

from __future__ import annotations

import logging
import time

import numpy as np
from flwr.serverapp import Grid

from .. import metrics_schema as schema
from ..config import ExperimentConfig
from ..export import run_summary, write_card
from ..protocols import ServerProtocol
from ..protocols.transfer import DOWNLINK
from ..rounds.context import RoundContext
from ..rounds.exchange import Exchange
from ..rounds.roundlog import RoundLog
from ..schema import REWARD_BOUND
from ..wire.records import Adapter
from . import checkpoint, trackers
from .metrics import GLOBAL_ITEMS, HARDER_TIER_ITEMS, RunRecorder, json_safe

log = logging.getLogger("pubswap_flwr")


class Runner:
    """Runs `protocol` for the configured rounds. `evaluator` holds the server's copy of the base model (None when
    the protocol keeps no global adapter); `resume_from` continues a checkpointed run."""

    def __init__(self, cfg: ExperimentConfig, recorder: RunRecorder, protocol: ServerProtocol, evaluator=None,
                 resume_from: checkpoint.ServerCheckpoint | None = None, settle_seconds: float = 1.0):
        self.cfg = cfg
        self.recorder = recorder
        self.protocol = protocol
        self.evaluator = evaluator
        self.resume_from = resume_from
        self.settle_seconds = settle_seconds
        self.cumulative_reward = 0.0
        self.exchange: Exchange | None = None
        self.tracker: trackers.Tracker = trackers.Tracker()
        self.rounds_run = 0  # by this start (a resumed run starts after its checkpoint's round)
        self.idle_rounds: list[int] = []  # rounds of this start that trained nothing (see trained_nothing)

    def _write_row(self, row: dict) -> None:
        """metrics.jsonl, the configured experiment tracker (output.report-to), and the console line."""
        self.recorder.write_row(row)
        node_index = self.exchange.node_index if self.exchange is not None else {}
        self.tracker.log(row["round"], trackers.scalars(trackers.by_node_index(json_safe(row), node_index)))
        self.recorder.progress(row)

    def run(self, grid: Grid, initial_adapter: Adapter | None) -> Adapter | None:
        """All rounds; returns the final global adapter (None in modes without one)."""
        self.tracker = trackers.open_tracker(self.cfg, self.recorder.run_dir)
        try:
            master = self._rounds(grid, initial_adapter)
        except BaseException:
            self.tracker.close("failed")
            raise
        self.tracker.close(self.outcome(0.0)[0])
        return master

    def outcome(self, seconds: float) -> tuple[str, str]:
        """The run's final status and detail after `seconds` (see `outcome`)."""
        return outcome(self.rounds_run, self.idle_rounds, seconds)

    def _rounds(self, grid: Grid, initial_adapter: Adapter | None) -> Adapter | None:
        s = self.cfg.strategy
        rewards = (-REWARD_BOUND, REWARD_BOUND) if self.cfg.tasks.trl_rewards else (0.0, 1.0)
        self.exchange = Exchange(grid, timeout=s.timeout, min_clients=s.min_clients, fraction=s.fraction_train,
                                 seed=self.cfg.seed, settle_seconds=self.settle_seconds, reward_range=rewards)
        log.info("%s: mode=%s rounds=%d min-clients=%d fraction-train=%s timeout=%ss aggregation=%s %s",
                 type(self.protocol).__name__, s.mode, self.cfg.num_server_rounds, s.min_clients, s.fraction_train,
                 s.timeout, s.aggregation, self.protocol.describe())
        first = 1
        if self.resume_from is not None:
            first = self._restore(self.resume_from) + 1
            log.info("resuming after round %d of %d", first - 1, self.cfg.num_server_rounds)
        elif self.protocol.holds_global_adapter:
            if initial_adapter is None:
                raise ValueError(f"{type(self.protocol).__name__} keeps a global adapter: the run needs its first one")
            self.protocol.master = {k: np.asarray(v, dtype=np.float32) for k, v in initial_adapter.items()}
            self._evaluate_and_record(RoundLog(0), final=False)
        run_dir = self.recorder.run_dir
        for number in range(first, self.cfg.num_server_rounds + 1):
            final = number == self.cfg.num_server_rounds
            round_log = RoundLog(number)
            self.protocol.run_round(RoundContext(number, final, self.eval_due(number, final), self.exchange,
                                                 round_log, run_dir.name, str(run_dir)))
            self._evaluate_and_record(round_log, final)
            self._checkpoint(number)
            self.rounds_run += 1
        return self.protocol.master

    # -- checkpoints -----------------------------------------------------------------------------------------
    def _started_exchange(self) -> Exchange:
        if self.exchange is None:
            raise RuntimeError("the exchange is made when the rounds start")
        return self.exchange

    def _checkpoint(self, number: int) -> None:
        exchange = self._started_exchange()
        checkpoint.save(self.recorder.run_dir, checkpoint.ServerCheckpoint(
            round=number, config=self.cfg.to_flat(), cumulative_reward=self.cumulative_reward,
            node_index=exchange.node_index, node_rounds=exchange.accepted_round,
            protocol=self.protocol.state(), master=self.protocol.master, adapters=self.protocol.saved_adapters()))

    def _restore(self, saved: checkpoint.ServerCheckpoint) -> int:
        if self.protocol.holds_global_adapter and self.evaluator is not None:
            checkpoint.check_adapter(saved, self.evaluator.policy.adapter())  # keys and shapes fit the model
        self.protocol.master = saved.master
        adapters = saved.adapters
        if DOWNLINK in adapters and saved.source is not None and saved.source.name != checkpoint.CHECKPOINT_DIR:
            # an older checkpoint: nodes may be two rounds ahead with no snapshot of the repeated round's start,
            # holding a global the saved downlink's deltas do not apply to; every node gets it whole once (the
            # server's own state, such as a server optimizer's moments, is that round's and stays)
            log.warning("resuming from %s: the compressed downlink restarts with whole globals", saved.source.name)
            adapters = {k: v for k, v in adapters.items() if k != DOWNLINK}
        try:
            self.protocol.restore(saved.protocol, adapters, saved.node_index)
        except (KeyError, TypeError, ValueError) as err:
            raise checkpoint.CheckpointError(f"{saved.state_path}: 'protocol' state cannot be restored "
                                             f"({type(err).__name__}: {err})") from err
        self.cumulative_reward = saved.cumulative_reward
        exchange = self._started_exchange()
        exchange.node_index = dict(saved.node_index)
        exchange.accepted_round = dict(saved.node_rounds)
        return saved.round

    # -- evaluation and the metrics row ----------------------------------------------------------------------
    def eval_due(self, number: int, final: bool) -> bool:
        every = self.cfg.eval.every
        return number == 0 or final or (every > 0 and number % every == 0)

    def _evaluate_and_record(self, round_log: RoundLog, final: bool) -> None:
        mode = self.cfg.strategy.mode
        master = self.protocol.master
        initial = round_log.initial_evals
        if initial:  # nodes' own starting points (SAPO), measured at the start of round 1
            results = {str(node): node_eval.pop(schema.ITEM_RESULTS) for node, node_eval in initial.items()
                       if schema.ITEM_RESULTS in node_eval}
            if results:
                self.recorder.write_eval_items(0, results)
            self._write_row({schema.ROUND: 0, schema.MODE: mode, schema.NODE_EVAL: initial,
                             schema.EVAL: mean_eval(list(initial.values()))})
        row: dict = {schema.ROUND: round_log.number, schema.MODE: mode}
        item_results: dict[str, dict] = {}
        if self.evaluator is not None and master is not None and self.eval_due(round_log.number, final):
            started = time.perf_counter()
            row[schema.EVAL] = self.evaluator.evaluate(master)
            round_log.eval_seconds += time.perf_counter() - started
            item_results[GLOBAL_ITEMS] = row[schema.EVAL].pop(schema.ITEM_RESULTS)
            harder = row[schema.EVAL].get(schema.HARDER_TIER)
            if harder is not None:  # eval.harder-tier: the global adapter's results on the harder tier's items
                item_results[HARDER_TIER_ITEMS] = harder.pop(schema.ITEM_RESULTS)
        if round_log.node_evals:
            row[schema.NODE_EVAL] = round_log.node_evals
            item_results.update({str(node): node_eval.pop(schema.ITEM_RESULTS) for node, node_eval in
                                 round_log.node_evals.items() if schema.ITEM_RESULTS in node_eval})
            row[schema.EVAL] = mean_eval(list(round_log.node_evals.values()))
        if item_results:
            self.recorder.write_eval_items(round_log.number, item_results)
        saved = []
        if self.evaluator is not None and master is not None and round_log.number > 0:
            save_every = self.cfg.output.save_every
            adapters = self.recorder.run_dir / "adapters"
            if final or (save_every > 0 and round_log.number % save_every == 0):
                saved.append(adapters / f"round-{round_log.number:04d}")
                self.evaluator.save(master, saved[-1])
            if final:  # the folder to hand on: the tokenizer travels with it
                saved.append(adapters / "final")
                self.evaluator.save(master, saved[-1], tokenizer=True)
        if round_log.number > 0:
            row.update(self._round_fields(round_log))
            if trained_nothing(row):
                self.idle_rounds.append(round_log.number)
                log.warning("round %d trained nothing: %s", round_log.number,
                            row.get(schema.KEPT_REASON, "too few valid adapters to aggregate")
                            if row.get("aggregated") is False else "every client was dropped")
        self._write_row(row)
        for directory in saved:  # the model card shows the round's metrics, known only now
            write_card(directory, run_summary(self.cfg, round_log.number, json_safe(row)))

    def _round_fields(self, round_log: RoundLog) -> dict:
        # by node index, so that means over clients sum in one order whatever order replies arrived in
        order = sorted(round_log.clients, key=lambda n: (round_log.clients[n].get(schema.NODE_INDEX, -1), n))
        round_log.warn_broken_formats()
        clients = {str(n): round_log.clients[n] for n in order if n not in round_log.dropped}
        reported = [c.get(self.protocol.reward_field) for c in clients.values()]
        rewards = [r for r in reported if r is not None]
        if rewards:
            self.cumulative_reward += float(np.mean(rewards))
        fields: dict = {schema.TRAIN_REWARD: float(np.mean(rewards)) if rewards else None,
                        schema.CUMULATIVE_REWARD: self.cumulative_reward, schema.CLIENTS: clients,
                        schema.DROPPED: {str(n): r for n, r in round_log.dropped.items()}}
        shares = [c[schema.ZERO_ADVANTAGE_SHARE] for c in clients.values() if schema.ZERO_ADVANTAGE_SHARE in c]
        if shares:  # the mean over the clients that trained a group this round
            fields[schema.ZERO_ADVANTAGE_SHARE] = float(np.mean(shares))
        fields.update(round_log.extra)
        sampling = sum(c["sample_s"] for c in round_log.clients.values())
        update = sum(c["update_s"] for c in round_log.clients.values())
        comm = max(0.0, round_log.exchange_wall - round_log.exchange_busy) + round_log.server_seconds
        fields[schema.TIME] = {"round_s": time.time() - round_log.started, schema.SAMPLING_S: sampling,
                               "update_s": update, "evaluation_s": round_log.eval_seconds,
                               "client_busy_s": round_log.exchange_busy, "comm_orchestration_s": comm}
        fields[schema.BYTES] = {"sent_by_clients": sum(c["bytes_sent"] for c in round_log.clients.values()),
                           "received_by_clients": sum(c["bytes_received"] for c in round_log.clients.values()),
                           "array_records": round_log.array_records}
        return fields


def trained_nothing(row: dict) -> bool:
    """A round's row in which no client's work counted: the global adapter was kept for want of valid adapters, or
    every client was dropped (a killed Ray actor, a timeout, a rejected reply)."""
    return row.get("aggregated") is False or not row.get(schema.CLIENTS)


def outcome(rounds_run: int, idle_rounds: list[int], seconds: float) -> tuple[str, str]:
    """The run's final status and detail: `failed` when none of the rounds this start ran trained anything (its
    metrics would describe the starting model, not the configured experiment), `completed` otherwise, naming
    the rounds that trained nothing."""
    detail = f"{rounds_run} rounds in {seconds:.1f} s"
    if rounds_run > 0 and len(idle_rounds) == rounds_run:
        return "failed", f"no round trained anything ({detail}): every round kept the global adapter or dropped " \
                         "every client; the rows' 'kept_reason' and 'dropped' say why"
    if idle_rounds:
        return "completed", f"{detail}; {len(idle_rounds)} trained nothing (rounds " \
                            f"{', '.join(map(str, idle_rounds))}; the rows' 'kept_reason' and 'dropped' say why)"
    return "completed", detail


def mean_eval(evals: list[dict]) -> dict:
    """Mean of nodes' held-out metrics (SAPO: every node has its own model); a task whose answers collapsed at any
    node stays flagged in the mean (the report's shortcut check reads the mean row)."""
    keys = list(dict.fromkeys(k for e in evals for k, v in e.items() if isinstance(v, (int, float))))
    out: dict = {k: float(np.mean([e[k] for e in evals if k in e])) for k in keys}
    for key in schema.SHORTCUT_TASKS:
        found = [e[key] for e in evals if isinstance(e.get(key), list)]
        if found:
            out[key] = sorted({task for tasks in found for task in tasks if isinstance(task, str)})
    rows = [e.get("per_task", {}) for e in evals]
    numeric = (int, float)
    tasks = list(dict.fromkeys(t for per_task in rows for t in per_task))  # nodes may report different tasks
    out["per_task"] = {}
    for task in tasks:
        present = [per_task[task] for per_task in rows if task in per_task]
        metrics = list(dict.fromkeys(m for row in present for m in row))
        out["per_task"][task] = {m: float(np.mean([row[m] for row in present if isinstance(row.get(m), numeric)]))
                                 for m in metrics if any(isinstance(row.get(m), numeric) for row in present)}
    return out
