"""Run outputs: the run directory, metrics.jsonl (one JSON row per round), the config used, and console progress."""

from __future__ import annotations

import json
import logging
import math
import os
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from .. import metrics_schema as ms
from ..config import ExperimentConfig
from ..interruption import INTERRUPTED_DETAIL, interrupted
from ..schema import parse, parse_value_of

log = logging.getLogger("pubswap_flwr")


METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
STATUS_FILE = "status.json"
EVAL_ITEMS_FILE = "eval_items.jsonl"  # per evaluated round, each held-out item's correct counts (item-level intervals)
GLOBAL_ITEMS = "global"  # eval_items.jsonl's record of the server's own evaluation of the global adapter
HARDER_TIER_ITEMS = "harder_tier"  # ... of the global adapter on eval.harder-tier's items (other keys: node ids)
STOPPED = "stopped"
UNREADABLE = "unreadable"  # read_status of a status.json that cannot be read or is not a run's status
KEEP_UNREADABLE = "move the run folder away (or mend the file) to run it again"  # a sweep never clears such a run
MAX_STATUS_BYTES = 1 << 20  # write_status writes one line with the reason; the reason quotes at most a log's tail
STOP_DETAIL = "stopped before its last round: `flwr stop`, or its process was told to exit (SIGINT/SIGTERM)"
class RunExistsError(FileExistsError):
    """The run directory already holds metrics from another run."""


def refuse_existing_run(run_dir: Path) -> None:
    """RunExistsError when `run_dir` already holds a run's metrics (a new run must not mix its rows into them)."""
    metrics = run_dir / METRICS_FILE
    if metrics.exists() and metrics.stat().st_size > 0:
        raise RunExistsError(f"{run_dir} already holds a run's metrics; choose another run-name, remove the "
                             "directory, or set resume = true to continue it")


def json_safe(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, paths text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class RunRecorder:
    """Writes everything a run produces under one absolute directory."""

    def __init__(self, run_dir: Path, cfg: ExperimentConfig, run_id: int | str, *, resume_after: int | None = None):
        """`resume_after`: continue a run from its checkpoint at that round (rows after it are dropped)."""
        self.run_dir = run_dir
        self.cfg = cfg
        self.started = time.time()
        self.status = ""
        metrics = run_dir / METRICS_FILE
        if resume_after is None:
            refuse_existing_run(run_dir)
        if resume_after is not None and metrics.exists():
            kept = [row for row in read_metrics(run_dir) if row["round"] <= resume_after]
            metrics.write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in kept))
        items = run_dir / EVAL_ITEMS_FILE
        if resume_after is not None and items.exists():
            kept = [row for row in read_eval_items(run_dir) if row["round"] <= resume_after]
            items.write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in kept))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CONFIG_FILE).write_text(json.dumps({"run_id": str(run_id), "config": cfg.to_flat()}, indent=2))
        _RECORDERS.add(self)
        self.write_status("running")

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_FILE

    def write_row(self, row: dict) -> None:
        with self.metrics_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(json_safe(row), separators=(",", ":")) + "\n")

    def write_eval_items(self, round_number: int, results: dict[str, dict]) -> None:
        """One eval_items.jsonl row: `results` maps GLOBAL_ITEMS, HARDER_TIER_ITEMS or a node id to
        evaluation.ITEM_RESULTS."""
        row = {"round": round_number, **{key: json_safe(value) for key, value in results.items()}}
        with (self.run_dir / EVAL_ITEMS_FILE).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")

    def write_status(self, status: str, detail: str = "") -> None:
        if self.status == STOPPED:  # what the process does on its way out after a stop is not the run's outcome
            return
        if interrupted():  # whatever the run saw next (a lost node, a failed exchange) followed the Ctrl-C
            status, detail = STOPPED, INTERRUPTED_DETAIL
        self.status = status
        write_status(self.run_dir, status, detail, time.time() - self.started)

    def stopped_on_exit(self) -> None:
        """Called as the process exits (Flower's exit handlers: `flwr stop` makes the ServerApp's process exit
        through them): a run still `running` then was stopped, not finished."""
        if self.status == "running":
            self.write_status(STOPPED, STOP_DETAIL)

    def progress(self, row: dict) -> None:
        """One console line per round."""
        parts = [f"[round {row[ms.ROUND]}/{self.cfg.num_server_rounds}]"]
        if row.get(ms.TRAIN_REWARD) is not None:
            parts.append(f"train reward {row[ms.TRAIN_REWARD]:.3f} "
                         f"(cumulative {row.get(ms.CUMULATIVE_REWARD, 0):.2f})")
        if row.get(ms.ZERO_ADVANTAGE_SHARE) is not None:
            parts.append(f"zero-advantage groups {row[ms.ZERO_ADVANTAGE_SHARE]:.2f}")
        levels = [level for client in (row.get(ms.CLIENTS) or {}).values()
                  for level in (client.get(ms.CURRICULUM_LEVELS) or {}).values()]
        if levels:  # tasks.curriculum: where the nodes' private tasks stand
            parts.append(f"curriculum levels {min(levels)}-{max(levels)} (mean {sum(levels) / len(levels):.2f})")
        held = row.get(ms.EVAL)
        if held:
            text = ("held-out, self-reported by the nodes," if row.get(ms.NODE_EVAL) else "held-out") + \
                f" greedy {held[ms.GREEDY_ACCURACY]:.3f}"
            if ms.SAMPLED_ACCURACY in held:
                text += f" sampled {held[ms.SAMPLED_ACCURACY]:.3f}"
                if held.get(ms.SAMPLED_REWARD) is not None:  # optional in a node's self-reported evaluation
                    text += f" (reward {held[ms.SAMPLED_REWARD]:.3f})"
            harder = held.get(ms.HARDER_TIER)
            if harder:
                text += f", harder tier greedy {harder[ms.GREEDY_ACCURACY]:.3f}"
                if ms.SAMPLED_ACCURACY in harder:
                    text += f" sampled {harder[ms.SAMPLED_ACCURACY]:.3f}"
            parts.append(text)
        if ms.CLIENTS in row:
            text = f"{len(row[ms.CLIENTS])} clients"
            if row.get(ms.DROPPED):
                text += f", {len(row[ms.DROPPED])} dropped"
            parts.append(text)
        if ms.SWAP in row:
            parts.append(f"swapped pairs {row[ms.SWAP]['swapped_pair_fraction']:.2f}")
        if ms.TIME in row:
            parts.append(f"{row[ms.TIME]['round_s']:.1f} s")
        log.info(" | ".join(parts))


_RECORDERS: weakref.WeakSet[RunRecorder] = weakref.WeakSet()  # the runs this process records


def stop_recording(detail: str, since: float = 0.0) -> list[Path]:
    """The directories of the runs this process began recording at `since` (time.time()) or later, those still
    `running` marked stopped with `detail` (their own thread did not get to it)."""
    recorders = sorted((r for r in _RECORDERS if r.started >= since), key=lambda r: r.started)
    for recorder in recorders:
        if recorder.status == "running":
            recorder.write_status(STOPPED, detail)
    return [recorder.run_dir for recorder in recorders]


def write_status(run_dir: Path, status: str, detail: str = "", elapsed_s: float = 0.0) -> None:
    """status.json: `running`, `completed`, `failed` or `stopped`, with the reason; replaced atomically (a reader
    never sees half a file). Also used before a RunRecorder exists, e.g. when a resume fails on its checkpoint."""
    path = run_dir / STATUS_FILE
    tmp = run_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps({"status": status, "detail": detail, "elapsed_s": round(elapsed_s, 2)}))
    os.replace(tmp, path)


def final_adapters(run_dir: Path, holds_global_adapter: bool) -> str:
    """Where the run's final adapter is (the last words of a run's log): the global one, or each SAPO node's own
    (under the run directory in simulation, in its state dir on a deployed node's machine)."""
    if holds_global_adapter:
        return f"final adapter: {run_dir / 'adapters' / 'final'}"
    indices = sorted(int(p.parent.name.split("-", 1)[1]) for p in run_dir.glob("nodes/partition-*/adapter")
                     if p.parent.name.split("-", 1)[1].isdigit())
    if not indices:
        return f"final adapters: one per node, on each node's machine in <its state-dir>/{run_dir.name}/adapter"
    which = str(indices[0]) if len(indices) == 1 else "{" + ",".join(map(str, indices)) + "}"
    return f"final adapters, one per node: {run_dir / 'nodes'}/partition-{which}/adapter"


def read_status(run_dir: Path) -> dict:
    """status.json's `status`, `detail` and `elapsed_s`: {} when there is none, and `status` UNREADABLE with the
    reason as `detail` when it cannot be read or is not a run's status (write_status replaces the file whole, so
    that is someone else's file or a damaged disk): no caller may take such a run for completed, or for nothing.
    `detail` comes back printable (untrusted.printable): it is free text the run quoted, an error or a log's tail,
    which may hold line breaks and colour codes, so a control character in it is escaped rather than the file
    refused (a failed run would then read as unreadable, which a sweep never clears), and printed as it is nowhere."""
    from ..untrusted import UntrustedFileError, is_present, printable, read_json

    path = Path(run_dir) / STATUS_FILE
    try:
        if not is_present(path):
            return {}
        record = parse_value_of(path, read_json(path, limit=MAX_STATUS_BYTES), RunStatusFile, UntrustedFileError)
    except OSError as err:  # the run folder is a file, or cannot be searched
        reason = f"{path}: cannot be read ({err.strerror or err})"
        return {"status": UNREADABLE, "detail": printable(reason), "elapsed_s": None}
    except UntrustedFileError as err:  # its message may quote the file's values
        return {"status": UNREADABLE, "detail": printable(str(err)), "elapsed_s": None}
    return {"status": record.status, "detail": printable(record.detail), "elapsed_s": record.elapsed_s}


def mark_stopped(run_dir: Path, detail: str) -> bool:
    """Record a stop that the run's own process could not (it was killed): status.json `running` becomes `stopped`,
    keeping its elapsed time. Returns whether it changed anything."""
    status = read_status(run_dir)
    if status.get("status") != "running":
        return False
    write_status(Path(run_dir), STOPPED, detail, float(status.get("elapsed_s") or 0.0))
    return True


def mark_failed(run_dir: Path, detail: str) -> bool:
    """Record that Flower ended the run as failed (e.g. its nodes' heartbeats were lost): the run's process, told to
    exit, recorded `stopped` on its way out (it cannot tell a failure from `flwr stop`), or nothing (`running`).
    Either becomes `failed`, keeping the elapsed time and what the process had recorded; an outcome the run recorded
    itself (completed, failed) stays. Returns whether it changed anything."""
    status = read_status(run_dir)
    if status.get("status") not in ("running", STOPPED):
        return False
    recorded = f" (the run's process had recorded: {status['status']}, {status.get('detail') or 'no detail'})"
    write_status(Path(run_dir), "failed", detail + recorded, float(status.get("elapsed_s") or 0.0))
    return True


class MetricsError(ValueError):
    """A metrics.jsonl row the readers cannot use; the message names the file, line and field."""


class EvalTaskNumbers(Struct):
    """The held-out metrics the readers (report, verify, progress) use as numbers; a row may hold others. Any JSON
    number passes (NaN too), one beyond a float's range does not: the report takes means of them."""

    greedy_accuracy: float | None = None
    greedy_reward: float | None = None
    sampled_accuracy: float | None = None
    sampled_reward: float | None = None
    sampled_accuracy_se: float | None = None
    sampled_reward_se: float | None = None
    greedy_lenient_accuracy: float | None = None
    greedy_well_formed: float | None = None
    sampled_lenient_accuracy: float | None = None
    sampled_lenient_accuracy_se: float | None = None
    sampled_well_formed: float | None = None
    items: float | None = None
    samples: float | None = None


class EvalNumbers(EvalTaskNumbers):
    per_task: dict[str, EvalTaskNumbers] = {}


Seconds = Annotated[float, Meta(ge=0)]


class RoundTime(Struct):
    round_s: float
    sampling_s: Seconds | None = None


class RoundBytes(Struct):
    sent_by_clients: float
    received_by_clients: float


Share = Annotated[float, Meta(ge=0, le=1)]
Count = Annotated[int, Meta(ge=0)]


class SwapNumbers(Struct):
    policy_disagreement: float | None = None
    zero_advantage_before_swap: Share | None = None
    zero_advantage_after_swap: Share | None = None


class ClientNumbers(Struct):
    well_formed: float | None = None
    node_index: int | None = None
    trained_groups: Count | None = None
    zero_advantage_groups: Count | None = None
    zero_advantage_share: Share | None = None
    external_usable: Count | None = None
    external_zero_advantage_share: Share | None = None
    sample_s: Seconds | None = None
    curriculum_levels: dict[str, Annotated[int, Meta(ge=0, le=1000)]] | None = None
    dynamic_filled_share: Share | None = None


class MetricsRow(Struct):
    """A metrics.jsonl row as far as its readers use it (the runner writes more)."""

    round: Annotated[int, Meta(ge=0, lt=10**9)]
    mode: str = ""
    train_reward: float | None = None
    cumulative_reward: float | None = None
    parameter_drift: float | None = None
    zero_advantage_share: Share | None = None
    eval: EvalNumbers | None = None
    node_eval: dict[str, EvalNumbers] | None = None
    # absent or an object, never null: the readers index into them whenever the key is there
    time: RoundTime | msgspec.UnsetType = msgspec.UNSET
    bytes: RoundBytes | msgspec.UnsetType = msgspec.UNSET
    swap: SwapNumbers | None = None
    dropped: dict[str, Any] | None = None
    clients: dict[str, ClientNumbers] | msgspec.UnsetType = msgspec.UNSET


class RunConfigFile(Struct):
    """config.json as its readers use it: the run's flat config keys (checked further by ExperimentConfig; absent,
    {}: the report reads only the sampling temperature from it, verify refuses a run without them)."""

    config: dict[str, Any] = {}


class SamplingSettings(Struct):
    """The one config key the report reads without building the whole config: held-out samples' temperature."""

    temperature: float | None = msgspec.field(default=None, name="generation.temperature")


class RunStatusFile(Struct):
    """status.json as write_status writes it (other keys are ignored)."""

    status: Literal["running", "completed", "failed", "stopped"]
    detail: str = ""
    elapsed_s: float | None = None

    def __post_init__(self) -> None:
        if self.elapsed_s is not None and not math.isfinite(self.elapsed_s):  # json reads Infinity, NaN and 1e999
            raise ValueError(f"elapsed_s: must be a finite number of seconds, got {self.elapsed_s}")


class EvalItemsRecord(Struct):
    """One adapter's per-item counts in an eval_items.jsonl row (evaluation.ITEM_RESULTS), under GLOBAL_ITEMS (the
    server's own evaluation), HARDER_TIER_ITEMS (its evaluation on eval.harder-tier's items) or a node id (that node's
    self-reported one); `record_problem` checks what types cannot."""

    uids: list[str]
    tasks: list[str] | None = None
    samples: Annotated[float, Meta(gt=0)] | None = None
    greedy: list[float] | None = None
    sampled: list[float] | None = None


def record_problem(record: EvalItemsRecord, samples: float) -> str | None:
    """What makes a record one the runner never writes, or None: a list of another length than its uids, an item
    listed twice, a count below 0 or over its answers (1 greedy, `samples` sampled)."""
    for key, label in (("tasks", "tasks"), ("greedy", "greedy counts"), ("sampled", "sampled counts")):
        values = getattr(record, key)
        if values is not None and len(values) != len(record.uids):
            return f"lists {len(values)} {label} for {len(record.uids)} uids"
    listed = Counter(record.uids)
    for uid in record.uids:
        if listed[uid] > 1:
            return f"lists item {uid!r} {listed[uid]} times"
    for counts, top, answers in ((record.greedy, 1.0, "greedy answer"), (record.sampled, samples, "samples")):
        for uid, count in zip(record.uids, counts or ()):
            if not 0 <= count <= top:
                return f"counts {count:g} right of {top:g} {answers} for item {uid!r}"
    return None


def eval_items_records(row: dict, where: str, samples: float = math.inf) -> dict[str, EvalItemsRecord]:
    """One eval_items.jsonl row's records by key ("global" or a node id), each checked (record_problem: sampled
    counts against the record's own samples, else `samples`); ValueError names `where`, the round, the record and
    the item."""
    records = {}
    for key, value in row.items():
        if key != "round" and isinstance(value, dict):
            record = parse(value, EvalItemsRecord, f"{where}: round {row['round']}: {key!r}", ValueError)
            problem = record_problem(record, record.samples or samples)
            if problem is not None:
                raise ValueError(f"{where}: round {row['round']}: {key!r} {problem}")
            records[key] = record
    return records


def check_row(row: Any, where: str) -> dict:
    """`row` when its fields that readers use have the types they expect (MetricsRow); MetricsError naming `where`
    and the field otherwise."""
    parse(row, MetricsRow, f"{where}: row", MetricsError)
    return row


def parse_metrics(text: str, path: Path) -> list[dict]:
    """The rows of a metrics.jsonl's text, each checked (check_row); MetricsError names `path`, line and field."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise MetricsError(f"{path}:{number}: not a JSON row ({err.msg})") from None
            except (ValueError, RecursionError) as err:  # over 4300 digits; nested beyond the stack
                raise MetricsError(f"{path}:{number}: not a usable JSON row ({type(err).__name__})") from None
            rows.append(check_row(row, f"{path}:{number}"))
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The run's metrics.jsonl rows: a regular file (never a link or FIFO), each row checked (check_row).
    UntrustedFileError or MetricsError (both ValueError) name the file."""
    from ..untrusted import read_text

    path = Path(run_dir) / METRICS_FILE
    return parse_metrics(read_text(path), path)


def read_eval_items(run_dir: str | Path) -> list[dict]:
    """eval_items.jsonl's rows ([] for a run made before the file existed): a regular file (never a link or FIFO),
    each row's records checked (eval_items_records: a record whose counts are not the runner's, an item listed twice,
    is refused); ValueError names the file and line (and the round, record and item)."""
    from ..untrusted import is_present, read_text

    path = Path(run_dir) / EVAL_ITEMS_FILE
    if not is_present(path):
        return []
    rows = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON row ({err.msg})") from err
            if not isinstance(row, dict) or not isinstance(row.get("round"), int):
                raise ValueError(f"{path}:{number}: a row must be an object with an integer 'round'")
            eval_items_records(row, f"{path}:{number}")
            rows.append(row)
    return rows
