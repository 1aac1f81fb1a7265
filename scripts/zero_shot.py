"""Zero-shot table of a model on the project's tasks: per task, greedy and sampled pass@1 with standard errors,
scored strictly (the answer tags) and leniently (the tagged answer, else the last number or word:
tasks.lenient_answer), and the share of well-formed answers; through the project's own evaluation
(pubswap_flwr.evaluation.evaluate) on a held-out seed range of its own.

    python scripts/zero_shot.py --model smollm2-135m-instruct --template plain --max-new-tokens 64 \\
        --items 200 --samples 4 --out docs/results/zero-shot-smollm2/plain.json

Writes the JSON (every number, the command, the code version) and a markdown table beside it (same name, .md).
Re-running with the same --out skips the tasks already in the JSON (a long table can be finished over sittings).
Each task's row also holds the best constant answer's accuracy on the same items (tasks/shortcuts.py): a model's
score is only worth what it adds to that. `--add-constants` fills it into an existing table from the items alone
(no model), for tables made before the column existed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET_TASKS = ("basic_arithmetic", "gcd", "count_bits", "fraction_simplification", "spell_backward", "chain_sum",
                "base_conversion", "products")
DATA_SEED = 909  # a seed range no run uses (runs take tasks.data-seed, default 0)


def code_version() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return commit + (" (uncommitted changes)" if dirty else "")


def table(result: dict) -> str:
    s = result["settings"]
    model = s["model"] + (f" with its adapter merged times {s['adapter_scale']:g}" if "adapter_scale" in s else "")
    lines = [f"# Zero-shot: {model}, template `{s['template']}`, {s['max_new_tokens']} new tokens", "",
             f"{s['items']} held-out items per task (data seed {s['data_seed']}); greedy, and {s['samples']} samples "
             f"per item at T = {s['temperature']}. Strict: a correct answer inside `<answer></answer>` (the training "
             "reward). Lenient: the tagged answer, else the last number (numeric answers) or last word. Well-formed: "
             "exactly one `<answer>...</answer>` with nothing after it. ± is one standard error over items.", "",
             f"Command: `{result['command']}`; code {result['code']}; {result['seconds']:.0f} s.", "",
             "| task | greedy strict | greedy lenient | sampled strict | sampled lenient | well-formed (sampled) | "
             "best constant answer |", "|---|---|---|---|---|---|---|"]
    for task, row in result["tasks"].items():
        constant = "–" if "constant_accuracy" not in row else (
            f"{row['constant_accuracy']:.3f} (`{row.get('constant_answer')}`)")
        lines.append(f"| {task} | {row['greedy_accuracy']:.3f} | {row['greedy_lenient_accuracy']:.3f} | "
                     f"{row['sampled_accuracy']:.3f} ± {row['sampled_accuracy_se']:.3f} | "
                     f"{row['sampled_lenient_accuracy']:.3f} ± {row['sampled_lenient_accuracy_se']:.3f} | "
                     f"{row['sampled_well_formed']:.3f} | {constant} |")
    if "constants_added" in result:
        lines += ["", f"The best-constant column was added later from the same items, without the model: "
                      f"`{result['constants_added']['command']}`, code {result['constants_added']['code']}."]
    return "\n".join(lines) + "\n"


def constant_figures(items) -> dict:
    """The best constant answer and its accuracy on these items (tasks/shortcuts.py)."""
    from pubswap_flwr.tasks.shortcuts import check_task

    check = check_task([item.answer for item in items], [])
    return {"constant_accuracy": check.constant_accuracy, "constant_answer": check.constant_answer}


def add_constants(out: Path) -> None:
    """Fill the constant-answer column into an existing table from its own items (data seed, items per task)."""
    from pubswap_flwr.tasks import HeldOutSet, parse_custom_tasks, parse_mix

    result = json.loads(out.read_text())
    names = list(result["tasks"])
    custom = parse_custom_tasks(result["settings"].get("custom", ""))
    held_out = HeldOutSet.build(parse_mix(",".join(f"{t}:1" for t in names), custom),
                                per_task=result["settings"]["items"],
                                data_seed=result["settings"]["data_seed"])
    for name in names:
        result["tasks"][name].update(constant_figures([i for i in held_out.items if i.task == name]))
    result["constants_added"] = {"command": "python scripts/zero_shot.py " + " ".join(sys.argv[1:]),
                                 "code": code_version()}
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(result))


def scaled_variant(name: str, scale: float, scratch: Path) -> str:
    """The HF folder of packaged variant `name` with its adapter merged times `scale`, built under `scratch`."""
    from dataclasses import replace

    from pubswap_flwr.model_packages import PACKAGED
    from pubswap_flwr.policy.packaged import ensure_folder, merge_adapter

    variant = PACKAGED.get(name)
    if variant is None or not variant.adapter or not variant.base:
        sys.exit(f"--adapter-scale needs a packaged variant with an adapter; --model {name!r} is none of "
                 f"{', '.join(n for n, m in PACKAGED.items() if m.adapter)}")
    target = scratch / "model"
    merge_adapter(replace(variant, adapter_scale=scale), ensure_folder(variant.base), target)
    return str(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--template", default="plain", help="tasks.template: auto, plain, math")
    parser.add_argument("--tasks", default=",".join(PRESET_TASKS))
    parser.add_argument("--custom", default="", help="tasks.custom: a JSON object {name: {generator, config}} of "
                                                     "tasks --tasks may name beside the presets (harder variants)")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--adapter-scale", type=float, default=None,
                        help="probe the packaged variant --model with its adapter merged times this (a candidate "
                             "scaled variant: merged into a temporary folder, not the model cache)")
    parser.add_argument("--add-constants", action="store_true",
                        help="only fill the best-constant column into the existing --out table (no model)")
    args = parser.parse_args()
    if args.add_constants:
        add_constants(args.out)
        return

    from pubswap_flwr.evaluation import evaluate
    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
    from pubswap_flwr.policy.sampling import GenerationSettings
    from pubswap_flwr.policy.threads import apply_threads
    from pubswap_flwr.settings import EvalSettings
    from pubswap_flwr.tasks import HeldOutSet, parse_custom_tasks, parse_mix

    apply_threads()
    scratch = tempfile.TemporaryDirectory(prefix="zero-shot-")  # a scaled variant's folder lives only while we run
    model_name = args.model if args.adapter_scale is None else scaled_variant(args.model, args.adapter_scale,
                                                                             Path(scratch.name))
    scale = {"adapter_scale": args.adapter_scale} if args.adapter_scale is not None else {}
    settings = {"model": args.model, **scale, "template": args.template, "items": args.items, "samples": args.samples,
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "data_seed": DATA_SEED,
                **({"custom": args.custom} if args.custom else {})}
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if result and result.get("settings") != settings:
        sys.exit(f"{args.out} holds a table made with other settings ({result.get('settings')}); use another --out")
    result.setdefault("settings", settings)
    result.setdefault("tasks", {})
    result["command"] = "python scripts/zero_shot.py " + " ".join(sys.argv[1:])
    result["code"] = code_version()
    policy = Policy(PolicySpec(model_name=model_name, lora=LoraSettings(r=8, alpha=16), template=args.template,
                               generation=GenerationSettings(max_new_tokens=args.max_new_tokens,
                                                             temperature=args.temperature, max_prompt_tokens=512)))
    names = [t for t in args.tasks.split(",") if t]
    specs = parse_mix(",".join(f"{t}:1" for t in names), parse_custom_tasks(args.custom))
    held_out = HeldOutSet.build(specs, per_task=args.items, data_seed=DATA_SEED)
    started = time.perf_counter() - result.get("seconds", 0.0)
    for name in names:
        if name in result["tasks"]:
            continue
        items = [item for item in held_out.items if item.task == name]
        task_started = time.perf_counter()
        out = evaluate(policy, items,
                       EvalSettings(samples=args.samples, batch_size=args.batch_size, seed=0, lenient=True))
        row = {k: v for k, v in out.items() if k not in ("per_task", "item_results")}
        row.update(constant_figures(items))
        result["tasks"][name] = row
        result["seconds"] = time.perf_counter() - started
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(table(result))
        print(f"{name}: greedy {row['greedy_accuracy']:.3f} / lenient {row['greedy_lenient_accuracy']:.3f}; sampled "
              f"{row['sampled_accuracy']:.3f} / lenient {row['sampled_lenient_accuracy']:.3f}; well-formed "
              f"{row['sampled_well_formed']:.3f} ({time.perf_counter() - task_started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
