"""GPU check and benchmark: the policy (sampling, GRPO update, FedProx, adapters) on CUDA agrees with the CPU, and
how much faster a GPU client is, measured side by side in one run. Needs a CUDA device; never run by the tests.

    python benchmarks/gpu_check.py [--repeats 5] [--medium-layers 8]

Checks (exit status 1 if any fails): a fresh adapter is bit-identical on both devices; sampled log-probs match a
re-scoring pass; merged sampling restores the base weights exactly; one fp32 GRPO update on the same groups gives
the same loss and adapter on both devices; FedProx and bf16 updates run on the GPU; an adapter trained on the GPU
loads into a CPU policy and greedy answers agree. Then medians of interleaved CPU/GPU sample+update steps on the
shipped tiny model and on a randomly initialised mid-size Qwen2 loaded from a local directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec, from_wire, initial_adapter, to_wire
from pubswap_flwr.policy.grpo import build_batch, per_token_logps
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.tasks import TaskItem

QUESTIONS = [f"What is the greatest common divisor of {a} and {b}?" for a, b in
             [(12, 18), (35, 49), (8, 20), (27, 36), (14, 21), (16, 40), (9, 30), (45, 60)]]
FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        FAILURES.append(name)


def items(n: int = 8) -> list[TaskItem]:
    return [TaskItem(f"gpu/{i}", "gcd", q, None, "exact") for i, q in enumerate(QUESTIONS[:n])]


def policy(device: str, model: str = "embedded:tiny", dtype: str = "float32") -> Policy:
    p = Policy(PolicySpec(model_name=model, dtype=dtype, device=device, lora=LoraSettings(r=16, alpha=32)))
    p.reset(seed=11)
    return p


def groups_from(p: Policy, k: int = 8) -> list[RolloutGroup]:
    """Sampled groups with a fixed synthetic reward (longer completions score higher) so both devices see equal data."""
    torch.manual_seed(0)
    qs = items()
    out = []
    for prompt, row in zip(p.prompts(qs), p.sample(qs, k)):
        rewards = [min(len(s.token_ids), 8) / 8 for s in row]
        out.append(RolloutGroup(prompt, [Completion(s.text, tuple(s.token_ids)) for s in row], rewards))
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def correctness() -> None:
    cpu, gpu = policy("cpu"), policy("cuda")
    check("device", next(gpu.model.parameters()).device.type == "cuda", f"policy on {gpu.device}")
    check("initial adapter", max_diff(cpu.adapter(), gpu.adapter()) == 0.0, "fresh adapter bit-identical CPU vs CUDA")

    torch.manual_seed(1)
    rows = gpu.sample(items(), 8)
    flat = [s for row in rows for s in row]
    groups = [RolloutGroup(p, [Completion(s.text, tuple(s.token_ids)) for s in row], [0.0] * len(row))
              for p, row in zip(gpu.prompts(items()), rows)]
    batch = build_batch(gpu.tokenizer, groups, gpu.learner.generation).to(gpu.device)
    with torch.no_grad(), gpu.sampler.merged():
        scored = per_token_logps(gpu.model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1])
    worst = max(abs(lp - float(scored[i, j])) for i, s in enumerate(flat) for j, lp in enumerate(s.logprobs))
    check("sampling log-probs", worst < 1e-3, f"{len(flat)} CUDA samples, max |sampled - rescored| = {worst:.2e}")

    layer = next(m for m in gpu.model.modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A"))
    before = layer.base_layer.weight.detach().clone()
    initial_adapter(gpu.model, 5)
    for p in gpu.learner.params.values():
        p.data.add_(0.01)
    with gpu.sampler.merged():
        merged_moved = not torch.equal(layer.base_layer.weight, before)
    check("merged sampling", merged_moved and torch.equal(layer.base_layer.weight, before),
          "base weights change while merged and are restored exactly on CUDA")

    cpu, gpu = policy("cpu"), policy("cuda")
    groups = groups_from(cpu)
    s_cpu, s_gpu = cpu.update(groups), gpu.update(groups)
    # Compare gradients, not the stepped weights: Adam's first step moves every element by about lr * sign(g), so
    # float noise in a near-zero gradient component shows up as a full-size weight difference.
    grads = {n: (p.grad.detach().cpu(), gpu.learner.params[n].grad.detach().cpu())
             for n, p in cpu.learner.params.items()}
    scale = max(float(c.abs().max()) for c, _ in grads.values())
    grad_gap = max(float((c - g).abs().max()) for c, g in grads.values()) / scale
    gap = max_diff(cpu.adapter(), gpu.adapter())
    check("fp32 GRPO update", abs(s_cpu.loss - s_gpu.loss) <= 1e-4 * max(1.0, abs(s_cpu.loss)) and grad_gap < 1e-3,
          f"loss CPU {s_cpu.loss:.6f} vs CUDA {s_gpu.loss:.6f}; LoRA gradients max gap {grad_gap:.2e} of the largest "
          f"component; stepped adapter max gap {gap:.2e} (lr {cpu.learner.settings.learning_rate:g})")

    prox_ref = {n: p.detach().clone() for n, p in gpu.learner.params.items()}
    gpu.update(groups, prox_ref, 0.5)
    stats = gpu.update(groups, prox_ref, 0.5)
    check("FedProx on CUDA", stats.proximal > 0 and all(v.device.type == "cpu" for v in gpu.adapter().values()),
          f"proximal term {stats.proximal:.3e} after two steps; adapter returned as CPU tensors")

    shared = from_wire(to_wire(gpu.adapter()))
    cpu.load_adapter(shared)
    gpu.load_adapter(shared)  # both now hold the same fp16-rounded adapter
    qs = items()
    a = [row[0].text for row in cpu.sample(qs, 1, greedy=True)]
    b = [row[0].text for row in gpu.sample(qs, 1, greedy=True)]
    agree = sum(x == y for x, y in zip(a, b)) / len(a)
    check("adapter CUDA -> CPU", agree >= 0.75, f"greedy answers agree on {agree:.0%} of {len(a)} prompts")

    bf = policy("cuda", dtype="bfloat16")
    stats = bf.update(groups_from(bf))
    adapter = bf.adapter()
    check("bf16 on CUDA", torch.isfinite(torch.tensor(stats.loss)).item()
          and all(v.dtype == torch.float32 for v in adapter.values()),
          f"loss {stats.loss:.4f}, grad norm {stats.grad_norm:.4f}, adapter fp32 on CPU")


def medium_model(directory: str, layers: int) -> str:
    """A randomly initialised Qwen2 (hidden 512) with the tiny tokenizer, saved as a local HF model directory."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from pubswap_flwr.policy.model import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("embedded:tiny"))
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def step_seconds(p: Policy) -> tuple[float, float]:
    if p.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    groups = groups_from(p)
    if p.device.type == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    p.update(groups)
    if p.device.type == "cuda":
        torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t1


def benchmark(label: str, model: str, repeats: int, dtype: str = "float32") -> None:
    pols = {"cpu": policy("cpu", model, dtype), "cuda": policy("cuda", model, dtype)}
    for p in pols.values():
        step_seconds(p)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {d: [] for d in pols}
    for _ in range(repeats):
        for device, p in pols.items():  # interleaved, so drift hits both alike
            times[device].append(step_seconds(p))
    med = {d: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for d, ts in times.items()}
    params = sum(p.numel() for p in pols["cpu"].model.parameters())
    print(f"{label} ({params / 1e6:.1f}M params, {dtype}, 8 prompts x 8 completions, {repeats} interleaved repeats, "
          f"{torch.get_num_threads()} CPU threads)")
    for phase, i in (("sample", 0), ("update", 1)):
        print(f"  {phase}: CPU {med['cpu'][i] * 1e3:8.1f} ms   CUDA {med['cuda'][i] * 1e3:8.1f} ms   "
              f"CPU/CUDA {med['cpu'][i] / med['cuda'][i]:6.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--medium-layers", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (the tests never do)", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    correctness()
    benchmark("embedded:tiny", "embedded:tiny", args.repeats)
    with tempfile.TemporaryDirectory() as directory:
        path = medium_model(directory, args.medium_layers)
        benchmark("random Qwen2 from a local directory", path, args.repeats)
        benchmark("random Qwen2 from a local directory", path, args.repeats, dtype="bfloat16")
    print(f"{len(FAILURES)} check(s) failed: {', '.join(FAILURES)}" if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
