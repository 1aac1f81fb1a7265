"""Benchmark: our GRPO update vs TRL 1.16 GRPOTrainer's loss/backward/step on the same batch, and sampling
throughput with the adapter merged vs the plain model vs unmerged PEFT. Measured side by side (interleaved) in one
run on the shipped model; prints medians and ratios.

    python benchmarks/grpo_step.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
from pubswap_flwr.policy.grpo import build_batch, group_advantages
from pubswap_flwr.policy.sampling import GenerationSettings, generate
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.tasks import DEFAULT_MIX, HeldOutSet, parse_mix, score_completion


def rollout_batch(policy: Policy, prompts: int, k: int) -> list[RolloutGroup]:
    items = HeldOutSet.build(parse_mix(DEFAULT_MIX), per_task=prompts).items[:prompts]
    torch.manual_seed(0)
    samples = policy.sample(items, k)
    return [RolloutGroup(p, [Completion(s.text, tuple(s.token_ids)) for s in row],
                         [score_completion(s.text, item).reward for s in row])
            for item, p, row in zip(items, policy.prompts(items), samples)]


def trl_step_fn(policy: Policy, groups: list[RolloutGroup], workdir: str, max_completion_length: int = 16):
    """One TRL GRPOTrainer optimisation step (its _compute_loss, backward, clip, AdamW) on our batch."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    batch = build_batch(policy.tokenizer, groups, policy.learner.generation)
    n = batch.rewards.shape[0]
    args = GRPOConfig(output_dir=workdir, use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=n,
                      num_generations=len(groups[0].completions), beta=0.0, epsilon=0.2, epsilon_high=0.28,
                      loss_type="dapo", max_completion_length=max_completion_length, gradient_checkpointing=False,
                      learning_rate=1e-3)
    trainer = GRPOTrainer(model=policy.model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * n),
                          processing_class=policy.tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-3,
                                  betas=(0.9, 0.99))

    def step() -> None:
        b = build_batch(policy.tokenizer, groups, policy.learner.generation)  # same preprocessing cost as ours
        inputs = {"prompt_ids": b.prompt_ids, "prompt_mask": b.prompt_mask, "completion_ids": b.completion_ids,
                  "completion_mask": b.completion_mask,
                  "advantages": group_advantages(b.rewards, b.group_sizes), "old_per_token_logps": None,
                  "num_items_in_batch": b.completion_mask.sum()}
        policy.model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in policy.model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        policy.model.eval()

    return step, int(batch.completion_mask.sum()), int(batch.attention_mask.sum())


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    policy = Policy(PolicySpec(lora=LoraSettings(r=16, alpha=32)))
    groups = rollout_batch(policy, args.prompts, args.k)
    with tempfile.TemporaryDirectory() as workdir:
        trl_step, completion_tokens, total_tokens = trl_step_fn(policy, groups, workdir)
        ours_step = lambda: policy.update(groups)
        for fn in (ours_step, trl_step):  # warm-up
            fn()
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(timed(ours_step))
            theirs.append(timed(trl_step))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"GRPO update, {len(groups)} groups x {args.k} completions = {completion_tokens} completion tokens "
          f"({total_tokens} tokens with prompts), median of {args.repeats}:")
    print(f"  ours  {o * 1000:7.1f} ms  {total_tokens / o:9.0f} tok/s")
    print(f"  TRL   {t * 1000:7.1f} ms  {total_tokens / t:9.0f} tok/s")
    print(f"  ratio ours/TRL tokens/s = {t / o:.2f}  (goal >= 1.0)")

    items = HeldOutSet.build(parse_mix(DEFAULT_MIX), per_task=args.prompts).items[:args.prompts]
    prompts = policy.prompts(items)
    settings = GenerationSettings(max_new_tokens=16)
    base = policy.model.get_base_model()

    def sample(model):
        torch.manual_seed(0)
        return generate(model, policy.tokenizer, prompts, num_return=args.k, settings=settings)

    def merged():
        with policy.sampler.merged():
            return sample(policy.model)

    def plain():
        with policy.model.disable_adapter():
            return sample(base)

    unmerged = lambda: sample(policy.model)
    counts = {}
    for name, fn in (("merged", merged), ("plain", plain), ("unmerged", unmerged)):
        counts[name] = sum(len(s.token_ids) for row in fn() for s in row)  # warm-up and token count
    times = {name: [] for name in counts}
    for _ in range(args.repeats):
        for name, fn in (("merged", merged), ("plain", plain), ("unmerged", unmerged)):
            times[name].append(timed(fn))
    rate = {name: counts[name] / statistics.median(times[name]) for name in counts}
    print(f"Sampling {len(prompts)} prompts x {args.k} completions (<= 16 new tokens), median of {args.repeats}:")
    for name in ("plain", "merged", "unmerged"):
        print(f"  {name:9} {statistics.median(times[name]) * 1000:7.1f} ms  {rate[name]:8.0f} generated tok/s")
    print(f"  ratio merged/plain = {rate['merged'] / rate['plain']:.2f}  (goal >= 0.95); "
          f"merged/unmerged = {rate['merged'] / rate['unmerged']:.2f}")


if __name__ == "__main__":
    main()
