"""Everything measured during one round (per-client rows, drops, timings, protocol extras), folded in from each
exchange and turned into the round's metrics.jsonl row by the runner."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .. import metrics_schema as schema
from ..metrics_schema import WELL_FORMED_WARNING
from ..wire.counters import ForeignCounts, FormatCounts, SamplingCounts, SignalCounts, UptakeCounts
from ..wire.records import OwnAdapterReply
from .exchange import ExchangeResult

log = logging.getLogger("pubswap_flwr")


@dataclass
class RoundLog:
    number: int
    started: float = field(default_factory=time.time)
    clients: dict[int, dict] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    exchange_wall: float = 0.0
    exchange_busy: float = 0.0
    server_seconds: float = 0.0  # aggregation, verification, swap construction
    eval_seconds: float = 0.0
    array_records: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # protocol-specific fields of the metrics row
    node_evals: dict[str, dict] = field(default_factory=dict)  # sapo: node -> its own held-out metrics this round
    initial_evals: dict[str, dict] = field(default_factory=dict)  # sapo, round 1: node -> its starting point's
    train_totals: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> (reward sum, completions)
    formats: dict[int, FormatCounts] = field(default_factory=dict)  # node -> its own samples' answer format
    foreign: dict[int, ForeignCounts] = field(default_factory=dict)  # node -> foreign text (train.foreign-correction)
    uptake: dict[int, UptakeCounts] = field(default_factory=dict)  # node -> pubswap.measure-uptake
    signal: dict[int, SignalCounts] = field(default_factory=dict)  # node -> the groups it trained on
    sampling: dict[int, SamplingCounts] = field(default_factory=dict)  # node -> train.dynamic-sampling

    def client(self, node: int) -> dict:
        return self.clients.setdefault(node, {"bytes_sent": 0, "bytes_received": 0, "sample_s": 0.0,
                                              "update_s": 0.0, "handler_s": 0.0})

    def absorb(self, exchange: ExchangeResult) -> None:
        """Fold one exchange in: costs, drops, and each accepted reply's report. Rewards of private steps are
        averaged over all the round's messages (PubSwap runs private steps in several segments); counters keep
        the latest value."""
        self.exchange_wall += exchange.wall
        self.exchange_busy += exchange.busy
        self.server_seconds += exchange.decode_seconds
        self.array_records += exchange.array_records
        for node, size in exchange.bytes_out.items():
            self.client(node)["bytes_received"] += size  # what the client received = what the server sent
        for node, size in exchange.bytes_in.items():
            self.client(node)["bytes_sent"] += size
        for node, reason in exchange.dropped.items():
            self.dropped[node] = reason
        for node, reply in exchange.replies.items():
            report = reply.report
            row = self.client(node)
            row["sample_s"] += report.sample_seconds
            row["update_s"] += report.update_seconds
            row["handler_s"] += report.t_end - report.t_start
            row[schema.NODE_INDEX] = report.node_index
            if report.num_examples > 0:
                row["examples"] = row.get("examples", 0) + int(report.num_examples)
            if report.train_reward is not None and report.train_completions > 0:
                total, seen = self.train_totals.get(node, (0.0, 0.0))
                total += report.train_reward * report.train_completions
                seen += report.train_completions
                self.train_totals[node] = (total, seen)
                row[schema.TRAIN_REWARD] = total / seen
            if report.rollout_reward is not None:
                row[schema.ROLLOUT_REWARD] = report.rollout_reward
            if report.formats.sampled:  # a PubSwap round's segments add up
                self.formats[node] = self.formats.get(node, FormatCounts()) + report.formats
                row.update(self.formats[node].row())
            if report.foreign:  # train.foreign-correction; segments add up
                self.foreign[node] = self.foreign.get(node, ForeignCounts()) + report.foreign
                row.update(self.foreign[node].row())
            if report.uptake:  # pubswap.measure-uptake; segments add up
                self.uptake[node] = self.uptake.get(node, UptakeCounts()) + report.uptake
                row.update(self.uptake[node].row())
            if report.signal:  # segments add up
                self.signal[node] = self.signal.get(node, SignalCounts()) + report.signal
                row.update(self.signal[node].row())
            if report.sampling:  # train.dynamic-sampling; segments add up
                self.sampling[node] = self.sampling.get(node, SamplingCounts()) + report.sampling
                row.update(self.sampling[node].row())
            row[schema.CUMULATIVE_REWARD] = report.cumulative_reward
            row["num_examples"] = float(report.num_examples)
            row["total_steps"] = float(report.total_steps)
            row["model"] = report.model
            row["tasks"] = report.tasks
            if report.curriculum:  # tasks.curriculum: the levels its private items were drawn at, as it reports them
                row[schema.CURRICULUM_LEVELS] = dict(report.curriculum)

    def warn_broken_formats(self, threshold: float = WELL_FORMED_WARNING) -> list[int]:
        """Log a warning for each client whose own samples this round kept the answer format less often than
        `threshold` (the first sign of a collapse, docs/results/README.md); returns those node ids."""
        broken = []
        for node, counts in sorted(self.formats.items()):
            formed, sampled = counts.well_formed, counts.sampled
            if sampled and formed / sampled < threshold and node not in self.dropped:
                broken.append(node)
                log.warning("round %d: client %d (node index %s) kept the <answer>...</answer> format in only %d of "
                            "its %d samples (%.0f%%): its answers may be breaking down; a learning rate too high for "
                            "the model does this", self.number, node, self.clients.get(node, {}).get(schema.NODE_INDEX),
                            formed, sampled, 100 * formed / sampled)
        return broken

    def drop(self, node: int, reason: str) -> None:
        self.dropped[node] = reason
        log.warning("round %d: dropped client %d: %s", self.number, node, reason)

    def record_own_evaluations(self, node: int, reply: OwnAdapterReply) -> None:
        """A node that keeps its own adapter: its self-reported held-out results (the metrics row's node_eval, their
        mean its eval, labelled self-reported; round 1's starting points make round 0's row) and their seconds."""
        if reply.eval_initial is not None:
            self.initial_evals[str(node)] = reply.eval_initial
        if reply.eval is not None:
            self.node_evals[str(node)] = reply.eval
        self.eval_seconds += reply.eval_seconds
