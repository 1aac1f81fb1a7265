"""Compressed adapter updates (strategy.compression): blockwise int8 / int4 deltas with error feedback (numpy only).

A delta (adapter − the global both sides hold) is cut into blocks of `block` values per tensor; each block is sent as
one fp16 scale (its absmax / qmax, rounded up) and one signed code per value in [−qmax, qmax] (int8: 127, int4: 7,
packed two per byte). Decoding is code × scale, so every value is off by at most scale / 2. All tensors travel as
one `codes` and one `scales` array, tensors in sorted key order, so a message carries two array headers.

Error feedback: the sender adds what quantization lost last time (its residual) to the next delta and keeps the new
loss, so the sum of decoded updates tracks the sum of true updates within one step's error. The server's downlink
(`Broadcast`) does the same implicitly: it sends master − H and advances H, the global every node holds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

Adapter = dict[str, np.ndarray]
SCHEMES = ("none", "int8", "int4")
QMAX = {"int8": 127, "int4": 7}
MAX_SCALE = 1024.0  # a block scale above this (values beyond ~1e5) is no LoRA update: refused on decode
MAX_BLOCK = 65536


class CodecError(ValueError):
    """A compressed update does not fit the reference adapter, or holds values the codec never produces."""


@dataclass(frozen=True)
class Quantized:
    """One compressed delta: `codes` (int8 values, or uint8 with two int4 nibbles each) and fp16 `scales`."""

    codes: np.ndarray
    scales: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes)


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """Codes in [−7, 7] as nibbles code + 8, two per byte (first value in the low nibble; an odd tail is padded
    with code 0)."""
    nibbles = codes.astype(np.int16).reshape(-1) + 8
    if nibbles.size % 2:
        nibbles = np.append(nibbles, 8)
    pairs = nibbles.reshape(-1, 2).astype(np.uint8)
    return (pairs[:, 0] | (pairs[:, 1] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """The `count` int4 codes of `packed`; a nibble 0 (code −8, never produced) or a non-zero padding nibble is
    refused."""
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != (count + 1) // 2:
        raise CodecError(f"int4 codes must be {(count + 1) // 2} uint8 bytes for {count} values, got "
                         f"{packed.size} {packed.dtype} of shape {packed.shape}")
    nibbles = np.empty(packed.size * 2, dtype=np.int16)
    nibbles[0::2] = packed & 0x0F
    nibbles[1::2] = packed >> 4
    if count % 2 and nibbles[-1] != 8:
        raise CodecError("int4 padding nibble is not code 0")
    nibbles = nibbles[:count]
    if nibbles.size and nibbles.min() == 0:
        raise CodecError("int4 code -8 is out of range [-7, 7]")
    return (nibbles - 8).astype(np.int8)


def _blocks(count: int, block: int) -> int:
    return -(-count // block)


def quantize(values: np.ndarray, scheme: str, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, fp16 scales) of one flat tensor, blockwise symmetric absmax. Each fp16 scale is rounded up so
    no value needs a code beyond qmax: every decoded value is within scale / 2 of the input."""
    qmax = QMAX[scheme]
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    count = flat.size
    padded = np.zeros(_blocks(count, block) * block, dtype=np.float64)
    padded[:count] = flat
    blocks = padded.reshape(-1, block)
    absmax = np.abs(blocks).max(axis=1) if blocks.size else np.zeros(0)
    if not np.all(np.isfinite(absmax)):
        raise CodecError("the update has NaN or Inf values")
    with np.errstate(over="ignore"):
        scales = (absmax / qmax).astype(np.float16)
    if not np.all(np.isfinite(scales)) or np.any(scales.astype(np.float64) > MAX_SCALE):
        raise CodecError(f"an update value of {absmax.max():.3g} is beyond what the codec carries "
                         f"(block scale <= {MAX_SCALE:g})")
    low = scales.astype(np.float64) * qmax < absmax
    scales[low] = np.nextafter(scales[low], np.float16(np.inf))
    divisor = np.where(scales > 0, scales.astype(np.float64), 1.0)
    codes = np.clip(np.rint(blocks / divisor[:, None]), -qmax, qmax).astype(np.int8)
    return codes.reshape(-1)[:count], scales


def dequantize(codes: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """Flat float32 values code × scale (exact in float32: 8-bit codes times 11-bit fp16 mantissas)."""
    per_value = np.repeat(scales.astype(np.float32), block)[:codes.size]
    return codes.astype(np.float32) * per_value


@dataclass(frozen=True)
class Codec:
    """`scheme` int8 or int4 with `block` values per scale; encodes deltas against a reference adapter's layout."""

    scheme: str
    block: int = 64

    def __post_init__(self):
        if self.scheme not in QMAX:
            raise ValueError(f"compression scheme must be one of {sorted(QMAX)}, got {self.scheme!r}")
        if not 1 <= self.block <= MAX_BLOCK:
            raise ValueError(f"compression block must be in [1, {MAX_BLOCK}], got {self.block}")

    @property
    def qmax(self) -> int:
        return QMAX[self.scheme]

    def encode(self, delta: Adapter) -> Quantized:
        codes, scales = [], []
        for key in sorted(delta):
            c, s = quantize(delta[key], self.scheme, self.block)
            codes.append(c)
            scales.append(s)
        flat = np.concatenate(codes) if codes else np.zeros(0, dtype=np.int8)
        packed = pack_int4(flat) if self.scheme == "int4" else flat.astype(np.int8)
        return Quantized(packed, np.concatenate(scales) if scales else np.zeros(0, dtype=np.float16))

    def decode(self, quantized: Quantized, reference: Adapter) -> Adapter:
        """The float32 delta `quantized` carries, laid out like `reference`. Raises CodecError when it cannot have
        come from `encode`: wrong dtypes or sizes for the reference's tensors and the block size, scales that are
        not finite, negative or above MAX_SCALE, codes outside [−qmax, qmax]."""
        counts = [(key, reference[key].shape, int(np.prod(reference[key].shape, dtype=np.int64)))
                  for key in sorted(reference)]
        total = sum(n for _, _, n in counts)
        blocks = sum(_blocks(n, self.block) for _, _, n in counts)
        scales = quantized.scales
        if scales.dtype != np.float16 or scales.ndim != 1:
            raise CodecError(f"scales must be a flat float16 array, got {scales.dtype} of shape {scales.shape}")
        if scales.size != blocks:
            raise CodecError(f"{scales.size} scales, but the global adapter's tensors make {blocks} blocks of "
                             f"{self.block}")
        wide = scales.astype(np.float64)
        if not np.all(np.isfinite(wide)):
            raise CodecError("a block scale is NaN or Inf")
        if np.any(wide < 0):
            raise CodecError(f"a block scale is negative ({wide.min():.3g})")
        if np.any(wide > MAX_SCALE):
            raise CodecError(f"a block scale of {wide.max():.3g} is above the {MAX_SCALE:g} limit")
        if self.scheme == "int4":
            codes = unpack_int4(quantized.codes, total)
        else:
            codes = quantized.codes
            if codes.dtype != np.int8 or codes.ndim != 1 or codes.size != total:
                raise CodecError(f"int8 codes must be {total} int8 values, got {codes.size} {codes.dtype} of shape "
                                 f"{codes.shape}")
            if codes.size and codes.min() < -self.qmax:
                raise CodecError(f"int8 code {codes.min()} is out of range [-127, 127]")
        out, at, block_at = {}, 0, 0
        for key, shape, n in counts:
            nb = _blocks(n, self.block)
            out[key] = dequantize(codes[at:at + n], scales[block_at:block_at + nb], self.block).reshape(shape)
            at, block_at = at + n, block_at + nb
        return out

    def compress(self, update: Adapter, residual: Adapter | None) -> tuple[Quantized, Adapter, Adapter]:
        """Error feedback: encode update + residual; returns (what to send, what it decodes to, the new residual:
        what this step lost, to add to the next update)."""
        target = {k: (update[k].astype(np.float32) + (residual[k] if residual is not None and k in residual
                                                        else 0.0)).astype(np.float32) for k in update}
        quantized = self.encode(target)
        decoded = self.decode(quantized, target)
        return quantized, decoded, {k: target[k] - decoded[k] for k in target}


def fingerprint(adapter: Adapter) -> str:
    """SHA-256 of an adapter's float32 values, keys in sorted order (both sides check they hold the same global)."""
    digest = hashlib.sha256()
    for key in sorted(adapter):
        digest.update(key.encode("utf-8"))
        digest.update(np.ascontiguousarray(adapter[key], dtype=np.float32).tobytes())
    return digest.hexdigest()


def apply_delta(base: Adapter, delta: Adapter) -> Adapter:
    """base + delta rounded to fp16 values (kept as float32): a global both ends compute bit for bit, and that a
    whole fp16 copy carries exactly to a node that missed the previous one."""
    return {k: (base[k].astype(np.float32) + delta[k]).astype(np.float16).astype(np.float32) for k in base}


def as_fp16_values(adapter: Adapter) -> Adapter:
    return {k: np.asarray(v, dtype=np.float32).astype(np.float16).astype(np.float32) for k, v in adapter.items()}


@dataclass
class Broadcast:
    """The server's compressed downlink. `current` is the global H every node that kept up holds; each round H
    advances by the quantized delta master − H (so what one round's quantization lost is in the next delta: error
    feedback without a stored residual). A node that did not confirm the previous H gets H whole, in fp16."""

    codec: Codec
    current: Adapter | None = None
    current_sha: str = ""
    previous_sha: str = ""
    delta: Quantized | None = None
    holders: set[int] = field(default_factory=set)  # nodes known to hold the previous H

    def advance(self, master: Adapter) -> None:
        """Move H towards `master` for this round's first message (H starts as master's fp16 values)."""
        if self.current is None:
            self.current, self.delta, self.holders = as_fp16_values(master), None, set()
        else:
            try:
                self.delta = self.codec.encode({k: master[k] - self.current[k] for k in self.current})
            except CodecError:  # the global moved beyond what block scales carry: everyone gets it whole
                self.current, self.delta, self.holders = as_fp16_values(master), None, set()
            else:
                self.current = apply_delta(self.current, self.codec.decode(self.delta, self.current))
        self.previous_sha, self.current_sha = self.current_sha, fingerprint(self.current)

    def restore(self, current: Adapter, holders) -> None:
        """Continue from a checkpoint: H = `current` (fp16 values), held by the nodes `holders`; the next `advance`
        sends them a delta again, as an uninterrupted run would."""
        self.current = as_fp16_values(current)
        self.current_sha, self.previous_sha = fingerprint(self.current), ""
        self.delta, self.holders = None, {int(node) for node in holders}

    def sends_delta(self, node: int) -> bool:
        return self.delta is not None and node in self.holders

    def confirm(self, nodes) -> None:
        """`nodes` replied to this round's first message, so they now hold `current`."""
        self.holders = set(nodes)
