"""Portable results: adapter folders with tokenizer, model card and a movable base-model reference; `pubswap export`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import metrics_schema as schema
from .adapter_files import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    BASE_DIR,
    SUMMARY_FILE,
    AdapterConfigFile,
    AdapterFileError,
    check_adapter_folder,
    read_card,
)
from .model_packages import PACKAGED, PackagedModelError, licence_of, terms_path
from .untrusted import UntrustedFileError, check_no_links, read_bytes

# Light at import (the `pubswap` command registers this module's subcommand): torch, transformers and peft load
# only when an adapter is saved, loaded or exported.
EMBEDDED_PREFIX = "embedded:"  # policy.model.EMBEDDED_PREFIX
CARD_FILE = "README.md"
NOTICE_FILE = "NOTICE"  # what a licence that asks for a notice file gets (the Gemma Terms of Use, section 3.1)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
PROJECT = "pubswap-flwr"


class ExportError(ValueError):
    """The run or adapter folder cannot be exported; the message says what is missing."""


# -- saving an adapter folder --------------------------------------------------------------------------------------
def _project_name(name: str) -> bool:
    """An embedded model or a packaged one (policy/packaged.py): a name this project resolves on any machine."""
    from .policy.packaged import is_packaged

    return name.startswith(EMBEDDED_PREFIX) or is_packaged(name)


def base_reference(model_name: str, location: str) -> str:
    """What adapter_config.json records as the base model: the project's own name for its embedded and packaged
    models (`embedded:tiny`, `smollm2-135m-instruct`: their folders' absolute paths are only valid on the machine
    that trained), otherwise the local path or Hub id as given."""
    return model_name if _project_name(model_name) else location


def save_adapter(policy, directory: Path, *, tokenizer: bool = True) -> None:
    """The policy's adapter in PEFT format, its base-model reference made portable, and (with `tokenizer`) the
    tokenizer beside it. The model card comes separately (`write_card`), once the round's metrics are known."""
    directory = Path(directory)
    policy.model.save_pretrained(str(directory))
    path = directory / ADAPTER_CONFIG
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base_reference(policy.spec.model_name, policy.location)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer:
        policy.tokenizer.save_pretrained(str(directory))
    ordinary_permissions(directory)


def ordinary_permissions(root: Path) -> None:
    """The permissions a plainly created file or folder gets (0644 and 0755 under the usual umask 022) for everything
    under `root`: safetensors writes its files 0600, but adapters and exports are meant to be handed on."""
    umask = os.umask(0)
    os.umask(umask)
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def run_summary(cfg, round_number: int, row: dict | None = None, *, node: str = "", spec=None) -> dict[str, Any]:
    """The facts a card shows: mode, rounds, tasks, the base model, LoRA and GRPO settings, and the round's metrics
    (held-out evaluation, train and cumulative reward) when the row has them. A node's own card passes its policy's
    `spec`: in a swarm its model and learning rate may not be the run's model.name and train.learning-rate."""
    row = row or {}
    t = cfg.train
    base_model = spec.model_name if spec else cfg.model.name
    learning_rate = spec.grpo.learning_rate if spec else t.learning_rate
    summary: dict[str, Any] = {
        "project": PROJECT, "base_model": base_model, "mode": cfg.strategy.mode,
        "round": round_number, "rounds": cfg.num_server_rounds, "seed": cfg.seed,
        "tasks": {"mix": cfg.tasks.mix, "per-node": cfg.tasks.per_node, "node-mixes": cfg.tasks.node_mixes,
                  "data-paths": cfg.tasks.data_paths},
        "lora": {"r": cfg.model.lora_r, "alpha": cfg.model.lora_alpha, "targets": cfg.model.lora_targets},
        "grpo": {"loss-type": t.loss_type, "completions-per-prompt": t.completions_per_prompt,
                 "learning-rate": learning_rate, "epsilon-low": t.epsilon_low, "epsilon-high": t.epsilon_high,
                 "kl-beta": t.kl_beta, "local-steps": t.local_steps},
        "metrics": {},
    }
    if node:
        summary["node"] = node
    held = row.get(schema.EVAL) or {}
    for key in (schema.GREEDY_ACCURACY, schema.SAMPLED_ACCURACY, schema.SAMPLED_REWARD):
        if isinstance(held.get(key), (int, float)):
            summary["metrics"][f"{schema.EVAL}/{key}"] = held[key]
    for key in (schema.TRAIN_REWARD, schema.CUMULATIVE_REWARD):
        if isinstance(row.get(key), (int, float)):
            summary["metrics"][key] = row[key]
    return summary


def write_card(directory: Path, summary: dict[str, Any], *, merged: bool = False) -> None:
    """README.md (a Hugging Face model card) and pubswap_run.json, replacing PEFT's empty template."""
    directory = Path(directory)
    (directory / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    has_tokenizer = any((directory / name).is_file() for name in TOKENIZER_FILES)
    shipped_base = (directory / BASE_DIR / "config.json").is_file()
    (directory / CARD_FILE).write_text(render_card(summary, merged=merged, has_tokenizer=has_tokenizer,
                                                   shipped_base=shipped_base))
    licence = licence_of(str(summary.get("base_model", "")))
    if licence is not None and licence.notice:
        (directory / NOTICE_FILE).write_text(licence.notice + "\n")


def ship_terms(directory: Path, base_model: str) -> None:
    """A copy of the base model's licence terms beside an export, where its licence asks every recipient to get one
    (read from the model's installed package); ExportError when that package is missing."""
    if base_model not in PACKAGED:
        return
    try:
        terms = terms_path(PACKAGED[base_model])
    except PackagedModelError as err:
        raise ExportError(f"{err} (its licence terms ship with every export)") from None
    if terms is not None:
        shutil.copyfile(terms, Path(directory) / terms.name)


def _is_hub_id(name: str) -> bool:
    return not _project_name(name) and not Path(name).expanduser().is_absolute() and \
        not name.startswith((".", "~")) and name.count("/") <= 1


def _task_split(tasks: dict[str, Any]) -> str:
    """How the mix was split over nodes, when the summary says (an adapter saved without a summary does not)."""
    if tasks.get("node-mixes"):
        return f", node mixes `{tasks['node-mixes']}`"
    if "per-node" in tasks:
        return f", {tasks['per-node']} per node (0 = all)"
    return ""


def render_card(summary: dict[str, Any], *, merged: bool = False, has_tokenizer: bool = True,
                shipped_base: bool = False) -> str:
    """The card's markdown: YAML metadata, what was trained and how, the round's metrics, how to load it."""
    base = summary["base_model"]
    header = ["---", f"library_name: {'transformers' if merged else 'peft'}"]
    if _is_hub_id(base):
        header.append(f"base_model: {base}")
    licence = licence_of(base)
    if licence is not None:
        header.append(f"license: {licence.card_id}")
    header += ["tags:", "- pubswap-flwr", "- grpo", "- lora", "- federated-learning", "---", ""]
    what = "a standalone model (LoRA adapter merged into the base weights)" if merged else "a LoRA adapter"
    node = f", node {summary['node']}" if summary.get("node") else ""
    lines = header + [
        f"# {what[0].upper() + what[1:]} trained with GRPO by {PROJECT}", "",
        f"Mode `{summary['mode']}`{node}, after round {summary['round']} of {summary['rounds']} (seed "
        f"{summary['seed']}).", "",
        "| | |", "|---|---|",
        f"| base model | `{base}`" + (" (the embedded model shipped in the pubswap-flwr checkout's "
                                    f"`data/models/{base[len(EMBEDDED_PREFIX):]}`)" if base.startswith(EMBEDDED_PREFIX)
                                    else "") + " |",
        f"| tasks | `{summary['tasks']['mix']}`{_task_split(summary['tasks'])} |",
        f"| LoRA | r {summary['lora']['r']}, alpha {summary['lora']['alpha']}, `{summary['lora']['targets']}` |",
        "| GRPO | " + ", ".join(f"{k} {v}" for k, v in summary["grpo"].items()) + " |",
    ]
    names = {"eval/greedy_accuracy": "held-out greedy pass@1", "eval/sampled_accuracy": "held-out sampled pass@1",
             "eval/sampled_reward": "held-out sampled reward", "train_reward": "train reward (this round)",
             "cumulative_reward": "cumulative train reward"}
    for key, label in names.items():
        if key in summary["metrics"]:
            lines.append(f"| {label} | {summary['metrics'][key]:.4f} |")
    if not summary["metrics"]:
        lines.append("| metrics | not evaluated at this round (see the run's metrics.jsonl) |")
    if licence is not None:
        lines += ["", "## Licence", "", *licence.card_lines()]
    lines += ["", "## Load it", ""]
    if merged:
        lines += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  'model = AutoModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER")',
                  'tokenizer = AutoTokenizer.from_pretrained("PATH/TO/THIS/FOLDER")', "```", ""]
    elif shipped_base:
        lines += [f"The base model's files are in `{BASE_DIR}/` beside the adapter, and `adapter_config.json` names "
                  "that folder by the absolute path it was exported to, so plain transformers + peft load it:", "",
                  "```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer",
                  "", 'model = AutoPeftModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER")',
                  'tokenizer = AutoTokenizer.from_pretrained("PATH/TO/THIS/FOLDER")', "```", "",
                  f"Moved or copied elsewhere, load the base from its `{BASE_DIR}/` yourself (or export again):", "",
                  "```python", "from peft import PeftModel", "from transformers import AutoModelForCausalLM", "",
                  f'base = AutoModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER/{BASE_DIR}")',
                  'model = PeftModel.from_pretrained(base, "PATH/TO/THIS/FOLDER")', "```", ""]
    else:
        location = f"data/models/{base[len(EMBEDDED_PREFIX):]}" if base.startswith(EMBEDDED_PREFIX) else base
        tokenizer = "PATH/TO/THIS/FOLDER" if has_tokenizer else location  # round-NNNN folders: the base's
        lines += ["With pubswap-flwr installed (resolves `embedded:` base models):", "",
                  "```python", "from pubswap_flwr.export import load_adapter_model", "",
                  'model, tokenizer = load_adapter_model("PATH/TO/THIS/FOLDER")', "```", "",
                  "With plain transformers + peft:", "",
                  "```python", "from peft import PeftModel", "from transformers import AutoModelForCausalLM, "
                  "AutoTokenizer", "",
                  f'base = AutoModelForCausalLM.from_pretrained("{location}")',
                  'model = PeftModel.from_pretrained(base, "PATH/TO/THIS/FOLDER")',
                  f'tokenizer = AutoTokenizer.from_pretrained("{tokenizer}")', "```", "",
                  "A standalone copy with the adapter merged in: `pubswap export RUN_DIR OUT --merged`.", ""]
    return "\n".join(lines)


# -- loading -------------------------------------------------------------------------------------------------------
def adapter_folder(path: str | Path) -> Path:
    """An adapter folder, or a run directory's final global adapter (adapters/final)."""
    path = Path(path).expanduser()
    if (path / ADAPTER_CONFIG).is_file():
        return path
    final = path / "adapters" / "final"
    if (final / ADAPTER_CONFIG).is_file():
        try:
            check_no_links(final, path)
        except UntrustedFileError as err:
            raise ExportError(str(err)) from None
        return final
    if (path / "nodes").is_dir() and not (path / "adapters").is_dir():
        raise ExportError(f"{path} has no global adapter (a sapo or local run keeps one model per node): export a "
                          f"node's, e.g. {path / 'nodes' / 'partition-0' / 'adapter'}")
    raise ExportError(f"{path} is neither an adapter folder (no {ADAPTER_CONFIG}) nor a run directory with "
                      f"adapters/final/{ADAPTER_CONFIG}")


def adapter_config(adapter_dir: Path) -> AdapterConfigFile:
    """adapter_files.check_adapter_folder, its refusal an ExportError: every load and export goes through it."""
    try:
        return check_adapter_folder(adapter_dir)
    except AdapterFileError as err:
        raise ExportError(str(err)) from None


def base_location(adapter_dir: Path, config: AdapterConfigFile | None = None) -> str:
    """Where the adapter's base model loads from on this machine (`embedded:` names resolve to data/models; an
    exported folder's own base/ wherever the folder was moved to); `config`: the folder's, already checked."""
    from .policy.model import resolve_model

    name = (config or adapter_config(adapter_dir)).base_model_name_or_path
    if not name:
        raise ExportError(f"{adapter_dir / ADAPTER_CONFIG} names no base model (base_model_name_or_path)")
    shipped = adapter_dir / BASE_DIR
    if (shipped / "config.json").is_file() and not Path(name).is_dir():
        return str(shipped.resolve())
    return resolve_model(name)


def load_tokenizer_for(adapter_dir: Path, base: str):
    """The tokenizer saved beside the adapter, else the base model's."""
    from .policy.model import load_tokenizer

    has_own = any((adapter_dir / name).is_file() for name in TOKENIZER_FILES)
    return load_tokenizer(str(adapter_dir) if has_own else base)


def load_adapter_model(path: str | Path, *, device: str = "cpu", dtype: str = "float32"):
    """(PeftModel, tokenizer) for an adapter folder or a run directory, its base model resolved on this machine."""
    from peft import PeftModel

    from .policy.model import load_causal_lm

    adapter_dir = adapter_folder(path)
    base = base_location(adapter_dir)
    model = PeftModel.from_pretrained(load_causal_lm(base, dtype, device), str(adapter_dir))
    for config in model.peft_config.values():  # where the base was found here (peft re-reads it when saving)
        config.base_model_name_or_path = base
    model.eval()
    return model, load_tokenizer_for(adapter_dir, base)


# -- export --------------------------------------------------------------------------------------------------------
def _summary_of(adapter_dir: Path, config: AdapterConfigFile) -> dict[str, Any]:
    """The card's facts: pubswap_run.json checked against its declaration, or what adapter_config.json says."""
    try:
        card = read_card(adapter_dir)
    except AdapterFileError as err:
        raise ExportError(str(err)) from None
    if card is not None:
        return card
    # an adapter saved before cards existed: what its config says
    return {"project": PROJECT, "base_model": config.base_model_name_or_path or "?", "mode": "?", "round": "?",
            "rounds": "?", "seed": "?", "tasks": {"mix": "?"}, "metrics": {},
            "lora": {"r": config.r, "alpha": config.lora_alpha, "targets": config.target_modules}, "grpo": {}}


def export(path: str | Path, out: str | Path, *, merged: bool = False, force: bool = False) -> Path:
    """Write `out`: with `merged`, a standalone model (adapter merged into fp32 base weights, tokenizer, card) that
    plain `AutoModelForCausalLM.from_pretrained(out)` loads; otherwise a copy of the adapter with tokenizer and card,
    which plain `AutoPeftModelForCausalLM.from_pretrained(out)` loads: a base only this project can name (embedded,
    packaged) is copied into out/base and adapter_config.json names that folder by its absolute path (transformers
    resolves a relative one against the working directory, not the adapter's folder). Files get ordinary
    permissions."""
    adapter_dir = adapter_folder(path)
    out = Path(out).expanduser()
    source, target = adapter_dir.resolve(), out.resolve()
    if target == source or target in source.parents or (out / "metrics.jsonl").exists():
        raise ExportError(f"{out} holds a run or the adapter being exported; choose another folder")
    if out.exists() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} exists and is not empty; choose another folder or pass --force")
    config = adapter_config(adapter_dir)  # every input is checked before anything is written
    base = base_location(adapter_dir, config)
    tokenizer = load_tokenizer_for(adapter_dir, base)
    summary = _summary_of(adapter_dir, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # replaces `out` only once complete
    try:
        _write_export(adapter_dir, config, base, tokenizer, summary, work, out.resolve(), merged)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    work.rename(out)
    return out


# parameters: the pieces `pubswap export` has read and checked, written in one place
def _write_export(adapter_dir: Path, config: AdapterConfigFile, base: str, tokenizer, summary: dict[str, Any],
                  work: Path, out: Path, merged: bool) -> None:
    """export's files, written into `work`, which becomes `out` (where a shipped base is named from)."""
    if merged:
        model, _ = load_adapter_model(adapter_dir)
        model = model.merge_and_unload()
        model.save_pretrained(str(work), safe_serialization=True)
    else:
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):  # checked by adapter_config: regular files, no links
            try:
                (work / name).write_bytes(read_bytes(adapter_dir / name, adapter_dir))
            except UntrustedFileError as err:
                raise ExportError(str(err)) from None
        # plain transformers cannot resolve `embedded:tiny`: ship the base (again, for an export of an export)
        if _project_name(config.base_model_name_or_path or "") or (adapter_dir / BASE_DIR / "config.json").is_file():
            shutil.copytree(base, work / BASE_DIR, ignore=shutil.ignore_patterns(".*"))
            peft_config = json.loads((work / ADAPTER_CONFIG).read_text())  # every key PEFT wrote, kept
            peft_config["base_model_name_or_path"] = str(out / BASE_DIR)
            (work / ADAPTER_CONFIG).write_text(json.dumps(peft_config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(work))
    write_card(work, summary, merged=merged)
    ship_terms(work, str(summary.get("base_model", "")))
    ordinary_permissions(work)


def cmd_export(args: argparse.Namespace) -> int:
    from .policy.model import ModelError

    try:
        out = export(args.run, args.out, merged=args.merged, force=args.force)
    except (ExportError, ModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{'merged model' if args.merged else 'adapter'} written to {out}")
    if (out / BASE_DIR).is_dir():
        print(f"with its base model in {out / BASE_DIR}: AutoPeftModelForCausalLM.from_pretrained({str(out)!r}) loads "
              "it while the folder stays where it is (its README.md says how to load a moved copy)")
    return 0


def register(sub) -> None:
    export_parser = sub.add_parser("export", help="write a run's final adapter, or a standalone merged model, to a "
                                                  "folder (tokenizer and model card included)")
    export_parser.add_argument("run", help="a run directory (its adapters/final) or an adapter folder")
    export_parser.add_argument("out", help="the folder to write")
    export_parser.add_argument("--merged", action="store_true",
                               help="merge the adapter into the base weights: a standalone model that "
                                    "AutoModelForCausalLM.from_pretrained(OUT) loads")
    export_parser.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    export_parser.set_defaults(func=cmd_export)
