"""The zero-shot table of a warm-up's own check, before and after (pubswap_flwr/warmup.py): per task, greedy and
sampled strict pass@1, lenient pass@1 and the well-formed share, from its build.json, beside the best constant answer
on the same held-out items (regenerated from the recorded tasks, items, shots and check size; no model is run).

    python scripts/warmup_table.py data/models/gemma3-warm/build.json > docs/results/zero-shot-gemma3/warm-up-check.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def check_items(build: dict) -> list:
    """The items the build checked its model on (warmup.check_items, from the recorded source and shots)."""
    from pubswap_flwr.warmup import check_items as build_check_items
    from pubswap_flwr.warmup import shot_items, source_items

    tasks = build["tasks"]
    source = source_items(tasks, int(build["items_per_task"]))
    shown = source + shot_items(tasks, int(build.get("shots", 0)), source)
    return build_check_items(tasks, shown, int(build["check_items_per_task"]))


def table(build: dict, source: str) -> str:
    from zero_shot import constant_figures

    items = check_items(build)
    code = build.get("code") or {}
    version = (f"code {code.get('commit', '?')[:7]}{' with uncommitted changes' if code.get('dirty') else ''}"
               if code else "code version not recorded")
    lines = [f"# Warm-up check: {build['model']}, before and after", "",
             f"From `{source}` (command `{build['command']}`, {version}): {build['check_items_per_task']} "
             f"held-out items per task, the runs' prompt (no examples shown), greedy and "
             f"{build['check_samples']} samples per item at T = {build['temperature']}, {build['max_new_tokens']} new "
             "tokens. Strict: a correct answer inside `<answer></answer>` (the training reward). Lenient: the tagged "
             "answer, else the last number or word. Well-formed: exactly one `<answer>...</answer>` with nothing after "
             "it. ± is one standard error over items. The best constant answer is scored on the same items.", "",
             "| task | | greedy strict | greedy lenient | sampled strict | sampled lenient | well-formed (sampled) | "
             "best constant answer |", "|---|---|---|---|---|---|---|---|"]
    for task in build["after"]["per_task"]:
        constant = constant_figures([item for item in items if item.task == task])
        for when in ("before", "after"):
            row = build[when]["per_task"][task]
            best = f"{constant['constant_accuracy']:.3f} (`{constant['constant_answer']}`)" if when == "before" else ""
            lines.append(f"| {task if when == 'before' else ''} | {when} | {row['greedy_accuracy']:.3f} | "
                         f"{row['greedy_lenient_accuracy']:.3f} | {row['sampled_accuracy']:.3f} ± "
                         f"{row['sampled_accuracy_se']:.3f} | {row['sampled_lenient_accuracy']:.3f} | "
                         f"{row['sampled_well_formed']:.3f} | {best} |")
    for when in ("before", "after"):
        row = build[when]["overall"]
        lines.append(f"| all | {when} | {row['greedy_accuracy']:.3f} | {row['greedy_lenient_accuracy']:.3f} | "
                     f"{row['sampled_accuracy']:.3f} ± {row['sampled_accuracy_se']:.3f} | "
                     f"{row['sampled_lenient_accuracy']:.3f} | {row['sampled_well_formed']:.3f} | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path, help="a warm-up's build.json")
    args = parser.parse_args()
    try:
        build = json.loads(args.build.read_text())
        sys.stdout.write(table(build, str(args.build)))
    except (OSError, ValueError, KeyError, TypeError) as err:
        sys.exit(f"{args.build}: not a warm-up record with its check ({type(err).__name__}: {err})")


if __name__ == "__main__":
    main()
