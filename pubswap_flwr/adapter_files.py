"""An adapter folder someone else may have made (a colleague's run, a published result), read as untrusted: its JSON
files as declared here, its weights as safetensors only (nothing pickled is ever loaded), no file through a link."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta, Struct

from .schema import parse_value_of
from .untrusted import MAX_FILE_BYTES, UntrustedFileError, is_present, read_json

T = TypeVar("T")

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
SUMMARY_FILE = "pubswap_run.json"  # what the card says, machine-readable (the card is rendered from it)
BASE_DIR = "base"  # an exported adapter of a base only this project can name ships the base's files here
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")  # torch.load would unpickle any of them
MAX_CARD_BYTES = 16 << 20  # a card's task mixes grow with the nodes (up to 10,000); far above any real card
# One line of a card: no control character and none of the line breaks YAML also honours (NEL, LS, PS), so a value
# cannot add lines to the card's YAML header.
LINE_PATTERN = "\\A[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*\\Z"
Line = Annotated[str, Meta(pattern=LINE_PATTERN)]
Value = Line | int | float | bool | None


class AdapterFileError(ValueError):
    """An adapter folder that cannot be used as it is; the message names the file and says why, on one line."""


class AdapterConfigFile(Struct):
    """adapter_config.json as this project reads it (PEFT writes many more keys)."""

    base_model_name_or_path: Line | None = None
    r: int | None = None
    lora_alpha: int | float | None = None
    target_modules: Line | list[Line] | None = None


class CardTasks(Struct):
    mix: Line
    per_node: int | None = msgspec.field(default=None, name="per-node")
    node_mixes: Line | None = msgspec.field(default=None, name="node-mixes")


class CardLora(Struct):
    r: int | None
    alpha: int | float | None
    targets: Line | list[Line] | None


class RunCardFile(Struct):
    """pubswap_run.json (export.run_summary): what a card shows, as export.render_card reads it."""

    base_model: Line
    mode: Line
    round: int | Line
    rounds: int | Line
    seed: int | Line
    tasks: CardTasks
    lora: CardLora
    grpo: dict[Line, Value]
    metrics: dict[Line, float]
    node: Line | None = None


def _parse(path: Path, value: Any, declaration: type[T]) -> T:
    try:
        return parse_value_of(path, value, declaration, AdapterFileError)
    except AdapterFileError as err:  # msgspec quotes the pattern; say what it means
        raise AdapterFileError(str(err).replace(f"matching regex {LINE_PATTERN!r}", "of one line (no line break or "
                                                "control character)")) from None


def _json(path: Path, root: Path, limit: int = MAX_FILE_BYTES) -> Any:
    try:
        return read_json(path, root, limit)
    except UntrustedFileError as err:
        raise AdapterFileError(str(err)) from None


def check_adapter_folder(adapter_dir: Path) -> AdapterConfigFile:
    """The folder's adapter_config.json, after checking everything a load would open: no link anywhere in the folder
    (the tokenizer and a shipped base are opened by name), no pickled weights anywhere, and a readable
    adapter_model.safetensors."""
    config = _parse(adapter_dir / ADAPTER_CONFIG, _json(adapter_dir / ADAPTER_CONFIG, adapter_dir), AdapterConfigFile)
    for path in sorted(adapter_dir.rglob("*")):
        if path.is_symlink():
            raise AdapterFileError(f"{path}: a link in the adapter folder; links are refused")
        if path.suffix in PICKLED_SUFFIXES:
            raise AdapterFileError(f"{path}: pickled weights are never loaded from a folder someone else may have "
                                   "made; save them as safetensors")
    weights = adapter_dir / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise AdapterFileError(f"{weights}: missing or not a regular file (an adapter's weights are read as "
                               "safetensors only)")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), "pt"):  # the header only: a truncated or foreign file fails here
            pass
    except (SafetensorError, OSError) as err:
        raise AdapterFileError(f"{weights}: not a readable safetensors file ({str(err)[:200]})") from None
    return config


def read_card(adapter_dir: Path) -> dict[str, Any] | None:
    """pubswap_run.json as written (the card keeps its keys), once it matches RunCardFile; None when there is none."""
    path = adapter_dir / SUMMARY_FILE
    if not is_present(path):
        return None
    value = _json(path, adapter_dir, MAX_CARD_BYTES)
    _parse(path, value, RunCardFile)
    return value
