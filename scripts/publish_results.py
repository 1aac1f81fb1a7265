"""Copy a finished sweep's small files (metrics.jsonl, config.json, status.json, provenance.json per run) and each
run's final adapter(s) into docs/results/<sweep>/ and regenerate its report from those copies, so the committed
report is reproducible from what is committed and `pubswap verify docs/results/<sweep>/runs/<run>` re-evaluates what
the run trained.

    python scripts/publish_results.py configs/compare-sapo.toml results     # results/ = the sweep's --out
    python scripts/publish_results.py configs/compare-sapo.toml results --force    # replace a published sweep
    python scripts/publish_results.py --regenerate configs/compare-sapo.toml      # the report again, from the
                                                                                  # committed runs alone

A published sweep is never replaced without --force. --regenerate rewrites only docs/results/<sweep>/report.md,
summary.json and plots/ from the runs and outcomes.json already there (asking for it is asking to replace them).

Adapters: the global one (adapters/final/) or, for SAPO, every node's own (nodes/partition-N/adapter/), at the same
paths under the published run, with adapter_config.json and the model card but not the tokenizer (the base model's).
Weights are stored as fp16 (the run keeps fp32 master weights; fp16 is also what travels on the wire), so an adapter
costs 2 bytes per LoRA parameter plus ~8 KB of JSON and card: on the embedded tiny model with the default LoRA (r 16,
all linear layers: 155,648 parameters) 0.32 MB, i.e. 3.7 MB for a 4-arm x 3-seed fedavg/pubswap sweep and 30 MB for
compare-sapo (4 arms x 3 seeds x 8 nodes); on SmolLM2-135M (r 8, all linear: 2.5M parameters) 4.9 MB each, i.e.
29 MB for real-pubswap's 6 runs but 176 MB for real-sapo's 9 runs x 4 nodes. The script prints the total.
--no-adapters leaves them out (the report does not need them; `pubswap verify` does); --adapter-seeds 0 copies
only seed 0's (every arm's, so each arm stays verifiable) and says so in the report's command.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from pubswap_flwr.compare import load_sweep
from pubswap_flwr.export import ordinary_permissions
from pubswap_flwr.report import write_report
from pubswap_flwr.report.writer import read_summary
from pubswap_flwr.verify import VerifyError, final_adapters

RUN_FILES = ("metrics.jsonl", "config.json", "status.json")
OPTIONAL_FILES = ("provenance.json", "eval_items.jsonl")  # runs made before either existed have none
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = ("adapter_config.json", "README.md", "pubswap_run.json")  # beside the weights; no tokenizer
DOCS = Path("docs/results")


def copy_adapter(src: Path, dst: Path) -> int:
    """The adapter folder `src` to `dst` with fp32 weights stored as fp16; returns the bytes written."""
    dst.mkdir(parents=True)
    for name in ADAPTER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    with safe_open(str(src / ADAPTER_WEIGHTS), framework="np") as handle:
        metadata = handle.metadata()
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    save_file({k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in tensors.items()},
              str(dst / ADAPTER_WEIGHTS), metadata=metadata)
    ordinary_permissions(dst)  # safetensors writes 0600; a published adapter is for anyone
    return sum(p.stat().st_size for p in dst.iterdir())


def copy_adapters(src_run: Path, dst_run: Path) -> int:
    """A run's final adapter(s) (verify.final_adapters: global, or each SAPO node's) at the same paths under the
    published run; returns the bytes written (0 for a run that kept none)."""
    try:
        found = final_adapters(src_run)
    except VerifyError:
        return 0
    return sum(copy_adapter(folder, dst_run / folder.relative_to(src_run)) for _, folder in found)


def _report(sweep_file: Path, dst: Path, outcomes: list[dict], command: str) -> Path:
    sweep = load_sweep(sweep_file)
    runs = [dst / "runs" / sweep.run_name(o["arm"], o["seed"]) for o in outcomes if o["status"] == "completed"]
    failures = {(o["arm"], o["seed"]): o["detail"] for o in outcomes if o["status"] != "completed"}
    return write_report(dst, runs, failures=failures, title=sweep.name, notes=sweep.notes, command=command,
                        made_by=f"pubswap compare configs/{sweep_file.name}", force=True,
                        arm_order=[arm.name for arm in sweep.arms])


def publish(sweep_file: Path, results: Path, docs: Path = DOCS, force: bool = False, adapters: bool = True,
            adapter_seeds: set[int] | None = None) -> Path:
    """Copy a finished sweep's completed runs to docs/results/<sweep> and write its report. `adapters`: copy the
    runs' final adapters as fp16 too; `adapter_seeds`: only those of these seeds (None: every seed)."""
    sweep = load_sweep(sweep_file)
    src, dst = results / sweep.name, docs / sweep.name
    if not (src / "outcomes.json").is_file():
        raise SystemExit(f"{src} has no outcomes.json: run `pubswap compare {sweep_file}` to the end first")
    if dst.exists() and not force:
        raise SystemExit(f"{dst} is already published; pass --force to replace it, or --regenerate to rewrite "
                         "only its report from the runs committed there")
    outcomes = json.loads((src / "outcomes.json").read_text())
    seed_of = {sweep.run_name(o["arm"], o["seed"]): int(o["seed"]) for o in outcomes if o["status"] == "completed"}
    completed = list(seed_of)
    missing = [f"{name}/{f}" for name in completed for f in RUN_FILES if not (src / "runs" / name / f).is_file()]
    if missing:
        raise SystemExit(f"{src} lacks files of completed runs: {', '.join(missing[:5])}")
    if dst.exists():
        shutil.rmtree(dst)
    adapter_bytes, without = 0, []
    for name in completed:
        (dst / "runs" / name).mkdir(parents=True)
        for f in RUN_FILES + tuple(f for f in OPTIONAL_FILES if (src / "runs" / name / f).is_file()):
            shutil.copy2(src / "runs" / name / f, dst / "runs" / name / f)
        if adapters and (adapter_seeds is None or seed_of[name] in adapter_seeds):
            written = copy_adapters(src / "runs" / name, dst / "runs" / name)
            adapter_bytes += written
            if not written:
                without.append(name)
    if adapters:
        print(f"final adapters: {adapter_bytes / 1e6:.1f} MB (fp16)"
              + (f" of seeds {sorted(adapter_seeds)}" if adapter_seeds is not None else "")
              + (f"; none kept by {len(without)} run(s): {', '.join(without[:5])}" if without else ""))
    for outcome in outcomes:
        outcome["run_dir"] = str(Path("runs") / Path(outcome["run_dir"]).name)
    (dst / "outcomes.json").write_text(json.dumps(outcomes, indent=2))
    _report(sweep_file, dst, outcomes, f"python scripts/publish_results.py configs/{sweep_file.name} {results}"
            + (" --force" if force else "") + (" --no-adapters" if not adapters else "")
            + (f" --adapter-seeds {' '.join(map(str, sorted(adapter_seeds)))}" if adapters and adapter_seeds is not None
               else ""))
    return dst


def regenerate(sweep_file: Path, docs: Path = DOCS) -> Path:
    """docs/results/<sweep>/report.md (and summary.json, plots/) again from the runs and outcomes.json there. The
    report keeps the command that published the runs (summary.json's): regenerating a published sweep with the same
    code gives the same bytes (tests/unit/test_published_reports.py)."""
    sweep = load_sweep(sweep_file)
    dst = docs / sweep.name
    if not (dst / "outcomes.json").is_file():
        raise SystemExit(f"{dst} has no outcomes.json: publish the sweep first")
    outcomes = json.loads((dst / "outcomes.json").read_text())
    published = read_summary(dst).get("command")
    return _report(sweep_file, dst, outcomes, published if isinstance(published, str) and published else
                   f"python scripts/publish_results.py --regenerate configs/{sweep_file.name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the sweep file, configs/<sweep>.toml")
    parser.add_argument("results", type=Path, nargs="?", help="the sweep's --out folder (results)")
    parser.add_argument("--force", action="store_true", help="replace an already published sweep")
    parser.add_argument("--regenerate", action="store_true",
                        help="rewrite the published report from the committed runs (no results folder)")
    parser.add_argument("--no-adapters", action="store_true",
                        help="leave the runs' final adapters out (pubswap verify needs them; see above for the bytes)")
    parser.add_argument("--adapter-seeds", type=int, nargs="+", metavar="SEED",
                        help="copy only these seeds' adapters (a SAPO sweep keeps one per node and run)")
    args = parser.parse_args(argv)
    if args.regenerate:
        if args.results is not None:
            parser.error("--regenerate reads the committed runs: give no results folder")
        print(regenerate(args.sweep))
    elif args.results is None:
        parser.error("give the sweep's results folder (or --regenerate)")
    else:
        if args.no_adapters and args.adapter_seeds:
            parser.error("--adapter-seeds chooses which adapters to copy: it cannot go with --no-adapters")
        print(publish(args.sweep, args.results, force=args.force, adapters=not args.no_adapters,
                      adapter_seeds=set(args.adapter_seeds) if args.adapter_seeds else None))


if __name__ == "__main__":
    main()
