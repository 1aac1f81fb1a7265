"""Per-round curves over seeds for the plots: each round's mean with its 95% CI, of an arm or of its paired
difference to the baseline."""

from __future__ import annotations

from typing import Callable

from .. import metrics_schema as schema
from .statistics import Interval, mean_ci
from .summaries import RunSummary

Pick = Callable[[dict], "float | None"]


def _series(rows: list[dict], pick: Pick) -> dict[int, float]:
    out = {}
    for r in rows:
        value = pick(r)
        if value is not None and value == value:
            out[r["round"]] = float(value)
    return out


def band(runs: list[RunSummary], pick: Pick) -> tuple[list[int], list[Interval]]:
    """Per round, the mean over seeds with its 95% CI (over the seeds that have a value that round)."""
    per_round: dict[int, list[float]] = {}
    for run in runs:
        for rnd, value in _series(run.rows, pick).items():
            per_round.setdefault(rnd, []).append(value)
    rounds = sorted(per_round)
    return rounds, [mean_ci(per_round[r]) for r in rounds]


def paired_band(runs: list[RunSummary], baseline_runs: list[RunSummary],
                pick: Pick) -> tuple[list[int], list[Interval]]:
    """Per round, the arm-minus-baseline difference on each shared seed, averaged over seeds with its 95% CI."""
    base = {r.seed: _series(r.rows, pick) for r in baseline_runs}
    per_round: dict[int, list[float]] = {}
    for run in runs:
        if run.seed not in base:
            continue
        for rnd, value in _series(run.rows, pick).items():
            if rnd in base[run.seed]:
                per_round.setdefault(rnd, []).append(value - base[run.seed][rnd])
    rounds = sorted(per_round)
    return rounds, [mean_ci(per_round[r]) for r in rounds]


def _eval(key: str) -> Pick:
    return lambda r: (r.get(schema.EVAL) or {}).get(key)


def _megabytes(row: dict) -> float | None:
    if "bytes" not in row or row["round"] == 0:
        return None
    return (row["bytes"]["sent_by_clients"] + row["bytes"]["received_by_clients"]) / 1e6


PICKS: dict[str, Pick] = {
    schema.SAMPLED_ACCURACY: _eval(schema.SAMPLED_ACCURACY),
    schema.GREEDY_ACCURACY: _eval(schema.GREEDY_ACCURACY),
    schema.TRAIN_REWARD: lambda r: r.get(schema.TRAIN_REWARD),
    schema.CUMULATIVE_REWARD: lambda r: r.get(schema.CUMULATIVE_REWARD) if r[schema.ROUND] > 0 else None,
    schema.PARAMETER_DRIFT: lambda r: r.get(schema.PARAMETER_DRIFT),
    "policy_disagreement": lambda r: (r.get(schema.SWAP) or {}).get("policy_disagreement"),
    "megabytes": _megabytes,
}
