"""Held-out evaluation of a policy: greedy pass@1, and sampled pass@1 (at generation.temperature) and mean reward
averaged over n samples per item, each with its standard error over items, per task and overall.

At this model scale RL moves sampled behaviour first (greedy accuracy can even dip while sampled reward
rises; tests/integration/test_learning.py), so both are reported. One sample per item leaves a standard error of
about 0.02 on a few hundred items, the size of a whole short run's gain; n samples per item shrink the part of it
that comes from sampling. Sampling uses a fixed seed so rounds and arms are comparable, and since 2026-12-06 (#55)
each item's samples come from random streams of its own (the seed and the item's uid), so splitting the items across
batches or processes changes no draw where the numerics do not depend on the batch (fp32); a bf16 model's rounding
does, so there a different split changes some samples (the same distribution). Figures from before that date are not
comparable draw for draw.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, NamedTuple, Sequence

import torch

from .metrics_schema import ITEM_RESULTS
from .policy import Policy
from .policy.sampling import stream_seed
from .settings import EvalSettings
from .tasks import TaskItem, lenient_answer, lenient_score, score_completion
from .tasks.rewards import RewardTable
from .tasks.shortcuts import check_task
from .tasks.verifiers import completion_shape

Progress = Callable[[str, int, int], None]  # (pass: "greedy" | "sampled" | "greedy + sampled", items done, items)
PROGRESS_EVERY_S = 20.0  # a real model's evaluation takes minutes (22 on a loaded machine); a tiny one's a second

log = logging.getLogger("pubswap_flwr")


def duration(seconds: float) -> str:
    """`45 s`, or `12 min 5 s` from a minute on."""
    whole = max(0, round(seconds))
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


class ProgressLog:
    """A Progress that logs `what: pass done/total items, elapsed, ETA` at INFO on the project's logger, at most every
    `every` seconds and always at a pass's last item. The ETA is the pass's rate so far over the items it has left."""

    def __init__(self, what: str, *, clock: Callable[[], float] = time.monotonic, every: float = PROGRESS_EVERY_S,
                 emit: Callable[[str], None] | None = None):
        self.what, self.clock, self.every = what, clock, every
        self.emit = emit or (lambda line: log.info("%s", line))
        self.started = self.last = self.called = clock()
        # the pass being timed: the next pass's clock starts where this one's last batch ended
        self.current: str | None = None

    def __call__(self, evaluation_pass: str, done: int, total: int) -> None:
        now = self.clock()
        if evaluation_pass != self.current:
            if self.current is not None:
                self.started = self.called
            self.current = evaluation_pass
        self.called = now
        if done < total and now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.started
        eta = elapsed * (total - done) / done if done else 0.0
        self.emit(f"{self.what}: {evaluation_pass} {done}/{total} items, {duration(elapsed)} elapsed, "
                  f"ETA {duration(eta)}")


Scores = tuple[dict[str, list[list[float]]], dict[str, list[list[float]]], dict[str, list[str | None]]]
# the greedy completion and the sampled ones of an item decoded together from one prefill of its prompt (a policy
# whose sampler can mix them: Policy.can_mix_greedy); False: a greedy pass, then a sampled pass (each its own prefill)
SHARED_PREFILL = True


def _add_scores(into: Scores, items: Sequence[TaskItem], rows: Sequence[Sequence], table: RewardTable,
                max_chars: int, lenient: bool) -> None:
    """Score each item's completions (`rows[i]` for `items[i]`) into `into` (see `_scores`)."""
    rewards, extra, answers = into
    for item, row in zip(items, rows):
        reward = table.for_task(item.task)
        rewards.setdefault(item.task, []).append(
            [score_completion(s.text, item, max_chars=max_chars, reward=reward).reward for s in row])
        answers.setdefault(item.task, []).extend(
            lenient_answer(s.text, item.answer) if isinstance(s.text, str) and len(s.text) <= max_chars else None
            for s in row)
        if lenient:
            extra.setdefault(item.task, []).append(
                [float(lenient_score(s.text, item, max_chars=max_chars, reward=reward).reward >= 1.0) for s in row]
                + [float(completion_shape(s.text) == "well-formed") for s in row])


class Scoring(NamedTuple):
    """What every pass of one evaluation shares: its settings, its progress callback and its reward table."""

    settings: EvalSettings
    progress: Progress | None
    rewards: RewardTable | None


def item_seed(seed: int, uid: str) -> int:
    """The seed of an item's sampled completions in an evaluation with seed `seed` (see `_scores`)."""
    return stream_seed(seed, "held-out item", uid)


def _scores(policy: Policy, items: Sequence[TaskItem], per_item: int, parts: Sequence[slice], pass_name: str,
            scoring: Scoring, **sample) -> list[Scores]:
    """One generation pass: `per_item` completions of every item (`policy.sample(..., **sample)`, batch_size
    sequences a call), scored as one Scores per slice of each item's completions in `parts`; `scoring`: the
    evaluation's settings, its progress callback and its reward table. A Scores is (task -> per
    item, the rewards of its samples; with `lenient`, task -> per item, each sample's lenient correctness (1/0)
    followed by whether it is well-formed (1/0), else {}; task -> every sample's answer (the tagged one, else the last
    number or word: tasks.lenient_answer), for the shortcut check). A policy with per-item streams
    (`has_item_streams`) draws each item's samples from streams seeded by the evaluation's seed and the item's uid
    (`item_seed`), so an item's results do not depend on the items beside it, the batch size or how items are split
    across calls or processes, up to the rounding a batch's size changes (bf16: some draws); any other policy samples
    from the global generator as `_passes` seeds it."""
    settings, progress, user_rewards = scoring
    max_chars, lenient = settings.max_chars, settings.lenient
    scores: list[Scores] = [({}, {}, {}) for _ in parts]
    table = user_rewards or RewardTable()
    own_streams = getattr(policy, "has_item_streams", False)
    streams = own_streams and not sample.get("greedy", False)
    # several calls at once only where an item's completions do not depend on its batch (the cached sampler)
    workers = eval_workers(settings) if own_streams else 1
    per_call = max(1, settings.batch_size // workers // per_item)
    chunks = [items[start:start + per_call] for start in range(0, len(items), per_call)]

    def seeds(chunk: Sequence[TaskItem]) -> dict:
        return {"item_seeds": [item_seed(settings.seed, item.uid) for item in chunk]} if streams else {}

    done = 0
    for chunk, out in zip(chunks, _sampled_chunks(policy, chunks, per_item, workers, seeds, sample)):
        for into, part in zip(scores, parts):
            _add_scores(into, chunk, [row[part] for row in out], table, max_chars, lenient)
        done += len(chunk)
        if progress is not None:
            progress(pass_name, done, len(items))
    return scores


def eval_workers(settings: EvalSettings) -> int:
    """eval.workers as a count: 0 means one per torch thread of this process. An item's draws do not depend on its
    batch where the numerics do not (the tiny fp32 models); a bf16 model's rounding does depend on the batch's size,
    so there a split changes some draws (the same distribution)."""
    return settings.workers or torch.get_num_threads()


def _sampled_chunks(policy: Policy, chunks: list[Sequence[TaskItem]], per_item: int, workers: int,
                    seeds: Callable[[Sequence[TaskItem]], dict], sample: dict) -> Iterator[list]:
    """Each chunk's completions, in order: one call at a time on the process's torch threads, or with `workers` > 1
    that many calls at once in threads of one torch thread each (torch's operations run outside the GIL; one call on
    2 threads leaves most of a decode step's small operations on one core)."""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            yield policy.sample(chunk, per_item, with_logprobs=False, **seeds(chunk), **sample)
        return
    threads = torch.get_num_threads()

    def one_thread() -> None:
        torch.set_num_threads(1)

    try:
        with policy.concurrent_sampling() as call, \
                ThreadPoolExecutor(max_workers=workers, initializer=one_thread) as pool:
            futures = [pool.submit(call, chunk, per_item, with_logprobs=False, **seeds(chunk), **sample)
                       for chunk in chunks]
            for future in futures:
                yield future.result()
    finally:
        torch.set_num_threads(threads)


def _passes(policy: Policy, items: Sequence[TaskItem], settings: EvalSettings, progress: Progress | None,
            rewards: RewardTable | None) -> tuple[Scores, Scores | None]:
    """The greedy pass's scores and, with `settings.sampled`, the sampled pass's (else None). Sampling starts from
    `settings.seed` and leaves the global random state as it found it; greedy rows draw nothing, so sharing the
    prefill (SHARED_PREFILL) leaves the sampled rows the seed's stream, as a pass of their own would."""
    every = [slice(None)]
    scoring = Scoring(settings, progress, rewards)
    samples, seed = settings.samples, settings.seed
    if not settings.sampled:
        return _scores(policy, items, 1, every, "greedy", scoring, greedy=True)[0], None
    shared = SHARED_PREFILL and policy.can_mix_greedy
    greedy = None if shared else _scores(policy, items, 1, every, "greedy", scoring, greedy=True)[0]
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        if greedy is None:  # each item's prompt prefilled once for its greedy and its sampled completions
            both = _scores(policy, items, samples + 1, [slice(0, 1), slice(1, None)], "greedy + sampled", scoring,
                           greedy_first=1)
            return both[0], both[1]
        return greedy, _scores(policy, items, samples, every, "sampled", scoring)[0]
    finally:
        torch.set_rng_state(state)


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample SD / sqrt(n); 0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def item_estimates(rewards: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Per item: the fraction of its samples that are correct (reward >= 1), and its mean reward."""
    accuracy = [sum(r >= 1.0 for r in row) / len(row) for row in rewards]
    reward = [sum(row) / len(row) for row in rewards]
    return accuracy, reward


def _summary(rewards: dict[str, list[list[float]]], prefix: str, out: dict, with_se: bool) -> None:
    def fill(target: dict, rows: list[list[float]]) -> None:
        accuracy, reward = item_estimates(rows)
        target[f"{prefix}_accuracy"], accuracy_se = mean_and_se(accuracy)
        target[f"{prefix}_reward"], reward_se = mean_and_se(reward)
        if with_se:
            target[f"{prefix}_accuracy_se"], target[f"{prefix}_reward_se"] = accuracy_se, reward_se

    fill(out, [row for rows in rewards.values() for row in rows])
    for task, rows in rewards.items():
        fill(out["per_task"].setdefault(task, {}), rows)


def _lenient_summary(extra: dict[str, list[list[float]]], prefix: str, out: dict, with_se: bool) -> None:
    """`{prefix}_lenient_accuracy` (answers right whatever the format, tasks.lenient_answer) and
    `{prefix}_well_formed` (share of samples with exactly one <answer>...</answer> and nothing after it)."""
    def fill(target: dict, rows: list[list[float]]) -> None:
        half = [len(row) // 2 for row in rows]
        right = [sum(row[:h]) / h for row, h in zip(rows, half)]
        formed = [sum(row[h:]) / h for row, h in zip(rows, half)]
        target[f"{prefix}_lenient_accuracy"], lenient_se = mean_and_se(right)
        target[f"{prefix}_well_formed"] = mean_and_se(formed)[0]
        if with_se:
            target[f"{prefix}_lenient_accuracy_se"] = lenient_se

    fill(out, [row for rows in extra.values() for row in rows])
    for task, rows in extra.items():
        fill(out["per_task"].setdefault(task, {}), rows)


def _shortcut_summary(items: Sequence[TaskItem], answers: dict[str, list[str | None]], prefix: str,
                      out: dict) -> None:
    """Per task: `constant_accuracy` (the best constant answer's accuracy on these items), `constant_answer`,
    `{prefix}_modal_share` and `{prefix}_modal_answer` (the model's most frequent answer) and, when the model's answers
    collapsed onto one value, the task in `{prefix}_shortcut_tasks` (tasks.shortcuts)."""
    golds: dict[str, list[str | None]] = {}
    for item in items:
        golds.setdefault(item.task, []).append(item.answer)
    flagged = []
    for task, task_answers in answers.items():
        check = check_task(golds[task], task_answers)
        row = out["per_task"].setdefault(task, {})
        row["constant_accuracy"], row["constant_answer"] = check.constant_accuracy, check.constant_answer
        row[f"{prefix}_modal_share"], row[f"{prefix}_modal_answer"] = check.modal_share, check.modal_answer
        if check.flagged:
            flagged.append(task)
    out[f"{prefix}_shortcut_tasks"] = flagged


def _item_results(items: Sequence[TaskItem], rewards: dict[str, list[list[float]]]) -> list[int]:
    """Per item, in `items` order: how many of its samples are correct (reward >= 1)."""
    position = {task: 0 for task in rewards}
    out = []
    for item in items:
        row = rewards[item.task][position[item.task]]
        position[item.task] += 1
        out.append(sum(r >= 1.0 for r in row))
    return out


def evaluate(policy: Policy, items: Sequence[TaskItem], settings: EvalSettings = EvalSettings(), *,
             progress: Progress | None = None, rewards: RewardTable | None = None) -> dict:
    """{"greedy_accuracy", "greedy_reward", ["sampled_accuracy", "sampled_reward" and their "_se", "samples"],
    "per_task": {...}, "items", ITEM_RESULTS}: sampled metrics average `samples` samples per item (at the policy's
    temperature); the standard errors are over items (the overall one treats items as independent draws of the task
    mix). With `lenient` (eval.lenient), also the lenient accuracy and the well-formed share of the same samples
    (`_lenient_summary`). Every task also gets its shortcut figures (`_shortcut_summary`). ITEM_RESULTS holds each
    item's uid and correct counts (greedy 0/1, sampled 0..samples) for item-level intervals; the run writes it to
    eval_items.jsonl, never into the metrics row. `progress(pass, items done, items)` is called after each batch.
    `rewards` (tasks.rewards) scores its tasks instead of their items' verifiers, as in training."""
    if not items:
        raise ValueError("no held-out items to evaluate")
    samples, lenient = settings.samples, settings.lenient
    if samples < 1:
        raise ValueError(f"samples per item must be >= 1, got {samples}")
    out: dict = {"per_task": {}, "items": len(items)}
    greedy_scores, sampled_scores = _passes(policy, items, settings, progress, rewards)
    scored, extra, answers = greedy_scores
    _summary(scored, "greedy", out, with_se=False)
    if lenient:
        _lenient_summary(extra, "greedy", out, with_se=False)
    _shortcut_summary(items, answers, "greedy", out)
    results = {"uids": [item.uid for item in items], "tasks": [item.task for item in items],
               "greedy": _item_results(items, scored)}
    if sampled_scores is not None:
        scored, extra, answers = sampled_scores
        _summary(scored, "sampled", out, with_se=True)
        if lenient:
            _lenient_summary(extra, "sampled", out, with_se=True)
        _shortcut_summary(items, answers, "sampled", out)
        results["sampled"], results["samples"] = _item_results(items, scored), samples
        out["samples"] = samples
    out[ITEM_RESULTS] = results
    return out
