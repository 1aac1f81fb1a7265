"""Client-side round logic and persisted node state (adapter, optimizer, stream cursor, counters) on local disk.

Deployed ClientApps are a new process per message and `context.state` is memory-only, so everything a node needs
to continue lives under its state dir. Sampling seeds derive from (run seed, node, call counter), so a restarted
node draws exactly what it would have drawn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file

from .config import ExperimentConfig
from .policy import GenerationSettings, GRPOSettings, LoraSettings, Policy, PolicySpec
from .policy import cached_policy
from .policy.model import ModelError, data_dir
from .rollouts import Completion, RolloutGroup
from .sapo import Packet, Selection, reputation, select_external, select_local
from .tasks import (HeldOutSet, ItemListStream, MixtureStream, PublicSet, StreamCursor, TaskItem, load_items,
                    node_mixes, parse_custom_tasks, parse_mix, score_completion)
from .tasks.specs import generate_entry
from .tasks.splits import MAX_NODES, RANGE
from .tasks.verifiers import VERIFIERS

log = logging.getLogger(__name__)

STATE_FILE = "node.json"
ADAPTER_FILE = "adapter.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
ROUND_START_DIR = "round-start"


# --- shared task universe (identical on server and every client: built from the run config alone) ---------------


@dataclass
class TaskUniverse:
    tasks: list  # every TaskSpec named anywhere in the run (index = seed-range slot)
    held_out: HeldOutSet
    public: PublicSet

    @property
    def training_exclude(self) -> set[str]:
        """Questions no private stream may contain: held-out and public ones."""
        return self.held_out.questions | {item.question for item in self.public.items}


def resolve_data_path(path: str) -> Path:
    """A data file path: absolute, or relative to the working directory or to the project (data/samples/...)."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        tried = [candidate]
    else:
        tried = [Path.cwd() / candidate]
        try:
            tried.append(data_dir().parent / candidate)
        except ModelError:
            pass
    for option in tried:
        if option.is_file():
            return option.resolve()
    raise FileNotFoundError(f"data file {path!r} not found (looked in: {', '.join(str(t) for t in tried)})")


@lru_cache(maxsize=4)
def _universe(mix: str, public_mix: str, custom: str, per_task: int, public_size: int, data_seed: int,
              node_mixes_text: str, eval_path: str, data_format: str) -> TaskUniverse:
    custom_specs = parse_custom_tasks(custom)
    tasks = parse_mix(mix, custom_specs)
    names = [t.name for t in tasks]
    extra = []
    for text, key in [(public_mix, "pubswap.public-mix")] + [(m, "tasks.node-mixes") for m in
                                                             node_mixes_text.split(";")]:
        if text.strip():
            for spec in parse_mix(text, custom_specs, key=key):
                if spec.name not in names:
                    names.append(spec.name)
                    extra.append(spec)
    tasks = tasks + extra
    if eval_path:
        held_out = HeldOutSet(load_items(resolve_data_path(eval_path), fmt=data_format, uid_prefix="eval"))
    else:
        held_out = HeldOutSet.build(tasks, per_task, data_seed)
    public_tasks = parse_mix(public_mix, custom_specs, key="pubswap.public-mix") if public_mix.strip() else tasks[
        : len(tasks) - len(extra)]
    public = PublicSet.build(public_tasks, tasks, public_size, held_out.questions, data_seed, seed=data_seed)
    return TaskUniverse(tasks, held_out, public)


def task_universe(cfg: ExperimentConfig) -> TaskUniverse:
    return _universe(cfg.tasks.mix, cfg.pubswap.public_mix, cfg.tasks.custom, cfg.eval.items_per_task,
                     cfg.pubswap.public_size, cfg.tasks.data_seed, cfg.tasks.node_mixes, cfg.eval.data_path,
                     cfg.eval.data_format or cfg.tasks.data_format)


def policy_spec(cfg: ExperimentConfig, model_name: str | None = None) -> PolicySpec:
    g, t = cfg.generation, cfg.train
    return PolicySpec(
        model_name=model_name or cfg.model.name,
        dtype=cfg.model.dtype,
        device=cfg.model.device,
        lora=LoraSettings(cfg.model.lora_r, cfg.model.lora_alpha, cfg.model.lora_dropout, cfg.model.lora_targets),
        generation=GenerationSettings(g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_tokens),
        grpo=GRPOSettings(
            learning_rate=t.learning_rate, loss_type=t.loss_type, epsilon_low=t.epsilon_low,
            epsilon_high=t.epsilon_high, kl_beta=t.kl_beta, inner_iterations=t.inner_iterations,
            micro_batch_size=t.micro_batch_size, max_grad_norm=t.max_grad_norm, weight_decay=t.weight_decay,
            temperature=g.temperature, max_prompt_tokens=g.max_prompt_tokens,
            max_completion_tokens=g.max_new_tokens,
            proximal_mu=cfg.strategy.proximal_mu if cfg.uses_proximal else 0.0,
        ),
        template=cfg.tasks.template,
    )


def derive_seed(*parts: Any) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


# --- node identity and state -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeIdentity:
    """Who this node is: its index (seed ranges, default task mix), state dir, model and private data."""

    index: int
    state_dir: Path
    model_name: str
    data_path: str | None = None
    task_mix: str | None = None

    @classmethod
    def from_flower(cls, cfg: ExperimentConfig, node_config: dict, node_id: int, run_dir: str | None,
                    run_name: str) -> "NodeIdentity":
        """Simulation: partition-id from Flower, state under the run dir. Deployment: node-config keys
        `state-dir`, `data-path`, `model-name`, `task-mix`, optional `partition-id`."""
        partition = node_config.get("partition-id")
        index = int(partition) if partition is not None else int(node_id) % MAX_NODES
        simulated = "num-partitions" in node_config  # Flower sets it only for simulated nodes
        if node_config.get("state-dir"):
            state_dir = Path(str(node_config["state-dir"])).expanduser().resolve() / run_name
        elif run_dir and simulated:
            state_dir = Path(run_dir) / "nodes" / f"partition-{index}"
        else:
            state_dir = Path.home() / ".pubswap" / "state" / run_name / f"node-{node_id}"
        model = node_config.get("model-name") or _round_robin(cfg.model.node_models, index) or cfg.model.name
        data_path = node_config.get("data-path") or _round_robin(cfg.tasks.data_paths, index)
        return cls(index, state_dir, str(model), str(data_path) if data_path else None,
                   node_config.get("task-mix") or None)


def _round_robin(text: str, index: int) -> str | None:
    """Entry `index` (modulo length) of a comma-separated run-config list, or None when the list is empty."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return names[index % len(names)] if names else None


@dataclass
class NodeState:
    """Small JSON-able node state; tensors live in their own files next to it."""

    model_name: str = ""
    rounds: int = 0
    steps: int = 0
    sample_calls: int = 0
    cumulative_reward: float = 0.0
    last_round: int = 0
    cursor: StreamCursor = field(default_factory=StreamCursor)
    pending_public: dict[str, list[dict]] = field(default_factory=dict)  # uid -> own samples (text, ids)
    pending_sapo: list[dict] = field(default_factory=list)  # own groups of the current SAPO round
    peers: dict[str, tuple[int, int]] = field(default_factory=dict)  # sender -> (packets passed, failed)

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name, "rounds": self.rounds, "steps": self.steps,
            "sample_calls": self.sample_calls, "cumulative_reward": self.cumulative_reward,
            "last_round": self.last_round, "cursor": self.cursor.to_dict(),
            "pending_public": self.pending_public, "pending_sapo": self.pending_sapo,
            "peers": {k: list(v) for k, v in self.peers.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> "NodeState":
        return cls(
            model_name=str(data.get("model_name", "")), rounds=int(data.get("rounds", 0)),
            steps=int(data.get("steps", 0)), sample_calls=int(data.get("sample_calls", 0)),
            cumulative_reward=float(data.get("cumulative_reward", 0.0)), last_round=int(data.get("last_round", 0)),
            cursor=StreamCursor.from_dict(data.get("cursor", {})),
            pending_public=dict(data.get("pending_public", {})), pending_sapo=list(data.get("pending_sapo", [])),
            peers={str(k): (int(v[0]), int(v[1])) for k, v in dict(data.get("peers", {})).items()},
        )


@dataclass
class StepRecord:
    step: int
    kind: str  # "private" | "public" | "sapo"
    mean_reward: float
    completions: int
    sample_seconds: float
    update_seconds: float
    zero_advantage_groups: int = 0
    foreign_completions: int = 0


@dataclass
class WorkReport:
    """What a node did during one message: per-step records and timings."""

    steps: list[StepRecord] = field(default_factory=list)
    sample_seconds: float = 0.0
    update_seconds: float = 0.0
    num_examples: int = 0

    def add(self, record: StepRecord) -> None:
        self.steps.append(record)
        self.sample_seconds += record.sample_seconds
        self.update_seconds += record.update_seconds

    def mean_reward(self, kind: str | None = None) -> float:
        rows = [s for s in self.steps if kind is None or s.kind == kind]
        total = sum(s.completions for s in rows)
        return sum(s.mean_reward * s.completions for s in rows) / total if total else 0.0


class Node:
    """One organization's learner: its policy with its own adapter and optimizer, its private stream and state."""

    def __init__(self, cfg: ExperimentConfig, identity: NodeIdentity):
        self.cfg = cfg
        self.identity = identity
        self.universe = task_universe(cfg)
        self.policy: Policy = cached_policy(policy_spec(cfg, identity.model_name))
        self.state_dir = identity.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state = self._load_state()
        self.stream = self._build_stream()
        self.proximal_reference: dict[str, torch.Tensor] | None = None

    # -- persistence -----------------------------------------------------------------------------------------
    def _load_state(self) -> NodeState:
        path = self.state_dir / STATE_FILE
        self.policy.reset(derive_seed(self.cfg.seed, self.identity.index, "init"))
        if not path.is_file():
            return NodeState(model_name=self.identity.model_name)
        state = NodeState.from_dict(json.loads(path.read_text()))
        if state.model_name and state.model_name != self.identity.model_name:
            raise ValueError(f"state dir {self.state_dir} belongs to model {state.model_name!r}, "
                             f"not {self.identity.model_name!r}; use another state-dir or run-name")
        if (self.state_dir / ADAPTER_FILE).is_file():
            self.policy.load_adapter(load_file(str(self.state_dir / ADAPTER_FILE)))
        if (self.state_dir / OPTIMIZER_FILE).is_file():
            self.policy.learner.load_optimizer_state(
                torch.load(self.state_dir / OPTIMIZER_FILE, weights_only=True))
        return state

    def save(self) -> None:
        """Write adapter, optimizer and state atomically (temp file + rename), so a crash never leaves half."""
        tmp = self.state_dir / f".{ADAPTER_FILE}.tmp"
        save_file(self.policy.adapter(), str(tmp))
        os.replace(tmp, self.state_dir / ADAPTER_FILE)
        tmp = self.state_dir / f".{OPTIMIZER_FILE}.tmp"
        torch.save(self.policy.learner.optimizer_state(), tmp)
        os.replace(tmp, self.state_dir / OPTIMIZER_FILE)
        tmp = self.state_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.state.to_dict()))
        os.replace(tmp, self.state_dir / STATE_FILE)

    def begin_round(self, round_number: int) -> bool:
        """Called by a round's first message. A node that already worked on this round (the server was restarted
        and resumed from an earlier checkpoint) restores the state it had at the start of the round, so the
        round is repeated exactly; otherwise its current state is kept as that round's starting point.
        Returns True when it restored."""
        snapshot = self.state_dir / ROUND_START_DIR
        marker = snapshot / "round"
        if self.state.last_round >= round_number and marker.is_file() and int(marker.read_text()) == round_number:
            for name in (STATE_FILE, ADAPTER_FILE, OPTIMIZER_FILE):
                if (snapshot / name).is_file():
                    shutil.copy2(snapshot / name, self.state_dir / name)
            self.state = self._load_state()
            self.stream = self._build_stream()
            log.info("node %d: repeating round %d from its saved start", self.identity.index, round_number)
            return True
        self.save()
        tmp = self.state_dir / f".{ROUND_START_DIR}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name in (STATE_FILE, ADAPTER_FILE, OPTIMIZER_FILE):
            shutil.copy2(self.state_dir / name, tmp / name)
        (tmp / "round").write_text(str(round_number))
        if snapshot.exists():
            shutil.rmtree(snapshot)
        os.replace(tmp, snapshot)
        return False

    def _build_stream(self):
        cfg = self.cfg
        exclude = self.universe.training_exclude
        if self.identity.data_path:
            items = load_items(resolve_data_path(self.identity.data_path), fmt=cfg.tasks.data_format,
                               uid_prefix=f"node{self.identity.index}")
            return ItemListStream(items, exclude, seed=derive_seed(cfg.seed, self.identity.index, "data"))
        custom = parse_custom_tasks(cfg.tasks.custom)
        if self.identity.task_mix:
            mix = parse_mix(self.identity.task_mix, custom, key="node-config task-mix")
        elif cfg.tasks.node_mixes.strip():
            mixes = [m for m in cfg.tasks.node_mixes.split(";") if m.strip()]
            mix = parse_mix(mixes[self.identity.index % len(mixes)], custom, key="tasks.node-mixes")
        else:
            base = parse_mix(cfg.tasks.mix, custom)
            mix = node_mixes(base, self.identity.index + 1, cfg.tasks.per_node)[self.identity.index]
        names = [t.name for t in self.universe.tasks]
        unknown = [s.name for s in mix if s.name not in names]
        if unknown:
            raise ValueError(f"node task mix names tasks outside tasks.mix: {unknown}")
        return MixtureStream(mix, self.universe.tasks, self.identity.index, exclude, cfg.tasks.data_seed)

    @property
    def task_names(self) -> list[str]:
        if isinstance(self.stream, MixtureStream):
            return [s.name for s in self.stream.mix]
        return sorted({i.task for i in self.stream.items})

    # -- global adapter --------------------------------------------------------------------------------------
    def receive_global(self, adapter: dict[str, torch.Tensor]) -> None:
        """Start a round from the server's adapter; it is also the FedProx reference."""
        self.policy.load_adapter(adapter)
        self.proximal_reference = ({n: p.detach().clone() for n, p in self.policy.learner.params.items()}
                                   if self.cfg.uses_proximal else None)
        if self.cfg.train.reset_optimizer:
            self.policy.learner.reset_optimizer()

    # -- rollouts --------------------------------------------------------------------------------------------
    def _seed_sampling(self) -> None:
        torch.manual_seed(derive_seed(self.cfg.seed, self.identity.index, self.state.sample_calls, "sample"))
        self.state.sample_calls += 1

    def rollout(self, items: Sequence[TaskItem], k: int) -> tuple[list[RolloutGroup], float]:
        """Sample `k` completions per item with the current policy and score them; (groups, seconds)."""
        started = time.perf_counter()
        self._seed_sampling()
        samples = self.policy.sample(items, k)
        prompts = self.policy.prompts(items)
        groups = []
        limit = self.cfg.generation.max_completion_chars
        for item, prompt, row in zip(items, prompts, samples):
            completions = [Completion(s.text, tuple(s.token_ids)) for s in row]
            rewards = [score_completion(s.text, item, max_chars=limit).reward for s in row]
            groups.append(RolloutGroup(prompt, completions, rewards, item.uid, item.task))
        return groups, time.perf_counter() - started

    def formatter_prompt(self, item: TaskItem) -> str:
        return self.policy.formatter(item)

    def learn(self, groups: Sequence[RolloutGroup]):
        started = time.perf_counter()
        stats = self.policy.update(groups, self.proximal_reference)
        return stats, time.perf_counter() - started

    def private_steps(self, count: int, report: WorkReport) -> None:
        """`count` GRPO steps on fresh prompts from the private stream."""
        cfg = self.cfg.train
        for _ in range(count):
            items = self.stream.take(cfg.prompts_per_step, self.state.cursor)
            groups, sample_s = self.rollout(items, cfg.completions_per_prompt)
            stats, update_s = self.learn(groups)
            self.state.steps += 1
            rewards = [r for g in groups for r in g.rewards]
            self.state.cumulative_reward += sum(rewards) / len(rewards)
            report.num_examples += len(rewards)
            report.add(StepRecord(self.state.steps, "private", stats.mean_reward, stats.completions, sample_s,
                                  update_s, stats.zero_advantage_groups, stats.foreign_completions))


    # -- PubSwap public steps ------------------------------------------------------------------------------
    def _public_items(self, uids: Sequence[str]) -> list[TaskItem]:
        items = []
        for uid in uids:
            item = self.universe.public.get(uid)
            if item is None:
                raise ValueError(f"unknown public prompt id {uid!r}")
            items.append(item)
        return items

    def public_generate(self, uids: Sequence[str], k: int) -> tuple[dict[str, list[str]], float]:
        """K responses per public prompt with the node's current policy; own ids are kept for the public step."""
        items = self._public_items(uids)
        self._seed_sampling()
        started = time.perf_counter()
        samples = self.policy.sample(items, k)
        self.state.pending_public = {item.uid: [{"text": s.text, "ids": s.token_ids} for s in row]
                                     for item, row in zip(items, samples)}
        texts = {uid: [s["text"] for s in rows] for uid, rows in self.state.pending_public.items()}
        return texts, time.perf_counter() - started

    def public_update(self, response_sets: dict[str, list[dict]], report: WorkReport) -> None:
        """One GRPO step on the server-built response sets. Own responses keep their sampled ids; foreign text is
        re-tokenized; rewards are the server's (it re-verified every response)."""
        groups = []
        for uid, responses in response_sets.items():
            item = self._public_items([uid])[0]
            own = self.state.pending_public.get(uid, [])
            completions, rewards = [], []
            for response in responses:
                index = int(response.get("own_index", -1))
                if index >= 0:
                    if index >= len(own):
                        raise ValueError(f"response set for {uid!r} names own response {index}, "
                                         f"but only {len(own)} exist")
                    completions.append(Completion(own[index]["text"], tuple(own[index]["ids"])))
                else:
                    completions.append(Completion(str(response["text"]), None, str(response.get("source", "peer"))))
                rewards.append(float(response["reward"]))
            groups.append(RolloutGroup(self.formatter_prompt(item), completions, rewards, uid, item.task))
        if not groups:
            return
        stats, update_s = self.learn(groups)
        self.state.steps += 1
        self.state.pending_public = {}
        report.num_examples += stats.completions
        report.add(StepRecord(self.state.steps, "public", stats.mean_reward, stats.completions, 0.0, update_s,
                              stats.zero_advantage_groups, stats.foreign_completions))


    # -- SAPO rounds -----------------------------------------------------------------------------------------
    def sapo_generate(self, round_number: int, report: WorkReport) -> list[Packet]:
        """Sample B questions x L completions, keep them for training, return the `share` groups to share."""
        scfg = self.cfg.sapo
        items = self.stream.take(scfg.questions, self.state.cursor)
        groups, sample_s = self.rollout(items, scfg.completions)
        self.state.pending_sapo = [
            {"item": item.to_dict(), "texts": [c.text for c in g.completions],
             "ids": [list(c.token_ids or ()) for c in g.completions], "rewards": g.rewards}
            for item, g in zip(items, groups)]
        rewards = [r for g in groups for r in g.rewards]
        mean = sum(rewards) / len(rewards)
        self.state.cumulative_reward += mean
        report.add(StepRecord(self.state.steps, "rollout", mean, len(rewards), sample_s, 0.0,
                              sum(not g.has_signal for g in groups), 0))
        chosen = shuffled(range(len(items)), derive_seed(self.cfg.seed, self.identity.index, round_number, "share"))
        return [Packet("", items[i], tuple(c.text for c in groups[i].completions)) for i in chosen[: scfg.share]]

    def _pending_groups(self) -> list[RolloutGroup]:
        out = []
        for row in self.state.pending_sapo:
            item = TaskItem.from_dict(row["item"])
            completions = [Completion(t, tuple(ids)) for t, ids in zip(row["texts"], row["ids"])]
            out.append(RolloutGroup(self.formatter_prompt(item), completions, list(row["rewards"]), item.uid, item.task))
        return out

    def verified_item(self, item: TaskItem) -> TaskItem:
        """A peer's reasoning-gym item checked against its provenance: the receiver regenerates it (only for task
        specs in its own run, so a peer cannot make it build arbitrary generators) and scores with the regenerated
        entry, so a forged answer or tampered metadata is caught. Items from organization files cannot be
        regenerated and are scored as sent."""
        if item.verifier != "rg" or not self.cfg.sapo.verify_provenance:
            return item
        prov = item.provenance
        spec = next((t for t in self.universe.tasks if t.generator == prov.get("generator")
                     and dict(t.config) == dict(prov.get("config") or {})), None)
        if spec is None:
            raise ValueError(f"provenance names a task this node does not run: {prov.get('generator')!r}")
        seed, index = prov.get("seed"), prov.get("index")
        if not isinstance(seed, int) or not isinstance(index, int) or seed < 0 or not 0 <= index < RANGE:
            raise ValueError("provenance has no valid seed and index")
        entry = generate_entry(spec.generator, spec.config, seed, index)
        if entry["question"] != item.question:
            raise ValueError("question does not match its provenance")
        if (None if entry["answer"] is None else str(entry["answer"])) != item.answer:
            raise ValueError("answer does not match its provenance (forged)")
        return TaskItem(item.uid, spec.name, entry["question"], item.answer, "rg", entry["metadata"],
                        {"generator": spec.generator, "config": dict(spec.config), "seed": seed, "index": index},
                        item.family)

    def rescore(self, packet: Packet) -> list[float]:
        """Rewards of a peer's completions under this node's own verifier; ValueError when it cannot score them."""
        item = self.verified_item(packet.item)
        if item.verifier not in VERIFIERS:
            raise ValueError(f"unknown verifier {item.verifier!r}")
        if item.answer is None and item.verifier != "rg":
            raise ValueError("packet has no answer")
        if not packet.completions:
            raise ValueError("packet has no completions")
        if len(packet.completions) > self.cfg.sapo.completions * 4:
            raise ValueError(f"packet has {len(packet.completions)} completions")
        scores = [score_completion(text, item, max_chars=self.cfg.generation.max_completion_chars)
                  for text in packet.completions]
        return [s.reward for s in scores]

    def sapo_train(self, pool: Sequence[Packet], round_number: int, report: WorkReport) -> Selection:
        """Train on I own groups + J external groups (re-scored here, zero-advantage ones dropped)."""
        scfg = self.cfg.sapo
        rng = random.Random(derive_seed(self.cfg.seed, self.identity.index, round_number, "select"))
        local = select_local(self._pending_groups(), scfg.local, rng)
        weight = None
        if scfg.reputation:
            weight = lambda sender: reputation(*self.state.peers.get(sender, (0, 0)))  # noqa: E731
        selection = select_external(pool, scfg.external, self.rescore, rng, weight)
        for sender in sorted({p.sender for p in pool}):  # verification record per peer (reputation)
            passed, failed = self.state.peers.get(sender, (0, 0))
            count = sum(r.startswith(sender + "/") for r in selection.rejections)
            sent = sum(p.sender == sender for p in pool)
            self.state.peers[sender] = (passed + sent - count, failed + count)
        for problem in selection.rejections:
            log.warning("node %d dropped a peer packet: %s", self.identity.index, problem)
        if selection.shortfall and scfg.external:
            log.info("node %d: %d of J=%d external groups available after filtering (%d zero-advantage, "
                     "%d rejected, %d received)", self.identity.index, len(selection.chosen), scfg.external,
                     selection.zero_advantage, selection.rejected, selection.received)
        external = [RolloutGroup(self.formatter_prompt(s.packet.item),
                                 [Completion(t, None, s.packet.sender) for t in s.packet.completions],
                                 list(s.rewards), s.packet.item.uid, s.packet.item.task) for s in selection.chosen]
        groups = local + external
        if groups:
            stats, update_s = self.learn(groups)
            self.state.steps += 1
            report.num_examples += stats.completions
            report.add(StepRecord(self.state.steps, "sapo", stats.mean_reward, stats.completions, 0.0, update_s,
                                  stats.zero_advantage_groups, stats.foreign_completions))
        self.state.pending_sapo = []
        return selection

def shuffled(seq: Sequence, seed: int) -> list:
    out = list(seq)
    random.Random(seed).shuffle(out)
    return out

