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
Every file is read and checked before anything is written (regular files only: a link or FIFO is refused; arm names
and seeds come from the sweep file, each arm name one plain path component); a publication it replaces stays
until the new one is whole, and a problem is one line on stderr with exit code 2.

Adapters: the global one (adapters/final/) or, for SAPO and local runs, every node's own (nodes/partition-N/adapter/),
at the same paths under the published run, with adapter_config.json and the model card but not the tokenizer (the
base model's).
Weights are stored as fp16 (the run keeps fp32 master weights; fp16 is also what travels on the wire), so an adapter
costs 2 bytes per LoRA parameter plus ~8 KB of JSON and card: on the embedded tiny model with the default LoRA (r 16,
all linear layers: 155,648 parameters) 0.32 MB, i.e. 3.7 MB for a 4-arm x 3-seed fedavg/pubswap sweep and 30 MB for
compare-sapo (4 arms x 3 seeds x 8 nodes); on SmolLM2-135M (r 8, all linear: 2.5M parameters) 4.9 MB each, i.e.
29 MB for real-pubswap's 6 runs but 176 MB for real-sapo's 9 runs x 4 nodes. The script prints the total.
So that published adapters stop growing the repository, the command copies by default only the sweep's first
seed's adapters (every arm's, so each arm stays verifiable) and, of a SAPO or local run, only the first node of
each model (partition 0, or partitions 0..k-1 with k models in model.node-models round robin): a real-model SAPO
sweep's 176 MB becomes 20 MB. --adapter-seeds and --adapter-nodes choose others, --all-adapters copies every one,
--no-adapters none (the report does not need them; `pubswap verify` does). The report's command names the choice it
made.

Clone weight: a published sweep folder may add at most MAX_PUBLISHED_MB (5 MB) to the repository, report and plots
included; a bigger one is refused (the publication it would replace stays) with the size and what to leave out:
other seeds' and nodes' adapters stay in the sweep's run folders. --max-mb raises the cap for one publication, and
the report's command records it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import msgspec
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

from pubswap_flwr.compare import NOT_RUN, OutcomeEntry, SweepError, is_failure, load_sweep
from pubswap_flwr.config.keys import PLAIN_COMPONENT, is_plain_component
from pubswap_flwr.report import summarize_run, write_report
from pubswap_flwr.report.writer import read_summary
from pubswap_flwr.results.verify import NoAdapterError, VerifyError, final_adapters
from pubswap_flwr.schema import parse
from pubswap_flwr.server.metrics import MetricsError, parse_metrics
from pubswap_flwr.untrusted import UntrustedFileError, is_present, one_line, parse_json, read_bytes

RUN_FILES = ("metrics.jsonl", "config.json", "status.json")
OPTIONAL_FILES = ("provenance.json", "eval_items.jsonl")  # runs made before either existed have none
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = ("adapter_config.json", "README.md", "pubswap_run.json")  # beside the weights; no tokenizer
DOCS = Path("docs/results")
PUBLISH_COMMAND = "python scripts/publish_results.py "
MAX_PUBLISHED_MB = 5.0  # what one published sweep folder may add to every clone of the repository


class PublishError(ValueError):
    """The sweep cannot be published as it is (nothing was written or replaced); the message names the file."""


def _read(path: Path, root: Path) -> bytes:
    """A regular file under `root` (no link on the way, never a FIFO)."""
    try:
        return read_bytes(path, root)
    except UntrustedFileError as err:
        raise PublishError(str(err)) from None


def _json_object(data: bytes, path: Path) -> dict:
    try:
        value = parse_json(data.decode("utf-8"), str(path))
    except (UnicodeDecodeError, UntrustedFileError) as err:
        raise PublishError(f"{path}: not JSON text ({err})") from None
    if not isinstance(value, dict):
        raise PublishError(f"{path}: must hold a JSON object, got {type(value).__name__}")
    return value


def _sweep(sweep_file: Path):
    """The sweep, with its name and every arm's a plain path component (they name folders of the publication)."""
    try:
        sweep = load_sweep(sweep_file)
    except SweepError as err:
        raise PublishError(str(err)) from None
    for what, name in [("sweep name", sweep.name)] + [("arm name", arm.name) for arm in sweep.arms]:
        if not is_plain_component(name):
            raise PublishError(f"{sweep_file}: {what} {name!r} is not one plain path component ({PLAIN_COMPONENT})")
    return sweep


def _outcomes(path: Path, root: Path, sweep) -> list[dict]:
    """outcomes.json's entries, each an arm and seed of the sweep file (run folders are named from the sweep file,
    never from what outcomes.json says), with a status and detail as text."""
    try:
        entries = parse_json(_read(path, root).decode("utf-8"), str(path))
    except (UnicodeDecodeError, UntrustedFileError) as err:
        raise PublishError(f"{path}: not JSON text ({err})") from None
    arms = {arm.name for arm in sweep.arms}
    checked = []
    for number, entry in enumerate(parse(entries, list[OutcomeEntry], str(path), PublishError)):
        where = f"{path}: entry {number}"
        if entry.arm not in arms:
            raise PublishError(f"{where}: arm {entry.arm[:80]!r} is not an arm of {sweep.source}")
        if entry.seed not in sweep.seeds:
            raise PublishError(f"{where}: seed {entry.seed} is not a seed of {sweep.source}")
        checked.append({**msgspec.to_builtins(entry), "run_dir": str(Path("runs") / sweep.run_name(entry.arm,
                                                                                                   entry.seed))})
    return checked


def adapter_files(src: Path, rel: Path, root: Path) -> dict[Path, bytes]:
    """The adapter folder `src` as {path under the published run: content}, fp32 weights stored as fp16."""
    files = {rel / name: _read(src / name, root) for name in ADAPTER_FILES if is_present(src / name)}
    path = src / ADAPTER_WEIGHTS
    data = _read(path, root)
    try:
        tensors = load(data)
        (size,) = struct.unpack("<Q", data[:8])
        metadata = json.loads(data[8:8 + size]).get("__metadata__")
    except (SafetensorError, ValueError, struct.error, AttributeError) as err:
        raise PublishError(f"{path}: not a readable safetensors file ({type(err).__name__})") from None
    files[rel / ADAPTER_WEIGHTS] = save({k: v.astype(np.float16) if v.dtype == np.float32 else v
                                         for k, v in tensors.items()}, metadata=metadata)
    return files


def run_files(src: Path, name: str, with_adapters: bool, nodes: set[int] | None = None) -> dict[Path, bytes]:
    """Everything published of one run, read and checked: its small files and (`with_adapters`) its final
    adapter(s) (verify.final_adapters: global, or each SAPO or local node's, only partitions in `nodes` when given)
    at the same paths."""
    run, rel = src / "runs" / name, Path("runs") / name
    files = {rel / f: _read(run / f, src) for f in RUN_FILES}
    files.update({rel / f: _read(run / f, src) for f in OPTIONAL_FILES if is_present(run / f)})
    try:
        parse_metrics(files[rel / "metrics.jsonl"].decode("utf-8"), run / "metrics.jsonl")
    except (UnicodeDecodeError, MetricsError) as err:
        raise PublishError(f"{run / 'metrics.jsonl'}: {err}" if isinstance(err, UnicodeDecodeError)
                           else str(err)) from None
    for f in ("config.json", "status.json"):
        _json_object(files[rel / f], run / f)
    if with_adapters:
        try:
            found = final_adapters(run)
        except NoAdapterError:
            found = []
        except VerifyError as err:
            raise PublishError(str(err)) from None
        for label, folder in found:
            if nodes is not None and label != "global" and int(label.split()[1]) not in nodes:
                continue
            files.update(adapter_files(folder, rel / folder.relative_to(run), src))
    return files


def _report(sweep, sweep_file: Path, dst: Path, outcomes: list[dict], command: str) -> Path:
    runs = [dst / "runs" / sweep.run_name(o["arm"], o["seed"]) for o in outcomes if o["status"] == "completed"]
    failures = {(o["arm"], o["seed"]): o["detail"] for o in outcomes if is_failure(o["status"])}
    pending = [(o["arm"], o["seed"]) for o in outcomes if o["status"] == NOT_RUN]
    return write_report(dst, runs, failures=failures, pending=pending, title=sweep.name, notes=sweep.notes,
                        command=command,
                        made_by=f"pubswap compare configs/{sweep_file.name}", force=True,
                        arm_order=[arm.name for arm in sweep.arms])


def _stage(docs: Path, name: str, files: dict[Path, bytes], runs: list[str]) -> Path:
    """The publication written beside its place (a hidden folder under `docs`), and every run read back as the
    report reads it; PublishError (the folder removed) when something is wrong."""
    docs.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-staging-", dir=docs))
    try:
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700; a publication is for anyone
        for rel, data in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
        for run in runs:
            summarize_run(staging / "runs" / run)
    except ValueError as err:  # UntrustedFileError, MetricsError, an empty metrics.jsonl, a malformed eval_items.jsonl
        shutil.rmtree(staging)
        raise PublishError(str(err).replace(str(staging), str(docs / name))) from None
    except BaseException:
        shutil.rmtree(staging)
        raise
    return staging


def folder_bytes(folder: Path) -> int:
    """The bytes of the regular files under `folder`."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def _check_size(dst: Path, max_mb: float, adapter_bytes: int) -> int:
    """The published folder's bytes; PublishError when they are over `max_mb`."""
    size = folder_bytes(dst)
    if size > max_mb * 1e6:
        raise PublishError(f"{dst} adds {size / 1e6:.2f} MB to the repository (its adapters {adapter_bytes / 1e6:.2f} "
                           f"MB), over the {max_mb:g} MB a published sweep may add: keep fewer adapters with "
                           "--adapter-seeds, --adapter-nodes or --no-adapters (`pubswap verify` needs one run's; the "
                           "others stay in the sweep's run folders), or raise the cap knowingly with --max-mb")
    return size


def publish(sweep_file: Path, results: Path, docs: Path = DOCS, force: bool = False, adapters: bool = True,
            adapter_seeds: set[int] | None = None, adapter_nodes: set[int] | None = None,
            max_mb: float = MAX_PUBLISHED_MB) -> Path:
    """Copy a finished sweep's completed runs to docs/results/<sweep> and write its report. `adapters`: copy the
    runs' final adapters as fp16 too; `adapter_seeds`: only those of these seeds (None: every seed);
    `adapter_nodes`: of a SAPO or local run, only these partitions' adapters (None: every node's). Everything is
    read and checked before anything is written, and a publication it replaces stays until the new one is whole and
    within `max_mb` (the folder, report and plots included); PublishError names what was wrong."""
    sweep = _sweep(sweep_file)
    src, dst = results / sweep.name, docs / sweep.name
    if not is_present(src / "outcomes.json"):
        raise PublishError(f"{src} has no outcomes.json: run `pubswap compare {sweep_file}` to the end first")
    if is_present(dst) and not force:
        raise PublishError(f"{dst} is already published; pass --force to replace it, or --regenerate to rewrite "
                           "only its report from the runs committed there")
    if dst.is_symlink():
        raise PublishError(f"{dst} is a link; a publication is replaced only where it is")
    outcomes = _outcomes(src / "outcomes.json", src, sweep)
    completed = list(dict.fromkeys(sweep.run_name(o["arm"], o["seed"]) for o in outcomes
                                   if o["status"] == "completed"))
    seed_of = {sweep.run_name(o["arm"], o["seed"]): o["seed"] for o in outcomes}
    files: dict[Path, bytes] = {}
    adapter_bytes, without = 0, []
    for name in completed:
        copied = adapters and (adapter_seeds is None or seed_of[name] in adapter_seeds)
        found = run_files(src, name, copied, adapter_nodes)
        written = sum(len(data) for rel, data in found.items() if len(rel.parts) > 3)  # under adapters/ or nodes/
        adapter_bytes += written
        if copied and not written:
            without.append(name)
        files.update(found)
    files[Path("outcomes.json")] = json.dumps(outcomes, indent=2).encode()
    staging = _stage(docs, sweep.name, files, completed)
    backup = dst.with_name(f".{sweep.name}-replaced-{os.getpid()}") if is_present(dst) else None
    if backup is not None:
        dst.rename(backup)
    staging.rename(dst)
    try:
        _report(sweep, sweep_file, dst, outcomes,
                f"python scripts/publish_results.py configs/{sweep_file.name} {results}"
                + (" --force" if force else "") + (" --no-adapters" if not adapters else "")
                + (f" --adapter-seeds {' '.join(map(str, sorted(adapter_seeds)))}"
                   if adapters and adapter_seeds is not None else "")
                + (f" --adapter-nodes {' '.join(map(str, sorted(adapter_nodes)))}"
                   if adapters and adapter_nodes is not None else "")
                + (f" --max-mb {max_mb:g}" if max_mb != MAX_PUBLISHED_MB else ""))
        size = _check_size(dst, max_mb, adapter_bytes)
    except BaseException:  # the old publication comes back whole
        shutil.rmtree(dst)
        if backup is not None:
            backup.rename(dst)
        raise
    if backup is not None:
        shutil.rmtree(backup)
    if adapters:
        print(f"final adapters: {adapter_bytes / 1e6:.1f} MB (fp16)"
              + (f" of seeds {sorted(adapter_seeds)}" if adapter_seeds is not None else "")
              + (f", nodes {sorted(adapter_nodes)} of SAPO and local runs" if adapter_nodes is not None else "")
              + (f"; none kept by {len(without)} run(s): {', '.join(without[:5])}" if without else ""))
    print(f"published: {size / 1e6:.2f} MB of the {max_mb:g} MB a sweep may add")
    return dst


def regenerate(sweep_file: Path, docs: Path = DOCS) -> Path:
    """docs/results/<sweep>/report.md (and summary.json, plots/) again from the runs and outcomes.json there. The
    report keeps the command that published the runs (summary.json's, when it is one of this script's): regenerating a
    published sweep with the same code gives the same bytes (tests/unit/test_published_reports.py)."""
    sweep = _sweep(sweep_file)
    dst = docs / sweep.name
    if not is_present(dst / "outcomes.json"):
        raise PublishError(f"{dst} has no outcomes.json: publish the sweep first")
    outcomes = _outcomes(dst / "outcomes.json", dst, sweep)
    try:
        published = read_summary(dst).get("command")
        command = (published if isinstance(published, str) and published.startswith(PUBLISH_COMMAND) else
                   f"{PUBLISH_COMMAND}--regenerate configs/{sweep_file.name}")
        return _report(sweep, sweep_file, dst, outcomes, command)
    except (UntrustedFileError, MetricsError) as err:
        raise PublishError(str(err)) from None


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
                        help="copy only these seeds' adapters (default: the sweep's first seed)")
    parser.add_argument("--adapter-nodes", type=int, nargs="+", metavar="PARTITION",
                        help="of SAPO and local runs, copy only these partitions' node adapters (default: the first "
                             "node of each model)")
    parser.add_argument("--all-adapters", action="store_true",
                        help="copy every seed's and every node's adapters (default: the first seed's, and of SAPO and "
                             "local runs the first node of each model)")
    parser.add_argument("--max-mb", type=float, default=MAX_PUBLISHED_MB, metavar="MB",
                        help=f"the most the published folder may add to the repository (default {MAX_PUBLISHED_MB:g}; "
                             "raising it is recorded in the report's command)")
    args = parser.parse_args(argv)
    try:
        _run(parser, args)
    except PublishError as err:
        print(f"publish_results: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.regenerate:
        if args.results is not None:
            parser.error("--regenerate reads the committed runs: give no results folder")
        print(regenerate(args.sweep))
    elif args.results is None:
        parser.error("give the sweep's results folder (or --regenerate)")
    else:
        if (args.no_adapters or args.all_adapters) and (args.adapter_seeds or args.adapter_nodes):
            parser.error("--adapter-seeds and --adapter-nodes choose which adapters to copy: they cannot go with "
                         "--no-adapters or --all-adapters")
        if args.no_adapters and args.all_adapters:
            parser.error("--no-adapters and --all-adapters contradict each other")
        seeds, nodes = args.adapter_seeds, args.adapter_nodes
        if not args.all_adapters and not args.no_adapters:
            sweep = _sweep(args.sweep)
            seeds = seeds or [sweep.seeds[0]]
            nodes = nodes or sorted(first_node_of_each_model(sweep) or ())
        print(publish(args.sweep, args.results, force=args.force, adapters=not args.no_adapters,
                      adapter_seeds=set(seeds) if seeds else None, adapter_nodes=set(nodes) if nodes else None,
                      max_mb=args.max_mb))


def first_node_of_each_model(sweep) -> set[int] | None:
    """The partitions that run each of the sweep's models first (model.node-models is assigned round robin, so
    partitions 0..k-1 for k models; one model: partition 0), over every arm; None when no arm's mode keeps an adapter
    per node (only a global adapter to copy)."""
    from pubswap_flwr.config.catalog import CATALOG

    configs = [sweep.config_for(arm, sweep.seeds[0], Path("results")) for arm in sweep.arms]
    if all(CATALOG[str(c.get("strategy.mode", "fedavg"))].averages_adapters for c in configs):
        return None
    models = max(len([m for m in str(c.get("model.node-models", "")).split(",") if m.strip()]) for c in configs)
    return set(range(min(max(models, 1), sweep.nodes)))


if __name__ == "__main__":
    main()
