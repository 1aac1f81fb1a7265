"""LoRA adapters via peft: attach, read/write adapter state, fp16 wire form, and merged sampling."""

from __future__ import annotations

import contextlib
import copy
import functools
import weakref
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from .decode_step import DecodeStep

LINEAR_TARGETS = "all-linear"


@dataclass(frozen=True)
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    targets: str = LINEAR_TARGETS  # "all-linear" or comma-separated module names


def attach_lora(model, settings: LoraSettings):
    """Wrap `model` in a trainable PeftModel with LoRA on all linear projections (not the LM head)."""
    from peft import LoraConfig, get_peft_model

    targets = settings.targets if settings.targets == LINEAR_TARGETS else [
        t.strip() for t in settings.targets.split(",") if t.strip()]
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=targets, task_type="CAUSAL_LM", bias="none")
    peft_model = get_peft_model(model, config)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    if not trainable:
        raise RuntimeError("LoRA attached no trainable parameters; check model.lora-targets")
    return peft_model


_SLOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its adapter's (key, module, attribute)


def _adapter_slots(model) -> list[tuple[str, torch.nn.Module, str]]:
    """Where each adapter tensor lives: (the key peft saves it under, its module, the parameter's attribute), found
    once per model. peft's state-dict walk visits every module and tensor of the model (about 25 ms on the embedded
    model, at every read and write of an adapter: a fifth of a small simulated run); the parameters are read from
    their modules at each use, so a parameter replaced on its module is still found."""
    slots = _SLOTS.get(model)
    if slots is None:
        from peft import get_peft_model_state_dict

        by_identity = {id(param): name for name, param in model.named_parameters()}
        slots = []
        # keep_vars: the state dict holds the parameters themselves, so each key is matched by identity
        for key, tensor in get_peft_model_state_dict(model, state_dict=model.state_dict(keep_vars=True)).items():
            name = by_identity.get(id(tensor))
            if name is None:
                raise RuntimeError(f"adapter tensor {key} is not one of the model's parameters")
            path, _, attribute = name.rpartition(".")
            slots.append((key, model.get_submodule(path), attribute))
        _SLOTS[model] = slots
    return slots


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter tensors (fp32 CPU copies, wherever the model lives), keyed as peft saves them."""
    return {key: getattr(module, attribute).detach().to("cpu", torch.float32).clone()
            for key, module, attribute in _adapter_slots(model)}


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Load adapter tensors (any float dtype) into the model's fp32 master weights; keys and shapes must match."""
    current = {key: getattr(module, attribute) for key, module, attribute in _adapter_slots(model)}
    missing = sorted(set(current) - set(state))
    extra = sorted(set(state) - set(current))
    if missing or extra:
        raise ValueError(f"adapter keys do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(current[key].shape):
            raise ValueError(f"adapter tensor {key} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(current[key].shape)}")
    with torch.no_grad():
        for key, tensor in state.items():
            current[key].copy_(tensor.to(torch.float32))


def to_wire(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """fp16 numpy arrays: the form adapters leave the process in (bf16 cannot go through Flower's ArrayRecord)."""
    return {k: v.detach().to(torch.float16).cpu().numpy() for k, v in state.items()}


def from_wire(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.asarray(v, dtype=np.float32).copy()) for k, v in arrays.items()}


def lora_layers(model) -> dict:
    """`model`'s LoRA-wrapped layers by name: those whose update W + ΔW a merge writes."""
    return {name: module for name, module in model.named_modules()
            if hasattr(module, "base_layer") and hasattr(module, "lora_A")
            and hasattr(module, "get_delta_weight") and hasattr(module.base_layer, "weight")}


class MergedSampling:
    """Merges the adapter into the base weights for fast sampling (unmerged PEFT generation is ~25% slower).

    While sampling, each LoRA-targeted layer computes with a new tensor W + ΔW in place of its frozen W, which is
    put back untouched afterwards: no rounding from unmerging by subtraction (which would accumulate over thousands
    of merge cycles) and no standing copy of W to restore from (a float32 copy of every targeted weight, 400 MiB for
    Gemma-3-270M, held between rounds); the merged tensors live only while sampling. The merge is done here (then
    peft's `merged_adapters` flag so forward skips the LoRA path) because peft's merge_adapter/unmerge_adapter pair
    costs ~5x more on small models.
    """

    def __init__(self, model):
        self.model = model
        self._layers = list(lora_layers(model).values())

    @contextlib.contextmanager
    def merged(self) -> Iterator[None]:
        was_training = self.model.training
        self.model.eval()
        frozen = []  # each layer's own W, put back afterwards
        try:
            with torch.no_grad():
                for layer in self._layers:
                    weight = layer.base_layer.weight
                    frozen.append(weight.data)
                    active = [name for name in layer.active_adapters if name in layer.lora_A]
                    merged = weight.data.clone()
                    for name in active:
                        merged.add_(layer.get_delta_weight(name))
                    weight.data = merged
                    layer.merged_adapters = active
            yield
        finally:
            with torch.no_grad():
                for layer, weight in zip(self._layers, frozen):
                    layer.base_layer.weight.data = weight
                    layer.merged_adapters = []
            # The decode step built on the merged weights is stale now, and its fused copies of them (q, k, v and
            # gate, up) would stay until the next sampling call rebuilds it: about 270 MiB for SmolLM2-135M
            DecodeStep.forget(self.model)
            self.model.train(was_training)


def _share_frozen_embeddings(model, dtype: torch.dtype) -> tuple[list[torch.nn.Parameter], list[tuple]]:
    """Hold `model`'s frozen token embedding (and an LM head no adapter targets) in `dtype`, for the sampling copy
    to take as they are: one tensor for both instead of a float32 one and a copy. Returns the new parameters and, for
    `_cast_to_training`, each module with its training dtype. Tied weights stay tied; a trained weight, a LoRA layer
    or a missing one is left alone."""
    replaced: dict[int, torch.nn.Parameter] = {}  # id of a float32 weight -> its low-precision replacement
    modules = []
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        weight = getattr(module, "weight", None)
        if (module is None or hasattr(module, "lora_A") or hasattr(module, "base_layer")
                or not isinstance(weight, torch.nn.Parameter) or weight.requires_grad):
            continue
        if id(weight) not in replaced:
            replaced[id(weight)] = torch.nn.Parameter(weight.detach().to(dtype), requires_grad=False)
        module.weight = replaced[id(weight)]
        modules.append((module, weight.dtype))
    if replaced:
        # The loader's tensors may be views of the weights file mapped into memory. The replaced float32 embedding's
        # pages, touched by the cast, stay resident while any tensor keeps that mapping alive, so the other frozen
        # weights are copied into the process's own memory and the mapping goes (Gemma-3-270M: 1922 -> 1282 MiB).
        kept = {id(param) for param in replaced.values()}
        with torch.no_grad():
            for param in model.parameters():
                if not param.requires_grad and id(param) not in kept:
                    param.data = param.data.clone()
    return list(replaced.values()), modules


def _cast_to_training(modules: list[tuple]) -> None:
    """The training model's side of `_share_frozen_embeddings` (hooks added after the copy is made, which must not
    have them): the embedding's output cast back to the training dtype; outside autocast, the head's input cast to
    the head's dtype and its output back. For a bfloat16 update this changes only the embedding lookup's rounding
    (under autocast the head's product was bfloat16 already), and the training pass sees the embedding values the
    sampler does."""
    for module, train_dtype in modules:
        if isinstance(module, torch.nn.Embedding):
            module.register_forward_hook(functools.partial(_cast_output, dtype=train_dtype))
        else:
            module.register_forward_pre_hook(_input_to_weight_dtype)
            module.register_forward_hook(functools.partial(_cast_output, dtype=train_dtype, outside_autocast=True))


def _cast_output(module, args, output, dtype: torch.dtype, outside_autocast: bool = False):
    if outside_autocast and torch.is_autocast_enabled(output.device.type):
        return output  # autocast's own product dtype, as for any layer
    return output.to(dtype)


def _input_to_weight_dtype(module, args):
    hidden = args[0]
    if torch.is_autocast_enabled(hidden.device.type) or hidden.dtype == module.weight.dtype:
        return None
    return (hidden.to(module.weight.dtype), *args[1:])


class LowPrecisionSampling:
    """Sampling on a copy of the model in a lower precision (bf16), with the adapter merged in from the fp32 master
    weights. On CPU, decoding is bound by reading the weights, so half the bytes is up to twice the speed; training
    stays on the fp32 model, so the log-probs in the loss come from the training precision.

    The copy is made once (the adapter merged and unloaded, then cast); each `merged()` call rewrites only the
    LoRA-targeted weights as cast(W + ΔW), and skips even that when no adapter weight changed since the last call
    (torch bumps a tensor's version on every in-place write: optimizer steps and adapter loads)."""

    def __init__(self, model, dtype: torch.dtype, share_embeddings: bool = False):
        self.model = model
        self.dtype = dtype
        self._layers = lora_layers(model)
        # Gemma-3-270M: its embedding is 167.8M of 268.1M parameters, 640 MiB in float32 held once in bfloat16
        shared, modules = _share_frozen_embeddings(model, dtype) if share_embeddings else ([], [])
        self.shared_parameters = sum(param.numel() for param in shared)
        # the copy takes the shared tensors as they are (a deep copy's memo) instead of copying them
        plain = copy.deepcopy(model, memo={id(param): param for param in shared}).merge_and_unload()
        _cast_to_training(modules)
        self.copy = plain.to(dtype).eval()
        for param in self.copy.parameters():
            param.requires_grad_(False)
        targets = dict(self.copy.named_modules())
        prefix = "base_model.model."
        self._targets = {}
        for name in self._layers:
            short = name[len(prefix):] if name.startswith(prefix) else name
            if short not in targets or not hasattr(targets[short], "weight"):
                raise RuntimeError(f"sampling copy has no layer {short!r} for LoRA layer {name!r}")
            self._targets[name] = targets[short]
        self._synced: tuple | None = None

    def _version(self) -> tuple:
        return tuple(p._version for n, p in self.model.named_parameters() if "lora_" in n)

    def sync(self) -> None:
        version = self._version()
        if version == self._synced:
            return
        with torch.no_grad():
            for name, layer in self._layers.items():
                weight = layer.base_layer.weight.detach()
                for adapter in (a for a in layer.active_adapters if a in layer.lora_A):
                    weight = weight + layer.get_delta_weight(adapter)
                self._targets[name].weight.copy_(weight.to(self.dtype))
        self._synced = version

    @contextlib.contextmanager
    def merged(self) -> Iterator[None]:
        self.sync()
        yield
