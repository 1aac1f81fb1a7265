"""Supervised fine-tuning of a policy's LoRA adapter on fixed targets, its held-out check, and the adapter's files."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from pathlib import Path
from typing import Callable

import torch

from .evaluation import ProgressLog, evaluate
from .metrics_schema import ITEM_RESULTS
from .policy import Policy
from .policy.grpo import build_batch, completion_logps
from .rollouts import Completion, RolloutGroup
from .settings import EvalSettings
from .tasks import TaskItem

log = logging.getLogger("pubswap_flwr.sft")

CHECK_KEYS = ("greedy_accuracy", "greedy_lenient_accuracy", "greedy_well_formed", "sampled_accuracy",
              "sampled_accuracy_se", "sampled_lenient_accuracy", "sampled_lenient_accuracy_se", "sampled_well_formed")


def add_fine_tune_arguments(parser) -> None:
    """The LoRA fine-tune's options both builders (warmup, donor) take: rank, batch, learning rate, seed, threads,
    and the output folder."""
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the CPUs this process was given)")
    parser.add_argument("--out", required=True)


def fine_tune(policy: Policy, targets: list[tuple[TaskItem, str]], epochs: int, batch: int, lr: float, seed: int,
              after_epoch: Callable[[int], None] | None = None) -> list[float]:
    """Cross-entropy on each target's completion tokens (and EOS); returns the mean loss per epoch. `after_epoch(n)`
    runs after epoch n (1-based) with the model in eval mode (a check between epochs). Logs its progress with an ETA
    every 20 s."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    rng = random.Random(seed)
    order = list(range(len(targets)))
    losses = []
    progress = ProgressLog("fine-tune")  # an epoch of a few hundred targets takes minutes on a CPU
    for epoch in range(epochs):
        policy.model.train()
        rng.shuffle(order)
        total = 0.0
        for start in range(0, len(order), batch):
            rows = [targets[i] for i in order[start:start + batch]]
            groups = [RolloutGroup(policy.formatter(item), [Completion(text, None, "target")], [0.0])
                      for item, text in rows]
            data = build_batch(policy.tokenizer, groups, policy.spec.generation)
            logps = completion_logps(policy.model, data, slice(0, len(rows)))
            mask = data.completion_mask.float()
            loss = -(logps * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            total += float(loss.detach()) * len(rows)
            progress(f"epoch {epoch + 1}/{epochs}", min(start + batch, len(order)), len(order))
        losses.append(total / len(order))
        log.info("epoch %d: loss %.4f", epoch + 1, losses[-1])
        policy.model.eval()
        if after_epoch is not None:
            after_epoch(epoch + 1)
    policy.model.eval()
    return losses


def held_out_check(policy: Policy, items: list[TaskItem], samples: int) -> dict:
    """Strict / lenient pass@1 and well-formed share, greedy and over `samples` samples, overall and per task, and
    how many items had 0, 1, ... `samples` samples correct (`solved_of_samples`, the per-item solve-rate spread)."""
    out = evaluate(policy, items, EvalSettings(samples=samples, batch_size=64, lenient=True))
    solved = Counter(out[ITEM_RESULTS]["sampled"])
    return {"overall": {k: out[k] for k in CHECK_KEYS},
            "per_task": {t: {k: v[k] for k in CHECK_KEYS if k in v} for t, v in out["per_task"].items()},
            "solved_of_samples": {str(n): solved[n] for n in range(samples + 1)}}


def save_adapter(policy: Policy, out: Path, model_name: str) -> None:
    """The policy's LoRA adapter in PEFT format under `out`, in fp16, naming `model_name` as its base, with files
    anyone may read (committed to the repository)."""
    out.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(str(out))
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = model_name
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    _to_fp16(out / "adapter_model.safetensors")
    (out / "README.md").unlink(missing_ok=True)  # peft's empty card template; build.json says what this is
    for path in out.iterdir():
        path.chmod(0o644)


def write_record(out: Path, report: dict) -> None:
    (out / "build.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "build.json").chmod(0o644)


def _to_fp16(path: Path) -> None:
    """Store the adapter in fp16 (half the bytes in the repository); merging reads it back as fp32."""
    from safetensors.torch import load_file, save_file

    tensors = {k: v.to(torch.float16) for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
