"""Copy a finished sweep's small files (metrics.jsonl, config.json, status.json per run) into docs/results/<sweep>/
and regenerate its report from those copies, so the committed report is reproducible from what is committed.

    python scripts/publish_results.py configs/compare-sapo.toml results     # results/ = the sweep's --out
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from pubswap_flwr.compare import load_sweep
from pubswap_flwr.report import write_report

RUN_FILES = ("metrics.jsonl", "config.json", "status.json")


def publish(sweep_file: Path, results: Path, docs: Path = Path("docs/results")) -> Path:
    sweep = load_sweep(sweep_file)
    src, dst = results / sweep.name, docs / sweep.name
    if not (src / "outcomes.json").is_file():
        raise SystemExit(f"{src} has no outcomes.json: run `pubswap compare {sweep_file}` to the end first")
    outcomes = json.loads((src / "outcomes.json").read_text())
    completed = [sweep.run_name(o["arm"], o["seed"]) for o in outcomes if o["status"] == "completed"]
    missing = [f"{name}/{f}" for name in completed for f in RUN_FILES if not (src / "runs" / name / f).is_file()]
    if missing:
        raise SystemExit(f"{src} lacks files of completed runs: {', '.join(missing[:5])}")
    if dst.exists():
        shutil.rmtree(dst)
    runs = []
    for name in completed:
        (dst / "runs" / name).mkdir(parents=True)
        for f in RUN_FILES:
            shutil.copy2(src / "runs" / name / f, dst / "runs" / name / f)
        runs.append(dst / "runs" / name)
    for outcome in outcomes:
        outcome["run_dir"] = str(Path("runs") / Path(outcome["run_dir"]).name)
    (dst / "outcomes.json").write_text(json.dumps(outcomes, indent=2))
    failures = {(o["arm"], o["seed"]): o["detail"] for o in outcomes if o["status"] != "completed"}
    write_report(dst, runs, failures=failures, title=sweep.name, notes=sweep.notes,
                 command=f"pubswap compare configs/{sweep_file.name}")
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(publish(Path(sys.argv[1]), Path(sys.argv[2])))
