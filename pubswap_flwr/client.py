"""ClientApp message handling: turns the strategy's messages into Node work and Node results into replies.

One handler serves every message; `config["task"]` says what to do:
- `fedavg-round`     load the global adapter, run tau private GRPO steps, reply the adapter (fp16) + metrics
- `pubswap-segment`  [load global] [public GRPO step on the sent response sets] n private steps
                     [K responses to the next public prompts] [final: reply the adapter]
- `sapo-generate`    sample B questions x L completions, reply the shared packets
- `sapo-train`       train on I own + J relayed external groups, reply metrics (and held-out metrics if asked)
- `sapo-async`       train on I fresh own + J groups of the previous round's pool, reply packets + metrics
"""

from __future__ import annotations

import logging
import time

from flwr.app import Context, Message, RecordDict

from .config import ExperimentConfig
from .evaluation import evaluate
from .metrics import route_logs_to_flower
from .node import Node, NodeIdentity, WorkReport
from .policy import from_wire, to_wire
from .sapo import Packet
from .wire import (ADAPTER_KEY, CONFIG_KEY, METRICS_KEY, PAYLOAD_KEY, adapter_from_record, adapter_record,
                   metrics_record, payload_from_record, payload_record)

log = logging.getLogger(__name__)

TASKS = ("fedavg-round", "pubswap-segment", "sapo-generate", "sapo-train", "sapo-async")


def handle(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    """Do what the message asks; `run_config` replaces context.run_config (in-process simulation has none)."""
    started = time.time()
    route_logs_to_flower()
    cfg = ExperimentConfig.from_flat(run_config if run_config is not None else context.run_config)
    config = msg.content[CONFIG_KEY]
    task = str(config.get("task", ""))
    if task not in TASKS:
        raise ValueError(f"unknown client task {task!r}; expected one of {TASKS}")
    identity = NodeIdentity.from_flower(cfg, dict(context.node_config), context.node_id,
                                        str(config.get("run-dir", "")) or None, str(config["run-name"]))
    if cfg.strategy.mode != "sapo" and identity.model_name != cfg.model.name:
        raise ValueError(f"this node's model {identity.model_name!r} differs from the run's model.name "
                         f"{cfg.model.name!r}; only strategy.mode = 'sapo' lets nodes keep different models")
    node = Node(cfg, identity)
    round_number = int(config["server-round"])
    report = WorkReport()
    content = RecordDict()
    metrics: dict[str, float] = {}
    payload: dict = {}

    if bool(config.get("round-start", False)):
        node.begin_round(round_number)
    if bool(config.get("evaluate-initial", False)):  # SAPO: each node's own starting point (round 0)
        payload["eval-initial"] = _evaluate(node, cfg)
    if task in ("fedavg-round", "pubswap-segment") and ADAPTER_KEY in msg.content:
        node.receive_global(from_wire(adapter_from_record(msg.content[ADAPTER_KEY])))
    if task == "fedavg-round":
        node.private_steps(int(config["local-steps"]), report)
        content[ADAPTER_KEY] = adapter_record(to_wire(node.policy.adapter()))
    elif task == "pubswap-segment":
        if PAYLOAD_KEY in msg.content:
            sets = payload_from_record(msg.content[PAYLOAD_KEY]).get("response-sets", {})
            node.public_update(sets, report)
        node.private_steps(int(config.get("private-steps", 0)), report)
        uids = [u for u in str(config.get("public-uids", "")).split("\n") if u]
        if uids:
            responses, seconds = node.public_generate(uids, int(config["k"]))
            report.sample_seconds += seconds
            payload["responses"] = responses
        if bool(config.get("final", False)):
            content[ADAPTER_KEY] = adapter_record(to_wire(node.policy.adapter()))
    elif task == "sapo-generate":
        packets = node.sapo_generate(round_number, report)
        payload["packets"] = [p.to_wire() for p in packets]
    elif task in ("sapo-train", "sapo-async"):
        pool = [Packet.from_wire(p) for p in payload_from_record(msg.content[PAYLOAD_KEY]).get("pool", [])] \
            if PAYLOAD_KEY in msg.content else []
        if task == "sapo-async":
            packets = node.sapo_generate(round_number, report)
            payload["packets"] = [p.to_wire() for p in packets]
        selection = node.sapo_train(pool, round_number, report)
        metrics.update({"external-received": selection.received, "external-used": len(selection.chosen),
                        "external-zero-advantage": selection.zero_advantage,
                        "external-rejected": selection.rejected, "external-shortfall": selection.shortfall})
        payload["rejections"] = selection.rejections[:20]
        if bool(config.get("evaluate", False)):
            ev_started = time.perf_counter()
            payload["eval"] = _evaluate(node, cfg)
            metrics["eval-seconds"] = time.perf_counter() - ev_started
        if bool(config.get("save-adapter", False)):
            node.policy.model.save_pretrained(str(node.state_dir / "adapter"))

    node.state.rounds = max(node.state.rounds, round_number)
    node.state.last_round = round_number
    node.save()
    metrics.update({
        "num-examples": report.num_examples,
        "node-index": identity.index,
        "steps": len(report.steps),
        "total-steps": node.state.steps,
        "cumulative-reward": node.state.cumulative_reward,
        "sample-seconds": report.sample_seconds,
        "update-seconds": report.update_seconds,
        "t-start": started,
        "t-end": time.time(),
    })
    for kind, key in (("private", "train-reward"), ("rollout", "rollout-reward"), ("public", "public-update-reward"),
                      ("sapo", "sapo-update-reward")):
        if any(s.kind == kind for s in report.steps):
            metrics[key] = report.mean_reward(kind)
    metrics["train-completions"] = sum(s.completions for s in report.steps if s.kind == "private")
    payload["step-rewards"] = [[s.kind, round(s.mean_reward, 5)] for s in report.steps]
    payload["model"] = identity.model_name
    payload["tasks"] = node.task_names
    content[METRICS_KEY] = metrics_record(metrics)
    content[PAYLOAD_KEY] = payload_record(payload)
    return Message(content, reply_to=msg)


def _evaluate(node: Node, cfg: ExperimentConfig) -> dict:
    return evaluate(node.policy, node.universe.held_out.items, sampled=cfg.eval.sampled,
                    batch_size=cfg.eval.batch_size, seed=cfg.seed, max_chars=cfg.generation.max_completion_chars)
