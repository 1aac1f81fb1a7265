"""One run's headline numbers from its metrics.jsonl (RunSummary), and runs grouped by arm in the sweep's order."""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from ..metrics_schema import WELL_FORMED_WARNING
from ..schema import parse, parse_value_of
from ..server.metrics import (
    CONFIG_FILE,
    EVAL_ITEMS_FILE,
    GLOBAL_ITEMS,
    HARDER_TIER_ITEMS,
    STATUS_FILE,
    RunConfigFile,
    RunStatusFile,
    SamplingSettings,
    eval_items_records,
    read_eval_items,
    read_metrics,
)
from ..untrusted import UntrustedFileError, is_present, read_json

RUN_NAME = re.compile(r"^(?P<arm>.+)-s(?P<seed>\d+)$")
NAN = float("nan")


@dataclass
class RunSummary:
    arm: str
    seed: int
    run_dir: Path
    mode: str
    values: dict[str, float]
    per_task: dict[str, dict[str, float]]
    rows: list[dict] = field(repr=False)
    # round -> metric (greedy_accuracy, sampled_accuracy) -> item uid -> the item's value (eval_items.jsonl; {} for
    # runs made before it existed)
    items: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)
    item_tasks: dict[str, str] = field(default_factory=dict, repr=False)  # item uid -> its task, where recorded
    harder_items: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)  # as `items`,
    # on eval.harder-tier's items ({} for runs that did not record them)
    node_evals: dict[int, dict] = field(default_factory=dict)  # sapo: each node's own last held-out report, by index


def arm_and_seed(run_dir: Path) -> tuple[str, int]:
    match = RUN_NAME.match(run_dir.name)
    if not match:
        return run_dir.name, 0
    return match["arm"], int(match["seed"])


def _get(mapping: dict, key: str) -> float:
    value = mapping.get(key)
    return NAN if value is None else float(value)


def summarize_run(run_dir: Path) -> RunSummary:
    """The headline numbers of one run, all from its metrics.jsonl (and status.json's elapsed time if present).
    `sampled_accuracy_se` and `samples` are NaN when the run's evaluation did not record them (older metrics)."""
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}: metrics.jsonl is empty")
    evaluated = [r for r in rows if r.get("eval")]
    final = evaluated[-1]["eval"] if evaluated else {}
    node_evals = _node_evals(rows, evaluated[-1]) if evaluated else {}
    trained = [r for r in rows if r["round"] > 0]
    wall = sum(r["time"]["round_s"] for r in trained if "time" in r)
    status = run_dir / STATUS_FILE
    if is_present(status):
        wall = parse_value_of(status, read_json(status), RunStatusFile, UntrustedFileError).elapsed_s or wall
    values = {
        "greedy_accuracy": _get(final, "greedy_accuracy"),
        "sampled_accuracy": _get(final, "sampled_accuracy"),
        "sampled_accuracy_se": _get(final, "sampled_accuracy_se"),
        "samples": _get(final, "samples"),
        "sampled_reward": _get(final, "sampled_reward"),
        "cumulative_reward": (_get(trained[-1], "cumulative_reward") if "cumulative_reward" in trained[-1] else 0.0)
        if trained else 0.0,  # recorded as null: not a number (NaN), which the tables leave out
        "rounds": float(max(r["round"] for r in rows)),
        "wall_s": wall,
        "megabytes": sum(r["bytes"]["sent_by_clients"] + r["bytes"]["received_by_clients"]
                         for r in trained if "bytes" in r) / 1e6,
    }
    values["temperature"] = _sampling_temperature(run_dir)
    values["self_reported"] = float(bool(node_evals))
    values.update(format_health(trained))
    arm, seed = arm_and_seed(run_dir)
    samples = {row["round"]: row["eval"].get("samples") for row in evaluated}
    recorded = read_eval_items(run_dir)  # read once for both tiers
    items, item_tasks = item_values(run_dir, samples, rows=recorded)
    harder_items, _ = item_values(run_dir, samples, harder=True, rows=recorded)
    return RunSummary(arm, seed, run_dir, rows[-1].get("mode", "?"), values, final.get("per_task", {}), rows,
                      items=items, item_tasks=item_tasks, node_evals=node_evals, harder_items=harder_items)


def item_values(run_dir: Path, samples_by_round: dict[int, int | None] | None = None, harder: bool = False,
                rows: list[dict] | None = None, nodes: Collection[str] | None = None
                ) -> tuple[dict[int, dict[str, dict[str, float]]], dict[str, str]]:
    """Per evaluated round, each held-out item's greedy (0/1) and sampled (share of samples right) accuracy from
    eval_items.jsonl: the global adapter's, or (sapo, local) the mean over the nodes that reported the item (only
    those in `nodes`, node ids, when given: e.g. the receivers of a swarm) (`harder`:
    the global adapter's on eval.harder-tier's items, from the rounds that recorded them); and each item's task where
    the records name it. A record without its `samples` (the first runs that wrote the file) takes
    the round's eval.samples from metrics.jsonl. The file is read as the runner writes it: a record listing an item
    twice or counting more right answers than it has, or two records naming different tasks for one item (the server
    rejects a node's evaluation that names another), is refused with a ValueError naming the file, round and item."""
    path = run_dir / EVAL_ITEMS_FILE
    out: dict[int, dict[str, dict[str, float]]] = {}
    tasks: dict[str, str] = {}
    for row in read_eval_items(run_dir) if rows is None else rows:  # `rows`: the file's rows, read by the caller
        number = row["round"]
        fallback = (samples_by_round or {}).get(number) or 1
        records = eval_items_records(row, str(path), fallback)
        tier = records.pop(HARDER_TIER_ITEMS, None)
        if harder:
            if tier is None:
                continue
            chosen = {HARDER_TIER_ITEMS: tier}
        else:
            chosen = {GLOBAL_ITEMS: records[GLOBAL_ITEMS]} if GLOBAL_ITEMS in records else records
            if nodes is not None:
                chosen = {key: record for key, record in chosen.items() if key in nodes}
        sums: dict[str, dict[str, list[float]]] = {}
        for key, record in chosen.items():
            for uid, task in zip(record.uids, record.tasks or ()):
                if tasks.setdefault(uid, task) != task:
                    raise ValueError(f"{path}: round {number}: {key!r} names task {task!r} for item {uid!r}, "
                                     f"recorded before as {tasks[uid]!r}")
            samples = record.samples or fallback
            for metric, counts, scale in (("greedy_accuracy", record.greedy, 1),
                                          ("sampled_accuracy", record.sampled, samples)):
                if counts is None:
                    continue
                target = sums.setdefault(metric, {})
                for uid, count in zip(record.uids, counts):
                    target.setdefault(uid, []).append(count / scale)
        out[number] = {metric: {uid: statistics.fmean(v) for uid, v in values.items()}
                       for metric, values in sums.items()}
    return out, tasks


def _node_evals(rows: list[dict], final: dict) -> dict[int, dict]:
    """SAPO: the held-out metrics each node reported of its own adapter in the run's last evaluated round (whose
    `eval` is their mean), by node index; {} when the last evaluation was the server's own."""
    indices = {str(node): c.get("node_index") for r in rows for node, c in (r.get("clients") or {}).items()}
    reported = final.get("node_eval") or {}
    return {index: result for node, result in reported.items()
            if isinstance(index := indices.get(str(node)), int)}


def _sampling_temperature(run_dir: Path) -> float:
    """generation.temperature from the run's config.json (held-out samples are drawn with the run's own settings);
    NaN when the run has no readable config."""
    path = run_dir / CONFIG_FILE
    if not is_present(path):
        return NAN
    config = parse_value_of(path, read_json(path), RunConfigFile, UntrustedFileError).config
    temperature = parse(config, SamplingSettings, f"{path}: config", UntrustedFileError).temperature
    return NAN if temperature is None else temperature


def format_health(trained: list[dict]) -> dict[str, float]:
    """How well clients kept the <answer>...</answer> format in their own samples (`well_formed` per client per
    round): the mean over clients in the last round that recorded it, and how many client-rounds fell below the
    warning threshold (the first sign of a collapse, which the server also logs). NaN / 0 without the field."""
    shares = [(r["round"], c["well_formed"]) for r in trained for c in r.get("clients", {}).values()
              if isinstance(c.get("well_formed"), (int, float))]
    if not shares:
        return {"well_formed_last": NAN, "format_breaks": 0.0, "format_client_rounds": 0.0}
    last = max(number for number, _ in shares)
    return {"well_formed_last": statistics.fmean(v for number, v in shares if number == last),
            "format_breaks": float(sum(v < WELL_FORMED_WARNING for _, v in shares)),
            "format_client_rounds": float(len(shares))}


def group(runs: list[RunSummary]) -> dict[str, list[RunSummary]]:
    """Runs by arm, arms in the order first given (a sweep's own order), seeds ascending within an arm."""
    arms: dict[str, list[RunSummary]] = {}
    for run in runs:
        arms.setdefault(run.arm, []).append(run)
    return {arm: sorted(members, key=lambda r: r.seed) for arm, members in arms.items()}
