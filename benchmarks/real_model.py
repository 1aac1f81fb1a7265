"""Benchmark: the real model (SmolLM2-135M-Instruct, `model.name = "smollm2-135m-instruct"`) on this CPU, each goal
measured side by side in one run, printing medians and ratios.

    python benchmarks/real_model.py [--repeats 5] [--prompts 4] [--k 8] [--new-tokens 64] [--skip threads,round]

1. Sampling: our sampler (cached decode loop; bf16 sampling copy under generation.dtype = "auto") against plain
   `model.generate` in fp32 and, like for like, `generate` on the same bf16 sampling copy (dynamic and static KV
   cache), same prompts, batch (prompts x K), new-token limit, temperature and thread count, interleaved repeats;
   generated tokens/s (through EOS) per arm; the headline ratio is against the best `generate` on the same copy.
   The compiled arm (generation.compile-step) against the eager decode step: its ratio, its first pass (the
   compile) and how many prompts drew token for token the same completions.
   Then the log-prob gap: the sampler's log-probs of
   the tokens it drew against the fp32 training pass's on the same tokens (mean and max absolute difference).
2. One GRPO update (G = K completions per prompt, LoRA r 8 on all linear layers) against TRL 1.16 GRPOTrainer's
   `_compute_loss` + backward + clip + AdamW step on the same batch (benchmarks/grpo_step.py's harness), fp32 both,
   tokens/s (prompt + completion tokens). The batch is the arm-1 samples scored by the verifiers, as a run has it
   (groups whose rewards all agree included: our update leaves their rows out, and since #53 its normaliser too,
   which TRL's counts them in: the same work, a loss scaled to the groups trained).
3. Peak memory (max RSS) of one simulated client's process: model + adapter + optimizer + sampling copy, after a
   rollout and an update, fp32-only sampling against generation.dtype = "auto".
4. Thread policy: two processes at once (two simulated clients, or two SuperNodes, on this 2-core machine), each
   repeating a client's step (sample prompts x K, update): torch's default threads (all cores in each process)
   against the thread policy (one CPU each, as Ray's client-resources-num-cpus = 1 gives); median step time.
6. The matmul ceiling: this CPU's fp32 and bf16 throughput on the model's own matrix shapes (every product a token's
   forward makes, at the sampler's batch and at 1024 rows), and the share of it the sampler (part 1), its prefill
   and the update (part 2) reach. Printed after part 2 (`--skip ceiling` leaves it out).
7. Held-out evaluation, old against new: `evaluation.evaluate` on configs/real.toml's held-out settings
   (smollm2-135m-warm, its 3-task mix, greedy + 4 samples at T 0.7, 64 new tokens, eval.batch-size 256) with the
   code as it was before 2026-12-03 (the LM head given a strided input, so torch multiplied it against a copy of the
   head's weight per prompt; Hugging Face's concatenating KV cache; torch.multinomial; a greedy pass, then a sampled
   pass) and as it is (contiguous head input, sampling.GrowingLayer, sampling.draw, each prompt prefilled once for
   its greedy and its sampled completions: evaluation.SHARED_PREFILL); each arm in its own process, interleaved,
   at each torch thread count of --eval-threads (default 1):
   time, peak RSS, whether the greedy results are the same, and the sampled pass@1 of each (other draws of the same
   distribution).
5. Rounds of the real-model learning sweep (configs/real.toml, 2 clients through Flower's Ray engine: the fedavg arm
   of configs/real-pubswap.toml), split into sampling, update, evaluation and communication + orchestration, from
   a run's metrics.jsonl (--round-from RUN, or a 1-round run made here).
10. One compaction of the sampler's KV cache (a quarter of 32 rows finished), the old gather against keep_rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
MODEL = "smollm2-135m-instruct"
MIX = "basic_arithmetic:1,gcd:1,count_bits:1,spell_backward:1"


def peak_mib() -> float:
    """This process's peak resident memory in MiB: /proc's VmHWM, which starts afresh in a spawned process
    (getrusage's ru_maxrss survives exec, so a child spawned by a parent that had loaded the model reported the
    parent's peak), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _policy(dtype: str = "auto", sampler: str = "cached", new_tokens: int = 64, lora_r: int = 8,
            micro_batch: int = 64, model: str = MODEL, temperature: float = 1.0, update_dtype: str = "float32",
            recompute_layers: bool = True):
    from pubswap_flwr.policy import GRPOSettings, LoraSettings, Policy, PolicySpec
    from pubswap_flwr.policy.sampling import GenerationSettings

    return Policy(PolicySpec(model_name=model, lora=LoraSettings(r=lora_r, alpha=2 * lora_r),
                             generation=GenerationSettings(max_new_tokens=new_tokens, max_prompt_tokens=512,
                                                           sampler=sampler, dtype=dtype, temperature=temperature),
                             grpo=GRPOSettings(learning_rate=1e-4, micro_batch_size=micro_batch,
                                               update_dtype=update_dtype, recompute_layers=recompute_layers)))


def _items(count: int):
    from pubswap_flwr.tasks import HeldOutSet, parse_mix

    items = HeldOutSet.build(parse_mix(MIX), per_task=count, data_seed=11).items
    return items[::max(1, len(items) // count)][:count]


def _groups(policy, items, samples):
    from pubswap_flwr.rollouts import Behaviour, Completion, RolloutGroup
    from pubswap_flwr.tasks import score_completion

    return [RolloutGroup(prompt, [Completion(s.text, tuple(s.token_ids),
                                             behaviour=Behaviour(tuple(s.token_ids), tuple(s.logprobs)))
                                  for s in row], [score_completion(s.text, item).reward for s in row])
            for item, prompt, row in zip(items, policy.prompts(items), samples)]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def sampling(args) -> list:
    import torch

    from pubswap_flwr.policy.grpo import build_batch, logprob_gap, per_token_logps
    from pubswap_flwr.policy.sampling import generate

    policy = _policy(new_tokens=args.new_tokens)
    items = _items(args.prompts)
    prompts = policy.prompts(items)
    plain_settings = policy.spec.generation.__class__(**{**policy.spec.generation.__dict__, "sampler": "generate"})
    fp32_settings = policy.spec.generation

    def ours():
        return policy.sample(items, args.k)

    def plain():  # Hugging Face generate on the fp32 model (adapter merged, as any fp32 sampling would)
        with _merged_fp32(policy):
            return generate(policy.model, policy.tokenizer, prompts, num_return=args.k, settings=plain_settings)

    def cached_fp32():
        with _merged_fp32(policy):
            return generate(policy.model, policy.tokenizer, prompts, num_return=args.k, settings=fp32_settings)

    low = str(policy.sampling_dtype).removeprefix("torch.")

    def plain_low(static: bool):  # like for like: generate on our own sampling copy (same dtype, weights, batch)
        def run():
            with policy.sampler.merged(), _cache_implementation(policy.sampling_model, "static" if static else None):
                return generate(policy.sampling_model, policy.tokenizer, prompts, num_return=args.k,
                                settings=plain_settings)
        return run

    def ours_hf_forward():  # the decode loop as before #55 item 1: Hugging Face's forward for every step
        settings = policy.spec.generation.__class__(**{**policy.spec.generation.__dict__, "decode_step": False})
        with policy.sampler.merged():
            return generate(policy.sampling_model, policy.tokenizer, prompts, num_return=args.k, settings=settings)

    def ours_compiled():  # generation.compile-step: the decode step's elementwise kernels through torch.compile
        settings = policy.spec.generation.__class__(**{**policy.spec.generation.__dict__, "compile_step": True})
        with policy.sampler.merged():
            return generate(policy.sampling_model, policy.tokenizer, prompts, num_return=args.k, settings=settings)

    arms = {"generate fp32": plain, "cached fp32": cached_fp32, f"generate {low}": plain_low(False),
            f"generate {low} static": plain_low(True), f"ours, HF forward ({low})": ours_hf_forward,
            f"ours ({low})": ours, f"ours, compiled ({low})": ours_compiled}
    rates = {name: [] for name in arms}
    seconds = {name: [] for name in arms}
    kept = None
    outputs: dict[str, list] = {}  # our arms' tokens per repeat: the same seed, so the same draws
    first_pass: dict[str, float] = {}
    for repeat in range(args.repeats + 1):  # the first pass warms up (and compiles the compiled arm's kernels)
        for name, fn in arms.items():
            torch.manual_seed(repeat)
            elapsed, out = timed(fn)
            tokens = sum(len(s.token_ids) for row in out for s in row)
            if repeat:
                rates[name].append(tokens / elapsed)
                seconds[name].append(elapsed)
            else:
                first_pass[name] = elapsed
            if name == f"ours ({low})":
                kept = out
            if name.startswith("ours"):
                outputs.setdefault(name, []).append([[s.token_ids for s in row] for row in out])
    base = statistics.median(rates["generate fp32"])
    print(f"\n1. Sampling {len(prompts)} prompts x {args.k} completions, <= {args.new_tokens} new tokens, T = 1, "
          f"{torch.get_num_threads()} torch thread(s), median of {args.repeats}:")
    for name in arms:
        rate = statistics.median(rates[name])
        print(f"  {name:<22}{statistics.median(seconds[name]):8.2f} s {rate:8.1f} tok/s   x generate fp32 "
              f"{rate / base:5.2f}")
    ours_rate = statistics.median(rates[f"ours ({low})"])
    print(f"  ratio ours / generate fp32 = {ours_rate / base:.2f} (not like for like: different dtypes)")
    fair = {name: statistics.median(rates[name]) for name in (f"generate {low}", f"generate {low} static")}
    best = max(fair, key=fair.get)
    print(f"  like for like, ours / the best generate on the same {low} copy ({best}) = "
          f"{ours_rate / fair[best]:.2f}  (goal >= 3)")
    print(f"  the decode step (policy/decode_step.py) against Hugging Face's forward in the same loop = "
          f"{ours_rate / statistics.median(rates[f'ours, HF forward ({low})']):.2f}; the same tokens in every "
          f"repeat: {'yes' if outputs[f'ours ({low})'] == outputs[f'ours, HF forward ({low})'] else 'NO'}")
    compiled_name = f"ours, compiled ({low})"
    same = sum(a == b for run_a, run_b in zip(outputs[compiled_name], outputs[f"ours ({low})"])
               for a, b in zip(run_a, run_b))
    print(f"  the compiled kernels (generation.compile-step) against the eager step = "
          f"{statistics.median(rates[compiled_name]) / ours_rate:.2f}; their first pass (the compile) took "
          f"{first_pass[compiled_name]:.1f} s against {first_pass[f'ours ({low})']:.1f} s; prompts whose completions "
          f"were token for token the same: {same} of {len(outputs[compiled_name]) * len(prompts)} (RMSNorm rounds "
          f"differently: the same distribution, not the same draws)")
    groups = _groups(policy, items, kept)
    batch = build_batch(policy.tokenizer, groups, policy.spec.generation)
    with torch.no_grad():
        policy.model.eval()
        training = per_token_logps(policy.model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1])
    total, worst, count = logprob_gap(training, batch.sampled_logps, batch.completion_mask.bool()
                                      & batch.has_sampled.unsqueeze(1))
    print(f"  log-prob gap, {policy.sampling_dtype} sampler vs fp32 training pass, {count} tokens: mean |diff| "
          f"{total / count:.4f}, max {worst:.4f} (ratio exp(gap): mean {2.718281828 ** (total / count):.4f})")
    return groups, ours_rate


class _cache_implementation:
    """`generate`'s KV cache kind on `model` ("static": preallocated, fixed shapes; None: dynamic), restored on exit."""

    def __init__(self, model, kind: str | None):
        self.config, self.kind = model.generation_config, kind

    def __enter__(self):
        self.before = getattr(self.config, "cache_implementation", None)
        self.config.cache_implementation = self.kind

    def __exit__(self, *exc):
        self.config.cache_implementation = self.before


class _merged_fp32:
    """The adapter merged into the fp32 weights (the plain fp32 sampling path), restored on exit."""

    def __init__(self, policy):
        from pubswap_flwr.policy.lora import MergedSampling

        self.merger = policy.__dict__.setdefault("_fp32_merger", MergedSampling(policy.model))

    def __enter__(self):
        self.context = self.merger.merged()
        return self.context.__enter__()

    def __exit__(self, *exc):
        return self.context.__exit__(*exc)


def update(args, sampled_groups) -> float:
    from grpo_step import trl_step_fn

    from pubswap_flwr.rollouts import RolloutGroup

    policy = _policy(new_tokens=args.new_tokens)
    # every row trained (alternating rewards: no group whose rewards all agree), then the batch as it was scored
    alternating = [RolloutGroup(g.prompt, g.completions, [float(i % 2) for i in range(len(g.completions))])
                   for g in sampled_groups]
    print(f"\n2. GRPO update, {len(alternating)} groups x {args.k} completions, LoRA r 8, fp32, median of "
          f"{args.repeats}:")
    ratios, rates = {}, {}
    for label, groups in (("every row trained", alternating), ("as sampled", sampled_groups)):
        zero = sum(1 for g in groups if not g.has_signal)
        with tempfile.TemporaryDirectory() as workdir:
            trl_step, completion_tokens, total_tokens = trl_step_fn(policy, groups, workdir,
                                                                    max_completion_length=args.new_tokens)
            ours = lambda: policy.update(groups)
            ours()
            trl_step()
            mine, theirs = [], []
            for _ in range(args.repeats):
                mine.append(timed(ours)[0])
                theirs.append(timed(trl_step)[0])
        o, t = statistics.median(mine), statistics.median(theirs)
        ratios[label] = t / o
        print(f"  {label} ({zero} groups with equal rewards; {completion_tokens} completion tokens, {total_tokens} "
              f"with prompts):")
        print(f"    ours {o:8.2f} s {total_tokens / o:8.0f} tok/s")
        print(f"    TRL  {t:8.2f} s {total_tokens / t:8.0f} tok/s")
        print(f"    ratio ours / TRL tokens/s = {t / o:.2f}  (goal >= 1.0)")
        rates[label] = total_tokens / o
    return rates["every row trained"]


def _linear_shapes(config) -> list[tuple[int, int, int]]:
    """(in, out, how many) of every matrix product a token goes through: one layer's projections times the layers,
    then the LM head."""
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    layers = config.num_hidden_layers
    return [(hidden, config.num_attention_heads * head_dim, layers), (hidden, kv, 2 * layers),
            (config.num_attention_heads * head_dim, hidden, layers), (hidden, inner, 2 * layers),
            (inner, hidden, layers), (hidden, config.vocab_size, 1)]


def _matmul_seconds(rows: int, shapes, dtype, repeats: int) -> float:
    """Median seconds of every product one token's forward makes, for `rows` tokens at once (weights as nn.Linear
    holds them, F.linear as the model calls it)."""
    import torch
    import torch.nn.functional as F

    total = 0.0
    for fan_in, fan_out, count in shapes:
        x = torch.randn(rows, fan_in, dtype=dtype)
        w = torch.randn(fan_out, fan_in, dtype=dtype) * 0.02
        F.linear(x, w)  # warm-up: the kernel chosen and its buffers made
        times = []
        for _ in range(max(3, repeats)):
            start = time.perf_counter()
            F.linear(x, w)
            times.append(time.perf_counter() - start)
        total += statistics.median(times) * count
    return total


def ceiling(args, sampler_rate: float | None, update_rate: float | None) -> None:
    """Part 6: this CPU's matmul throughput on the model's own shapes at the thread count of parts 1-2, and the share
    of it the sampler and the update reach (their matrix products are most of their arithmetic)."""
    import torch

    policy = _policy(new_tokens=args.new_tokens)
    config = policy.model.config
    shapes = _linear_shapes(config)
    flops_per_token = 2 * sum(i * o * n for i, o, n in shapes)
    batch = args.prompts * args.k
    print(f"\n6. The matmul ceiling on the model's shapes ({flops_per_token / 1e6:.0f} MFLOP per token forward, "
          f"{torch.get_num_threads()} thread(s)):")
    ceilings = {}
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (batch, 1024):
            seconds = _matmul_seconds(rows, shapes, dtype, args.repeats)
            ceilings[(dtype, rows)] = rows / seconds
            gflops = rows * flops_per_token / seconds / 1e9
            print(f"  {str(dtype).removeprefix('torch.'):<9} {rows:>5} rows at once: {gflops:7.1f} GFLOP/s, "
                  f"{rows / seconds:9.1f} tokens/s through every product")
    # prefill: the prompts' forward on the sampling copy, as the sampler makes it (one pass, last logits only)
    from pubswap_flwr.policy.sampling import encode_prompts

    prompts = policy.prompts(_items(args.prompts))
    encoded = encode_prompts(policy.tokenizer, prompts, policy.spec.generation.max_prompt_tokens)
    tokens = int(encoded["attention_mask"].sum())
    times = []
    with torch.no_grad(), policy.sampler.merged():
        for _ in range(max(3, args.repeats)):
            start = time.perf_counter()
            policy.sampling_model(**encoded, logits_to_keep=1)
            times.append(time.perf_counter() - start)
    prefill_rate = tokens / statistics.median(times)
    low = policy.sampling_dtype
    prefill_rows = int(encoded["input_ids"].numel())
    prefill_ceiling = prefill_rows / _matmul_seconds(prefill_rows, shapes[:-1], low, args.repeats)
    print(f"  prefill ({low}, {len(prompts)} prompts, {tokens} tokens): {prefill_rate:.0f} tokens/s = "
          f"{prefill_rate / prefill_ceiling:.0%} of the ceiling without the LM head at {prefill_rows} rows "
          f"({prefill_ceiling:.0f} tokens/s; the head runs on the last position only)")
    source = "part 1"
    if sampler_rate is None:  # part 1 skipped: our sampler alone, as part 1 times it
        items, rates = _items(args.prompts), []
        policy.sample(items, args.k)  # warm-up
        for repeat in range(max(1, args.repeats)):
            torch.manual_seed(repeat + 1)
            elapsed, out = timed(lambda: policy.sample(items, args.k))
            rates.append(sum(len(s.token_ids) for row in out for s in row) / elapsed)
        sampler_rate, source = statistics.median(rates), f"median of {max(1, args.repeats)}"
    print(f"  sampler ({low}, {source}, {batch} rows, prefill included): {sampler_rate:.1f} tokens/s = "
          f"{sampler_rate / ceilings[(low, batch)]:.0%} of the ceiling at {batch} rows "
          f"({ceilings[(low, batch)]:.0f} tokens/s)  (goal >= 35%)")
    _where_sampling_goes(policy, args)
    if update_rate is not None:  # an estimate: the forward and the gradients to the inputs (the base is frozen)
        need = update_rate * 2
        print(f"  update (fp32, part 2, every row trained): {update_rate:.0f} tokens/s; its products (the forward and "
              f"the input gradients, about 2x a forward's) make {need:.0f} forward-tokens/s = "
              f"{need / ceilings[(torch.float32, 1024)]:.0%} of the fp32 ceiling at 1024 rows (an estimate)")


SAMPLING_OPS = (  # (category, substrings of aten op names), first match wins
    ("matrix products", ("addmm", "aten::mm", "matmul", "linear", "bmm", "mkldnn", "onednn")),
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax_backward")),
    ("KV cache and copies", ("aten::cat", "aten::copy_", "index_select", "aten::index", "aten::to", "_to_copy",
                             "contiguous", "clone", "empty", "aten::repeat")),
    ("sampling ops (softmax, top-k/p, multinomial, log-probs)", ("softmax", "multinomial", "sort", "topk", "gather",
                                                                 "cumsum", "div", "argmax", "where")),
)


def _where_sampling_goes(policy, args) -> None:
    """One call of our sampler under torch's profiler: its time by kind of op, and what no op accounts for (Python
    per token: the decode loop, the model's modules, tokenizer checks)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    items = _items(args.prompts)
    torch.manual_seed(0)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        policy.sample(items, args.k)
    wall = time.perf_counter() - start
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        name = event.key.lower()
        category = next((label for label, keys in SAMPLING_OPS if any(k in name for k in keys)), "other ops")
        totals[category] = totals.get(category, 0.0) + event.self_cpu_time_total / 1e6
    ops = sum(totals.values())
    print(f"  where one sampling call's {wall:.1f} s go (torch profiler, self time by kind of op; the profiler itself "
          f"adds overhead per op):")
    for label, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"    {label:<58}{seconds:7.2f} s {seconds / wall:6.0%}")
    print(f"    {'no op (Python: decode loop, modules, checks; profiler)':<58}{wall - ops:7.2f} s "
          f"{(wall - ops) / wall:6.0%}")


EVAL_MIX = "basic_arithmetic:1,chain_sum:1,products:1"  # configs/real.toml's held-out mix


def _evaluation_arm(old: bool, per_task: int, threads: int, queue, workers: int = 0) -> None:
    import torch
    from transformers import DynamicCache

    from pubswap_flwr import evaluation
    from pubswap_flwr.evaluation import evaluate
    from pubswap_flwr.policy import sampling
    from pubswap_flwr.settings import EvalSettings
    from pubswap_flwr.tasks import HeldOutSet, parse_mix

    torch.set_num_threads(threads)
    policy = _policy(model="smollm2-135m-warm", temperature=0.7)
    if old:  # the code before 2026-12-03: no head hook, Hugging Face's concatenating cache and forward,
        # torch.multinomial from the global generator (no per-item streams), a greedy pass then a sampled pass
        for model in (policy.model, policy.sampling_model):
            model.get_output_embeddings()._forward_pre_hooks.clear()
        sampling.decode_cache = lambda model, room: DynamicCache(config=model.config)
        sampling.draw = lambda probs, uniforms=None: torch.multinomial(probs, num_samples=1).squeeze(1)
        evaluation.SHARED_PREFILL = False  # a greedy pass, then a sampled pass, each prefilling every prompt
        type(policy).has_item_streams = property(lambda self: False)  # type: ignore[method-assign]
        policy.spec = dataclasses.replace(policy.spec, generation=dataclasses.replace(policy.spec.generation,
                                                                                      decode_step=False))
    items = HeldOutSet.build(parse_mix(EVAL_MIX), per_task=per_task, data_seed=11).items
    before = peak_mib()
    settings = EvalSettings(samples=4, batch_size=256, seed=0, lenient=True, workers=1 if old else workers)
    elapsed, result = timed(lambda: evaluate(policy, items, settings))
    peak = peak_mib()
    greedy = {key: value for key, value in result.items() if key.startswith("greedy")}
    queue.put((elapsed, before, peak, json.dumps(greedy, sort_keys=True), result["sampled_accuracy"],
               result["sampled_accuracy_se"]))


def evaluation_speed(args) -> None:
    """Part 7: the held-out evaluator before and after the head and cache changes, side by side, at each thread
    count of --eval-threads (1: the like-for-like kernel comparison; the CPUs a run's server process has: what a
    run's evaluation gets, as the server evaluates while the clients wait)."""
    for threads in args.eval_threads:
        _evaluation_pairs(args, threads)


def thread_counts(text: str) -> list[int]:
    """--eval-threads: distinct positive thread counts, ascending ("1,2" -> [1, 2])."""
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if counts[0] < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be at least 1, got {text!r}")
    return counts


def _evaluation_pairs(args, threads: int) -> None:
    context = multiprocessing.get_context("spawn")
    print(f"\n7. Held-out evaluation of smollm2-135m-warm, {args.eval_items} items per task x 3 tasks, greedy + 4 "
          f"samples, batch 256, {threads} thread(s), each arm in its own process (old, new interleaved, "
          f"{args.eval_repeats} pair(s)):")
    # "new, 1 worker": one sampling call at a time on all the threads (eval.workers = 1), beside the default
    labels = ("old", "new") if threads == 1 else ("old", "new", "new, 1 worker")
    runs: dict[str, list] = {label: [] for label in labels}
    for _ in range(args.eval_repeats):
        for label in labels:
            queue = context.Queue()
            proc = context.Process(target=_evaluation_arm, args=(label == "old", args.eval_items, threads, queue,
                                                                 1 if label == "new, 1 worker" else 0))
            proc.start()
            runs[label].append(queue.get())
            proc.join()
            elapsed, before, peak, _, sampled, se = runs[label][-1]
            print(f"  {label}: {elapsed:7.1f} s, peak RSS {peak:6.0f} MiB ({before:.0f} MiB after loading), sampled "
                  f"pass@1 {sampled:.3f} (SE {se:.3f})  load average {os.getloadavg()[0]:.2f}")
    same = len({run[3] for label in runs for run in runs[label]}) == 1
    old_time = statistics.median(r[0] for r in runs["old"])
    new_time = statistics.median(r[0] for r in runs["new"])
    old_peak = statistics.median(r[2] for r in runs["old"])
    new_peak = statistics.median(r[2] for r in runs["new"])
    if "new, 1 worker" in runs:
        one = statistics.median(r[0] for r in runs["new, 1 worker"])
        print(f"  eval.workers: {threads} calls at once on one thread each against one call on {threads} threads: "
              f"{new_time:.1f} / {one:.1f} s = {one / new_time:.2f}x faster")
    print(f"  median time old / new = {old_time:.1f} / {new_time:.1f} s = {old_time / new_time:.2f}x  (goal >= 3x); "
          f"peak RSS {old_peak:.0f} -> {new_peak:.0f} MiB; greedy metrics the same in every run: "
          f"{'yes' if same else 'NO'} (sampled ones come from other draws of the same distribution)")


def _client_memory(dtype: str, micro_batch: int, queue) -> None:
    import torch

    from pubswap_flwr.rollouts import RolloutGroup

    torch.set_num_threads(1)
    policy = _policy(dtype=dtype, micro_batch=micro_batch)
    items = _items(4)
    torch.manual_seed(0)
    groups = _groups(policy, items, policy.sample(items, 8))
    # every row trained (the update's largest footprint), as in part 2
    policy.update([RolloutGroup(g.prompt, g.completions, [float(i % 2) for i in range(len(g.completions))])
                   for g in groups])
    queue.put(peak_mib())


def memory() -> None:
    print("\n3. Peak memory (max RSS) of one client process after a rollout (4 x 8, 64 new tokens) and an update "
          "with every row trained:")
    context = multiprocessing.get_context("spawn")
    results = {}
    for dtype, micro_batch in (("float32", 64), ("auto", 64), ("auto", 16)):
        queue = context.Queue()
        proc = context.Process(target=_client_memory, args=(dtype, micro_batch, queue))
        proc.start()
        results[(dtype, micro_batch)] = queue.get()
        proc.join()
        print(f"  generation.dtype = {dtype:<8} train.micro-batch-size = {micro_batch:<3} "
              f"{results[(dtype, micro_batch)]:7.0f} MiB")
    print(f"  ratio auto / float32 (micro-batch 64) = {results[('auto', 64)] / results[('float32', 64)]:.2f}; "
          f"micro-batch 16 / 64 (auto) = {results[('auto', 16)] / results[('auto', 64)]:.2f}")


def _client_steps(policy_threads: bool, steps: int, prompts: int, k: int, queue) -> None:
    import torch

    if policy_threads:
        from pubswap_flwr.policy.threads import apply_threads

        apply_threads(node_cpus=1)  # what Ray's one CPU per client gives
    policy = _policy()
    items = _items(prompts)
    times = []
    for step in range(steps + 1):
        torch.manual_seed(step)
        elapsed, _ = timed(lambda: policy.update(_groups(policy, items, policy.sample(items, k))))
        if step:
            times.append(elapsed)
    queue.put((torch.get_num_threads(), times))


def threads(args) -> None:
    context = multiprocessing.get_context("spawn")
    print(f"\n4. Two clients at once on {os.cpu_count()} cores, each repeating a step ({args.prompts} prompts x "
          f"{args.k}, sample + update), {args.steps} steps after one warm-up:")
    medians = {}
    env = os.environ.pop("OMP_NUM_THREADS", None)  # torch's default: every core in every process
    try:
        for label, use_policy in (("default threads", False), ("thread policy", True)):
            queue = context.Queue()
            procs = [context.Process(target=_client_steps, args=(use_policy, args.steps, args.prompts, args.k, queue))
                     for _ in range(2)]
            for proc in procs:
                proc.start()
            results = [queue.get() for _ in procs]
            for proc in procs:
                proc.join()
            steps = [t for _, per in results for t in per]
            medians[label] = statistics.median(steps)
            print(f"  {label:<16} threads per client {[n for n, _ in results]}: median step {medians[label]:7.1f} s "
                  f"(steps: {', '.join(f'{t:.1f}' for t in steps)})")
    finally:
        if env is not None:
            os.environ["OMP_NUM_THREADS"] = env
    print(f"  ratio default / policy = {medians['default threads'] / medians['thread policy']:.2f}  (goal >= 1.5)")


UPDATE_ARMS = (("float32", True), ("float32", False), ("bfloat16", True), ("bfloat16", False))  # first: before #55
PEAK_GOAL_MIB = 2500  # #55: a client's peak at most 2.5 GB


def _update_arm(update_dtype: str, recompute: bool, micro_batch: int, repeats: int, queue) -> None:
    import torch

    from pubswap_flwr.rollouts import RolloutGroup

    torch.set_num_threads(1)
    policy = _policy(micro_batch=micro_batch, update_dtype=update_dtype, recompute_layers=recompute)
    items = _items(4)
    torch.manual_seed(0)
    groups = [RolloutGroup(g.prompt, g.completions, [float(i % 2) for i in range(len(g.completions))])
              for g in _groups(policy, items, policy.sample(items, 8))]  # every row trained
    held = peak_mib()
    policy.update(groups)  # warm-up
    times = [timed(lambda: policy.update(groups))[0] for _ in range(repeats)]
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    queue.put((times, tokens, held, peak_mib()))


def update_arms(args) -> None:
    """Part 8 (#55 item 2): one client's GRPO update (4 prompts x 8 completions, every row trained, configs/real.toml's
    micro-batch) under each train.update-dtype with and without train.recompute-layers, each arm in its own process
    (a client's peak RSS: model, sampling copy, optimizer, one rollout and the updates), arms interleaved over
    --update-rounds rounds; time per update (median) and peak, each against the default before #55 (float32,
    recomputing). The rule, stated before measuring: the default is the fastest arm whose peak stays within
    PEAK_GOAL_MIB; recompute only if no arm without it does."""
    context = multiprocessing.get_context("spawn")
    print(f"\n8. The update's precision and layer recomputation: 4 prompts x 8 completions, every row trained, "
          f"micro-batch {args.update_micro_batch}, 1 thread, {args.repeats} updates after a warm-up per process, "
          f"{args.update_rounds} round(s) of the arms interleaved:")
    results: dict[tuple[str, bool], list] = {arm: [] for arm in UPDATE_ARMS}
    for _ in range(args.update_rounds):
        for arm in UPDATE_ARMS:
            queue = context.Queue()
            proc = context.Process(target=_update_arm, args=(*arm, args.update_micro_batch, args.repeats, queue))
            proc.start()
            results[arm].append(queue.get())
            proc.join()
    base = statistics.median(t for run in results[UPDATE_ARMS[0]] for t in run[0])
    fastest: tuple[str, bool] | None = None
    for arm in UPDATE_ARMS:
        times = [t for run in results[arm] for t in run[0]]
        median = statistics.median(times)
        peak = max(run[3] for run in results[arm])
        within = peak <= PEAK_GOAL_MIB
        if within and (fastest is None or median < statistics.median(t for r in results[fastest] for t in r[0])):
            fastest = arm
        held = max(r[2] for r in results[arm])
        print(f"  update-dtype {arm[0]:<9} recompute-layers {str(arm[1]).lower():<6} {median:7.2f} s per update "
              f"(x default {base / median:5.2f}), peak {peak:6.0f} MiB (after the rollout {held:.0f}); "
              f"{results[arm][0][1]} completion tokens")
    if fastest is None:
        print(f"  no arm stays within {PEAK_GOAL_MIB} MiB")
    else:
        median = statistics.median(t for r in results[fastest] for t in r[0])
        print(f"  by the rule: update-dtype {fastest[0]}, recompute-layers {str(fastest[1]).lower()}: "
              f"{base / median:.2f}x the default before #55 (goal >= 1.8x at a peak <= {PEAK_GOAL_MIB} MiB)")


def compaction(args) -> None:
    """Part 10: finished rows leaving the decode batch's KV cache, the old way (a gather of every kept row's whole
    buffer into new tensors) against `sampling.keep_rows` (the rows after the first finished one moved up in place,
    their filled positions only), on SmolLM2-135M's cache shapes (30 layers x keys and values, 3 KV heads of 64)."""
    import torch

    from pubswap_flwr.policy.sampling import keep_rows

    layers, heads, head_dim, rows = 30, 3, 64, args.prompts * args.k
    capacity, filled = 80 + args.new_tokens, 80 + args.new_tokens // 2  # a prompt of ~80 tokens, half the completion
    generator = torch.Generator().manual_seed(0)
    timings: dict[str, list[float]] = {"gather (before)": [], "keep_rows (in place)": []}
    for repeat in range(args.repeats * 4):
        finished = torch.randperm(rows, generator=generator)[:rows // 4]  # COMPACT_FRACTION of the rows
        keep = torch.tensor(sorted(set(range(rows)) - set(finished.tolist())))
        for name in timings:
            buffers = [torch.randn(rows, heads, capacity, head_dim) for _ in range(2 * layers)]
            start = time.perf_counter()
            if name.startswith("gather"):
                kept = [buffer[keep, ...] for buffer in buffers]
            else:
                kept = [keep_rows(buffer, keep, filled) for buffer in buffers]
            timings[name].append(time.perf_counter() - start)
            assert kept[0].shape[0] == len(keep)
    before, now = (statistics.median(t) * 1000 for t in timings.values())
    print(f"\n10. One compaction of the decode batch's KV cache ({rows} rows -> {len(keep)}, {layers} layers, capacity "
          f"{capacity}, {filled} positions filled), median of {len(timings['gather (before)'])}:")
    print(f"  gather (before) {before:.2f} ms, keep_rows (in place) {now:.2f} ms: {before / now:.2f}x")


def _simulate_round(checkout: Path, config: str, label: str, out: Path) -> tuple[float, Path]:
    """One round of `config` (2 clients through Ray) with the code of `checkout`; its wall time and run."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-m", "pubswap_flwr.cli", "simulate", "-c", str(checkout / config), "-c",
           "num-server-rounds=1", "--nodes", "2", "--out", str(out), "--run-name", label]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started, out / label


def whole_round(args) -> None:
    """Part 9 (#55 item 4): a whole configs/real.toml round (2 clients, tau 4, held-out evaluation at rounds 0 and 1)
    with this checkout's code against --before's (a checkout of the commit before #55), interleaved; wall time,
    each part of the round from metrics.jsonl, and the held-out results side by side (greedy identical where the
    numerics did not change; sampled within 2 SE)."""
    before = Path(args.before).resolve()
    if not (before / "pubswap_flwr").is_dir():
        raise SystemExit(f"--before {before}: not a checkout of this project (no pubswap_flwr/ in it)")
    arms = {"before": before, "now": ROOT}
    print(f"\n9. A whole {args.round_config} round, 2 clients through Ray, code of {before} (before) against this "
          f"checkout (now), {args.round_repeats} pair(s) interleaved:")
    walls: dict[str, list[float]] = {label: [] for label in arms}
    runs: dict[str, list[list[dict]]] = {label: [] for label in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.round_repeats):
            for label, checkout in arms.items():
                out = Path(tmp) / f"{label}-{repeat}"
                out.mkdir()
                wall, run_dir = _simulate_round(checkout, args.round_config, label, out)
                walls[label].append(wall)
                runs[label].append([json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()])
                print(f"  {label:<7} {wall:7.0f} s   load average {os.getloadavg()[0]:.2f}")
    for label in arms:
        trained = [row for rows in runs[label] for row in rows if row["round"] > 0 and "time" in row]
        keys = list(trained[0]["time"]) if trained else []
        print(f"  {label}: median wall {statistics.median(walls[label]):.0f} s; round 1 " + ", ".join(
            f"{key} {statistics.median(row['time'][key] for row in trained):.1f} s" for key in keys))
    ratio = statistics.median(walls["now"]) / statistics.median(walls["before"])
    print(f"  whole command now / before = {ratio:.2f}  (goal <= 0.5)")
    for round_ in (0, 1):
        for label in arms:
            for rows in runs[label]:
                row = next((r for r in rows if r["round"] == round_ and "eval" in r), None)
                if row is not None:
                    e = {key: row["eval"].get(key, float("nan"))
                         for key in ("greedy_accuracy", "sampled_accuracy", "sampled_accuracy_se")}
                    print(f"  round {round_} {label:<7} greedy {e['greedy_accuracy']:.4f}  sampled "
                          f"{e['sampled_accuracy']:.4f} (SE {e['sampled_accuracy_se']:.4f})")


def one_round(args) -> None:
    """Part 5: from a finished run of the sweep (--round-from RUN), or a 1-round run of configs/real.toml here."""
    if args.round_from:
        run_dir = Path(args.round_from)
        source = f"{run_dir} (a run of the sweep)"
        wall = None
    else:
        config = ROOT / "configs" / "real.toml"
        tmp = Path(tempfile.mkdtemp())
        cmd = [sys.executable, "-m", "pubswap_flwr.cli", "simulate", "-c", str(config), "-c", "num-server-rounds=1",
               "--nodes", "2", "--out", str(tmp), "--run-name", "round"]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        run_dir = tmp / "round"
        source = f"{config.relative_to(ROOT)} for 1 round, 2 clients through Ray"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["round"] > 0 and "time" in r]
    print(f"\n5. Rounds of the learning sweep, from {source}"
          + (f"; whole command {wall:.0f} s (Ray start, model loads and round 0's evaluation included)" if wall else "")
          + ":")
    keys = list(trained[0]["time"])
    print("  round " + "".join(f"{k:>22}" for k in keys))
    for row in trained:
        print(f"  {row['round']:>5} " + "".join(f"{row['time'][k]:>22.1f}" for k in keys))
    medians = {k: statistics.median(r["time"][k] for r in trained) for k in keys}
    print("  median" + "".join(f"{medians[k]:>22.1f}" for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="steps per client in the thread benchmark")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for parts 1-2")
    parser.add_argument("--round-from", help="part 5 from this finished run of the sweep instead of a 1-round run")
    parser.add_argument("--eval-items", type=int, default=16, help="held-out items per task in part 7")
    parser.add_argument("--eval-repeats", type=int, default=2, help="old/new pairs in part 7")
    parser.add_argument("--eval-threads", type=thread_counts, default=[1],
                        help="comma-separated torch thread counts for part 7, each measured old against new (e.g. 1,2)")
    parser.add_argument("--update-micro-batch", type=int, default=16, help="part 8's micro-batch (configs/real.toml's)")
    parser.add_argument("--update-rounds", type=int, default=2, help="rounds of part 8's arms, interleaved")
    parser.add_argument("--before", help="part 9: a checkout of the commit before #55 (git worktree add DIR COMMIT)")
    parser.add_argument("--round-repeats", type=int, default=1, help="before/now pairs in part 9")
    parser.add_argument("--round-config", default="configs/real.toml", help="part 9's config, in each checkout")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: sampling,update,ceiling,"
                                                   "memory,threads,evaluation,round,update-arms,compaction,whole-round")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    import torch

    torch.set_num_threads(args.threads)
    print(f"{MODEL}; torch {torch.__version__}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; "
          f"bf16 native: {torch.cpu._is_avx512_bf16_supported()}")
    groups, sampler_rate = sampling(args) if "sampling" not in skip else (None, None)
    update_rate = update(args, groups) if "update" not in skip and groups is not None else None
    if "ceiling" not in skip:
        ceiling(args, sampler_rate, update_rate)
    if "memory" not in skip:
        memory()
    if "threads" not in skip:
        threads(args)
    if "evaluation" not in skip:
        evaluation_speed(args)
    if "round" not in skip:
        one_round(args)
    if "update-arms" not in skip:
        update_arms(args)
    if "compaction" not in skip:
        compaction(args)
    if "whole-round" not in skip:
        if args.before:
            whole_round(args)
        else:
            print("\n9. skipped: --before names no checkout of the commit before #55")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
