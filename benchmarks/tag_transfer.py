"""Benchmark (#52 item 1): can one GRPO update on a warm donor's groups teach the raw SmolLM2 to open the answer tag?

    python benchmarks/tag_transfer.py [--prompts 16] [--k 8] [--new-tokens 64] [--held-out 50] [--threads 0]

The cancellation law (tests/unit/test_cancellation_law.py; /work/shared/DESIGN.md "Where sharing can act"): with
group-centred advantages, the token-level ("dapo") loss and one inner iteration, a token every member of a group
shares in the same context gets no net gradient, so groups in which every member opens the tag cannot push the tag
up; groups whose right members are tagged and wrong members not carry the contrast. Measured on the real model:

1. Donor groups: smollm2-135m-warm samples K completions for each of P training-split prompts of one task of
   configs/real.toml (its generation settings: T 0.7, its token limit unless --new-tokens), scored by the verifiers;
   the groups with mixed rewards are kept (how many of P, and the tag rate of right and wrong members).
2. Arms, each one GRPO update of the raw model (smollm2-135m-instruct) from the same fresh LoRA adapter and an empty
   optimizer (same seed), on those groups entering as a SAPO receiver's external groups do (foreign text,
   re-tokenized, prompt rendered and rewards re-scored by the receiver): (i) as sent; (ii) "<answer>"/"</answer>"
   stripped from the wrong members' text (the inner text kept); (iii) the control, stripped from every member (it
   keeps the donor's rewards: re-scored without tags every member would score 0). configs/real.toml's learning rate
   and micro-batch, loss-type "dapo", one inner iteration, foreign-correction "none".
3. On N held-out prompts of the same task, before and after each arm: the raw model's log P("<answer>" | prompt) as
   its first completion tokens (the sum over the tag's sub-tokens, and the first sub-token alone) at the sampling
   temperature and at T = 1; mean and SE over prompts of each arm's change, and (ii) - (i), (iii) - (i) with paired
   t intervals over prompts.
4. Foreign-correction "is" on arm (i)'s batch, computed without stepping: the truncated IS weight
   min(exp(receiver - donor), cap) of the donor's own ids, averaged over the tag-opening sub-token, the other tag
   tokens and the other tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from pubswap_flwr.settings import GRPOSettings
    from pubswap_flwr.tasks import TaskItem

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONFIG = ROOT / "configs" / "real.toml"
DONOR, RECEIVER = "smollm2-135m-warm", "smollm2-135m-instruct"
SENDER = "donor"  # the external completions' source, as a SAPO packet's sender
TAG_OPEN, TAG_CLOSE = "<answer>", "</answer>"
ARMS = ("as sent", "wrong stripped", "all stripped")  # (i), (ii), (iii)


@dataclass(frozen=True)
class DonorGroup:
    """One prompt's donor completions as the donor sampled and scored them (its packet, with behaviours)."""

    item: TaskItem
    texts: tuple[str, ...]
    ids: tuple[tuple[int, ...], ...]
    logprobs: tuple[tuple[float, ...], ...]
    rewards: tuple[float, ...]

    @property
    def mixed(self) -> bool:
        return max(self.rewards) - min(self.rewards) > 1e-12


def strip_tags(text: str) -> str:
    """The text without its answer tags, the text between them kept ("So <answer>7</answer>" -> "So 7")."""
    return text.replace(TAG_OPEN, "").replace(TAG_CLOSE, "")


def arm_texts(texts: Sequence[str], rewards: Sequence[float], arm: str) -> list[str]:
    """The members' texts an arm trains on: as sent, tags stripped from the wrong members (reward below 1), or
    stripped from every member."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")
    if arm == "as sent":
        return list(texts)
    return [strip_tags(t) if arm == "all stripped" or r < 1.0 else t for t, r in zip(texts, rewards)]


def tag_rate(groups: Sequence[DonorGroup], right: bool) -> tuple[int, int]:
    """(members that open the tag, members) among the right (reward 1) or the wrong members of `groups`."""
    members = [t for g in groups for t, r in zip(g.texts, g.rewards) if (r >= 1.0) == right]
    return sum(TAG_OPEN in t for t in members), len(members)


def opening_token_mask(tokenizer, completion_ids, completion_mask):
    """(B, C) bool: each row's tokens that begin an "<answer>" (the token whose text overlaps the tag's first
    character), found by decoding token by token as grpo_batch.tag_token_mask does."""
    import torch

    mask = torch.zeros_like(completion_mask, dtype=torch.bool)
    for row in range(completion_ids.shape[0]):
        text = ""
        starts = []
        for token in completion_ids[row][completion_mask[row].bool()].tolist():
            starts.append(len(text))
            text += tokenizer.decode([token], skip_special_tokens=False)
        at = text.find(TAG_OPEN)
        while at >= 0:
            index = max(i for i, start in enumerate(starts) if start <= at)
            mask[row, index] = True
            at = text.find(TAG_OPEN, at + 1)
    return mask


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error over `values` (SE NaN for fewer than 2)."""
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, se


# -- the models ------------------------------------------------------------------------------------------------

def load_config():
    """configs/real.toml over the app's defaults, as `flwr run -c configs/real.toml` fuses them."""
    from pubswap_flwr.config import ExperimentConfig, load_toml
    from pubswap_flwr.server.preflight import app_defaults

    return ExperimentConfig.from_flat({**app_defaults(ROOT), **load_toml(CONFIG)})


def build_policy(cfg, model_name: str, new_tokens: int):
    """A node's policy of `model_name` (shared.policy_spec) with this measurement's update settings."""
    from pubswap_flwr.policy import Policy
    from pubswap_flwr.shared import policy_spec

    spec = policy_spec(cfg, model_name)
    spec = dataclasses.replace(
        spec, generation=dataclasses.replace(spec.generation, max_new_tokens=new_tokens),
        grpo=dataclasses.replace(spec.grpo, loss_type="dapo", inner_iterations=1, foreign_correction="none"))
    return Policy(spec)


def donor_groups(cfg, items, k: int, new_tokens: int, seed: int) -> list[DonorGroup]:
    """The warm donor's K samples per item, scored as node_runtime/learner.py's Learner.rollout scores them."""
    import torch

    from pubswap_flwr.tasks import score_completion, training_reward

    donor = build_policy(cfg, DONOR, new_tokens)
    torch.manual_seed(seed)
    samples = donor.sample(items, k)
    limit, partial = cfg.generation.max_completion_chars, cfg.tasks.partial_credit
    groups = [DonorGroup(item, tuple(s.text for s in row), tuple(tuple(s.token_ids) for s in row),
                         tuple(tuple(s.logprobs) for s in row),
                         tuple(training_reward(score_completion(s.text, item, max_chars=limit).reward, partial)
                               for s in row))
              for item, row in zip(items, samples)]
    del donor
    gc.collect()
    return groups


def external_group(policy, cfg, group: DonorGroup, arm: str, correction: str = "none"):
    """`group` as a SAPO receiver trains on it (protocols/sapo.py SapoNode.train_on_pool and external_completions,
    node_runtime/learner.py Learner.foreign_completion): the receiver's prompt, the text as a foreign completion (with
    the donor's behaviour under "is" when accept_behaviour takes it) and the receiver's re-scored rewards; the
    all-stripped control keeps the donor's rewards."""
    from pubswap_flwr.policy.behaviour import accept_behaviour
    from pubswap_flwr.rollouts import Behaviour, Completion, RolloutGroup
    from pubswap_flwr.tasks import score_completion, training_reward

    texts = arm_texts(group.texts, group.rewards, arm)
    completions = []
    for text, ids, logprobs in zip(texts, group.ids, group.logprobs):
        usable = None
        if correction == "is":
            usable, _ = accept_behaviour(policy.tokenizer, text, Behaviour(ids, logprobs),
                                         policy.spec.generation.max_new_tokens)
        completions.append(Completion(text, None, SENDER, usable))
    if arm == "all stripped":
        rewards = list(group.rewards)
    else:
        limit, partial = cfg.generation.max_completion_chars, cfg.tasks.partial_credit
        rewards = [training_reward(score_completion(t, group.item, max_chars=limit).reward, partial) for t in texts]
        if rewards != list(group.rewards):
            raise RuntimeError(f"arm {arm!r}: the receiver re-scored item {group.item.uid} as {rewards}, the donor "
                               f"as {list(group.rewards)}: the arms would differ in rewards, not only in tags")
    return RolloutGroup(policy.prompts([group.item])[0], completions, rewards, group.item.uid, group.item.task)


def opening_logps(policy, prompts: Sequence[str], temperature: float) -> tuple[list[float], list[float]]:
    """Per prompt, the policy's log P("<answer>" | prompt) as the first completion tokens at `temperature`: summed
    over the tag's sub-tokens, and of the first sub-token alone."""
    import torch

    from pubswap_flwr.policy.grpo_batch import build_batch
    from pubswap_flwr.policy.grpo_loss import completion_logps
    from pubswap_flwr.rollouts import Completion, RolloutGroup

    ids = tuple(policy.tokenizer(TAG_OPEN, add_special_tokens=False)["input_ids"])
    groups = [RolloutGroup(prompt, [Completion(TAG_OPEN, ids)], [0.0]) for prompt in prompts]
    batch = build_batch(policy.tokenizer, groups, policy.spec.generation)
    policy.model.eval()
    with torch.no_grad():
        logps = completion_logps(policy.model, batch, slice(0, len(prompts)), temperature)
    return logps.sum(-1).tolist(), logps[:, 0].tolist()


def is_weights(policy, groups, s: GRPOSettings) -> tuple[dict[str, tuple[float, int, float, float]], Counter[str]]:
    """Foreign-correction "is" (settings `s`) on `groups` without stepping: per token class (tag-opening sub-token,
    other tag tokens, other tokens) of the rows with an accepted behaviour, (mean truncated IS weight, tokens, share
    at the cap, mean receiver - donor log-ratio); and how often each token text opened the tag."""
    import torch

    from pubswap_flwr.policy.grpo import foreign_token_weights
    from pubswap_flwr.policy.grpo_batch import build_batch, tag_token_mask
    from pubswap_flwr.policy.grpo_loss import completion_logps

    generation = policy.spec.generation
    batch = build_batch(policy.tokenizer, groups, generation)
    if batch.has_behaviour is None or batch.donor_logps is None:
        raise RuntimeError("no donor behaviour was accepted: nothing to weight")
    policy.model.eval()
    with torch.no_grad():
        receiver = torch.cat([completion_logps(policy.model, batch, slice(i, i + s.micro_batch_size),
                                               generation.temperature)
                              for i in range(0, len(batch.rewards), s.micro_batch_size)])
    weights = foreign_token_weights(receiver, batch.foreign, "is", s.foreign_weight, s.is_cap, batch.donor_logps,
                                    batch.has_behaviour)
    ratio = receiver - batch.donor_logps
    rows = batch.completion_mask.bool() & batch.has_behaviour.unsqueeze(1)
    tags = tag_token_mask(policy.tokenizer, batch.completion_ids, batch.completion_mask, batch.foreign)
    opening = opening_token_mask(policy.tokenizer, batch.completion_ids, batch.completion_mask)
    classes = {"tag-opening sub-token": rows & opening, "other tag tokens": rows & tags & ~opening,
               "other tokens": rows & ~tags}
    openings = Counter(policy.tokenizer.decode([int(i)]) for i in batch.completion_ids[rows & opening].tolist())
    out = {}
    for name, mask in classes.items():
        count = int(mask.sum())
        out[name] = (float(weights[mask].mean()) if count else float("nan"), count,
                     float((weights[mask] >= s.is_cap).float().mean()) if count else float("nan"),
                     float(ratio[mask].mean()) if count else float("nan"))
    return out, openings


# -- the run ---------------------------------------------------------------------------------------------------

def _items(cfg, task: str, prompts: int, held_out: int):
    """P training-split items of `task` (node 0's private stream, held-out and public questions excluded) and the
    first N held-out items of `task`."""
    from pubswap_flwr.shared import task_universe
    from pubswap_flwr.tasks import MixtureStream, StreamCursor

    universe = task_universe(cfg)
    spec = next((t for t in universe.tasks if t.name == task), None)
    if spec is None:
        raise SystemExit(f"--task {task!r} is not one of configs/real.toml's tasks: "
                         f"{', '.join(t.name for t in universe.tasks)}")
    stream = MixtureStream([spec], universe.tasks, 0, universe.training_exclude, cfg.tasks.data_seed)
    training = stream.take(prompts, StreamCursor())
    evaluation = [item for item in universe.held_out.items if item.task == task][:held_out]
    if len(evaluation) < held_out:
        raise SystemExit(f"configs/real.toml holds {len(evaluation)} held-out {task} items, fewer than --held-out "
                         f"{held_out}")
    return training, evaluation


def _change_line(label: str, before: Sequence[float], after: Sequence[float]) -> str:
    mean, se = mean_se([a - b for a, b in zip(after, before)])
    return (f"{label}: {statistics.fmean(before):7.3f} -> {statistics.fmean(after):7.3f}, change {mean:+.4f} "
            f"(SE {se:.4f})")


def _difference_line(label: str, base: Sequence[float], other: Sequence[float]) -> str:
    from pubswap_flwr.report.statistics import mean_ci

    interval = mean_ci([o - b for o, b in zip(other, base)])
    return f"{label}: {interval.mean:+.4f}  95% paired t interval [{interval.low:+.4f}, {interval.high:+.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="basic_arithmetic", help="one of configs/real.toml's tasks")
    parser.add_argument("--prompts", type=int, default=16, help="P: training prompts the donor samples")
    parser.add_argument("--k", type=int, default=8, help="K: donor completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=0, help="new-token limit (0: configs/real.toml's)")
    parser.add_argument("--held-out", type=int, default=50, help="N: held-out prompts measured")
    parser.add_argument("--seed", type=int, default=0, help="the donor's sampling seed and every arm's adapter seed")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the CPUs this process was given, "
                                                               "policy/threads.py)")
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or ARMS[0] not in arms:
        raise SystemExit(f"--arms must include {ARMS[0]!r} and name only {ARMS}; got {args.arms!r}")
    started = time.perf_counter()
    import torch

    from pubswap_flwr.policy.threads import apply_threads

    threads = apply_threads(args.threads)
    cfg = load_config()
    new_tokens = args.new_tokens or cfg.generation.max_new_tokens
    temperature = cfg.generation.temperature
    training, evaluation = _items(cfg, args.task, args.prompts, args.held_out)
    print(f"configs/real.toml: task {args.task}, P = {args.prompts} training prompts x K = {args.k}, <= {new_tokens} "
          f"new tokens, T = {temperature}, template {cfg.tasks.template!r}; update: learning rate "
          f"{cfg.train.learning_rate:g}, micro-batch {cfg.train.micro_batch_size}, loss dapo, 1 inner iteration, "
          f"foreign-correction none, LoRA r {cfg.model.lora_r}; N = {args.held_out} held-out prompts; seed {args.seed}")
    print(f"torch {torch.__version__}, {threads.threads} thread(s) ({threads.reason}), load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)

    clock = time.perf_counter()
    groups = donor_groups(cfg, training, args.k, new_tokens, args.seed)
    mixed = [g for g in groups if g.mixed]
    print(f"\n1. Donor {DONOR}: {time.perf_counter() - clock:.0f} s; mean reward "
          f"{statistics.fmean(r for g in groups for r in g.rewards):.3f}; {len(mixed)} of {len(groups)} groups mixed")
    for label, pool in (("all groups", groups), ("mixed groups", mixed)):
        tagged_right, right = tag_rate(pool, right=True)
        tagged_wrong, wrong = tag_rate(pool, right=False)
        print(f"  {label}: right members tagged {tagged_right}/{right}, wrong members tagged {tagged_wrong}/{wrong}")
    for group in mixed[:2]:
        print(f"  e.g. {group.item.question.splitlines()[0][:60]!r} (answer {group.item.answer}): "
              + ", ".join(f"{t!r}={r:g}" for t, r in list(zip(group.texts, group.rewards))[:4]))
    if not mixed:
        raise SystemExit("no donor group has mixed rewards: nothing to train on; raise --prompts or --k")

    clock = time.perf_counter()
    receiver = build_policy(cfg, RECEIVER, new_tokens)
    prompts = receiver.prompts(evaluation)
    receiver.reset(args.seed)
    temperatures = (temperature, 1.0)
    before = {t: opening_logps(receiver, prompts, t) for t in temperatures}
    print(f"\n2. Receiver {RECEIVER} (loaded and measured in {time.perf_counter() - clock:.0f} s). log P({TAG_OPEN!r} "
          f"| prompt) as the first completion tokens, mean over {len(prompts)} held-out prompts, before any update: "
          + "; ".join(f"T = {t:g}: sum {statistics.fmean(before[t][0]):.3f}, first sub-token "
                      f"{statistics.fmean(before[t][1]):.3f}" for t in temperatures))

    after: dict[str, dict[float, tuple[list[float], list[float]]]] = {}
    for arm in arms:
        clock = time.perf_counter()
        receiver.reset(args.seed)  # the same fresh adapter and an empty optimizer for every arm
        external = [external_group(receiver, cfg, g, arm) for g in mixed]
        stats = receiver.update(external)
        after[arm] = {t: opening_logps(receiver, prompts, t) for t in temperatures}
        tagged = sum(TAG_OPEN in c.text for g in external for c in g.completions)
        print(f"\n  arm ({'i' * (ARMS.index(arm) + 1)}) {arm}: {len(external)} groups, {tagged}/"
              f"{sum(len(g.completions) for g in external)} members tagged, {stats.tokens} tokens, loss "
              f"{stats.loss:+.5f}, grad norm {stats.grad_norm:.4f}; {time.perf_counter() - clock:.0f} s")
        for t in temperatures:
            print("    " + _change_line(f"T = {t:<3g} sum over sub-tokens", before[t][0], after[arm][t][0]))
            print("    " + _change_line(f"T = {t:<3g} first sub-token    ", before[t][1], after[arm][t][1]))

    print("\n3. Paired over the held-out prompts (the same prompts and starting adapter in every arm):")
    for arm in arms[1:]:
        name = f"({'i' * (ARMS.index(arm) + 1)}) - (i)"
        for t in temperatures:
            print(f"  {name} {arm} - as sent, T = {t:g}")
            print("    " + _difference_line("sum over sub-tokens", after[ARMS[0]][t][0], after[arm][t][0]))
            print("    " + _difference_line("first sub-token    ", after[ARMS[0]][t][1], after[arm][t][1]))

    clock = time.perf_counter()
    is_spec = dataclasses.replace(receiver.spec.grpo, foreign_correction="is")
    receiver.reset(args.seed)
    weighted, openings = is_weights(receiver, [external_group(receiver, cfg, g, ARMS[0], "is") for g in mixed], is_spec)
    print(f"\n4. Foreign-correction 'is' on arm (i)'s batch, the raw model before any update (no step; "
          f"{time.perf_counter() - clock:.0f} s): truncated IS weight min(exp(receiver - donor), {is_spec.is_cap:g}) "
          f"at T = {temperature:g}")
    for name, (weight, count, at_cap, log_ratio) in weighted.items():
        print(f"  {name:<24} mean weight {weight:.4f} over {count:4d} tokens, {at_cap:.0%} at the cap, mean "
              f"receiver - donor log-prob {log_ratio:+.3f}")
    print("  the tag-opening sub-token: " + ", ".join(f"{text!r} x {n}" for text, n in openings.most_common()))
    print(f"\nwall time {time.perf_counter() - started:.0f} s; load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
