"""Model and tokenizer loading: the embedded models shipped under data/models, a local path, or a Hub id."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .data import ModelError, data_dir, quiet_transformers

log = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"


def embedded_models() -> list[str]:
    return sorted(p.name for p in (data_dir() / "models").iterdir() if (p / "config.json").is_file())


def resolve_model(name: str) -> str:
    """A loadable location for `name`: `embedded:<n>`, a packaged model (policy/packaged.py, converted once into a
    cached folder), an existing local directory, or a Hub id (left as is)."""
    from .packaged import PackagedModelError, ensure_folder, is_packaged

    if not name or not name.strip():
        raise ModelError("model.name is empty")
    if is_packaged(name):
        try:
            return ensure_folder(name)
        except PackagedModelError as err:
            raise ModelError(str(err)) from None
    if name.startswith(EMBEDDED_PREFIX):
        short = name[len(EMBEDDED_PREFIX):]
        path = data_dir() / "models" / short
        if short not in embedded_models() or not (path / "config.json").is_file():  # never a path out of models/
            raise ModelError(f"no embedded model {short!r}; available: {', '.join(embedded_models()) or 'none'}")
        return str(path)
    local = Path(name).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelError(f"{local} exists but has no config.json; it is not a Hugging Face model directory")
        return str(local.resolve())
    return name


def load_tokenizer(location: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
    except OSError as err:
        raise ModelError(f"cannot load tokenizer for {location!r} (offline? set HF_HUB_OFFLINE=1 and use a local "
                         f"path or a cached id): {err}") from err
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise ModelError(f"tokenizer of {location!r} has no EOS token")
    return tokenizer


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """`model.device` as a torch device: auto picks the first CUDA device when torch sees one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ModelError(f"model.device {name!r} is not a torch device: {err}") from err
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelError(f"model.device = {name!r} but torch sees no CUDA device (a CPU-only torch build, or "
                             "CUDA_VISIBLE_DEVICES hides it; in simulation give clients GPUs with "
                             "client-resources-num-gpus); use model.device = \"auto\" or \"cpu\"")
        if device.index is not None and device.index >= count:
            raise ModelError(f"model.device = {name!r} but torch sees only {count} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ModelError(f"model.device = {name!r} but MPS is not available on this machine")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ModelError(f"model.device = {name!r}: only cpu, cuda and mps are supported")
    return device


def load_causal_lm(location: str, dtype: str = "float32", device: torch.device | str = "cpu"):
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    if dtype not in _DTYPES:
        raise ModelError(f"model.dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    from safetensors import SafetensorError

    from .packaged import cache_root

    try:
        model = AutoModelForCausalLM.from_pretrained(location, dtype=_DTYPES[dtype])
    except (OSError, SafetensorError) as err:
        if Path(location).parent == cache_root():  # a converted packaged model, damaged since
            raise ModelError(f"cannot load the converted model in {location} ({type(err).__name__}: {err}); "
                             f"delete {location} to convert it again") from None
        raise ModelError(f"cannot load model {location!r} (offline? use a local path or a cached id): {err}") from err
    model.to(device)  # type: ignore[arg-type]  # transformers wraps to() with functools.wraps: its type loses self
    model.eval()
    contiguous_head_input(model)
    return model


def _contiguous_input(module, args):
    return (args[0].contiguous(), *args[1:])


def contiguous_head_input(model) -> None:
    """Give the LM head a contiguous input. With `logits_to_keep` (the sampler's prefill, the update's prompt pass)
    Hugging Face passes the last positions' hidden states as a strided view, and torch.matmul multiplies such a view
    batch by batch against a copy of the head's weight expanded per sequence (sequences x hidden x vocabulary: 3.6 GB
    in bf16 for 64 SmolLM2 prompts, and most of a prefill's time); a contiguous input is one matrix product with the
    same values (benchmarks/real_model.py, part 7). Copies of the model (the bf16 sampling copy) keep the hook."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Module) and _contiguous_input not in head._forward_pre_hooks.values():
        head.register_forward_pre_hook(_contiguous_input)

