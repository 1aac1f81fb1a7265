"""Golden metrics: one small fixed-seed run of every mode, served in process (no Ray), reduced to the metrics that
must not change when code is restructured (wall times and byte counts are dropped; Flower node ids become node
indices). `python -m tests.golden.runs write [NAME ...]` records them next to this file; `check` compares."""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from pubswap_flwr.algorithms import server_optimizers  # light: numpy only
from pubswap_flwr.config import catalog

GOLDEN_DIR = Path(__file__).resolve().parent

# every golden run's settings under its own overrides; eval.samples = 1 and graded rewards were the behaviour these
# runs were recorded with (before #13)
COMMON = {"seed": 3, "num-server-rounds": 2, "train.local-steps": 2, "train.prompts-per-step": 2,
          "train.completions-per-prompt": 4, "eval.items-per-task": 6, "eval.samples": 1, "tasks.partial-credit": True,
          "model.threads": 1}
# each mode's golden runs are declared in its catalog entry (pubswap_flwr/config/catalog.py), each server
# optimizer's in its class (pubswap_flwr/algorithms/server_optimizers)
DECLARED = {**catalog.golden_runs(), **server_optimizers.golden_runs()}
# name -> (run config, nodes)
RUNS: dict[str, tuple[dict[str, Any], int]] = {name: ({**COMMON, **run["config"]}, run["nodes"])
                                               for name, run in DECLARED.items()}
SAPO = dict(DECLARED["sapo-sync"]["config"])  # SAPO's and PubSwap's golden settings (the beyond-papers runs use them)
PUBSWAP = dict(DECLARED["pubswap-balanced"]["config"])  # pubswap.swap = "balanced" is the default

VARYING_ROW_KEYS = {"time", "bytes"}
VARYING_CLIENT_KEYS = {"bytes_sent", "bytes_received", "sample_s", "update_s", "handler_s"}
# Norms of trained weights (client drift, a server optimizer's step): their last float32 digits follow the CPU's
# vector kernels, and one thread does not pin them (on an AVX-512 machine, parameter_drift differed from the recording
# by 1.2e-7 relative after round 1 and 1.7e-6 after round 2 while every reward, answer and count was identical), so
# they are compared to 1e-5 relative; every other value exactly.
CPU_DEPENDENT_KEYS = {"parameter_drift", "update_norm", "aggregate_norm"}
CPU_DEPENDENT_REL_TOL = 1e-5


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where `got` differs from the recorded `want` (JSON values): exact, except CPU_DEPENDENT_KEYS' numbers."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}/{k}: missing" for k in want if k not in got]
        out += [f"{where}/{k}: not recorded" for k in got if k not in want]
        for k in want.keys() & got.keys():
            key_where = f"{where}/{k}"
            if k in CPU_DEPENDENT_KEYS and isinstance(want[k], float) and isinstance(got[k], float):
                if not math.isclose(got[k], want[k], rel_tol=CPU_DEPENDENT_REL_TOL):
                    out.append(f"{key_where}: {got[k]!r} != {want[k]!r}")
            else:
                out += differences(got[k], want[k], key_where)
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{where}[{i}]")]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def golden_differences(name: str, rows: list[dict]) -> list[str]:
    """How comparable `rows` differ from golden run `name`'s recording (empty: the same)."""
    return differences(json.loads(json.dumps(rows)), json.loads((GOLDEN_DIR / f"{name}.json").read_text()))


def _rename(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {names.get(str(k), str(k)): _rename(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    return value


def comparable(rows: list[dict]) -> list[dict]:
    """metrics.jsonl rows without what varies between identical runs, nodes named by their index everywhere
    (round 0 of SAPO names nodes before any row lists them as clients)."""
    names = {str(node): f"node{c['node_index']}" for row in rows for node, c in row.get("clients", {}).items()}
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k not in VARYING_ROW_KEYS}
        if "clients" in row:
            row["clients"] = {n: {k: v for k, v in c.items() if k not in VARYING_CLIENT_KEYS}
                              for n, c in row["clients"].items()}
        if "aggregated_clients" in row:
            row["aggregated_clients"] = sorted(names.get(str(n), str(n)) for n in row["aggregated_clients"])
        out.append(_rename(row, names))
    return out


def golden_rows(name: str, out_dir: Path) -> list[dict]:
    """Run golden run `name` under `out_dir` and return its comparable rows."""
    import torch

    from pubswap_flwr.server.metrics import read_metrics
    from pubswap_flwr.simulation import simulate_in_process

    config, nodes = RUNS[name]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order for every float, on any machine of this kind
    try:
        simulate_in_process({**config, "output.dir": str(out_dir), "run-name": name}, nodes)
    finally:
        torch.set_num_threads(threads)
    return comparable(read_metrics(out_dir / name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["write", "check"])
    parser.add_argument("names", nargs="*", help="golden runs (default: all)")
    args = parser.parse_args()
    different = []
    for name in args.names or list(RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            rows = golden_rows(name, Path(tmp))
        path = GOLDEN_DIR / f"{name}.json"
        if args.action == "write":
            path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
            print(f"wrote {path} ({len(rows)} rows)")
        else:
            found = golden_differences(name, rows)
            print(f"{name}: {'same' if not found else 'DIFFERENT: ' + '; '.join(found[:5])}")
            different += [name] if found else []
    sys.exit(1 if different else 0)


if __name__ == "__main__":
    main()
