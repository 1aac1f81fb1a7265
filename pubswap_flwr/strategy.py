"""The custom Flower Strategy (Message API): one class, four modes (fedavg, fedprox, pubswap, sapo).

Round protocols (every exchange has a timeout; a client that errs, times out or sends a reply that fails validation
is dropped from the rest of the round with its reason logged and recorded; a round proceeds when at least
`strategy.min-clients` clients are left):
- fedavg / fedprox: one `train` message per client carrying the global adapter (fp16); the client runs tau local
  GRPO steps (FedProx adds mu/2·||w − w_global||²) and replies its adapter; the server averages every LoRA tensor
  weighted by examples into fp32 master weights.
- pubswap: a round of tau steps has a public step at every tau_swap-th step. One message per segment carries the
  response sets of the pending public step, the number of private steps to run next, and the ids of the next
  public prompts; the reply carries the K responses the client generated on them. The server re-scores every
  response with its own verifier (client-claimed rewards are never read) and builds the next response sets with
  the Balanced or Random rule. The last segment's reply carries the adapter, aggregated as in fedavg/fedprox.
- sapo: phase 1 `query.generate` (nodes reply shared rollout packets), phase 2 `train` (each node gets the others'
  packets and trains on I own + J external groups). No weights cross the network; the server keeps none.
  `sapo.async = true` sends one `train` message per round that carries the previous round's pool.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from . import checkpoint
from .aggregate import aggregate, mean_pairwise_l2
from .config import ExperimentConfig
from .metrics import RunRecorder
from .sapo import Packet
from .swap import Response, build_response_sets
from .tasks import PublicSet, extract_answer, score_completion
from .validate import (Limits, Rejected, check_adapter, check_eval, check_packets, check_public_responses,
                       check_weight)
from .wire import (ADAPTER_KEY, CONFIG_KEY, METRICS_KEY, PAYLOAD_KEY, WireError, adapter_from_record,
                   adapter_record, payload_from_record, payload_record, record_bytes)

log = logging.getLogger("pubswap_flwr")

Adapter = dict[str, np.ndarray]


@dataclass
class Exchange:
    """One send-and-receive: accepted replies by node, dropped nodes with reasons, and costs."""

    replies: dict[int, Message] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    wall: float = 0.0
    busy: float = 0.0  # union of the clients' handler intervals (shared clock in simulation/one host)
    bytes_out: dict[int, int] = field(default_factory=dict)
    bytes_in: dict[int, int] = field(default_factory=dict)
    array_records: int = 0  # ArrayRecords sent plus received (weights on the wire)
    payloads: dict[int, dict] = field(default_factory=dict)  # each accepted reply's decoded JSON payload


@dataclass
class RoundLog:
    """Everything measured during one round, turned into a metrics.jsonl row at the end."""

    number: int
    started: float = field(default_factory=time.time)
    clients: dict[int, dict] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    exchange_wall: float = 0.0
    exchange_busy: float = 0.0
    server_seconds: float = 0.0  # aggregation, verification, swap construction
    eval_seconds: float = 0.0
    array_records: int = 0
    extra: dict = field(default_factory=dict)
    train_totals: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> (reward sum, completions)

    def client(self, node: int) -> dict:
        return self.clients.setdefault(node, {"bytes_sent": 0, "bytes_received": 0, "sample_s": 0.0,
                                              "update_s": 0.0, "handler_s": 0.0})

    def absorb(self, exchange: Exchange) -> None:
        self.exchange_wall += exchange.wall
        self.exchange_busy += exchange.busy
        self.array_records += exchange.array_records
        for node, size in exchange.bytes_out.items():
            self.client(node)["bytes_received"] += size  # what the client received = what the server sent
        for node, size in exchange.bytes_in.items():
            self.client(node)["bytes_sent"] += size
        for node, reason in exchange.dropped.items():
            self.dropped[node] = reason
        for node, reply in exchange.replies.items():
            m = reply.content[METRICS_KEY]
            row = self.client(node)
            row["sample_s"] += float(m.get("sample-seconds", 0.0))
            row["update_s"] += float(m.get("update-seconds", 0.0))
            row["handler_s"] += float(m.get("t-end", 0.0)) - float(m.get("t-start", 0.0))
            row["node_index"] = int(m.get("node-index", -1))
            examples = m.get("num-examples", 0)
            if isinstance(examples, (int, float)) and math.isfinite(examples) and examples > 0:
                row["examples"] = row.get("examples", 0) + int(examples)

    def drop(self, node: int, reason: str) -> None:
        self.dropped[node] = reason
        log.warning("round %d: dropped client %d: %s", self.number, node, reason)


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _describe_error(reply: Message) -> str:
    first_line = (reply.error.reason or "").strip().splitlines()
    detail = first_line[-1] if first_line else ""
    return f"client error (code {reply.error.code}): {detail[:300]}"


class PubSwapStrategy(Strategy):
    """FedAvg-GRPO, FedProx-GRPO, PubSwap (Balanced/Random) and SAPO over LoRA adapters, selected by config."""

    def __init__(self, cfg: ExperimentConfig, recorder: RunRecorder, evaluator=None,
                 public: PublicSet | None = None, resume_from: checkpoint.ServerCheckpoint | None = None):
        self.cfg = cfg
        self.recorder = recorder
        self.evaluator = evaluator
        self.public = public
        self.run_dir = str(recorder.run_dir)
        self.run_name = recorder.run_dir.name
        self.mode = cfg.strategy.mode
        self.node_index: dict[int, int] = {}  # Flower node id -> node index reported by the client
        self.resume_from = resume_from
        self.master: Adapter | None = None  # fp32 global adapter (fedavg/fedprox/pubswap)
        self.cumulative_reward = 0.0
        self.public_cursor = 0
        self.sapo_pool: list[Packet] = []  # async mode: the previous round's packets
        self.limits = Limits(max_completion_chars=cfg.generation.max_completion_chars)

    # -- Flower Strategy interface ---------------------------------------------------------------------------
    def summary(self) -> None:
        s = self.cfg.strategy
        text = f"mode={self.mode} rounds={self.cfg.num_server_rounds} min-clients={s.min_clients} " \
               f"fraction-train={s.fraction_train} timeout={s.timeout}s aggregation={s.aggregation}"
        if self.mode == "pubswap":
            p = self.cfg.pubswap
            text += f" swap={p.swap} tau={self.cfg.train.local_steps} tau-swap={p.tau_swap} " \
                    f"public-prompts={p.public_prompts} base={p.base}"
        if self.mode == "sapo":
            text += f" I/J={self.cfg.sapo.local}/{self.cfg.sapo.external} B={self.cfg.sapo.questions} " \
                    f"L={self.cfg.sapo.completions} async={self.cfg.sapo.async_mode}"
        log.info("PubSwapStrategy: %s", text)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """fedavg/fedprox: the global adapter and the round's settings to every selected node."""
        nodes = self._select_nodes(grid, server_round)
        cfg = self._base_config(server_round, "fedavg-round")
        cfg["round-start"] = True
        cfg["local-steps"] = self.cfg.train.local_steps
        cfg["proximal-mu"] = self.cfg.strategy.proximal_mu if self.cfg.uses_proximal else 0.0
        for key, value in config.items():
            cfg[key] = value
        return [Message(RecordDict({ADAPTER_KEY: arrays, CONFIG_KEY: ConfigRecord(dict(cfg))}), dst_node_id=n,
                        message_type="train") for n in nodes]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None,
                                                                                    MetricRecord | None]:
        """Weighted mean (or robust variant) of valid adapters; invalid replies are skipped with a reason."""
        adapters, weights = [], []
        for reply in replies:
            if reply.has_error():
                log.warning("round %d: %s", server_round, _describe_error(reply))
                continue
            try:
                adapter, weight = self._validated_adapter(reply)
            except Rejected as err:
                log.warning("round %d: rejected reply from node %d: %s", server_round, reply.metadata.src_node_id,
                            err)
                continue
            adapters.append(adapter)
            weights.append(weight)
        if len(adapters) < self.cfg.strategy.min_clients:
            log.warning("round %d: %d valid adapters, fewer than strategy.min-clients = %d; global adapter kept",
                        server_round, len(adapters), self.cfg.strategy.min_clients)
            return None, None
        s = self.cfg.strategy
        self.master = aggregate(adapters, weights, method=s.aggregation, trim_fraction=s.trim_fraction,
                                reference=self.master, clip_norm=s.clip_norm, noise_multiplier=s.dp_noise_multiplier,
                                rng=np.random.default_rng([self.cfg.seed, server_round]))
        return adapter_record(self.master), MetricRecord({"clients": len(adapters),
                                                          "num-examples": float(sum(weights))})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Evaluation is server-side (global adapter) or rides on SAPO train messages: no separate messages."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # -- the run ---------------------------------------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn=None) -> Result:
        self.summary()
        result = Result()
        first = 1
        if self.resume_from is not None:
            first = self._restore(self.resume_from) + 1
            log.info("resuming after round %d of %d", first - 1, num_rounds)
        elif self.mode != "sapo":
            self.master = {k: v.astype(np.float32) for k, v in adapter_from_record(initial_arrays).items()}
            result.arrays = initial_arrays
            self._evaluate_and_record(RoundLog(0), final=False)
        for number in range(first, num_rounds + 1):
            round_log = RoundLog(number)
            if self.mode in ("fedavg", "fedprox"):
                self._round_fedavg(grid, round_log)
            elif self.mode == "pubswap":
                self._round_pubswap(grid, round_log)
            else:
                self._round_sapo(grid, round_log, final=number == num_rounds)
            if self.master is not None:
                result.arrays = adapter_record(self.master)
            self._evaluate_and_record(round_log, final=number == num_rounds)
            self._checkpoint(number)
        return result

    # -- checkpoints -----------------------------------------------------------------------------------------
    def _checkpoint(self, number: int) -> None:
        checkpoint.save(self.recorder.run_dir, checkpoint.ServerCheckpoint(
            round=number, config=self.cfg.to_flat(), public_cursor=self.public_cursor,
            cumulative_reward=self.cumulative_reward, node_index=self.node_index,
            sapo_pool=[p.to_wire() for p in self.sapo_pool], master=self.master))

    def _restore(self, saved: checkpoint.ServerCheckpoint) -> int:
        self.master = saved.master
        self.public_cursor = saved.public_cursor
        self.cumulative_reward = saved.cumulative_reward
        self.node_index = dict(saved.node_index)
        self.sapo_pool = [Packet.from_wire(p) for p in saved.sapo_pool]
        return saved.round

    # -- plumbing --------------------------------------------------------------------------------------------
    def _base_config(self, server_round: int, task: str) -> ConfigRecord:
        return ConfigRecord({"task": task, "server-round": server_round, "run-dir": self.run_dir,
                             "run-name": self.run_name})

    def _select_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """Wait (up to the timeout) for at least min-clients nodes, then sample fraction-train of them."""
        s = self.cfg.strategy
        deadline = time.time() + s.timeout
        nodes: list[int] = []
        stable_since = time.time()
        while True:
            current = sorted(grid.get_node_ids())
            if current != nodes:
                nodes, stable_since = current, time.time()
            # Simulated nodes register one by one: take the set once it is big enough and stopped growing.
            if len(nodes) >= s.min_clients and time.time() - stable_since >= 1.0:
                break
            if time.time() > deadline:
                raise RuntimeError(f"only {len(nodes)} node(s) connected after {s.timeout:.0f} s; "
                                   f"strategy.min-clients = {s.min_clients}")
            time.sleep(0.2)
        count = max(s.min_clients, math.ceil(s.fraction_train * len(nodes)))
        chosen = sorted(random.Random(f"{self.cfg.seed}:{server_round}").sample(nodes, min(count, len(nodes))))
        return chosen

    def _exchange(self, grid: Grid, messages: list[Message]) -> Exchange:
        out = Exchange()
        by_id: dict[str, int] = {}
        for msg in messages:
            out.bytes_out[msg.metadata.dst_node_id] = record_bytes(msg.content)
            out.array_records += len(msg.content.array_records)
        started = time.perf_counter()
        replies = list(grid.send_and_receive(messages, timeout=self.cfg.strategy.timeout))
        out.wall = time.perf_counter() - started
        for msg in messages:
            by_id[msg.metadata.message_id] = msg.metadata.dst_node_id
        intervals = []
        for reply in replies:
            node = by_id.get(reply.metadata.reply_to_message_id)
            if node is None:
                log.warning("ignoring a reply to an unknown message %s", reply.metadata.reply_to_message_id)
                continue
            if reply.has_error():
                out.dropped[node] = _describe_error(reply)
                continue
            if METRICS_KEY not in reply.content or PAYLOAD_KEY not in reply.content:
                out.dropped[node] = "reply lacks its metrics or payload record"
                continue
            try:
                payload = payload_from_record(reply.content[PAYLOAD_KEY])
            except WireError as err:
                out.dropped[node] = f"rejected reply: {err}"
                continue
            if not isinstance(payload, dict):
                out.dropped[node] = "rejected reply: payload is not a JSON object"
                continue
            out.payloads[node] = payload
            out.replies[node] = reply
            index = reply.content[METRICS_KEY].get("node-index")
            if isinstance(index, int) and not isinstance(index, bool):
                self.node_index[node] = index
            out.bytes_in[node] = record_bytes(reply.content)
            out.array_records += len(reply.content.array_records)
            m = reply.content[METRICS_KEY]
            intervals.append((float(m.get("t-start", 0.0)), float(m.get("t-end", 0.0))))
        for node in by_id.values():
            if node not in out.replies and node not in out.dropped:
                out.dropped[node] = f"no reply within strategy.timeout = {self.cfg.strategy.timeout:g} s"
        for node, reason in out.dropped.items():
            log.warning("dropped client %d: %s", node, reason)
        out.busy = min(_union_length(intervals), out.wall)
        return out

    def label(self, node: int) -> str:
        """A client's name in swaps and pools: sorts by node index, so results do not depend on Flower's random
        node ids or on reply arrival order (a resumed run repeats an uninterrupted one)."""
        return f"{self.node_index.get(node, 99999):05d}-{node}"

    def ordered(self, nodes) -> list[int]:
        return sorted(nodes, key=self.label)

    def _validated_adapter(self, reply: Message, weight: float | None = None) -> tuple[Adapter, float]:
        """The reply's adapter after key/shape/finiteness checks, and its aggregation weight (the reply's
        num-examples unless the caller counted the client's examples over the whole round)."""
        if ADAPTER_KEY not in reply.content:
            raise Rejected("reply has no adapter")
        try:
            adapter = adapter_from_record(reply.content[ADAPTER_KEY])
        except WireError as err:
            raise Rejected(str(err)) from err
        assert self.master is not None
        checked = check_adapter(adapter, self.master)
        return checked, check_weight(reply.content[METRICS_KEY].get("num-examples", 0) if weight is None else weight)

    def _client_metrics(self, round_log: RoundLog, exchange: Exchange) -> None:
        """Fold one exchange's client metrics into the round: rewards of private steps are averaged over all the
        round's messages (PubSwap runs private steps in several segments), counters keep the latest value."""
        for node, reply in exchange.replies.items():
            m = reply.content[METRICS_KEY]
            row = round_log.client(node)
            if "train-reward" in m and float(m.get("train-completions", 0)) > 0:
                count = float(m["train-completions"])
                total, seen = round_log.train_totals.get(node, (0.0, 0.0))
                total, seen = total + float(m["train-reward"]) * count, seen + count
                round_log.train_totals[node] = (total, seen)
                row["train_reward"] = total / seen
            for key in ("rollout-reward", "cumulative-reward", "num-examples", "total-steps"):
                if key in m:
                    row[key.replace("-", "_")] = float(m[key])
            payload = exchange.payloads[node]
            row["model"] = payload.get("model")
            row["tasks"] = payload.get("tasks")

    def _aggregate_round(self, round_log: RoundLog, final_replies: dict[int, Message]) -> None:
        started = time.perf_counter()
        valid: dict[int, tuple[Adapter, float]] = {}
        for node in self.ordered(final_replies):
            reply = final_replies[node]
            try:
                valid[node] = self._validated_adapter(reply, round_log.client(node).get("examples", 0))
            except Rejected as err:
                round_log.drop(node, f"rejected reply: {err}")
        if len(valid) < self.cfg.strategy.min_clients:
            log.warning("round %d: %d valid adapters (< strategy.min-clients = %d): global adapter kept",
                        round_log.number, len(valid), self.cfg.strategy.min_clients)
            round_log.extra["aggregated"] = False
        else:
            adapters = [a for a, _ in valid.values()]
            s = self.cfg.strategy
            round_log.extra["parameter_drift"] = mean_pairwise_l2(adapters)
            self.master = aggregate(adapters, [w for _, w in valid.values()], method=s.aggregation,
                                    trim_fraction=s.trim_fraction, reference=self.master, clip_norm=s.clip_norm,
                                    noise_multiplier=s.dp_noise_multiplier,
                                    rng=np.random.default_rng([self.cfg.seed, round_log.number]))
            round_log.extra["aggregated"] = True
        round_log.extra["aggregated_clients"] = sorted(valid)
        round_log.server_seconds += time.perf_counter() - started

    # -- fedavg / fedprox ------------------------------------------------------------------------------------
    def _round_fedavg(self, grid: Grid, round_log: RoundLog) -> None:
        assert self.master is not None
        messages = list(self.configure_train(round_log.number, adapter_record(self.master), ConfigRecord(), grid))
        exchange = self._exchange(grid, messages)
        round_log.absorb(exchange)
        self._client_metrics(round_log, exchange)
        self._aggregate_round(round_log, exchange.replies)

    # -- pubswap ---------------------------------------------------------------------------------------------
    def public_step_positions(self) -> list[int]:
        tau, every = self.cfg.train.local_steps, self.cfg.pubswap.tau_swap
        return [t for t in range(1, tau + 1) if t % every == 0]

    def _next_public_uids(self) -> list[str]:
        assert self.public is not None
        items = self.public.items
        count = self.cfg.pubswap.public_prompts
        uids = []
        for _ in range(count):
            epoch, pos = divmod(self.public_cursor, len(items))
            order = list(range(len(items)))
            random.Random(f"{self.cfg.seed}:public:{epoch}").shuffle(order)
            uids.append(items[order[pos]].uid)
            self.public_cursor += 1
        return uids

    def _round_pubswap(self, grid: Grid, round_log: RoundLog) -> None:
        assert self.master is not None and self.public is not None
        p = self.cfg.pubswap
        k = self.cfg.train.completions_per_prompt
        positions = self.public_step_positions()
        nodes = self._select_nodes(grid, round_log.number)
        active = list(nodes)
        pending_sets: dict[int, dict] = {}
        previous = 0
        round_log.extra["public_steps"] = []
        final_replies: dict[int, Message] = {}
        for segment in range(len(positions) + 1):
            is_final = segment == len(positions)
            next_public = positions[segment] if not is_final else self.cfg.train.local_steps + 1
            private = next_public - previous - 1
            uids = [] if is_final else self._next_public_uids()
            messages = []
            for node in active:
                config = self._base_config(round_log.number, "pubswap-segment")
                config.update({"private-steps": private, "public-uids": "\n".join(uids), "k": k,
                               "final": is_final, "segment": segment, "round-start": segment == 0})
                content = RecordDict({CONFIG_KEY: config})
                if segment == 0:
                    content[ADAPTER_KEY] = adapter_record(self.master)
                if node in pending_sets:
                    content[PAYLOAD_KEY] = payload_record({"response-sets": pending_sets[node]})
                messages.append(Message(content, dst_node_id=node, message_type="train"))
            exchange = self._exchange(grid, messages)
            round_log.absorb(exchange)
            self._client_metrics(round_log, exchange)
            active = [n for n in active if n in exchange.replies]
            if is_final:
                final_replies = exchange.replies
                break
            started = time.perf_counter()
            responses = {}
            for node in list(active):
                try:
                    responses[node] = self._verified_responses(exchange.payloads[node], uids, k)
                except Rejected as err:
                    round_log.drop(node, f"rejected public responses: {err}")
                    active.remove(node)
            pending_sets, step_metrics = self._swap(responses, uids, k, round_log.number, segment)
            step_metrics["step"] = next_public
            round_log.extra["public_steps"].append(step_metrics)
            round_log.server_seconds += time.perf_counter() - started
            previous = next_public
        self._aggregate_round(round_log, final_replies)
        round_log.extra["swap"] = _summarise_public_steps(round_log.extra["public_steps"])

    def _verified_responses(self, payload: dict, uids: list[str], k: int) -> dict[str, list[tuple[str, float]]]:
        """The client's responses with rewards from the server's own verifier; client-claimed rewards ignored."""
        assert self.public is not None
        texts = check_public_responses(payload, uids, k, self.limits)
        limit = self.limits.max_completion_chars
        return {uid: [(t, score_completion(t, self.public.get(uid), max_chars=limit).reward) for t in texts[uid]]
                for uid in uids}

    def _swap(self, responses: dict[int, dict[str, list[tuple[str, float]]]], uids: list[str], k: int,
              round_number: int, segment: int) -> tuple[dict[int, dict], dict]:
        p = self.cfg.pubswap
        rng = random.Random(f"{self.cfg.seed}:swap:{round_number}:{segment}")
        nodes = self.ordered(responses)
        sets: dict[int, dict] = {node: {} for node in nodes}
        swapped = {node: 0 for node in nodes}
        swapped_pairs = 0
        donors = []
        disagreement = []
        own_reward: dict[int, list[float]] = {node: [] for node in nodes}
        for uid in uids:
            pool = [Response(self.label(node), i, text, reward) for node in nodes
                    for i, (text, reward) in enumerate(responses[node][uid])]
            outcomes = build_response_sets(pool, p.swap, p.correct_threshold, k, rng) if pool else {}
            for node in nodes:
                me = self.label(node)
                outcome = outcomes[me]
                sets[node][uid] = [
                    {"own_index": r.index, "reward": r.reward} if r.client == me
                    else {"own_index": -1, "text": r.text, "reward": r.reward, "source": r.client}
                    for r in outcome.responses]
                swapped[node] += outcome.swapped
                swapped_pairs += outcome.swapped > 0
                donors.append(outcome.donors_available)
                own_reward[node].extend(reward for _, reward in responses[node][uid])
            modal = [Counter(extract_answer(t) for t, _ in responses[node][uid]).most_common(1)[0][0]
                     for node in nodes]
            pairs = list(combinations(modal, 2))
            if pairs:
                disagreement.append(sum(a != b for a, b in pairs) / len(pairs))
        pair_count = max(len(nodes) * len(uids), 1)
        metrics = {
            "prompts": uids,
            "clients": len(nodes),
            "swapped_pair_fraction": swapped_pairs / pair_count,
            "responses_swapped": {str(n): c for n, c in swapped.items()},
            "mean_donors": float(np.mean(donors)) if donors else 0.0,
            "public_reward_before_swap": {str(n): float(np.mean(r)) if r else 0.0 for n, r in own_reward.items()},
            "policy_disagreement": float(np.mean(disagreement)) if disagreement else 0.0,
        }
        return sets, metrics

    # -- sapo ------------------------------------------------------------------------------------------------
    def _pool(self, exchange: Exchange, round_log: RoundLog) -> list[Packet]:
        """Every valid packet of the round, tagged with the node that sent it; bad packets are dropped one by one."""
        pool = []
        for node in self.ordered(exchange.payloads):
            payload = exchange.payloads[node]
            try:
                packets, reasons = check_packets(payload, self.limits, self.cfg.sapo.completions)
            except Rejected as err:
                round_log.drop(node, f"rejected packets: {err}")
                continue
            if payload.get("eval-initial"):
                try:
                    round_log.extra.setdefault("initial_eval", {})[str(node)] = check_eval(payload["eval-initial"])
                except Rejected as err:
                    log.warning("round %d: ignored node %d's initial evaluation: %s", round_log.number, node, err)
            for reason in reasons:
                log.warning("round %d: dropped a packet from node %d: %s", round_log.number, node, reason)
            if reasons:
                round_log.client(node)["packets_rejected"] = len(reasons)
                round_log.extra.setdefault("rejected_packets", {})[str(node)] = reasons[:10]
            pool.extend(Packet(self.label(node), p.item, p.completions) for p in packets)  # sender = who sent it
        return pool

    def _sapo_messages(self, nodes: list[int], round_number: int, task: str, pool: list[Packet],
                       evaluate: bool, final: bool) -> list[Message]:
        messages = []
        for node in nodes:
            config = self._base_config(round_number, task)
            config.update({"evaluate": evaluate, "save-adapter": final, "round-start": task == "sapo-async",
                           "evaluate-initial": round_number == 1 and task == "sapo-async"})
            others = [p.to_wire() for p in pool if p.sender != self.label(node)]
            content = RecordDict({CONFIG_KEY: config, PAYLOAD_KEY: payload_record({"pool": others})})
            messages.append(Message(content, dst_node_id=node, message_type="train"))
        return messages

    def _round_sapo(self, grid: Grid, round_log: RoundLog, final: bool) -> None:
        nodes = self._select_nodes(grid, round_log.number)
        evaluate = self._eval_due(round_log.number, final)
        if self.cfg.sapo.async_mode:
            exchange = self._exchange(grid, self._sapo_messages(nodes, round_log.number, "sapo-async",
                                                                self.sapo_pool, evaluate, final))
            round_log.absorb(exchange)
            self.sapo_pool = self._pool(exchange, round_log)
            train_exchange = exchange
        else:
            generate = []
            for node in nodes:
                config = self._base_config(round_log.number, "sapo-generate")
                config["evaluate-initial"] = round_log.number == 1
                config["round-start"] = True
                generate.append(Message(RecordDict({CONFIG_KEY: config}), dst_node_id=node,
                                        message_type="query.generate"))
            exchange = self._exchange(grid, generate)
            round_log.absorb(exchange)
            self._client_metrics(round_log, exchange)
            pool = self._pool(exchange, round_log)
            active = [n for n in nodes if n in exchange.replies and n not in round_log.dropped]
            train_exchange = self._exchange(grid, self._sapo_messages(active, round_log.number, "sapo-train", pool,
                                                                      evaluate, final))
            round_log.absorb(train_exchange)
        self._client_metrics(round_log, train_exchange)
        evals = {}
        for node, reply in train_exchange.replies.items():
            m = reply.content[METRICS_KEY]
            row = round_log.client(node)
            for key in ("external-received", "external-used", "external-zero-advantage", "external-rejected",
                        "external-shortfall"):
                row[key.replace("-", "_")] = int(m.get(key, 0))
            payload = train_exchange.payloads[node]
            reasons = payload.get("rejections")
            if isinstance(reasons, list) and reasons:
                row["external_rejections"] = [str(r)[:300] for r in reasons[:5]]
            if "eval" in payload:
                try:
                    evals[str(node)] = check_eval(payload["eval"])
                except Rejected as err:
                    log.warning("round %d: ignored node %d's evaluation: %s", round_log.number, node, err)
            round_log.eval_seconds += float(m.get("eval-seconds", 0.0))
        if evals:
            round_log.extra["node_eval"] = evals

    # -- evaluation and the metrics row ----------------------------------------------------------------------
    def _eval_due(self, number: int, final: bool) -> bool:
        every = self.cfg.eval.every
        return number == 0 or final or (every > 0 and number % every == 0)

    def _evaluate_and_record(self, round_log: RoundLog, final: bool) -> None:
        initial = round_log.extra.pop("initial_eval", None)
        if initial:  # SAPO: the nodes' own starting points, measured at the start of round 1
            row0 = {"round": 0, "mode": self.mode, "node_eval": initial, "eval": _mean_eval(list(initial.values()))}
            self.recorder.write_row(row0)
            self.recorder.progress(row0)
        row: dict = {"round": round_log.number, "mode": self.mode}
        if self.evaluator is not None and self.master is not None and self._eval_due(round_log.number, final):
            started = time.perf_counter()
            row["eval"] = self.evaluator.evaluate(self.master)
            round_log.eval_seconds += time.perf_counter() - started
        if "node_eval" in round_log.extra:
            evals = round_log.extra.pop("node_eval")
            row["node_eval"] = evals
            row["eval"] = _mean_eval(list(evals.values()))
        if self.evaluator is not None and self.master is not None and round_log.number > 0:
            save_every = self.cfg.output.save_every
            if final or (save_every > 0 and round_log.number % save_every == 0):
                self.evaluator.save(self.master, self.recorder.run_dir / "adapters" / f"round-{round_log.number:04d}")
            if final:
                self.evaluator.save(self.master, self.recorder.run_dir / "adapters" / "final")
        if round_log.number > 0:
            clients = {str(n): c for n, c in round_log.clients.items() if n not in round_log.dropped}
            rewards = [c.get("rollout_reward") if self.mode == "sapo" else c.get("train_reward")
                       for c in clients.values()]
            rewards = [r for r in rewards if r is not None]
            row["train_reward"] = float(np.mean(rewards)) if rewards else None
            if rewards:
                self.cumulative_reward += float(np.mean(rewards))
            row["cumulative_reward"] = self.cumulative_reward
            row["clients"] = clients
            row["dropped"] = {str(n): r for n, r in round_log.dropped.items()}
            row.update({k: v for k, v in round_log.extra.items() if k not in ("public_steps",)})
            if "public_steps" in round_log.extra:
                row["public_steps"] = round_log.extra["public_steps"]
            total = time.time() - round_log.started
            sampling = sum(c["sample_s"] for c in round_log.clients.values())
            update = sum(c["update_s"] for c in round_log.clients.values())
            comm = max(0.0, round_log.exchange_wall - round_log.exchange_busy) + round_log.server_seconds
            row["time"] = {"round_s": total, "sampling_s": sampling, "update_s": update,
                           "evaluation_s": round_log.eval_seconds, "client_busy_s": round_log.exchange_busy,
                           "comm_orchestration_s": comm}
            row["bytes"] = {"sent_by_clients": sum(c["bytes_sent"] for c in round_log.clients.values()),
                            "received_by_clients": sum(c["bytes_received"] for c in round_log.clients.values()),
                            "array_records": round_log.array_records}
        self.recorder.write_row(row)
        self.recorder.progress(row)


def _summarise_public_steps(steps: list[dict]) -> dict:
    if not steps:
        return {"swapped_pair_fraction": 0.0, "responses_swapped": 0, "policy_disagreement": 0.0}
    return {
        "swapped_pair_fraction": float(np.mean([s["swapped_pair_fraction"] for s in steps])),
        "responses_swapped": int(sum(sum(s["responses_swapped"].values()) for s in steps)),
        "mean_donors": float(np.mean([s["mean_donors"] for s in steps])),
        "policy_disagreement": float(np.mean([s["policy_disagreement"] for s in steps])),
    }


def _mean_eval(evals: list[dict]) -> dict:
    """Mean of nodes' held-out metrics (SAPO: every node has its own model)."""
    keys = [k for k, v in evals[0].items() if isinstance(v, (int, float))]
    out: dict = {k: float(np.mean([e[k] for e in evals if k in e])) for k in keys}
    tasks = evals[0].get("per_task", {})
    out["per_task"] = {t: {m: float(np.mean([e["per_task"][t][m] for e in evals if t in e.get("per_task", {})]))
                           for m in tasks[t]} for t in tasks}
    return out
