"""Format warm-up of a real model by self-distillation, so that RL with answer-tag rewards has a signal from the start.

    python -m pubswap_flwr.warmup build --model smollm2-135m-instruct --out data/models/smollm2-warm
    python -m pubswap_flwr.warmup build --model gemma3-270m --shots 4 --out <folder>   (a base model)

A pretrained instruct model of this size rarely puts its answer in `<answer></answer>` tags (SmolLM2-135M: never, in
zero-shot; docs/results/zero-shot-smollm2), so every reward is 0 and GRPO learns nothing. The warm-up teaches the
format and nothing else it did not find itself:
1. sample `--samples` completions per item (at `--temperature`, the runs' prompt template) for `--items` generated items
   per task, from a seed range no run uses (`source_items`; reasoning-gym repeats question texts across seeds, so every
   run's held-out set leaves these questions out: `supervised_questions`, shared.task_universe). With `--shots N`
   (plain-format models only) each source prompt first shows N solved items of yet another seed range
   (`shot_items`), answer only, as the instruction asks: a base model follows a shown format and seldom an
   instruction. The answers it writes are still its own, and the targets are fine-tuned on the prompt without them;
   a plain completion ends where the model starts a question of its own (tasks/prompts.py);
2. keep, per item, the first completion whose lenient answer (tasks.lenient_answer: the last number or word) is
   correct, cut just after that answer and followed by a new line and `<answer>X</answer>` (a completion already
   tagged and correct is kept as it is): the model's own working and its own right answer, now in the tags;
3. fine-tune a LoRA adapter on these targets (cross-entropy on the completion tokens and EOS) for `--epochs`;
4. write the adapter (PEFT format, fp16) and build.json: the command, the code version (provenance), seed, counts per
   task, and held-out strict / lenient pass@1 and well-formed share before and after, on items of yet another seed
   range with the source questions left out.
The packaged model `smollm2-135m-warm` is the converted base with this adapter merged into its weights
(policy/packaged.py); RL runs start a fresh LoRA on it, so RL's round 0 is the warmed-up model.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from . import provenance
from .policy import GRPOSettings, LoraSettings, Policy, PolicySpec
from .policy.sampling import GenerationSettings
from .policy.threads import apply_threads
from .sft import add_fine_tune_arguments, fine_tune, held_out_check, save_adapter, write_record
from .tasks import HeldOutSet, TaskItem, lenient_answer, lenient_score, parse_mix, score_completion
from .tasks.splits import question_key

log = logging.getLogger("pubswap_flwr.warmup")

SOURCE_SEED = 707  # items the targets come from
CHECK_SEED = 708  # held-out items for the before / after check (runs use tasks.data-seed, default 0)
SHOT_SEED = 709  # the solved examples shown before source prompts (`--shots`)


def source_items(tasks: str, per_task: int) -> list[TaskItem]:
    """The items a warm-up samples its targets from (`--tasks`, `--items`): the same list for the same arguments."""
    return HeldOutSet.build(parse_mix(tasks), per_task=per_task, data_seed=SOURCE_SEED).items


def shot_items(tasks: str, shots: int, source: Sequence[TaskItem]) -> list[TaskItem]:
    """The `shots` solved items shown before every source prompt (`--shots`): the tasks in turn, from SHOT_SEED,
    none with the question of a `source` item (its answer would be in its prompt)."""
    specs = parse_mix(tasks)
    if shots <= 0 or not specs:
        return []
    pool = HeldOutSet.build(specs, per_task=-(-shots // len(specs)), data_seed=SHOT_SEED,
                            exclude={question_key(item.question) for item in source}).items
    by_task = [[item for item in pool if item.task == spec.name] for spec in specs]
    return [by_task[n % len(specs)][n // len(specs)] for n in range(shots)]


def check_items(tasks: str, shown: Sequence[TaskItem], per_task: int) -> list[TaskItem]:
    """The held-out items a build checks its model on before and after: CHECK_SEED, none with a question the model
    was `shown` (its source and solved examples)."""
    return HeldOutSet.build(parse_mix(tasks), per_task=per_task, data_seed=CHECK_SEED,
                            exclude={question_key(item.question) for item in shown}).items


def supervised_questions(build_json: Path) -> frozenset[str]:
    """The question keys (tasks.splits.question_key) a warmed-up model was fine-tuned on or shown, from its
    build.json: every source item's question (a superset of the targets' questions) and the solved examples',
    regenerated from the recorded tasks, items per task and shots. A run's held-out set leaves them out."""
    try:
        build = json.loads(build_json.read_text())
        tasks, per_task, shots = str(build["tasks"]), int(build["items_per_task"]), int(build.get("shots", 0))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{build_json}: cannot read the warm-up's tasks, items_per_task and shots ({err})") from err
    source = source_items(tasks, per_task)
    return frozenset(question_key(item.question) for item in source + shot_items(tasks, shots, source))


def distilled_target(text: str, item: TaskItem, next_question: str = "") -> str | None:
    """The warm-up target made from one of the model's completions, or None when its answer is wrong. With
    `next_question` (a plain-format prompt's, tasks/prompts.py) the completion is first cut where the model begins a
    question of its own: a base model goes on writing examples, and only what precedes them answers this one."""
    if next_question and next_question in text:
        text = text[:text.index(next_question)]
    if score_completion(text, item).reward >= 1.0:
        # a plain prompt ends in "Answer:", and the space the model put after it is part of its answer
        return text.rstrip() if next_question else text.strip()
    if lenient_score(text, item).reward < 1.0:
        return None
    answer = lenient_answer(text, item.answer)
    if answer is None:  # not after a lenient score of 1
        return None
    end = text.rfind(answer) + len(answer)
    return f"{text[:end].rstrip()}\n<answer>{answer}</answer>"


def collect_targets(policy: Policy, items: list[TaskItem], samples: int, batch_items: int,
                    examples: Sequence[TaskItem] = ()) -> list[tuple[TaskItem, str]]:
    targets = []
    for start in range(0, len(items), batch_items):
        chunk = items[start:start + batch_items]
        for item, row in zip(chunk, policy.sample(chunk, samples, with_logprobs=False, examples=examples)):
            for sample in row:
                target = distilled_target(sample.text, item, policy.formatter.next_question)
                if target is not None:
                    targets.append((item, target))
                    break
        log.info("sampled %d / %d items: %d targets", min(start + batch_items, len(items)), len(items), len(targets))
    return targets


def build(args: argparse.Namespace, argv: list[str]) -> dict:
    if args.shots < 0:  # before the model loads
        raise SystemExit(f"--shots must be 0 or more, got {args.shots}")
    apply_threads(args.threads)
    torch.manual_seed(args.seed)
    spec = PolicySpec(model_name=args.model, lora=LoraSettings(args.lora_r, 2 * args.lora_r), template=args.template,
                      generation=GenerationSettings(max_new_tokens=args.max_new_tokens, max_prompt_tokens=512,
                                                    temperature=args.temperature),
                      grpo=GRPOSettings())
    policy = Policy(spec)
    if args.shots and not policy.formatter.plain:
        raise SystemExit(f"--shots shows solved examples before plain-format prompts; {args.model} has a chat "
                         f"template (its warm-up samples zero-shot: leave --shots out)")
    policy.reset(args.seed)
    tasks = parse_mix(args.tasks)
    source = source_items(args.tasks, args.items)
    shots = shot_items(args.tasks, args.shots, source)
    check = check_items(args.tasks, source + shots, args.check_items)
    started = time.perf_counter()
    before = held_out_check(policy, check, args.check_samples)
    log.info("before: %s", before["overall"])
    targets = collect_targets(policy, source, args.samples, args.batch_items, shots)
    if not targets:
        raise SystemExit("no completion had a right answer: nothing to warm up on (more --items or --samples?)")
    counts = {spec.name: sum(1 for item, _ in targets if item.task == spec.name) for spec in tasks}
    losses = fine_tune(policy, targets, args.epochs, args.batch, args.lr, args.seed)
    after = held_out_check(policy, check, args.check_samples)
    log.info("after: %s", after["overall"])
    out = Path(args.out)
    save_adapter(policy, out, args.model)
    report = {"command": "python -m pubswap_flwr.warmup " + " ".join(argv), "model": args.model,
              "code": provenance.collect()["code"],
              "tasks": args.tasks, "template": args.template, "seed": args.seed, "items_per_task": args.items,
              "shots": args.shots, "shown": [{"task": item.task, "question": item.question, "answer": item.answer}
                                             for item in shots],
              "samples_per_item": args.samples, "max_new_tokens": args.max_new_tokens,
              "temperature": args.temperature, "lora_r": args.lora_r,
              "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "targets": counts,
              "examples": [{"task": item.task, "question": item.question, "target": text}
                           for item, text in targets[:: max(1, len(targets) // 8)][:8]],
              "loss_per_epoch": losses, "check_items_per_task": args.check_items,
              "check_samples": args.check_samples, "before": before, "after": after,
              "seconds": round(time.perf_counter() - started)}
    write_record(out, report)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pubswap_flwr.warmup", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="self-distil the answer format into a LoRA adapter")
    b.add_argument("--model", default="smollm2-135m-instruct")
    b.add_argument("--tasks", default="basic_arithmetic:1,gcd:1,chain_sum:1,products:1")
    b.add_argument("--template", default="plain")
    b.add_argument("--items", type=int, default=400, help="source items per task")
    b.add_argument("--samples", type=int, default=8, help="completions sampled per source item")
    b.add_argument("--shots", type=int, default=0,
                   help="solved examples shown before each source prompt (plain-format models only; default none)")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (source and check)")
    b.add_argument("--batch-items", type=int, default=8, help="source items per sampling call")
    b.add_argument("--epochs", type=int, default=3)
    b.add_argument("--check-items", type=int, default=50, help="held-out items per task for the before/after check")
    b.add_argument("--check-samples", type=int, default=2)
    add_fine_tune_arguments(b)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    report = build(args, argv)
    print(json.dumps({"targets": report["targets"], "before": report["before"]["overall"],
                      "after": report["after"]["overall"], "seconds": report["seconds"]}, indent=1))


if __name__ == "__main__":
    main()
