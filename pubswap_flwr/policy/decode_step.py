"""The sampler's one-token decode step for Llama and Qwen2 models: Hugging Face's forward, op for op, less its Python.

A decode step of SmolLM2-135M at batch 32 spends about three quarters of its time around its matrix products (#36):
module calls, keyword plumbing, a causal mask and rotary table rebuilt per step, a cache object per layer. Here the
same operations run in one loop over plain tensors: the layer's norms as Hugging Face computes them, the query /
key / value products (and the MLP's gate and up products) as one product each over their weights stacked
(`fuse`), the rotary embedding of queries and keys in one pass, the new key and value written into the GrowingLayer
buffers in place, and attention as Hugging Face's SDPA path calls it for one query token (grouped heads packed as
queries; no mask when no row is padded). The prefill stays Hugging Face's.

`compiled=True` (generation.compile-step) runs the step's elementwise work (the RMSNorms, the rotary embedding, the
MLP's gate) as kernels torch.compile fuses; the products and attention stay as they are. RMSNorm's reduction then
rounds differently (within about 2e-6 in float32), so the tokens are drawn from the same distribution but not bit for
bit the same; the eager kernels are Hugging Face's operations.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")  # the families tested against Hugging Face's forward
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its DecodeStep
_COMPILING = threading.Lock()  # torch.compile's first calls are not safe from two threads (eval.workers)
log = logging.getLogger("pubswap_flwr")


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm, operation for operation (the variance in float32, the weight in the model's)."""
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps)).to(dtype)


def rotary(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's apply_rotary_pos_emb, of queries and keys stacked on the head axis."""
    half = qk.shape[-1] // 2
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    return (qk * cos) + (rotated * sin)


def gated(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The MLP's SiLU gate."""
    return F.silu(gate) * up


@dataclass(frozen=True)
class Kernels:
    """The step's elementwise functions: eager (Hugging Face's operations) or compiled."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    gated: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


EAGER = Kernels(rms_norm, rotary, gated)


@functools.cache
def compiled_kernels() -> Kernels:
    """The same functions through torch.compile (inductor), shapes dynamic (the batch shrinks as rows finish); each
    compiles on its first call (`DecodeStep` warms them up)."""
    return Kernels(*(torch.compile(fn, dynamic=True) for fn in (rms_norm, rotary, gated)))


def compile_unavailable_reason(device: torch.device) -> str | None:
    """Why torch.compile cannot build the kernels for `device`, or None when it can: inductor's CPU kernels are C++
    that needs a compiler."""
    if device.type != "cpu":
        return None
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        get_cpp_compiler()
    except InvalidCxxCompiler:
        from torch._inductor import config

        return f"no C++ compiler for torch.compile's CPU kernels (searched: {config.cpp.cxx}; set CXX to one)"
    return None


@dataclass(frozen=True)
class StepShapes:
    """What a step's kernels are compiled for (torch.compile guards on each): device, dtype, sizes, the norms' eps and
    whether their weights (Parameters) require gradients."""

    device: torch.device
    dtype: torch.dtype
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    norm_requires_grad: bool


@functools.cache
def warmed_kernels(shapes: StepShapes) -> Kernels:
    """The compiled kernels, each called once on `shapes` as a step passes them, so that they compile here (a one-time
    cost per process, shorter once inductor's cache holds them) and not mid-decode; the eager ones, with a warning
    naming why, where torch.compile cannot build them. Once per shapes: a step is rebuilt whenever weights change."""
    reason = compile_unavailable_reason(shapes.device)
    if reason is not None:
        log.warning("generation.compile-step: %s; the decode step runs its eager kernels", reason)
        return EAGER
    from torch._dynamo.exc import BackendCompilerFailed  # inductor's InductorError is one

    kernels = compiled_kernels()
    start = time.perf_counter()
    with _COMPILING, torch.no_grad():
        try:
            for rows in (2, 1):  # one row specializes: its own compile
                _warm_up(kernels, shapes, rows)
        except BackendCompilerFailed as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            log.warning("generation.compile-step: torch.compile failed (%s); the decode step runs its eager kernels",
                        first_line)
            return EAGER
    seconds = time.perf_counter() - start
    if seconds > 1:
        log.info("generation.compile-step: the decode step's kernels compiled in %.1f s", seconds)
    return kernels


def _warm_up(kernels: Kernels, shapes: StepShapes, rows: int) -> None:
    """Each kernel once on `rows` rows laid out as a step passes them (views of the fused products)."""
    def zeros(*size: int) -> torch.Tensor:
        return torch.zeros(*size, dtype=shapes.dtype, device=shapes.device)

    weight = torch.nn.Parameter(zeros(shapes.hidden), requires_grad=shapes.norm_requires_grad)
    kernels.rms_norm(zeros(rows, shapes.hidden), weight, shapes.eps)
    qkv = zeros(rows, (shapes.heads + 2 * shapes.kv_heads) * shapes.head_dim)
    qk = qkv[:, :(shapes.heads + shapes.kv_heads) * shapes.head_dim].view(rows, -1, shapes.head_dim)
    kernels.rotary(qk, zeros(rows, 1, shapes.head_dim), zeros(rows, 1, shapes.head_dim))
    kernels.gated(*zeros(rows, 2 * shapes.intermediate).chunk(2, dim=-1))


@dataclass
class _Layer:
    norm_in: torch.Tensor
    norm_in_eps: float
    qkv: list[tuple[torch.Tensor, torch.Tensor | None]]  # (weight, bias) of each product: [qkv] fused, else [q, k, v]
    out: torch.Tensor
    out_bias: torch.Tensor | None
    norm_post: torch.Tensor
    norm_post_eps: float
    gate_up: list[torch.Tensor]  # [gate | up] fused, else [gate, up]
    down: torch.Tensor


def causal_lm(model):
    """The Hugging Face causal LM inside `model` (a PEFT wrapper's base model, or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _plain_linear(module) -> torch.nn.Linear | None:
    """The nn.Linear whose forward `module` computes: itself, or a PEFT LoRA layer's base layer when the adapter is
    merged into it (or it has none active); None when an unmerged adapter adds its own path."""
    if hasattr(module, "base_layer"):
        active = [name for name in getattr(module, "active_adapters", []) if name in getattr(module, "lora_A", {})]
        if active and not getattr(module, "merged", False):
            return None
        module = module.base_layer
    return module if type(module) is torch.nn.Linear else None


def _linear(module) -> torch.nn.Linear:
    """`_plain_linear` of a layer `unsupported_reason` accepted."""
    linear = _plain_linear(module)
    if linear is None:
        raise ValueError(f"DecodeStep cannot run a {type(module).__name__} layer")
    return linear


def unsupported_reason(model) -> str | None:
    """Why `DecodeStep` cannot run `model` (Hugging Face's forward runs it then), or None when it can."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} (sdpa only)"
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or [])) or getattr(
            config, "use_sliding_window", False):
        return "sliding-window layers"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r} (silu only)"
    inner = getattr(lm, "model", None)
    if inner is None or not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "no decoder stack (embed_tokens, layers, norm, rotary_emb)"
    linears = [_plain_linear(lm.lm_head)]
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [_plain_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj,
                                                mlp.up_proj, mlp.down_proj)]
    if any(linear is None for linear in linears):
        return "a linear layer with an unmerged adapter"
    if any(linear.bias is not None for layer in inner.layers  # type: ignore[union-attr]
           for linear in map(_plain_linear, (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj))):
        return "MLP biases"
    return None


class DecodeStep:
    """One decode step (one new token per row) of a Llama-family model over a cache of GrowingLayers.

    Built from the model's current weights: `for_model` keeps one per model and rebuilds it when any weight was
    written since (torch bumps a tensor's version on every in-place write: the sampling copy's sync, the merge)."""

    def __init__(self, model, fuse: bool = True, compiled: bool = False):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"DecodeStep cannot run this model: {reason}")
        lm = causal_lm(model)
        inner = lm.model
        config = lm.config
        self.fuse = fuse
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = inner.layers[0].self_attn.scaling
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.norm_eps = inner.norm.variance_epsilon
        self.head = _linear(lm.lm_head).weight
        self.rotary_emb = inner.rotary_emb
        self.version = self.weights_version(model)
        self.layers = [self._layer(layer) for layer in inner.layers]
        self.compiled = compiled  # what was asked for: `kernels` stay eager when compiling cannot work
        self.kernels = warmed_kernels(StepShapes(
            self.embed.device, self.embed.dtype, self.embed.shape[1], self.heads, self.kv_heads, self.head_dim,
            self.layers[0].down.shape[1], self.norm_eps, self.norm.requires_grad)) if compiled else EAGER

    @staticmethod
    def weights_version(model) -> tuple:
        """Where each of the model's weights lives and how often it was written in place: equal while the weights
        are."""
        return tuple((p.data_ptr(), p._version) for p in causal_lm(model).parameters())

    def _layer(self, layer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        q, k, v, o = (_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
        gate, up, down = (_linear(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        projections: list[tuple[torch.Tensor, torch.Tensor | None]] = [(m.weight, m.bias) for m in (q, k, v)]
        gate_up = [gate.weight, up.weight]
        with torch.no_grad():
            if self.fuse:
                biases = [b for _, b in projections]
                bias = None if all(b is None for b in biases) else torch.cat(
                    [b if b is not None else w.new_zeros(w.shape[0]) for w, b in projections])
                projections = [(torch.cat([w for w, _ in projections]), bias)]
                gate_up = [torch.cat(gate_up)]
        return _Layer(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, projections, o.weight,
                      o.bias, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                      gate_up, down.weight)

    @classmethod
    def for_model(cls, model, compiled: bool = False) -> DecodeStep | None:
        """The model's decode step (`compiled`: its elementwise kernels through torch.compile), built on first use and
        again after its weights change; None when the model is not supported (`unsupported_reason`)."""
        if unsupported_reason(model) is not None:
            return None
        step = _STEPS.get(model)
        if step is None or step.version != cls.weights_version(model) or step.compiled != compiled:
            step = _STEPS[model] = cls(model, compiled=compiled)
        return step

    @staticmethod
    def forget(model) -> None:
        """Drop `model`'s decode step and the fused weight copies it holds."""
        _STEPS.pop(model, None)

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cache, attention: torch.Tensor | None
                 ) -> torch.Tensor:
        """Logits (rows x vocabulary) for `tokens` (one per row) at `positions` (rows x 1), their keys and values
        appended to `cache` (a DynamicCache of GrowingLayers with room); `attention`: the rows' mask over the cache
        after this token (rows x length, True where a row attends), or None when no row has padding."""
        rows = tokens.shape[0]
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        kernels = self.kernels
        hidden = F.embedding(tokens, self.embed)
        cos, sin = self.rotary_emb(hidden, positions)  # rows x 1 x head_dim, in the hidden states' dtype
        mask = None if attention is None else attention[:, None, None, :]
        for layer, cached in zip(self.layers, cache.layers):
            residual = hidden
            hidden = kernels.rms_norm(hidden, layer.norm_in, layer.norm_in_eps)
            qkv = (F.linear(hidden, *layer.qkv[0]) if len(layer.qkv) == 1
                   else torch.cat([F.linear(hidden, w, b) for w, b in layer.qkv], dim=-1))
            qk = qkv[:, :(heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)
            qk = kernels.rotary(qk, cos, sin)
            key, value = qk[:, heads:], qkv[:, (heads + kv_heads) * head_dim:].view(rows, kv_heads, head_dim)
            end = cached.length + 1
            if end > cached.capacity:  # GrowingLayer.update's growth, for a cache made with less room
                cached._grow(end + cached.room, key[:, :, None], value[:, :, None])
            cached._keys[:, :, cached.length] = key
            cached._values[:, :, cached.length] = value
            cached.length = end
            cached._view()
            query = qk[:, :heads]
            if mask is None and group > 1:
                attended = F.scaled_dot_product_attention(query[:, :, None], cached.keys, cached.values,
                                                          scale=self.scaling, enable_gqa=True)
            else:  # Hugging Face's pack_gqa: a head group's queries attend as one key/value head's query rows
                attended = F.scaled_dot_product_attention(query.reshape(rows, kv_heads, group, head_dim),
                                                          cached.keys, cached.values, attn_mask=mask,
                                                          scale=self.scaling)
            hidden = residual + F.linear(attended.reshape(rows, heads * head_dim), layer.out, layer.out_bias)
            residual = hidden
            hidden = kernels.rms_norm(hidden, layer.norm_post, layer.norm_post_eps)
            if len(layer.gate_up) == 1:
                gate, up = F.linear(hidden, layer.gate_up[0]).chunk(2, dim=-1)
            else:
                gate, up = (F.linear(hidden, w) for w in layer.gate_up)
            hidden = residual + F.linear(kernels.gated(gate, up), layer.down)
        hidden = kernels.rms_norm(hidden, self.norm, self.norm_eps)
        return F.linear(hidden, self.head)
