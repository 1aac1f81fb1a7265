"""strategy.compression in whole in-process runs: int8 / int4 rounds complete with fewer bytes, and a hostile
compressed reply is dropped with its reason while the round goes on."""

from __future__ import annotations

import numpy as np
import pytest

from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process
from pubswap_flwr.wire.codecs import QUANTIZED_KEY, quantized_from_record, quantized_record
from tests.tiers import fast_only

FEDAVG = {"strategy.mode": "fedavg"}
PUBSWAP_ONE_SWAP = {"strategy.mode": "pubswap", "pubswap.tau-swap": 1, "pubswap.public-prompts": 2}
# a round of 2 replies (2 nodes, or 3 with one dropped) is applied: a robust rule keeps it by default (#54)
TINY = {"seed": 5, "train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 3,
        "eval.samples": 1, "eval.sampled": False, "train.local-steps": 1, "num-server-rounds": 2,
        "strategy.apply-below-robust": True}


def _run(tmp_path, name, nodes=2, **flat):
    grid = simulate_in_process({**TINY, **flat, "output.dir": str(tmp_path), "run-name": name}, nodes)
    return read_metrics(tmp_path / name), grid


def _bytes(rows) -> tuple[int, int]:
    clients = [c for r in rows[1:] for c in r["clients"].values()]
    return sum(c["bytes_sent"] for c in clients), sum(c["bytes_received"] for c in clients)


def test_int8_run_completes_with_under_055x_the_bytes_of_fp16(tmp_path):
    plain, _ = _run(tmp_path, "none")
    int8, _ = _run(tmp_path, "int8", **{"strategy.compression": "int8"})
    assert [r["round"] for r in int8] == [0, 1, 2]
    assert all(len(r["clients"]) == 2 and not r["dropped"] and r["aggregated"] for r in int8[1:])
    up_plain, down_plain = _bytes(plain)
    up, down = _bytes(int8)
    assert up < 0.55 * up_plain  # every reply is a quantized delta
    # the first round's global goes whole (the nodes hold none yet), the second as a delta
    first, second = ([c["bytes_received"] for c in r["clients"].values()] for r in int8[1:])
    assert min(first) > 0.95 * max(c["bytes_received"] for c in plain[1]["clients"].values())
    assert max(second) < 0.55 * min(first)
    assert int8[2]["eval"]["greedy_accuracy"] >= 0  # the global was evaluated


def test_pubswap_with_int4_completes_and_sends_quarter_size_adapters(tmp_path):
    flat = {"strategy.mode": "pubswap", "pubswap.tau-swap": 1, "pubswap.public-prompts": 2}
    plain, _ = _run(tmp_path, "none", **flat)
    int4, _ = _run(tmp_path, "int4", **flat, **{"strategy.compression": "int4"})
    assert all(len(r["clients"]) == 2 and not r["dropped"] and r["aggregated"] for r in int4[1:])
    for field in ("bytes_sent", "bytes_received"):  # both directions compressed in round 2
        fp16 = min(c[field] for c in plain[2]["clients"].values())
        assert max(c[field] for c in int4[2]["clients"].values()) < 0.3 * fp16


def _nan_scales(node_partition: int, round_number: int):
    def hook(msg, context, reply):
        config = msg.content["config"]
        if (int(context.node_config["partition-id"]) == node_partition and int(config["server-round"]) == round_number
                and QUANTIZED_KEY in reply.content):
            codes, scales = quantized_from_record(reply.content[QUANTIZED_KEY])
            scales = scales.copy()
            scales[0] = np.nan
            reply.content[QUANTIZED_KEY] = quantized_record(codes, scales)
        return reply

    return hook


def test_a_compressed_reply_with_nan_scales_is_dropped_with_its_reason_and_the_node_rejoins(tmp_path):
    config = {**TINY, "strategy.compression": "int8", "strategy.min-clients": 2, "output.dir": str(tmp_path),
              "run-name": "hostile", "num-server-rounds": 3}
    simulate_in_process(config, 3, reply_hook=_nan_scales(1, 1))
    rows = read_metrics(tmp_path / "hostile")
    (reason,) = rows[1]["dropped"].values()
    assert "compressed adapter (int8, block 64): a block scale is NaN or Inf" in reason
    assert len(rows[1]["clients"]) >= 2 and rows[1]["aggregated"]
    # round 2: the dropped node gets the global whole (it never confirmed round 1's), the others a delta
    assert not rows[2]["dropped"] and not rows[3]["dropped"] and len(rows[3]["clients"]) == 3
    received = sorted(c["bytes_received"] for c in rows[2]["clients"].values())
    assert received[-1] > 1.8 * received[0]


@pytest.mark.parametrize("mode", fast_only([FEDAVG, PUBSWAP_ONE_SWAP], fast=[PUBSWAP_ONE_SWAP]))
def test_a_resumed_compressed_run_repeats_the_uninterrupted_metrics_and_bytes(tmp_path, mode):
    """The downlink's H and the nodes known to hold it are in the checkpoint, so after a resume the nodes that kept
    up get a delta again (not the whole global) and the run is bit-identical to an uninterrupted one."""
    from tests.golden.runs import comparable

    # "full" and "half": names of one length, as the run name and dir travel in every message
    flat = {**mode, "strategy.compression": "int8", "num-server-rounds": 3}
    full, _ = _run(tmp_path, "full", **flat)
    _run(tmp_path, "half", **{**flat, "num-server-rounds": 2})
    cut, _ = _run(tmp_path, "half", **{**flat, "resume": True})
    assert [r["round"] for r in cut] == [0, 1, 2, 3]
    resumed_round = [c["bytes_received"] for c in cut[3]["clients"].values()]
    assert max(resumed_round) < 0.55 * min(c["bytes_received"] for c in cut[1]["clients"].values())  # a delta
    assert comparable(full) == comparable(cut)
    for field in ("bytes_sent", "bytes_received"):  # comparable() leaves bytes out
        assert [sorted(c[field] for c in r["clients"].values()) for r in cut[1:]] == [
            sorted(c[field] for c in r["clients"].values()) for r in full[1:]]


def test_a_node_killed_mid_message_repeats_the_round_from_its_snapshot_after_a_resume(tmp_path):
    """A kill inside a node's round-3 handler leaves its round-3 snapshot and a new global.safetensors, but node.json
    still at round 2: the resumed round restores the snapshot (its marker says round 3 began), so the node holds
    the global the server's delta is against and the run repeats the uninterrupted one."""
    from pubswap_flwr.node_runtime.state import GLOBAL_FILE, NodeStore
    from tests.golden.runs import comparable

    flat = {"strategy.compression": "int8", "num-server-rounds": 3}
    full, _ = _run(tmp_path, "full", **flat)
    _run(tmp_path, "cut", **{**flat, "num-server-rounds": 2})
    for node_dir in sorted((tmp_path / "cut" / "nodes").iterdir()):
        store = NodeStore(node_dir, "")
        store.snapshot_round_start(3)  # what begin_round(3) did before the kill
        held = store.load_arrays(GLOBAL_FILE)
        store.save_arrays(GLOBAL_FILE, {k: v + 0.5 for k, v in held.items()})  # round 3's global, half applied
    cut, _ = _run(tmp_path, "cut", **{**flat, "resume": True})
    assert not cut[3]["dropped"]
    assert comparable(full) == comparable(cut)
