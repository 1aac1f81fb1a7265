"""Builds the embedded tiny models: a byte-level BPE tokenizer (Qwen2 pre-tokenizer, ChatML), a tiny Qwen2 causal
LM, and a supervised warm-up on generated task items until held-out accuracy is partial (so GRPO has signal).

    python -m pubswap_flwr.tiny build --preset tiny --out data/models/tiny

The recipe (found by pilot builds on 2 CPU cores): vocab 512, hidden 128, 4 layers, AdamW 3e-3, batch 64, 1100
steps, loss on the answer tokens only. `build.json` beside the weights records the command, seed and held-out
accuracy per task.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from .tasks import DEFAULT_MIX, HeldOutSet, PublicSet, TaskItem, parse_mix, score_completion
from .tasks.prompts import CHATML_USER, user_message
from .tasks.splits import question_key

log = logging.getLogger("pubswap_flwr.tiny")

QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyPreset:
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    steps: int
    lr: float = 3e-3
    batch: int = 64
    warmup: int = 50
    tokenizer_lines: int = 40_000
    pool_per_task: int = 40_000


PRESETS = {
    # the default: 0.85M parameters (the smallest pilot that reached partial accuracy)
    "tiny": TinyPreset(vocab=512, hidden=128, layers=4, intermediate=384, heads=4, kv_heads=2, steps=1100),
    # a different model for heterogeneous swarms: wider, shallower, its own smaller vocabulary
    "tiny-b": TinyPreset(vocab=384, hidden=192, layers=3, intermediate=512, heads=4, kv_heads=2, steps=1100),
}


def target_text(item: TaskItem) -> str:
    return f"<answer>{item.answer}</answer><|im_end|>"


def prompt_text(item: TaskItem) -> str:
    return CHATML_USER.format(content=user_message(item.question, item.family))


def train_tokenizer(lines: list[str], vocab: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # The exact Qwen2 pipeline: transformers rebuilds it from vocab+merges for model_type qwen2, so ids only agree
    # across loaders when training used it too.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(preset: TinyPreset, tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(  # type: ignore[call-arg]  # rope_theta: a legacy keyword its dataclass fields omit
        vocab_size=len(tokenizer), hidden_size=preset.hidden, intermediate_size=preset.intermediate,
        num_hidden_layers=preset.layers, num_attention_heads=preset.heads, num_key_value_heads=preset.kv_heads,
        max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, rope_theta=10000.0,
    )
    return Qwen2ForCausalLM(config)


def evaluate_greedy(model, tokenizer, items: list[TaskItem], batch: int = 250) -> dict[str, dict[str, float]]:
    """Greedy held-out accuracy (reward == 1) and mean reward, per task and for the whole mix."""
    from .policy.sampling import GenerationSettings, generate

    model.eval()
    rewards: dict[str, list[float]] = {}
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        out = generate(model, tokenizer, [prompt_text(i) for i in chunk], num_return=1,
                       settings=GenerationSettings(max_new_tokens=16), greedy=True, with_logprobs=False)
        for item, samples in zip(chunk, out):
            rewards.setdefault(item.task, []).append(score_completion(samples[0].text, item).reward)
    report = {task: {"accuracy": sum(r == 1.0 for r in rs) / len(rs), "reward": sum(rs) / len(rs)}
              for task, rs in rewards.items()}
    every = [r for rs in rewards.values() for r in rs]
    report["mix"] = {"accuracy": sum(r == 1.0 for r in every) / len(every), "reward": sum(every) / len(every)}
    return report


# parameters: `python -m pubswap_flwr.tiny`'s options
def build(preset_name: str, out: Path, seed: int, steps: int | None, mix_text: str, eval_per_task: int,
          eval_every: int, pool_per_task: int | None = None) -> dict:
    preset = PRESETS[preset_name]
    if pool_per_task is not None:
        preset = replace(preset, pool_per_task=pool_per_task, tokenizer_lines=min(preset.tokenizer_lines,
                                                                                  pool_per_task * 4))
    steps = preset.steps if steps is None else steps
    torch.manual_seed(seed)
    rng = random.Random(seed)
    started = time.time()
    tasks = parse_mix(mix_text)
    held_out = HeldOutSet.build(tasks, eval_per_task)
    public = PublicSet.build(tasks, tasks, 200 * len(tasks), held_out.questions)
    exclude = held_out.questions | {question_key(i.question) for i in public.items}
    pools: dict[str, list[TaskItem]] = {}
    for index, spec in enumerate(tasks):
        pools[spec.name] = _sft_pool(spec, index, preset.pool_per_task, exclude)
        log.info("sft pool %-24s %6d distinct questions", spec.name, len(pools[spec.name]))
    lines = []
    for _ in range(preset.tokenizer_lines):
        spec = rng.choices(tasks, weights=[t.weight for t in tasks])[0]
        item = rng.choice(pools[spec.name])
        lines.append(prompt_text(item) + target_text(item))
    tokenizer = train_tokenizer(lines, preset.vocab)
    model = build_model(preset, tokenizer)
    log.info("model: %d parameters, vocab %d", sum(p.numel() for p in model.parameters()), len(tokenizer))
    encoded = {name: [(tokenizer(prompt_text(i), add_special_tokens=False)["input_ids"],
                       tokenizer(target_text(i), add_special_tokens=False)["input_ids"]) for i in pool]
               for name, pool in pools.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / preset.warmup))
    curve = []
    for step in range(1, steps + 1):
        model.train()
        rows = []
        for _ in range(preset.batch):
            spec = rng.choices(tasks, weights=[t.weight for t in tasks])[0]
            rows.append(rng.choice(encoded[spec.name]))
        width = max(len(p) + len(t) for p, t in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (p, t) in enumerate(rows):
            seq = p + t
            ids[r, : len(seq)] = torch.tensor(seq)
            labels[r, len(p): len(seq)] = torch.tensor(t)
            mask[r, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % eval_every == 0 or step == steps:
            report = evaluate_greedy(model, tokenizer, held_out.items)
            curve.append({"step": step, "loss": round(float(loss.detach()), 4),
                          "accuracy": round(report["mix"]["accuracy"], 4)})
            log.info("step %5d  loss %.3f  held-out greedy accuracy %.3f  (%.0f s)", step, float(loss.detach()),
                     report["mix"]["accuracy"], time.time() - started)
    report = evaluate_greedy(model, tokenizer, held_out.items)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    info = {
        "command": f"python -m pubswap_flwr.tiny build --preset {preset_name} --seed {seed} --steps {steps}",
        "preset": preset_name,
        "architecture": asdict(preset),
        "parameters": sum(p.numel() for p in model.parameters()),
        "seed": seed,
        "steps": steps,
        "tasks": mix_text,
        "held_out_items_per_task": eval_per_task,
        "held_out_greedy": {k: {m: round(v, 4) for m, v in d.items()} for k, d in report.items()},
        "curve": curve,
        "build_seconds": round(time.time() - started, 1),
        "versions": {"torch": torch.__version__, **_versions()},
    }
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _sft_pool(spec, task_index: int, count: int, exclude: set[str]) -> list[TaskItem]:
    """Up to `count` warm-up items from the sft seed range, without held-out/public questions."""
    from .tasks.splits import rg_item, stream_seed

    seed = stream_seed("sft", task_index)
    seen: set[str] = set()
    out = []
    for index in range(count):
        item = rg_item("sft", spec, seed, index, f"sft/{spec.name}/{index}")
        key = question_key(item.question)
        if key in exclude or key in seen:
            continue
        seen.add(key)
        out.append(item)
    return out


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("transformers", "tokenizers", "reasoning-gym")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pubswap_flwr.tiny", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build and warm up an embedded model")
    b.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    b.add_argument("--out", type=Path, help="output directory (default data/models/<preset>)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--steps", type=int, help="supervised steps (default from the preset)")
    b.add_argument("--tasks", default=DEFAULT_MIX, help="task mix, name:weight,... (default %(default)s)")
    b.add_argument("--eval-per-task", type=int, default=200)
    b.add_argument("--eval-every", type=int, default=100)
    b.add_argument("--pool-per-task", type=int, help="warm-up items generated per task (default from the preset)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    from .policy.model import data_dir

    out = args.out or data_dir() / "models" / args.preset
    info = build(args.preset, out, args.seed, args.steps, args.tasks, args.eval_per_task, args.eval_every,
                 args.pool_per_task)
    print(json.dumps(info["held_out_greedy"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
