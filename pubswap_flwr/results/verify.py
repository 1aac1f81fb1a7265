"""`pubswap verify RUN [--against RUN2]`: re-evaluate a finished run's final adapter(s) on held-out items the run never
saw (the same tasks, a fresh seed range) with the run's own settings, and print the result beside the run's own final
numbers, with each task's shortcut check (the best constant answer's accuracy, the model's modal-answer share).

A run's numbers are then checked from what it published alone (config.json, metrics.jsonl and its adapters), in a
process that shares nothing with the one that trained: a wrong or swapped adapter, an evaluation bug or a held-out
set that leaked into training shows as a gap far outside the two standard errors. With --against, a second run's
adapters are scored on the same fresh items and each difference is given with its standard error over items: the
part of a comparison between two runs that comes from which questions were drawn. Adapters pair by label (global,
node N), or a run's single global adapter pairs with each node of the other (FedAvg against training alone).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from ..untrusted import one_line
from .verify_inputs import (
    VerifyError,
    adapter_base,
    adapter_folder,
    check_chat_template,
    check_reward_source,
    is_local_folder,
    read_config,
    read_rows,
    read_weights,
)

if TYPE_CHECKING:
    from ..policy import Policy

SEED_OFFSET = 1000  # default verification data seed: the run's tasks.data-seed + this
BATCH_SIZE = 32  # sequences sampled at once: SmolLM2 at the runs' eval.batch-size 256 held ~13 GB (its KV cache)
COMPARED = ("greedy_accuracy", "sampled_accuracy", "sampled_reward", "greedy_lenient_accuracy",
            "sampled_lenient_accuracy")
TEMPLATE_SECONDS = 60.0  # rendering every prompt with a local base model's chat template (milliseconds normally)
PROGRESS_SECONDS = 10.0  # at most one progress line this often (a real model's evaluation takes minutes)


class Progress:
    """What verify starts, one line each, and how far each evaluation pass got, at most every PROGRESS_SECONDS;
    on stderr (stdout holds the result)."""

    def __init__(self, stream: IO[str] | None = None, clock: Callable[[], float] = time.monotonic,
                 every: float = PROGRESS_SECONDS):
        self.stream, self.clock, self.every = stream, clock, every
        self.started = self.last = clock()
        self.what = ""

    def _print(self, text: str) -> None:
        print(f"verify [{self.clock() - self.started:.0f} s]: {text}", file=self.stream or sys.stderr, flush=True)

    def start(self, what: str) -> None:
        self.what = what
        self.last = self.clock()
        self._print(what)

    def __call__(self, evaluation_pass: str, done: int, total: int) -> None:
        if self.clock() - self.last >= self.every:
            self.last = self.clock()
            self._print(f"{self.what}: {evaluation_pass} pass {done}/{total} items")


class NoAdapterError(VerifyError):
    """The run kept no final adapter (a sweep published before adapters were kept)."""


def final_adapters(run_dir: Path) -> list[tuple[str, Path]]:
    """[(label, adapter folder)]: the global adapter (adapters/final), or every node's own in sapo and local runs
    (node-N)."""
    global_dir = run_dir / "adapters" / "final"
    if adapter_folder(global_dir, run_dir):  # a link or a config that is no regular file is refused, not skipped
        return [("global", global_dir)]
    nodes = sorted((p for p in (run_dir / "nodes").glob("partition-*/adapter")
                    if p.parent.name.split("-", 1)[1].isdigit() and adapter_folder(p, run_dir)),
                   key=lambda p: int(p.parent.name.split("-")[1]))
    if nodes:
        return [(f"node {p.parent.name.split('-')[1]}", p) for p in nodes]
    raise NoAdapterError(f"{run_dir} has no final adapter (adapters/final/, or nodes/partition-N/adapter/ for sapo "
                         "and local); a sweep published before adapters were kept cannot be verified")


def own_results(rows: list[dict], label: str) -> tuple[int, dict]:
    """(round, eval) the run reported last for this adapter: the global eval, or the node's own (node_eval)."""
    for row in reversed(rows):
        if label == "global" and row.get("eval"):
            return row["round"], row["eval"]
        if label.startswith("node ") and row.get("node_eval"):
            index = int(label.split()[1])
            ids = {str(node): c.get("node_index") for r in rows for node, c in (r.get("clients") or {}).items()}
            for node, result in row["node_eval"].items():
                if ids.get(str(node)) == index:
                    return row["round"], result
    raise VerifyError(f"the run's metrics.jsonl has no held-out result for its {label} adapter")


class _Evaluator:
    """One Policy per base model for the whole verification (a SmolLM2 policy holds about a gigabyte; SAPO runs have
    an adapter per node), each checked adapter loaded into it in turn."""

    def __init__(self, cfg, batch_size: int, progress: Progress | None = None, rewards=None):
        self.cfg, self.batch_size, self.rewards = cfg, batch_size, rewards
        self.policies: dict[str, Policy] = {}
        self.progress = progress or Progress()

    def __call__(self, base: str, folder: Path, weights, items, samples: int | None) -> dict:
        import torch

        from ..evaluation import evaluate
        from ..policy import Policy
        from ..policy.model import ModelError
        from ..shared import eval_settings, policy_spec

        cfg = self.cfg
        if base not in self.policies:
            self.policies.clear()  # one base model in memory at a time
            self.progress.start(f"loading base model {base}")
            try:
                self.policies[base] = Policy(policy_spec(cfg, model_name=base))
            except (ModelError, OSError) as err:
                raise VerifyError(f"base model {base!r} cannot be loaded: {str(err)[:300]}") from None
        policy = self.policies[base]
        try:
            policy.load_adapter(weights)
        except ValueError as err:  # keys or shapes that are not the model's
            raise VerifyError(f"{folder / 'adapter_model.safetensors'}: {str(err)[:300]}") from None
        torch.manual_seed(cfg.seed)
        count = samples or cfg.eval.samples
        self.progress.start(f"scoring {folder} on {len(items)} items (greedy" +
                            (f" and {count} samples each)" if cfg.eval.sampled else ")"))
        return evaluate(policy, items, eval_settings(cfg.eval, cfg.generation, cfg.seed, samples=count,
                                                     batch_size=self.batch_size),
                        progress=self.progress, rewards=self.rewards)


def run_rewards(cfg, import_rewards: bool, run_dir: Path):
    """(the RewardTable verify scores with, a note for the report or None). A run's tasks.rewards names code that
    verify imports only when told to (`import_rewards`), and then only from the run's own reward modules
    (verify_inputs.check_reward_source, every name checked before any is imported): config.json is untrusted input;
    without the flag the built-in verifiers score its tasks and the note says so. tasks.trl-rewards scored training
    only, never held-out items: with the flag they are checked and imported the same way (the note says they
    import), without it left alone."""
    from ..tasks.isolation import check_rewards
    from ..tasks.rewards import TRL_REWARDS_KEY, RewardError, RewardTable, parse_rewards, parse_trl_rewards

    table, trl = parse_rewards(cfg.tasks.rewards), parse_trl_rewards(cfg.tasks.trl_rewards)
    trl_note = (f"the run's tasks.trl-rewards ({cfg.tasks.trl_rewards!r}) import; they scored training rollouts "
                "only, so the held-out scores here use the items' verifiers as the run's did")
    if table.empty and (trl.empty or not import_rewards):
        return RewardTable(), None
    if not import_rewards:
        return RewardTable(), (f"the run used user rewards (tasks.rewards = {cfg.tasks.rewards!r}); they are not "
                               "imported (pass --import-rewards to import and use them), so the tasks they scored "
                               "are scored here by their items' built-in verifiers and may differ from the run's "
                               "numbers")
    for ref in table.refs() + trl.refs():
        check_reward_source(ref, run_dir)
    try:
        check_rewards(table)
        check_rewards(trl, TRL_REWARDS_KEY)
    except RewardError as err:
        raise VerifyError(f"--import-rewards: {err}") from None
    if table.empty:
        return table, trl_note
    note = f"scored with the run's user rewards (tasks.rewards = {cfg.tasks.rewards!r}), imported"
    return table, note if trl.empty else f"{note}; {trl_note}"


# parameters: `pubswap verify`'s options with their defaults
def verify(run_dir: Path, data_seed: int | None = None, items_per_task: int | None = None,
           samples: int | None = None, against: Path | None = None,
           batch_size: int = BATCH_SIZE, progress: Progress | None = None,
           import_rewards: bool = False) -> list[dict[str, Any]]:
    from ..policy.threads import apply_threads
    from ..shared import task_universe
    from ..tasks.specs import TaskError
    from ..tasks.splits import question_key

    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    rows = read_rows(run_dir)
    if cfg.eval.data_path:
        raise VerifyError("the run's held-out set is a data file (eval.data-path): there is no other seed range to "
                          "draw fresh items from")
    seed = cfg.tasks.data_seed + SEED_OFFSET if data_seed is None else data_seed
    if seed == cfg.tasks.data_seed:
        raise VerifyError(f"data seed {seed} is the run's own tasks.data-seed: its held-out items are not fresh")
    rewards, rewards_note = run_rewards(cfg, import_rewards, run_dir)
    # everything read from the run is checked before any work (items, model, evaluation); the base model must be
    # one the config names, offline, not shipped by the run
    found = [(label, folder, adapter_base(folder, cfg, run_dir), read_weights(folder, run_dir),
              own_results(rows, label)) for label, folder in final_adapters(run_dir)]
    fresh = cfg.with_overrides({"tasks.data-seed": seed, **({"eval.items-per-task": items_per_task}
                                                             if items_per_task else {})})
    try:
        items = task_universe(fresh).held_out.items
        run_items = task_universe(cfg).held_out.questions
    except TaskError as err:
        raise VerifyError(f"{run_dir / 'config.json'}: its tasks cannot be drawn: {str(err)[:300]}") from None
    overlap = sum(1 for i in items if question_key(i.question) in run_items)
    other_dir, adapters = _against(cfg, Path(against)) if against is not None else (None, {})
    pairs = pairings([label for label, *_ in found], list(adapters), other_dir) if other_dir is not None else {}
    bases = [base for _, _, base, *_ in found] + [adapters[label][1] for labels in pairs.values() for label in labels]
    for base in dict.fromkeys(bases):  # each base model's template once, before minutes of scoring
        if is_local_folder(base):
            check_chat_template(base, items, cfg.tasks.template, TEMPLATE_SECONDS)
    progress = progress or Progress()
    threads = apply_threads(cfg.model.threads)  # 0: the CPUs this process was given, as training sizes its threads
    progress.start(f"{len(found)} adapter(s) of {run_dir}, {len(items)} fresh items, torch threads "
                   f"{threads.threads} ({threads.reason})")
    evaluate = _Evaluator(cfg, batch_size, progress, rewards)
    results, scored_other = [], {}
    for label, folder, base, weights, (round_number, theirs) in found:
        mine = evaluate(base, folder, weights, items, samples)
        result = {"adapter": label, "folder": str(folder), "base": base, "run_round": round_number,
                  "run": theirs, "verify": mine, "data_seed": seed, "items": len(items), "shared_questions": overlap,
                  "rewards_note": rewards_note}
        if other_dir is not None:
            result["against"] = []
            for other_label in pairs[label]:
                other_folder, other_base, other_weights = adapters[other_label]
                if other_label not in scored_other:  # each of the other run's adapters is scored once
                    scored_other[other_label] = evaluate(other_base, other_folder, other_weights, items, samples)
                result["against"].append({"run": str(other_dir), "adapter": other_label, "folder": str(other_folder),
                                          "verify": scored_other[other_label],
                                          # this run minus the other
                                          "paired": paired_on_items(scored_other[other_label], mine)})
        results.append(result)
    return results


def pairings(mine: list[str], theirs: list[str], other_dir: Path) -> dict[str, list[str]]:
    """Which of the other run's adapters each of this run's is compared with, decided before any scoring: the one of
    the same label (global, node N); else a run's global adapter against every node of the other (a FedAvg run
    against a local or SAPO run, or each node against it). A node is never compared with another partition's."""
    if all(label in theirs for label in mine):
        return {label: [label] for label in mine}
    if mine == ["global"] and theirs:
        return {"global": list(theirs)}
    if theirs == ["global"]:
        return {label: ["global"] for label in mine}
    raise VerifyError(f"{other_dir}'s adapters ({', '.join(theirs)}) do not match the run's ({', '.join(mine)}): "
                      "compare adapters of the same label, or a run's global adapter with the other's nodes")


def _against(cfg, other_dir: Path) -> tuple[Path, dict[str, tuple[Path, str, Any]]]:
    """The run to compare with, checked like the run itself: label -> (adapter folder, base model, weights); it must
    evaluate the same tasks so the same items mean the same."""
    other = read_config(other_dir)
    if (other.tasks.mix, other.eval.items_per_task) != (cfg.tasks.mix, cfg.eval.items_per_task):
        raise VerifyError(f"{other_dir} evaluates other tasks ({other.tasks.mix!r}, {other.eval.items_per_task} "
                          f"per task) than the run ({cfg.tasks.mix!r}, {cfg.eval.items_per_task}): no paired "
                          "comparison")
    return other_dir, {label: (folder, adapter_base(folder, other, other_dir), read_weights(folder, other_dir))
                       for label, folder in final_adapters(other_dir)}


def paired_on_items(first: dict, second: dict) -> dict[str, dict[str, float]]:
    """Per held-out metric, second minus first on the same items: mean difference and its standard error over items
    (each item's difference is one draw: the SE covers which questions were drawn and the sampling)."""
    from ..evaluation import mean_and_se

    out = {}
    a, b = first["item_results"], second["item_results"]
    if a["uids"] != b["uids"]:
        raise VerifyError("the two evaluations scored different items")
    for metric, key, scale in (("greedy_accuracy", "greedy", 1), ("sampled_accuracy", "sampled", a.get("samples", 1))):
        if key in a and key in b:
            mean, se = mean_and_se([(y - x) / scale for x, y in zip(a[key], b[key])])
            out[metric] = {"difference": mean, "se": se, "items": len(a[key])}
    return out


def _cell(result: dict, key: str) -> str:
    value = result.get(key)
    if value is None:
        return "–"
    se = result.get(f"{key}_se")
    return f"{value:.3f}" + (f" ± {se:.3f}" if se is not None else "")


def _shortcut_lines(result: dict) -> list[str]:
    """Per task: accuracy beside the best constant answer's, and the modal-answer share (flagged when collapsed)."""
    per_task = result["verify"].get("per_task", {})
    flagged = set(result["verify"].get("greedy_shortcut_tasks", [])) | set(
        result["verify"].get("sampled_shortcut_tasks", []))
    lines = [f"  {'task':<26}{'greedy':>10}{'sampled':>10}{'constant':>10}{'modal share':>13}  modal answer"]
    for task, row in per_task.items():
        share = row.get("sampled_modal_share", row.get("greedy_modal_share"))
        lines.append(f"  {task:<26}{_plain(row.get('greedy_accuracy')):>10}{_plain(row.get('sampled_accuracy')):>10}"
                     f"{_plain(row.get('constant_accuracy')):>10}{_plain(share):>13}  "
                     f"{row.get('sampled_modal_answer', row.get('greedy_modal_answer'))!r}"
                     + ("  SHORTCUT: the answers collapsed onto one value" if task in flagged else ""))
    return lines


def _plain(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.3f}"


def render(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines += [f"{r['adapter']} adapter ({r['folder']}, base {r['base']}): the run's own held-out result at round "
                  f"{r['run_round']} vs {r['items']} fresh items (tasks.data-seed {r['data_seed']}; "
                  f"{r['shared_questions']} questions also in the run's held-out set)",
                  f"  {'metric':<26}{'run':>18}{'verify':>18}{'difference':>14}"]
        if r.get("rewards_note"):
            lines.insert(len(lines) - 1, f"  NOTE: {r['rewards_note']}")
        for key in COMPARED:
            if key not in r["verify"] and key not in r["run"]:
                continue
            a, b = r["run"].get(key), r["verify"].get(key)
            diff = "–" if a is None or b is None else f"{b - a:+.3f}"
            se = [r["run"].get(f"{key}_se"), r["verify"].get(f"{key}_se")]
            if a is not None and b is not None and None not in se:
                z = abs(b - a) / max(math.hypot(*se), 1e-12)
                diff += " (within 2 SE)" if z <= 2 else f" ({z:.1f} SE)"
            lines.append(f"  {key:<26}{_cell(r['run'], key):>18}{_cell(r['verify'], key):>18}  {diff}")
        lines += _shortcut_lines(r)
        for other in r.get("against", []):
            lines.append(f"  against {other['adapter']} adapter {other['folder']} on the same {r['items']} items (this "
                         "run minus it, SE over items):")
            for metric, d in other["paired"].items():
                lines.append(f"    {metric:<24}{d['difference']:+.3f} ± {d['se']:.3f}")
    return "\n".join(lines)


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        results = verify(Path(args.run), args.data_seed, args.items_per_task, args.samples,
                         Path(args.against) if args.against else None, args.batch_size,
                         import_rewards=args.import_rewards)
    except VerifyError as err:
        print(f"pubswap verify: {one_line(err)}", file=sys.stderr)
        return 2
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


def register(sub) -> None:
    parser = sub.add_parser("verify", help="re-evaluate a run's final adapter(s) on fresh held-out items, beside the "
                                           "run's own result")
    parser.add_argument("run", help="a finished run directory (config.json, metrics.jsonl, its final adapters)")
    parser.add_argument("--data-seed", type=int, help=f"seed range of the fresh items (default: the run's "
                                                      f"tasks.data-seed + {SEED_OFFSET})")
    parser.add_argument("--items-per-task", type=int, help="default: the run's eval.items-per-task")
    parser.add_argument("--samples", type=int, help="sampled answers per item (default: the run's eval.samples)")
    parser.add_argument("--against", metavar="RUN2", help="also score RUN2's adapter(s) on the same fresh items and "
                                                          "print the paired difference with its SE over items: "
                                                          "adapters of the same label, or a run's single (global) "
                                                          "adapter against each of the other's")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                        help="sequences sampled at once (default %(default)s; memory grows with it: a SmolLM2 KV cache "
                             "of 256 sequences holds about 10 GB)")
    parser.add_argument("--import-rewards", action="store_true",
                        help="import and score with the user reward functions the run's tasks.rewards names (code "
                             "named by the run directory: only for runs you trust), only from reward modules in the "
                             "app's folder or a PYTHONPATH folder (never the standard library, installed packages or "
                             "the run directory); without it those tasks are scored by their built-in verifiers and "
                             "the output says so")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.set_defaults(func=cmd_verify)
