"""Reply validation, used by every mode before anything is aggregated, verified or pooled.

Each check raises `Rejected` with a reason that names what was wrong; the strategy drops the client from the round
(or, for a SAPO packet, just that packet) and records the reason in the log and in metrics.jsonl.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..algorithms.sapo_selection import Packet, behaviours_from_wire
from ..metrics_schema import ITEM_RESULTS
from ..rollouts import Behaviour
from ..schema import check_utf8, parse
from ..tasks import TaskItem
from .compression import Codec, CodecError, Quantized
from .payloads import EvalResult, Limits, packet_schema, responses_schema

Adapter = dict[str, np.ndarray]
# An adapter value an honest node can send: adapters travel as fp16, whose largest finite value this is. Bounding
# every value here also keeps any mean of adapters, and an update's squared norm in float64, far from overflow.
MAX_ADAPTER_VALUE = float(np.finfo(np.float16).max)


class Rejected(ValueError):
    """A reply (or one packet of it) failed validation; the message is the reason."""


def check_adapter(adapter: Adapter, reference: Adapter) -> Adapter:
    """Same tensor keys and shapes as the global adapter, floating point, and, as the fp32 values it is aggregated
    in, finite and within MAX_ADAPTER_VALUE; returns those fp32 copies."""
    missing = sorted(set(reference) - set(adapter))
    extra = sorted(set(adapter) - set(reference))
    if missing or extra:
        raise Rejected(f"adapter keys differ from the global adapter (missing {missing[:2]}, unexpected {extra[:2]})")
    out = {}
    for key, value in adapter.items():
        if value.dtype.kind != "f":
            raise Rejected(f"adapter tensor {key} has dtype {value.dtype}, expected floating point")
        if value.shape != reference[key].shape:
            raise Rejected(f"adapter tensor {key} has shape {value.shape}, expected {reference[key].shape}")
        with np.errstate(over="ignore", invalid="ignore"):  # float64 beyond fp32's range becomes inf: refused
            wide = value.astype(np.float32)
        if not np.all(np.isfinite(wide)):
            raise Rejected(f"adapter tensor {key} has NaN or Inf values (or values not finite in float32, "
                           f"the aggregation's precision)")
        largest = float(np.abs(wide).max()) if wide.size else 0.0
        if largest > MAX_ADAPTER_VALUE:
            raise Rejected(f"adapter tensor {key} has a value of magnitude {largest:.3g}, over {MAX_ADAPTER_VALUE:g} "
                           "(the largest fp16 value: adapters travel as fp16)")
        out[key] = wide
    return out


def check_compressed(quantized: Quantized, reference: Adapter, codec: Codec) -> Adapter:
    """A compressed reply decoded against the global adapter it is a delta of: scales finite, >= 0 and bounded,
    one per block of the reference's tensors, codes in range and as many as the reference has values; the result
    then passes check_adapter. Returns fp32 reference + delta."""
    try:
        delta = codec.decode(quantized, reference)
    except CodecError as err:
        raise Rejected(f"compressed adapter ({codec.scheme}, block {codec.block}): {err}") from None
    return check_adapter({k: reference[k].astype(np.float32) + delta[k] for k in reference}, reference)


def check_weight(weight: Any) -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
        raise Rejected(f"num-examples must be a positive number, got {weight!r}")
    return float(weight)


def check_public_responses(payload: Any, uids: list[str], k: int, limits: Limits) -> dict[str, list[str]]:
    """Exactly the requested prompt ids, each with exactly K text responses within the size limit. Anything else the
    client put in the payload (claimed rewards included) is ignored: the server scores responses itself."""
    responses = payload.get("responses") if isinstance(payload, dict) else None
    if not isinstance(responses, dict):
        raise Rejected("payload has no 'responses' object")
    if set(responses) != set(uids):
        unknown = sorted(set(responses) - set(uids))[:3]
        missing = sorted(set(uids) - set(responses))[:3]
        raise Rejected(f"responses do not match the requested prompts (unknown ids {unknown}, missing ids {missing})")
    out = {}
    for uid in uids:
        texts = parse(responses[uid], responses_schema(k, limits), f"prompt {uid}: responses", Rejected)
        for text in texts:
            try:
                check_utf8(text, f"prompt {uid}: a response")
            except ValueError as err:
                raise Rejected(str(err)) from None
        out[uid] = texts
    return out


def check_packet(entry: Any, limits: Limits, max_completions: int, what: str = "packet") -> Packet:
    """One shared SAPO rollout (schema.packet_schema: item fields typed and bounded, a known verifier, an answer,
    1..L completions), with its behaviours decoded."""
    packet = parse(entry, packet_schema(limits, max_completions), what, Rejected)
    item = packet.item
    try:
        behaviour = behaviours_from_wire(packet.behaviour, len(packet.completions), limits.max_behaviour_tokens)
    except ValueError as err:
        raise Rejected(f"{what}: {behaviour_reason(err, limits)}") from None
    task_item = TaskItem(item.uid, item.task, item.question, item.answer, item.verifier, item.metadata,
                         item.provenance, item.family or "plain")
    return Packet("", task_item, tuple(packet.completions), behaviour, packet.tokenizer)


def behaviour_reason(err: ValueError, limits: Limits) -> str:
    return f"{err} (generation.max-new-tokens = {limits.max_behaviour_tokens})"


def check_behaviour(row: Any, limits: Limits) -> Behaviour:
    """A peer's sampling behaviour, in its wire encoding and at most generation.max-new-tokens long."""
    try:
        return Behaviour.from_wire(row, limits.max_behaviour_tokens)
    except ValueError as err:
        raise Rejected(behaviour_reason(err, limits)) from None


def check_packets(payload: Any, limits: Limits, max_completions: int) -> tuple[list[Packet], list[str]]:
    """Valid packets and a reason per rejected one. A reply without a packets list is rejected as a whole."""
    raw = payload.get("packets") if isinstance(payload, dict) else None
    if not isinstance(raw, list):
        raise Rejected("payload has no 'packets' list")
    if len(raw) > limits.max_packets:
        raise Rejected(f"{len(raw)} packets, over the {limits.max_packets} limit")
    packets, reasons = [], []
    for index, entry in enumerate(raw):
        try:
            packets.append(check_packet(entry, limits, max_completions, f"packet {index}"))
        except Rejected as err:
            reasons.append(str(err))
    return packets, reasons


@dataclass(frozen=True)
class HeldOutRequest:
    """The held-out evaluation the server asks of a node that evaluates its own adapter (sapo, local): each held-out
    item's task by uid, and the samples per item (None: greedy answers only, eval.sampled = false)."""

    tasks: Mapping[str, str]
    samples: int | None

    @classmethod
    def of(cls, items: Sequence[TaskItem], sampled: bool, samples: int) -> "HeldOutRequest":
        return cls({item.uid: item.task for item in items}, samples if sampled else None)


def held_out_problem(evaluation: EvalResult, request: HeldOutRequest) -> str | None:
    """What makes a node's evaluation other than the one the server asked for, or None: its per-item results must
    list every requested item exactly once with that item's task, greedy counts and, when asked, sampled counts of
    the samples asked (EvalResult keeps counts within them); its per-task rows only the items' tasks."""
    results = evaluation.item_results
    if results is None:
        return "lists no per-item results (item_results)"
    if request.samples is None and (evaluation.samples is not None or results.sampled is not None):
        return "reports sampled results; the server asked for greedy ones only (eval.sampled = false)"
    if request.samples is not None and evaluation.samples != request.samples:
        return (f"reports {evaluation.samples or 'no'} samples per item; the server asked for {request.samples} "
                "(eval.samples)")
    if results.greedy is None:
        return f"lists no greedy counts ({ITEM_RESULTS}.greedy)"
    if request.samples is not None and results.sampled is None:
        return f"lists no sampled counts ({ITEM_RESULTS}.sampled)"
    listed = Counter(results.uids)
    for uid in results.uids:
        if listed[uid] > 1:
            return f"lists held-out item {uid!r} {listed[uid]} times"
        if uid not in request.tasks:
            return f"item {uid!r} is not a held-out item the server asked for"
    missing = [uid for uid in request.tasks if uid not in listed]
    if missing:
        return (f"lacks {len(missing)} of the {len(request.tasks)} held-out items the server asked for (first: "
                f"{missing[0]!r})")
    for uid, task in zip(results.uids, results.tasks):
        if task != request.tasks[uid]:
            return f"names task {task!r} for item {uid!r}, whose task is {request.tasks[uid]!r}"
    known = set(request.tasks.values())
    unknown = [task for task in evaluation.per_task if task not in known]
    if unknown:
        return f"per_task names {unknown[0]!r}, not a task of the held-out items"
    if evaluation.items is not None and evaluation.items != len(request.tasks):
        return f"reports {evaluation.items} items; the server asked for {len(request.tasks)}"
    return None


def check_eval(result: Any, request: HeldOutRequest, what: str = "eval") -> dict:
    """A node's self-reported held-out metrics (SAPO, local), as schema.EvalResult declares them and covering what
    the server asked (held_out_problem), in the form the metrics row keeps; Rejected names `what` and the problem."""
    evaluation = parse(result, EvalResult, what, Rejected)
    problem = held_out_problem(evaluation, request)
    if problem is not None:
        raise Rejected(f"{what}: {problem}")
    return evaluation.to_dict()
