"""Disjoint data splits: a held-out eval set, one public set, a private stream per node (and the model builder's
supervised warm-up pool).

Every (split, node, task) draws reasoning-gym items from its own seed range [base, base + RANGE); ranges never
intersect, because adjacent reasoning-gym seeds share all but one item (item i of a dataset
seeded s is drawn from seed s + i). Small problem
spaces still repeat questions by chance (reasoning-gym repeats texts across seeds), so every source of training text
drops any question found in the eval set, compared by `question_key` (lower-cased, whitespace collapsed): public
prompts, private streams (and so SAPO's questions), an organization's own files; the held-out set itself leaves out
the questions a model was supervised on before any run (`HeldOutSet.build(exclude=...)`, shared.task_universe).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import AbstractSet as Set
from typing import Iterable, Sequence

from .items import TaskItem
from .specs import TaskSpec, generate_entry

RANGE = 10_000_000  # items per stream; indices never reach this
MAX_TASKS = 90  # tasks per split namespace (keeps private node ranges apart)
MAX_NODES = 10_000  # node indices (deployment: node id modulo this)
# Flower node ids a checkpoint or a protocol's state may list with their indices: every id a node had (Ray gives
# nodes new ids when a run resumes), so more than MAX_NODES
MAX_KNOWN_NODES = 10 * MAX_NODES
# public/eval/sft take one 1e9 block each; private streams start above them: MAX_NODES * MAX_TASKS * RANGE = 9e12.
SPLIT_BASE = {"public": 1_000_000_000, "eval": 2_000_000_000, "harder": 3_000_000_000, "sft": 4_000_000_000,
              "private": 10_000_000_000}  # harder: eval.harder-tier's held-out items
DATA_SEED_STRIDE = 10_000_000_000_000  # > private base + the whole private block


def question_key(text: str) -> str:
    """A question as deduplication compares it: lower-cased, runs of whitespace made one space, stripped."""
    return " ".join(str(text).split()).lower()


def stream_seed(split: str, task_index: int, node: int = 0, data_seed: int = 0) -> int:
    """First reasoning-gym seed of the (split, node, task) stream; ranges of distinct streams are disjoint."""
    if split not in SPLIT_BASE:
        raise ValueError(f"unknown split {split!r}")
    if not 0 <= task_index < MAX_TASKS:
        raise ValueError(f"task index {task_index} out of range")
    if not 0 <= node < MAX_NODES:
        raise ValueError(f"node index {node} out of range [0, {MAX_NODES})")
    base = SPLIT_BASE[split] + data_seed * DATA_SEED_STRIDE
    if split == "private":
        return base + (node * MAX_TASKS + task_index) * RANGE
    return base + task_index * RANGE


def rg_item(split: str, spec: TaskSpec, seed: int, index: int, uid: str) -> TaskItem:
    entry = generate_entry(spec.generator, spec.config, seed, index)
    return TaskItem(
        uid=uid,
        task=spec.name,
        question=entry["question"],
        answer=None if entry["answer"] is None else str(entry["answer"]),
        verifier="rg",
        metadata=entry["metadata"],
        provenance={"generator": spec.generator, "config": dict(spec.config), "seed": seed, "index": index,
                    "split": split},
    )


def unique_items(split: str, spec: TaskSpec, task_index: int, count: int, *, exclude: Set[str] = frozenset(),
                 data_seed: int = 0, max_scan_factor: int = 50) -> list[TaskItem]:
    """`count` items of one task with distinct question texts whose `question_key` is not in `exclude`, in stream
    order."""
    seed = stream_seed(split, task_index, data_seed=data_seed)
    out: list[TaskItem] = []
    seen = set(exclude)
    index = 0
    while len(out) < count:
        if index >= max(count * max_scan_factor, 1000):
            raise ValueError(
                f"task {spec.name!r} has too few distinct questions for {count} {split} items "
                f"(found {len(out)} in {index} draws); lower the {split} size or widen the task config"
            )
        item = rg_item(split, spec, seed, index, f"{split}/{spec.name}/{index}")
        index += 1
        key = question_key(item.question)
        if key in seen:
            continue
        seen.add(key)
        out.append(item)
    return out


@dataclass
class HeldOutSet:
    """The held-out evaluation set: `per_task` distinct questions of every task."""

    items: list[TaskItem]

    @classmethod
    def build(cls, tasks: Sequence[TaskSpec], per_task: int, data_seed: int = 0,
              exclude: Set[str] = frozenset(), split: str = "eval",
              indices: Sequence[int] | None = None) -> "HeldOutSet":
        """`exclude`: question keys the held-out set must not contain (texts a model was supervised on). `split`
        "harder" is eval.harder-tier's set, from its own seed ranges; `indices`: each task's seed-range slot (its
        place in the run's task list; default, its place in `tasks`)."""
        items: list[TaskItem] = []
        for index, spec in zip(indices if indices is not None else range(len(tasks)), tasks):
            items.extend(unique_items(split, spec, index, per_task, exclude=exclude, data_seed=data_seed))
        return cls(items)

    @property
    def questions(self) -> set[str]:
        """The held-out questions' keys (`question_key`): what every training source is deduplicated against."""
        return {question_key(item.question) for item in self.items}


@dataclass
class PublicSet:
    """The public prompt set shared by all clients; the server keeps the answers. Items are addressed by id."""

    items: list[TaskItem]
    by_uid: dict[str, TaskItem] = field(init=False)

    def __post_init__(self) -> None:
        self.by_uid = {item.uid: item for item in self.items}

    @classmethod
    def build(cls, tasks: Sequence[TaskSpec], all_tasks: Sequence[TaskSpec], size: int, exclude: set[str],
              data_seed: int = 0, seed: int = 0) -> "PublicSet":
        """`size` items spread over `tasks` in proportion to weight, deduped against `exclude` (eval questions)."""
        weights = [spec.weight for spec in tasks]
        counts = _apportion(size, weights)
        items: list[TaskItem] = []
        for spec, count in zip(tasks, counts):
            task_index = [s.name for s in all_tasks].index(spec.name)
            items.extend(unique_items("public", spec, task_index, count, exclude=exclude, data_seed=data_seed))
        random.Random(seed).shuffle(items)
        return cls(items)

    def get(self, uid: str) -> TaskItem | None:
        return self.by_uid.get(uid)


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split `total` into integer parts proportional to `weights` (largest remainder)."""
    norm = sum(weights)
    raw = [total * w / norm for w in weights]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass
class StreamCursor:
    """Where a private stream stands: draws made and the next raw index per task. Persisted with node state."""

    draws: int = 0
    next_index: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"draws": self.draws, "next_index": dict(self.next_index)}

    @classmethod
    def from_dict(cls, data: dict) -> "StreamCursor":
        return cls(int(data.get("draws", 0)), {str(k): int(v) for k, v in dict(data.get("next_index", {})).items()})


class MixtureStream:
    """A node's private, endless stream over its task mixture, drawn from that node's own seed ranges."""

    def __init__(self, mix: Sequence[TaskSpec], all_tasks: Sequence[TaskSpec], node: int, exclude: set[str],
                 data_seed: int = 0):
        names = [s.name for s in all_tasks]
        self.mix = list(mix)
        self.node = node
        self.exclude = exclude
        self.data_seed = data_seed
        self.seeds = {spec.name: stream_seed("private", names.index(spec.name), node, data_seed) for spec in mix}
        self._weights = [spec.weight for spec in self.mix]

    def take(self, count: int, cursor: StreamCursor) -> list[TaskItem]:
        """The next `count` items after `cursor`; advances `cursor` in place."""
        items = []
        for _ in range(count):
            chooser = random.Random(self.data_seed * 1_000_003 + self.node * 7_919 + cursor.draws)
            spec = chooser.choices(self.mix, weights=self._weights)[0]
            cursor.draws += 1
            index = cursor.next_index.get(spec.name, 0)
            while True:
                if index >= RANGE:
                    raise RuntimeError(f"private stream for {spec.name!r} on node {self.node} is exhausted")
                item = rg_item("private", spec, self.seeds[spec.name], index,
                               f"private/{self.node}/{spec.name}/{index}")
                index += 1
                if question_key(item.question) not in self.exclude:
                    break
            cursor.next_index[spec.name] = index
            items.append(item)
        return items


class ItemListStream:
    """An endless stream over a fixed item list (an organization's own file), reshuffled each epoch."""

    def __init__(self, items: Sequence[TaskItem], exclude: set[str], seed: int = 0):
        kept = [item for item in items if question_key(item.question) not in exclude]
        if not kept:
            raise ValueError("the dataset has no items left after removing held-out questions")
        self.items = kept
        self.dropped = len(items) - len(kept)
        self.seed = seed
        self._epoch_order: tuple[int, list[int]] = (-1, [])

    def take(self, count: int, cursor: StreamCursor) -> list[TaskItem]:
        out = []
        for _ in range(count):
            epoch, pos = divmod(cursor.draws, len(self.items))
            out.append(self.items[self._order(epoch)[pos]])
            cursor.draws += 1
        return out

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order[0] != epoch:
            order = list(range(len(self.items)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]


def node_mixes(tasks: Sequence[TaskSpec], num_nodes: int, per_node: int) -> list[list[TaskSpec]]:
    """Non-IID assignment: node n gets `per_node` consecutive tasks starting at task n (round robin); 0 = all."""
    if per_node <= 0 or per_node >= len(tasks):
        return [list(tasks) for _ in range(num_nodes)]
    return [[tasks[(n + j) % len(tasks)] for j in range(per_node)] for n in range(num_nodes)]


def all_questions(items: Iterable[TaskItem]) -> set[str]:
    return {item.question for item in items}
