"""A skilled donor built offline: a model fine-tuned on worked solutions written by code, so it solves a task the
warm model does not.

    python -m pubswap_flwr.donor build --model smollm2-135m-warm --task chain_sum_3x2 --items 300 \\
        --out data/models/smollm2-donor-chain-sum

1. `--items` source items of the skill task (`SKILL_TASKS`) from a seed range no run uses, leaving out the
   validation and check items and the zero-shot probe's (scripts/zero_shot.py's seed range, any of its first task
   slots); a run's held-out set in turn leaves the source questions out (`supervised_questions`,
   shared.task_universe);
2. each source item's target is its worked solution (tasks.worked: the partial results line by line, then
   `<answer>X</answer>`), computed from the item's own expression, never sampled from a model;
3. fine-tune a LoRA adapter on the targets for up to `--epochs`, checking `--validation-items` items of their own
   seed range after every epoch, and keep the epoch `RULE` names (the solve rate nearest `--target`: a donor that
   solves about half the time, not one that always does);
4. write the adapter (PEFT format, fp16) and build.json: the command, the code version, seeds, counts, the targets'
   first examples, the loss and validation of every epoch, the chosen epoch, and strict / lenient pass@1 with the
   per-item solve counts before and after on `--check-items` items of a third seed range.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from . import provenance
from .policy import GRPOSettings, LoraSettings, Policy, PolicySpec
from .policy.sampling import GenerationSettings
from .policy.threads import apply_threads
from .sft import add_fine_tune_arguments, fine_tune, held_out_check, save_adapter, write_record
from .tasks import HeldOutSet, TaskError, TaskItem, TaskSpec
from .tasks.splits import question_key, unique_items
from .tasks.worked import worked_solution

log = logging.getLogger("pubswap_flwr.donor")

SOURCE_SEED, VALIDATION_SEED, CHECK_SEED = 711, 712, 713  # the warm-up takes 707 / 708; runs tasks.data-seed (0)
PROBE_SEED = 909  # scripts/zero_shot.py's DATA_SEED: the probe's items are never a donor's source
PROBE_ITEMS, PROBE_SLOTS = 200, 4  # per task slot, and the slots (positions in the probe's --tasks) left out
TARGET_SOLVE = 0.5

SKILL_TASKS = {  # the configs of docs/results/zero-shot-smollm2/warm-middle.md, where the warm model solves none
    "chain_sum_3x2": TaskSpec("chain_sum_3x2", "chain_sum",
                              {"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2}),
    "basic_arithmetic_3x12": TaskSpec("basic_arithmetic_3x12", "basic_arithmetic",
                                      {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2,
                                       "operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False,
                                       "format_style": "simple"}),
}


def rule(target: float) -> str:
    return (f"the epoch whose validation sampled strict pass@1 is nearest {target:g} (ties: the fewer epochs); "
            "its adapter is the one written")


def skill_task(name: str) -> TaskSpec:
    if name not in SKILL_TASKS:
        raise TaskError(f"unknown skill task {name!r}; a donor can be built for: {', '.join(sorted(SKILL_TASKS))}")
    return SKILL_TASKS[name]


def _keys(items: list[TaskItem]) -> set[str]:
    return {question_key(item.question) for item in items}


def reserved_items(spec: TaskSpec, validation: int, check: int) -> dict[str, list[TaskItem]]:
    """The items a donor's source must not share: the probe's (PROBE_ITEMS in each of the first PROBE_SLOTS task
    slots at PROBE_SEED), then the build's validation and check items, each set leaving out the ones before it."""
    probe = [item for slot in range(PROBE_SLOTS)
             for item in unique_items("eval", spec, slot, PROBE_ITEMS, data_seed=PROBE_SEED)]
    valid = HeldOutSet.build([spec], validation, VALIDATION_SEED, exclude=_keys(probe)).items
    held = HeldOutSet.build([spec], check, CHECK_SEED, exclude=_keys(probe) | _keys(valid)).items
    return {"probe": probe, "validation": valid, "check": held}


def source_items(spec: TaskSpec, items: int, validation: int, check: int) -> list[TaskItem]:
    """The items a donor is fine-tuned on: the same list for the same arguments."""
    reserved = set().union(*(_keys(group) for group in reserved_items(spec, validation, check).values()))
    return HeldOutSet.build([spec], items, SOURCE_SEED, exclude=reserved).items


def supervised_questions(build_json: Path) -> frozenset[str]:
    """The question keys a donor was fine-tuned on, regenerated from its build.json (a run's held-out set leaves
    them out)."""
    try:
        build = json.loads(build_json.read_text())
        spec = TaskSpec(str(build["task"]), str(build["generator"]), dict(build["config"]))
        counts = int(build["items"]), int(build["validation_items"]), int(build["check_items"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{build_json}: cannot read the donor's task, config and item counts ({err})") from err
    return frozenset(_keys(source_items(spec, *counts)))


def chosen_epoch(validation: list[dict], target: float) -> int:
    """`rule(target)`: the epoch whose sampled strict pass@1 is nearest `target`, the fewer epochs on a tie."""
    return min(validation, key=lambda row: (abs(row["sampled_accuracy"] - target), row["epoch"]))["epoch"]


def _trainable(policy: Policy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in policy.model.named_parameters() if p.requires_grad}


def build(args: argparse.Namespace, argv: list[str]) -> dict:
    spec = skill_task(args.task)
    apply_threads(args.threads)
    torch.manual_seed(args.seed)
    policy = Policy(PolicySpec(model_name=args.model, lora=LoraSettings(args.lora_r, 2 * args.lora_r),
                               template=args.template, grpo=GRPOSettings(),
                               generation=GenerationSettings(max_new_tokens=args.max_new_tokens, max_prompt_tokens=512,
                                                             temperature=args.temperature)))
    policy.reset(args.seed)
    reserved = reserved_items(spec, args.validation_items, args.check_items)
    targets = [(item, worked_solution(item)) for item in source_items(spec, args.items, args.validation_items,
                                                                      args.check_items)]
    started = time.perf_counter()
    before = held_out_check(policy, reserved["check"], args.samples)
    log.info("before: %s", before["overall"])
    validation: list[dict] = []
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def validate(epoch: int) -> None:
        result = held_out_check(policy, reserved["validation"], args.samples)
        validation.append({"epoch": epoch, **result["overall"], "solved_of_samples": result["solved_of_samples"]})
        snapshots[epoch] = _trainable(policy)
        log.info("validation after epoch %d: %s", epoch, validation[-1])

    losses = fine_tune(policy, targets, args.epochs, args.batch, args.lr, args.seed, after_epoch=validate)
    epoch = chosen_epoch(validation, args.target)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if name in snapshots[epoch]:
                param.copy_(snapshots[epoch][name])
    after = held_out_check(policy, reserved["check"], args.samples)
    log.info("after (epoch %d): %s", epoch, after["overall"])
    out = Path(args.out)
    save_adapter(policy, out, args.model)
    report = {"command": "python -m pubswap_flwr.donor " + " ".join(argv), "builder": "donor", "model": args.model,
              "code": provenance.collect()["code"], "task": spec.name, "generator": spec.generator,
              "config": dict(spec.config), "template": args.template, "seed": args.seed,
              "seeds": {"source": SOURCE_SEED, "validation": VALIDATION_SEED, "check": CHECK_SEED},
              "probe_left_out": {"seed": PROBE_SEED, "items_per_slot": PROBE_ITEMS, "slots": PROBE_SLOTS},
              "items": args.items, "validation_items": args.validation_items, "check_items": args.check_items,
              "samples": args.samples, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
              "lora_r": args.lora_r, "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
              "examples": [{"question": item.question, "answer": item.answer, "target": text}
                           for item, text in targets[:4]],
              "loss_per_epoch": losses, "validation": validation, "target": args.target, "rule": rule(args.target),
              "chosen_epoch": epoch, "before": before, "after": after,
              "seconds": round(time.perf_counter() - started)}
    write_record(out, report)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pubswap_flwr.donor", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fine-tune a LoRA adapter on worked solutions of one skill task")
    b.add_argument("--model", default="smollm2-135m-warm")
    b.add_argument("--task", default="chain_sum_3x2", help=f"one of: {', '.join(sorted(SKILL_TASKS))}")
    b.add_argument("--template", default="plain")
    b.add_argument("--items", type=int, default=300, help="source items (one worked solution each)")
    b.add_argument("--epochs", type=int, default=4, help="most epochs; the validation chooses among them")
    b.add_argument("--target", type=float, default=TARGET_SOLVE, help="the validation solve rate the rule aims at")
    b.add_argument("--validation-items", type=int, default=40)
    b.add_argument("--check-items", type=int, default=50, help="held-out items for the before/after check")
    b.add_argument("--samples", type=int, default=4, help="samples per item in the validation and the check")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (validation and check)")
    add_fine_tune_arguments(b)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    report = build(args, argv)
    print(json.dumps({"chosen_epoch": report["chosen_epoch"], "before": report["before"]["overall"],
                      "after": report["after"]["overall"], "solved_of_samples": report["after"]["solved_of_samples"],
                      "seconds": report["seconds"]}, indent=1))


if __name__ == "__main__":
    main()
