"""Copy a finished sweep's small files (metrics.jsonl, config.json, status.json per run) into docs/results/<sweep>/
and regenerate its report from those copies, so the committed report is reproducible from what is committed.

    python scripts/publish_results.py configs/compare-sapo.toml results     # results/ = the sweep's --out
    python scripts/publish_results.py configs/compare-sapo.toml results --force    # replace a published sweep
    python scripts/publish_results.py --regenerate configs/compare-sapo.toml      # the report again, from the
                                                                                  # committed runs alone

A published sweep is never replaced without --force. --regenerate rewrites only docs/results/<sweep>/report.md,
summary.json and plots/ from the runs and outcomes.json already there (asking for it is asking to replace them).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from pubswap_flwr.compare import load_sweep
from pubswap_flwr.report import write_report

RUN_FILES = ("metrics.jsonl", "config.json", "status.json")
OPTIONAL_FILES = ("provenance.json",)  # runs made before runs recorded their code have none
DOCS = Path("docs/results")


def _report(sweep_file: Path, dst: Path, outcomes: list[dict], command: str) -> Path:
    sweep = load_sweep(sweep_file)
    runs = [dst / "runs" / sweep.run_name(o["arm"], o["seed"]) for o in outcomes if o["status"] == "completed"]
    failures = {(o["arm"], o["seed"]): o["detail"] for o in outcomes if o["status"] != "completed"}
    return write_report(dst, runs, failures=failures, title=sweep.name, notes=sweep.notes, command=command,
                        made_by=f"pubswap compare configs/{sweep_file.name}", force=True,
                        arm_order=[arm.name for arm in sweep.arms])


def publish(sweep_file: Path, results: Path, docs: Path = DOCS, force: bool = False) -> Path:
    sweep = load_sweep(sweep_file)
    src, dst = results / sweep.name, docs / sweep.name
    if not (src / "outcomes.json").is_file():
        raise SystemExit(f"{src} has no outcomes.json: run `pubswap compare {sweep_file}` to the end first")
    if dst.exists() and not force:
        raise SystemExit(f"{dst} is already published; pass --force to replace it, or --regenerate to rewrite "
                         "only its report from the runs committed there")
    outcomes = json.loads((src / "outcomes.json").read_text())
    completed = [sweep.run_name(o["arm"], o["seed"]) for o in outcomes if o["status"] == "completed"]
    missing = [f"{name}/{f}" for name in completed for f in RUN_FILES if not (src / "runs" / name / f).is_file()]
    if missing:
        raise SystemExit(f"{src} lacks files of completed runs: {', '.join(missing[:5])}")
    if dst.exists():
        shutil.rmtree(dst)
    for name in completed:
        (dst / "runs" / name).mkdir(parents=True)
        for f in RUN_FILES + tuple(f for f in OPTIONAL_FILES if (src / "runs" / name / f).is_file()):
            shutil.copy2(src / "runs" / name / f, dst / "runs" / name / f)
    for outcome in outcomes:
        outcome["run_dir"] = str(Path("runs") / Path(outcome["run_dir"]).name)
    (dst / "outcomes.json").write_text(json.dumps(outcomes, indent=2))
    _report(sweep_file, dst, outcomes, f"python scripts/publish_results.py configs/{sweep_file.name} {results}"
            + (" --force" if force else ""))
    return dst


def regenerate(sweep_file: Path, docs: Path = DOCS) -> Path:
    """docs/results/<sweep>/report.md (and summary.json, plots/) again from the runs and outcomes.json there."""
    sweep = load_sweep(sweep_file)
    dst = docs / sweep.name
    if not (dst / "outcomes.json").is_file():
        raise SystemExit(f"{dst} has no outcomes.json: publish the sweep first")
    outcomes = json.loads((dst / "outcomes.json").read_text())
    return _report(sweep_file, dst, outcomes,
                   f"python scripts/publish_results.py --regenerate configs/{sweep_file.name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the sweep file, configs/<sweep>.toml")
    parser.add_argument("results", type=Path, nargs="?", help="the sweep's --out folder (results)")
    parser.add_argument("--force", action="store_true", help="replace an already published sweep")
    parser.add_argument("--regenerate", action="store_true",
                        help="rewrite the published report from the committed runs (no results folder)")
    args = parser.parse_args(argv)
    if args.regenerate:
        if args.results is not None:
            parser.error("--regenerate reads the committed runs: give no results folder")
        print(regenerate(args.sweep))
    elif args.results is None:
        parser.error("give the sweep's results folder (or --regenerate)")
    else:
        print(publish(args.sweep, args.results, force=args.force))


if __name__ == "__main__":
    main()
