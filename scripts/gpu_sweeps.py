r"""Run several sweeps' (arm, seed) runs at once on one machine (a single GPU: every run's clients on it), each run
in its own process without Ray (`pubswap simulate --engine inprocess`: the nodes of a run served one after another,
the runs side by side), writing each run where `pubswap compare` would, so `pubswap report` and
`scripts/publish_results.py` read them as they read a sweep run by `pubswap compare`.

    python scripts/gpu_sweeps.py configs/real-pubswap.toml configs/real-sapo.toml configs/real-sapo-hetero.toml \
        --out results --parallel 8
    python scripts/gpu_sweeps.py configs/real-pubswap.toml --out /tmp/dry --parallel 2 --dry-size   # CPU check

--dry-size shrinks every run (embedded tiny model, 2 rounds, a few steps and held-out items) to check the whole
path on a CPU in a minute or two. Completed runs are skipped (a stopped batch resumes) when they ran the config this
invocation gives them (`pubswap compare`'s check: an edited arm, or another --model or --dry-size, makes the old run
a failure naming the keys that differ, until --rerun-edited moves it to <out>/<sweep>/replaced/ and runs it again);
each sweep's outcomes.json and report are written when its runs end. --model overrides model.name in every run
(e.g. a local copy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pubswap_flwr.compare import REPLACED_DIR, check_reuse, load_sweep, move_aside
from pubswap_flwr.places import resolve_output
from pubswap_flwr.report import write_report
from pubswap_flwr.server.metrics import KEEP_UNREADABLE, UNREADABLE, read_status

DRY = {"model.name": "embedded:tiny", "model.node-models": "", "num-server-rounds": 2, "train.local-steps": 2,
       "train.prompts-per-step": 2, "eval.items-per-task": 4, "eval.samples": 2, "eval.every": 0,
       "generation.max-new-tokens": 16, "sapo.questions": 2, "pubswap.public-prompts": 2, "pubswap.tau-swap": 1}


def run(config: dict, nodes: int, log_path: Path, env: dict) -> int:
    command = [sys.executable, "-m", "pubswap_flwr.cli", "simulate", "--engine", "inprocess", "--nodes", str(nodes),
               "--json", json.dumps(config)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as handle:
        return subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, check=False).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("results"),
                        help="results root (a relative path resolves as output.dir does: never into the checkout)")
    parser.add_argument("--parallel", type=int, default=4, help="runs at once")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run (model.threads)")
    parser.add_argument("--dry-size", action="store_true", help="tiny runs on the embedded model (a CPU check)")
    parser.add_argument("--model", help="model.name for every run")
    parser.add_argument("--rerun-edited", action="store_true",
                        help="run again a completed run whose recorded config is not the one this invocation gives "
                             f"it: the old run is moved to <out>/<sweep>/{REPLACED_DIR}/ first")
    args = parser.parse_args()
    args.out = resolve_output(args.out)
    jobs = []
    sweeps = [load_sweep(path) for path in args.sweeps]
    for sweep in sweeps:
        out = args.out / sweep.name
        for seed in sweep.seeds:
            for arm in sweep.arms:
                if arm.error:
                    sys.exit(f"{sweep.source}: {arm.error}")
                config = sweep.config_for(arm, seed, out)
                config.update({"model.threads": args.threads, "model.device": "auto"})
                if args.dry_size:
                    config.update(DRY)
                if args.model:
                    config["model.name"] = args.model
                run_dir = out / "runs" / sweep.run_name(arm.name, seed)
                jobs.append((sweep, arm.name, seed, config, run_dir))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    started = time.time()

    def one(job):
        sweep, arm, seed, config, run_dir = job
        log = args.out / sweep.name / "logs" / f"{run_dir.name}.log"
        before = read_status(run_dir)
        if before.get("status") == "completed":
            reuse = check_reuse(run_dir, config)
            if not reuse.problem:
                return job, "completed", 0.0, True, ""
            if not (reuse.edited and args.rerun_edited):
                print(f"{sweep.name} {arm} seed {seed}: NOT RUN: {reuse.detail}", flush=True)
                return job, "failed", 0.0, False, reuse.detail
            moved = move_aside(run_dir, log, args.out / sweep.name / REPLACED_DIR)
            print(f"{sweep.name} {arm} seed {seed}: {reuse.problem}; moved to {moved}, running it again", flush=True)
        elif before.get("status") == UNREADABLE:  # never cleared unseen: it may be a finished run
            detail = f"{before['detail']}; {KEEP_UNREADABLE}"
            print(f"{sweep.name} {arm} seed {seed}: NOT RUN: {detail}", flush=True)
            return job, "failed", 0.0, False, detail
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        begun = time.time()
        code = run(config, sweep.nodes, log, env)
        status = read_status(run_dir).get("status")
        ok = code == 0 and status == "completed"
        print(f"[{time.time() - started:6.0f} s] {sweep.name} {arm} seed {seed}: "
              f"{'completed' if ok else f'FAILED (exit {code}, status {status})'} in {time.time() - begun:.0f} s",
              flush=True)
        return job, "completed" if ok else "failed", time.time() - begun, False, "" if ok else f"see {log}"

    print(f"{len(jobs)} runs, {args.parallel} at once", flush=True)
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(one, jobs))
    failed = 0
    for sweep in sweeps:
        out = args.out / sweep.name
        mine = [r for r in results if r[0][0] is sweep]
        outcomes = [{"arm": job[1], "seed": job[2], "status": status, "detail": detail, "seconds": round(seconds, 1),
                     "reused": reused, "run_dir": str(job[4])} for job, status, seconds, reused, detail in mine]
        (out / "outcomes.json").write_text(json.dumps(outcomes, indent=2))
        done = [job[4] for job, status, *_ in mine if status == "completed"]
        if done:
            report = write_report(out, done, failures={(o["arm"], o["seed"]): o["detail"] for o in outcomes
                                                       if o["status"] != "completed"},
                                  title=sweep.name, notes=sweep.notes,
                                  command="python scripts/gpu_sweeps.py " + " ".join(sys.argv[1:]), force=True)
            print(f"report: {report}")
        failed += sum(1 for o in outcomes if o["status"] != "completed")
    print(f"all done in {time.time() - started:.0f} s; {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
