"""The precisions a policy samples and updates in (generation.dtype, train.update-dtype), resolved for its model and
device."""

from __future__ import annotations

import torch

from .model import _DTYPES

AUTO_LOW_PRECISION_PARAMETERS = 50_000_000  # below this, sampling is bound by per-step overheads, not weight reads


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matrix products natively (CPU: AVX512-BF16 or AMX; CUDA: Ampere or newer)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def sampling_precision(setting: str, model_dtype: str, model, device: torch.device) -> torch.dtype:
    """`generation.dtype`: an explicit dtype, or for "auto" bfloat16 when the model has at least 50M parameters, is
    trained in float32 and the device has native bf16; else the model's own dtype. Measured on SmolLM2-135M (2-core
    CPU with AVX512-BF16): a decode step takes 0.041 s in bf16 against 0.069 s in fp32 (benchmarks/real_model.py);
    the embedded 0.85M model's steps are overhead-bound and gain nothing."""
    if setting != "auto":
        if setting not in _DTYPES:
            raise ValueError(f"generation.dtype must be auto or one of {', '.join(_DTYPES)}, got {setting!r}")
        return _DTYPES[setting]
    own = _DTYPES[model_dtype]
    if own != torch.float32 or not native_bf16(device):
        return own
    size = sum(p.numel() for p in model.parameters())
    return torch.bfloat16 if size >= AUTO_LOW_PRECISION_PARAMETERS else own


def update_precision(setting: str, model_dtype: str, model, device: torch.device) -> str:
    """`train.update-dtype`: "float32" or "bfloat16" as given, or for "auto" bfloat16 where `sampling_precision`'s
    auto picks it (a float32 model of 50M parameters or more on a device with native bf16), else float32. Chosen by
    benchmarks/real_model.py part 8 (SmolLM2, one client's update at configs/real.toml's micro-batch, layers
    recomputed): bfloat16 1.31-1.41x float32 at a peak of 2231 against 2011 MiB."""
    if setting != "auto":
        return setting
    return "bfloat16" if sampling_precision("auto", model_dtype, model, device) == torch.bfloat16 else "float32"
