"""Adapters on the wire under strategy.compression: the server's quantized downlink and the nodes' error-feedback
uplink.

Downlink: a node that confirmed the previous global gets the new one as a quantized delta against it (`Downlink`
names both by SHA-256, and the node checks them); any other node gets it whole in fp16. Uplink: the node sends
adapter − global + residual quantized, and keeps what was lost as its new residual in its state dir.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from ..config.sections import StrategyConfig
from ..node_runtime.serving import ClientWork
from ..node_runtime.state import GLOBAL_FILE, RESIDUAL_FILE
from ..policy import from_wire, to_wire
from ..tasks.splits import MAX_KNOWN_NODES
from ..wire.codecs import QUANTIZED_KEY, quantized_from_record, quantized_record, record_of
from ..wire.compression import Broadcast, Codec, CodecError, Quantized, apply_delta, fingerprint
from ..wire.records import Adapter
from ..wire.validate import Rejected, check_compressed

SHA_KEY, BASE_KEY = "adapter-sha", "adapter-base"


def codec_of(strategy: StrategyConfig) -> Codec | None:
    """strategy.compression's codec (None without it)."""
    return None if strategy.compression == "none" else Codec(strategy.compression, strategy.compression_block)


def broadcast_of(strategy: StrategyConfig) -> Broadcast | None:
    """The server's downlink state under strategy.compression (None without it)."""
    codec = codec_of(strategy)
    return Broadcast(codec) if codec is not None else None


def quantized_of(content: RecordDict) -> Quantized | None:
    if QUANTIZED_KEY not in content:
        return None
    codes, scales = quantized_from_record(record_of(content, QUANTIZED_KEY, ArrayRecord))
    return Quantized(codes, scales)


def put_quantized(content: RecordDict, quantized: Quantized | None) -> RecordDict:
    if quantized is not None:
        content[QUANTIZED_KEY] = quantized_record(quantized.codes, quantized.scales)
    return content


@dataclass(frozen=True)
class Downlink:
    """With compression: `sha` of the global this message carries, and, when it carries a delta, the `base` global
    it is a delta against (the message's adapter record is then absent)."""

    sha: str
    base: str = ""
    delta: Quantized | None = None

    def config(self) -> dict:
        return {SHA_KEY: self.sha, BASE_KEY: self.base}

    @classmethod
    def read(cls, config: ConfigRecord, content: RecordDict) -> "Downlink | None":
        if SHA_KEY not in config:
            return None
        delta = quantized_of(content)
        base = str(config.get(BASE_KEY, ""))
        if (delta is None) != (base == ""):
            raise ValueError("a compressed global names a base exactly when it carries a delta")
        return cls(str(config[SHA_KEY]), base, delta)


DOWNLINK = "downlink"  # the checkpoint's name for H, the global the nodes hold
HOLDERS_KEY = "downlink_holders"


def downlink_checkpoint(broadcast: Broadcast | None) -> tuple[dict, dict[str, Adapter]]:
    """(protocol state, named adapters) that let a resumed run continue the downlink exactly: H and the nodes known
    to hold it. Empty without compression or before the first round."""
    if broadcast is None or broadcast.current is None:
        return {}, {}
    return {HOLDERS_KEY: sorted(broadcast.holders)}, {DOWNLINK: broadcast.current}


def restore_downlink(broadcast: Broadcast | None, state: dict, adapters: dict[str, Adapter]) -> None:
    """Put back what `downlink_checkpoint` saved (a checkpoint without it, or of a run without compression: every
    node gets the next global whole)."""
    if broadcast is None or DOWNLINK not in adapters:
        return
    holders = state.get(HOLDERS_KEY, [])
    if (not isinstance(holders, list) or len(holders) > MAX_KNOWN_NODES
            or not all(type(n) is int and 0 <= n < 2**64 for n in holders)):
        raise ValueError(f"{HOLDERS_KEY} must be a list of node ids, got {str(holders)[:80]} (at most "
                         f"{MAX_KNOWN_NODES} integers in [0, 2**64))")
    broadcast.restore(adapters[DOWNLINK], holders)


def start_round(broadcast: Broadcast | None, master: Adapter) -> tuple[Adapter, Codec | None]:
    """(the global the round's replies are decoded and clipped against, the codec to decode them with): `master`
    and None without compression; with it, the broadcast advanced to `master`, as the nodes will rebuild it."""
    if broadcast is None:
        return master, None
    broadcast.advance(master)
    assert broadcast.current is not None
    return broadcast.current, broadcast.codec


def global_for(broadcast: Broadcast | None, master: Adapter, node: int) -> tuple[Adapter | None, Downlink | None]:
    """(the whole global or None, its Downlink or None) for `node` this round; uncompressed: (`master`, None)."""
    if broadcast is None:
        return master, None
    if broadcast.sends_delta(node):
        return None, Downlink(broadcast.current_sha, broadcast.previous_sha, broadcast.delta)
    assert broadcast.current is not None
    return broadcast.current, Downlink(broadcast.current_sha)


def receive_global(work: ClientWork[Any], whole: Adapter | None, downlink: Downlink,
                   codec: Codec) -> dict[str, torch.Tensor]:
    """The global adapter of a compressed message, decoded against the global this node holds and checked against
    the server's SHA-256; kept in the state dir as the base of the next deltas both ways."""
    store = work.learner.store
    if downlink.delta is not None:
        held = store.load_arrays(GLOBAL_FILE)
        held_sha = fingerprint(held) if held is not None else "none"
        if held is None or held_sha != downlink.base:
            raise ValueError(f"the global adapter is a delta against {downlink.base[:12]}, but this node holds "
                             f"{held_sha[:12]}; it gets the whole global next round")
        try:
            new = apply_delta(held, codec.decode(downlink.delta, held))
        except CodecError as err:
            raise ValueError(f"compressed global adapter: {err}") from None
    elif whole is not None:
        new = {k: np.asarray(v, dtype=np.float32) for k, v in whole.items()}
    else:
        raise ValueError("the message carries no global adapter")
    if fingerprint(new) != downlink.sha:
        raise ValueError(f"decoded global adapter {fingerprint(new)[:12]} differs from the server's "
                         f"{downlink.sha[:12]}")
    store.save_arrays(GLOBAL_FILE, new)
    return {k: torch.from_numpy(v.copy()) for k, v in new.items()}


def take_global(work: ClientWork[Any], whole: Adapter | None, downlink: Downlink | None) -> None:
    """Start the node's round from the message's global: as sent, or under strategy.compression rebuilt by
    `receive_global`."""
    codec = codec_of(work.settings.strategy)
    if codec is None:
        if whole is None:
            raise ValueError("the message carries no global adapter")
        work.learner.receive_global(from_wire(whole))
        return
    if downlink is None:
        raise ValueError(f"strategy.compression = {codec.scheme!r}, but the message's global is not compressed")
    work.learner.receive_global(receive_global(work, whole, downlink, codec))


def decoded(adapter: Adapter | Quantized | None) -> Adapter:
    """A reply's adapter on the server, where its `from_message` decoded and checked it (or rejected the reply)."""
    if adapter is None or isinstance(adapter, Quantized):
        raise TypeError(f"a reply's adapter reached the server's aggregation as {type(adapter).__name__}")
    return adapter


def adapter_to_send(work: ClientWork[Any]) -> Adapter | Quantized:
    """The node's adapter for its reply: fp16 as is, or under strategy.compression `upload`'s quantized delta."""
    codec = codec_of(work.settings.strategy)
    return to_wire(work.learner.policy.adapter()) if codec is None else upload(work, codec)


def upload(work: ClientWork[Any], codec: Codec) -> Quantized:
    """This node's adapter as a quantized delta against the global it holds, with error feedback."""
    store = work.learner.store
    base = store.load_arrays(GLOBAL_FILE)
    if base is None:
        raise ValueError("strategy.compression: this node holds no global adapter to send a delta against")
    current = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in work.learner.policy.adapter().items()}
    quantized, _, residual = codec.compress({k: current[k] - base[k] for k in base}, store.load_arrays(RESIDUAL_FILE))
    store.save_arrays(RESIDUAL_FILE, residual)
    return quantized


def checked_upload(content: RecordDict, reference: Adapter, codec: Codec) -> Adapter:
    """A compressed reply's adapter: reference + its delta, checked like any adapter (validate.check_compressed)."""
    quantized = quantized_of(content)
    if quantized is None:
        raise Rejected(f"reply has no compressed adapter (strategy.compression = {codec.scheme})")
    return check_compressed(quantized, reference, codec)

