"""Reply validation, used by every mode before anything is aggregated, verified or pooled.

Each check raises `Rejected` with a reason that names what was wrong; the strategy drops the client from the round
(or, for a SAPO packet, just that packet) and records the reason in the log and in metrics.jsonl.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np

from ..algorithms.sapo_selection import Packet, behaviours_from_wire
from ..config import ExperimentConfig
from ..metrics_schema import ITEM_RESULTS, SHORTCUT_TASKS
from ..rollouts import MAX_BEHAVIOUR_TOKENS, Behaviour
from ..tasks import TaskItem, items
from ..tasks.verifiers import VERIFIERS
from .compression import Codec, CodecError, Quantized

Adapter = dict[str, np.ndarray]
# An adapter value an honest node can send: adapters travel as fp16, whose largest finite value this is. Bounding
# every value here also keeps any mean of adapters, and an update's squared norm in float64, far from overflow.
MAX_ADAPTER_VALUE = float(np.finfo(np.float16).max)


class Rejected(ValueError):
    """A reply (or one packet of it) failed validation; the message is the reason."""


def number(record: Any, key: str, default: float | None = None, *, low: float = -math.inf,
           high: float = math.inf) -> float:
    """A finite scalar in [low, high] from a Metric/ConfigRecord; Rejected names the key otherwise."""
    if key not in record:
        if default is None:
            raise Rejected(f"'{key}' is missing")
        return default
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Rejected(f"'{key}' must be a finite number, got {type(value).__name__}")
    if not low <= value <= high:
        raise Rejected(f"'{key}' = {value} is outside [{low}, {high}]")
    return value


@dataclass(frozen=True)
class Limits:
    max_completion_chars: int = 4096
    score_seconds: float = 5.0  # scoring time per completion (the server's own scoring of public responses)
    sender_scoring_seconds: float = 60.0  # scoring time per sender per round; the rest of its answers get reward 0
    max_depth: int = 16  # nesting of JSON objects and lists in packet metadata and provenance
    max_question_chars: int = items.max_question_chars(256)  # generation.max-prompt-tokens x 32 (Limits.of)
    max_answer_chars: int = items.MAX_ANSWER_CHARS
    max_completions: int = 64  # per packet
    max_packets: int = 256  # per reply
    max_metadata_chars: int = 65536
    # a sampling behaviour's tokens (train.foreign-correction = "is"): the run's generation.max-new-tokens, the most
    # any sampler of the run draws; a longer one would only bloat what the server relays
    max_behaviour_tokens: int = MAX_BEHAVIOUR_TOKENS

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> "Limits":
        """The limits a run's own settings set: completion, behaviour and question length."""
        g = cfg.generation
        return cls(max_completion_chars=g.max_completion_chars, max_behaviour_tokens=g.max_new_tokens,
                   max_question_chars=items.max_question_chars(g.max_prompt_tokens))


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


def check_utf8(value: str, what: str) -> str:
    """Text that can be encoded as UTF-8 (JSON allows lone surrogates such as "\\ud800"; forwarding them fails)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Rejected(f"{what} is not valid Unicode text ({err.reason} at position {err.start})") from None
    return value


def check_depth(value: Any, limit: int, what: str) -> None:
    """Objects and lists nested at most `limit` deep (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, (dict, list)):
            if depth > limit:
                raise Rejected(f"{what} is nested more than {limit} levels deep")
            children = current.values() if isinstance(current, dict) else current
            stack.extend((child, depth + 1) for child in children)


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
        texts = responses[uid]
        if not isinstance(texts, list) or len(texts) != k:
            got = len(texts) if isinstance(texts, list) else type(texts).__name__
            raise Rejected(f"prompt {uid}: expected a list of {k} responses, got {got}")
        if not all(isinstance(t, str) for t in texts):
            raise Rejected(f"prompt {uid}: responses must be text")
        for text in texts:
            check_utf8(text, f"prompt {uid}: a response")
        longest = max((len(t) for t in texts), default=0)
        if longest > limits.max_completion_chars:
            raise Rejected(f"prompt {uid}: a response has {longest} chars, over the {limits.max_completion_chars} "
                           "limit")
        out[uid] = texts
    return out


@overload
def _text(entry: dict, key: str, limit: int, *, optional: Literal[False] = ...) -> str: ...
@overload
def _text(entry: dict, key: str, limit: int, *, optional: bool) -> str | None: ...
def _text(entry: dict, key: str, limit: int, *, optional: bool = False) -> str | None:
    value = entry.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise Rejected(f"'{key}' must be text, got {type(value).__name__}")
    if len(value) > limit:
        raise Rejected(f"'{key}' has {len(value)} chars, over the {limit} limit")
    return check_utf8(value, f"'{key}'")


def check_packet(entry: Any, limits: Limits, max_completions: int) -> Packet:
    """One shared SAPO rollout: item fields typed and bounded, a known verifier, an answer, 1..L completions."""
    if not isinstance(entry, dict):
        raise Rejected(f"packet is {type(entry).__name__}, not an object")
    item = entry.get("item")
    if not isinstance(item, dict):
        raise Rejected("packet has no 'item' object")
    question = _text(item, "question", limits.max_question_chars)
    if not question.strip():
        raise Rejected("'question' is empty")
    verifier = _text(item, "verifier", 64)
    if verifier not in VERIFIERS:
        raise Rejected(f"unknown verifier {verifier!r}")
    answer = _text(item, "answer", limits.max_answer_chars, optional=True)
    if answer is None and verifier != "rg":
        raise Rejected("'answer' is missing")
    for key in ("uid", "task"):
        _text(item, key, 256)
    provenance = item.get("provenance", {})
    if isinstance(provenance, dict):  # what a receiver regenerates the item from, when given
        for key, kinds in (("generator", str), ("config", dict), ("seed", int), ("index", int)):
            if key in provenance and (not isinstance(provenance[key], kinds) or isinstance(provenance[key], bool)):
                raise Rejected(f"provenance '{key}' must be {kinds.__name__}, got {type(provenance[key]).__name__}")
    for key in ("metadata", "provenance"):
        value = item.get(key, {})
        if not isinstance(value, dict):
            raise Rejected(f"'{key}' must be an object")
        check_depth(value, limits.max_depth, f"'{key}'")
        if len(repr(value)) > limits.max_metadata_chars:
            raise Rejected(f"'{key}' is over the {limits.max_metadata_chars}-char limit")
    completions = entry.get("completions")
    if not isinstance(completions, list) or not completions:
        raise Rejected("'completions' must be a non-empty list")
    if len(completions) > max_completions:
        raise Rejected(f"{len(completions)} completions, more than L = {max_completions}")
    for text in completions:
        if not isinstance(text, str):
            raise Rejected(f"a completion is {type(text).__name__}, not text")
        if len(text) > limits.max_completion_chars:
            raise Rejected(f"a completion has {len(text)} chars, over the {limits.max_completion_chars} limit")
        check_utf8(text, "a completion")
    check_utf8(json.dumps(item, ensure_ascii=False), "the item")  # also strings inside metadata
    try:
        behaviour = behaviours_from_wire(entry.get("behaviour"), len(completions), limits.max_behaviour_tokens)
    except ValueError as err:
        raise Rejected(behaviour_reason(err, limits)) from None
    tokenizer = entry.get("tokenizer", "")
    if not isinstance(tokenizer, str) or len(tokenizer) > 64:
        raise Rejected("'tokenizer' must be a fingerprint of at most 64 chars")
    return Packet("", TaskItem.from_dict(item), tuple(completions), behaviour, tokenizer)


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
            packets.append(check_packet(entry, limits, max_completions))
        except Rejected as err:
            reasons.append(f"packet {index}: {err}")
    return packets, reasons


def check_eval(result: Any) -> dict:
    """A node's self-reported held-out metrics (SAPO): numbers in [0, 1] for the known fields, per task likewise."""
    if not isinstance(result, dict):
        raise Rejected("evaluation result is not an object")
    fields = ("greedy_accuracy", "greedy_reward", "sampled_accuracy", "sampled_reward", "sampled_accuracy_se",
              "sampled_reward_se", "greedy_lenient_accuracy", "greedy_well_formed", "sampled_lenient_accuracy",
              "sampled_lenient_accuracy_se", "sampled_well_formed", "constant_accuracy", "greedy_modal_share",
              "sampled_modal_share")

    def numbers(row: Any, where: str) -> dict:
        if not isinstance(row, dict):
            raise Rejected(f"{where} is not an object")
        out = {}
        for key in fields:
            if key in row:
                value = row[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                    raise Rejected(f"{where}.{key} = {value!r} is not a number in [0, 1]")
                out[key] = float(value)
        if "greedy_accuracy" not in out:
            raise Rejected(f"{where} has no greedy_accuracy")
        return out

    clean = numbers(result, "eval")
    for key in ("items", "samples"):
        if key in result:
            value = result[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
                raise Rejected(f"eval.{key} = {value!r} is not a count")
            clean[key] = value
    per_task = result.get("per_task", {})
    if not isinstance(per_task, dict) or len(per_task) > 256:
        raise Rejected("eval.per_task is not an object of at most 256 tasks")
    clean["per_task"] = {check_utf8(str(task)[:128], "a task name"): numbers(row, f"eval.per_task[{task!r}]")
                         for task, row in per_task.items()}
    for key in SHORTCUT_TASKS:  # tasks whose answers collapsed: only tasks the evaluation itself reports
        if key in result:
            flagged = result[key]
            if not isinstance(flagged, list) or not all(isinstance(t, str) and t in clean["per_task"]
                                                        for t in flagged):
                raise Rejected(f"eval.{key} is not a list of the evaluation's own task names")
            clean[key] = sorted(set(flagged))
    if ITEM_RESULTS in result:
        clean[ITEM_RESULTS] = check_item_results(result[ITEM_RESULTS], clean.get("samples", 1))
    return clean


def check_item_results(raw: Any, samples: int, max_items: int = 100_000) -> dict:
    """A node's per-item correct counts (evaluation's ITEM_RESULTS): equal-length lists of uids, task names, greedy
    counts in {0, 1} and, when sampled, counts in [0, samples] (`samples`: the evaluation's own, already checked)."""
    if not isinstance(raw, dict):
        raise Rejected(f"eval.{ITEM_RESULTS} is not an object")
    uids, tasks = raw.get("uids"), raw.get("tasks")
    if not isinstance(uids, list) or not isinstance(tasks, list) or not 0 < len(uids) <= max_items \
            or len(tasks) != len(uids):
        raise Rejected(f"eval.{ITEM_RESULTS}: uids and tasks must be lists of the same length (1 to {max_items})")
    if not all(isinstance(u, str) and len(u) <= 128 for u in uids + tasks):
        raise Rejected(f"eval.{ITEM_RESULTS}: uids and tasks must be strings of at most 128 characters")
    out: dict = {"uids": uids, "tasks": tasks}
    for key, top in (("greedy", 1), ("sampled", samples)):
        if key not in raw:
            continue
        counts = raw[key]
        if not isinstance(counts, list) or len(counts) != len(uids) or not all(
                isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= top for c in counts):
            raise Rejected(f"eval.{ITEM_RESULTS}.{key} must be {len(uids)} counts in [0, {top}]")
        out[key] = counts
    if "sampled" in out:
        out["samples"] = samples
    return out
