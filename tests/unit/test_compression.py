"""The adapter codec: int8 / int4 round-trip error bounds, int4 packing, error feedback over rounds, hostile input."""

from __future__ import annotations

import numpy as np
import pytest

from pubswap_flwr.wire.compression import (
    MAX_SCALE,
    Broadcast,
    Codec,
    CodecError,
    Quantized,
    apply_delta,
    dequantize,
    fingerprint,
    pack_int4,
    quantize,
    unpack_int4,
)
from pubswap_flwr.wire.validate import Rejected, check_compressed

SHAPES = {"a.lora_A": (16, 37), "b.lora_B": (23, 16), "c.lora_A": (5,), "d.lora_B": (1, 1)}  # odd sizes on purpose


def _adapter(rng, scale=0.02) -> dict[str, np.ndarray]:
    return {k: (rng.standard_normal(s) * scale).astype(np.float32) for k, s in SHAPES.items()}


@pytest.mark.parametrize("scheme,qmax", [("int8", 127), ("int4", 7)])
@pytest.mark.parametrize("block", [1, 7, 64, 1000])
def test_round_trip_error_is_at_most_half_a_scale_per_value(scheme, qmax, block):
    rng = np.random.default_rng(block)
    values = np.concatenate([rng.standard_normal(500) * 10.0 ** rng.integers(-9, 2, 500), np.zeros(37),
                             [1e-12, -3e-9, 5e-8]]).astype(np.float32)
    codes, scales = quantize(values, scheme, block)
    assert codes.dtype == np.int8 and scales.dtype == np.float16
    assert codes.size == values.size and scales.size == -(-values.size // block)
    assert np.abs(codes).max() <= qmax
    per_value = np.repeat(scales.astype(np.float64), block)[:values.size]
    error = np.abs(dequantize(codes, scales, block).astype(np.float64) - values)
    assert np.all(error <= per_value / 2 * (1 + 1e-6) + 1e-30)
    # scales are the block absmax / qmax rounded up to fp16: never more than one fp16 step above it
    absmax = np.abs(np.pad(values, (0, scales.size * block - values.size))).reshape(-1, block).max(axis=1)
    assert np.all(scales.astype(np.float64) * qmax >= absmax)


def test_an_all_zero_block_has_scale_zero_and_decodes_to_zero():
    codes, scales = quantize(np.zeros(10, np.float32), "int8", 4)
    assert scales.tolist() == [0.0, 0.0, 0.0] and codes.tolist() == [0] * 10
    assert dequantize(codes, scales, 4).tolist() == [0.0] * 10


@pytest.mark.parametrize("count", [0, 1, 2, 3, 8, 9, 1001])
def test_int4_packing_round_trips_including_odd_lengths(count):
    codes = np.random.default_rng(count).integers(-7, 8, count).astype(np.int8)
    packed = pack_int4(codes)
    assert packed.dtype == np.uint8 and packed.size == (count + 1) // 2
    assert unpack_int4(packed, count).tolist() == codes.tolist()


def test_int4_packing_layout_first_value_in_the_low_nibble():
    assert pack_int4(np.array([-7, 7, 0], np.int8)).tolist() == [0x01 | 0xF0, 0x08 | 0x80]


@pytest.mark.parametrize("packed,count,message", [
    (np.array([0x08], np.uint8), 2, "int4 code -8 is out of range"),
    (np.array([0x88, 0x18], np.uint8), 3, "padding nibble is not code 0"),
    (np.array([0x88], np.uint8), 3, "must be 2 uint8 bytes for 3 values"),
    (np.array([8], np.int8), 2, "must be 1 uint8 bytes"),
])
def test_int4_unpacking_refuses_codes_the_packer_never_writes(packed, count, message):
    with pytest.raises(CodecError, match=message):
        unpack_int4(packed, count)


@pytest.mark.parametrize("scheme,ratio", [("int8", 0.52), ("int4", 0.27)])
def test_codec_round_trip_against_a_reference_layout_and_its_size(scheme, ratio):
    rng = np.random.default_rng(1)
    delta = _adapter(rng)
    codec = Codec(scheme, 64)
    quantized = codec.encode(delta)
    decoded = codec.decode(quantized, delta)
    assert set(decoded) == set(delta) and all(decoded[k].shape == delta[k].shape for k in delta)
    for key in delta:
        _, scales = quantize(delta[key], scheme, 64)
        per_value = np.repeat(scales.astype(np.float32), 64)[:delta[key].size].reshape(delta[key].shape)
        assert np.all(np.abs(decoded[key] - delta[key]) <= per_value / 2 * (1 + 1e-6))
    values = sum(v.size for v in delta.values())
    blocks = sum(-(-v.size // 64) for v in delta.values())
    assert quantized.scales.size == blocks
    assert quantized.codes.size == (values if scheme == "int8" else (values + 1) // 2)
    assert quantized.nbytes <= ratio * 2 * values + 2 * len(delta)  # fp16 minimum: 2 bytes per value


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_error_feedback_keeps_the_sum_of_decoded_updates_within_one_steps_error(scheme):
    """Over 30 rounds of small updates (many below one quantization step on their own), what the receiver summed
    equals what the sender meant to send minus the last residual, and that residual is within half a scale."""
    rng = np.random.default_rng(7)
    codec = Codec(scheme, 16)
    residual = None
    sent = {k: np.zeros(s, np.float64) for k, s in SHAPES.items()}
    received = {k: np.zeros(s, np.float64) for k, s in SHAPES.items()}
    for step in range(30):
        update = _adapter(rng, 0.01)
        update["a.lora_A"][0, 0] = 1.0  # one large value per block row makes the others' steps coarse
        quantized, decoded, residual = codec.compress(update, residual)
        again = codec.decode(quantized, update)  # what the receiver decodes from the codes alone
        for k in update:
            assert np.array_equal(again[k], decoded[k])
            sent[k] += update[k]
            received[k] += again[k]
    for k in SHAPES:
        np.testing.assert_allclose(sent[k] - received[k], residual[k], atol=1e-5)
        # the residual is what the last encode lost: at most half of that step's block scale per value
        _, scales = quantize(decoded[k] + residual[k], scheme, 16)
        per_value = np.repeat(scales.astype(np.float32), 16)[:residual[k].size].reshape(residual[k].shape)
        assert np.all(np.abs(residual[k]) <= per_value / 2 * (1 + 1e-5))
        assert np.abs(sent[k]).max() > 10 * np.abs(residual[k]).max()  # the bound is not trivially loose




def test_error_feedback_delivers_updates_below_one_step_that_plain_quantization_drops():
    codec = Codec("int4", 4)
    update = {"w": np.array([1.0, 0.05, 0.05, 0.05], np.float32)}  # 0.05 < scale/2 = 1/14: rounds to 0
    assert codec.decode(codec.encode(update), update)["w"][1:].tolist() == [0.0, 0.0, 0.0]
    residual, total = None, np.zeros(4)
    for _ in range(20):
        _, decoded, residual = codec.compress(update, residual)
        total += decoded["w"]
    np.testing.assert_allclose(total, 20 * update["w"], atol=1 / 14 / 2 + 1e-6)
    assert total[1] > 0.5  # 20 x 0.05 = 1.0 arrived (within half a step), not 0


def _reply(codec, rng):
    reference = _adapter(rng)
    return reference, codec.encode(_adapter(rng, 0.001))


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("bad,message", [
    (np.nan, "a block scale is NaN or Inf"),
    (np.inf, "a block scale is NaN or Inf"),
    (-0.5, "a block scale is negative"),
    (6e4, "a block scale of 6e\\+04 is above the 1024 limit"),
])
def test_hostile_scales_are_rejected_with_the_reason(scheme, bad, message):
    codec = Codec(scheme, 64)
    reference, quantized = _reply(codec, np.random.default_rng(3))
    scales = quantized.scales.copy()
    scales[1] = bad
    with pytest.raises(Rejected, match=rf"compressed adapter \({scheme}, block 64\): {message}"):
        check_compressed(Quantized(quantized.codes, scales), reference, codec)


@pytest.mark.parametrize("change,message", [
    (lambda q: Quantized(q.codes, q.scales[:-1]), "scales, but the global adapter's tensors make"),
    (lambda q: Quantized(q.codes, np.append(q.scales, np.float16(0.1))), "scales, but the global adapter's"),
    (lambda q: Quantized(q.codes, q.scales.astype(np.float32)), "scales must be a flat float16 array"),
    (lambda q: Quantized(q.codes, q.scales.reshape(1, -1)), "scales must be a flat float16 array"),
    (lambda q: Quantized(q.codes[:-1], q.scales), "int8 codes must be"),
    (lambda q: Quantized(q.codes.astype(np.int16), q.scales), "int8 codes must be"),
    (lambda q: Quantized(np.where(np.arange(q.codes.size) == 3, np.int8(-128), q.codes).astype(np.int8), q.scales),
     "int8 code -128 is out of range"),
])
def test_hostile_int8_shapes_and_codes_are_rejected_with_the_reason(change, message):
    codec = Codec("int8", 64)
    reference, quantized = _reply(codec, np.random.default_rng(4))
    with pytest.raises(Rejected, match=message):
        check_compressed(change(quantized), reference, codec)


def test_a_reply_for_another_adapter_shape_or_block_size_is_rejected():
    codec = Codec("int4", 64)
    reference, quantized = _reply(codec, np.random.default_rng(5))
    bigger = {**reference, "a.lora_A": np.zeros((16, 38), np.float32)}
    with pytest.raises(Rejected, match="int4 codes must be"):
        check_compressed(quantized, bigger, codec)
    with pytest.raises(Rejected, match="scales, but the global adapter's tensors make"):
        check_compressed(quantized, reference, Codec("int4", 32))


def test_a_valid_reply_decodes_to_reference_plus_delta_in_fp32():
    codec = Codec("int8", 64)
    rng = np.random.default_rng(6)
    reference, delta = _adapter(rng), _adapter(rng, 0.001)
    out = check_compressed(codec.encode(delta), reference, codec)
    for k in reference:
        assert out[k].dtype == np.float32
        np.testing.assert_allclose(out[k], reference[k] + delta[k], atol=0.001 * 5 / 127)


def test_encoding_refuses_values_beyond_the_scale_limit_and_non_finite_values():
    with pytest.raises(CodecError, match="beyond what the codec carries"):
        Codec("int4").encode({"w": np.array([MAX_SCALE * 7 * 2], np.float32)})
    with pytest.raises(CodecError, match="NaN or Inf"):
        Codec("int8").encode({"w": np.array([np.nan], np.float32)})


def test_codec_settings_are_checked():
    with pytest.raises(ValueError, match="scheme must be one of"):
        Codec("int2")
    with pytest.raises(ValueError, match="block must be in"):
        Codec("int8", 0)


def test_broadcast_sends_deltas_to_holders_and_whole_fp16_globals_to_others():
    rng = np.random.default_rng(8)
    broadcast = Broadcast(Codec("int8", 64))
    master = _adapter(rng)
    broadcast.advance(master)
    assert broadcast.delta is None and not broadcast.sends_delta(0)
    assert all(np.array_equal(broadcast.current[k], master[k].astype(np.float16).astype(np.float32)) for k in master)
    held = {0: dict(broadcast.current)}  # node 0 replied; node 1 did not
    broadcast.confirm([0])
    for _ in range(5):
        master = {k: v + _adapter(rng, 0.001)[k] for k, v in master.items()}
        before = broadcast.current_sha
        broadcast.advance(master)
        assert broadcast.previous_sha == before and broadcast.sends_delta(0) and not broadcast.sends_delta(1)
        # node 0 rebuilds the new global from the delta bit for bit
        held[0] = apply_delta(held[0], broadcast.codec.decode(broadcast.delta, held[0]))
        assert fingerprint(held[0]) == broadcast.current_sha
        broadcast.confirm([0])
    # the global nodes hold lags the master by at most one step's quantization (plus fp16 rounding)
    for k in master:
        assert np.abs(broadcast.current[k] - master[k]).max() <= 0.001 * 5 / 127 + np.abs(master[k]).max() * 2 ** -10


def test_a_restored_broadcast_sends_the_same_next_delta_as_the_original():
    from pubswap_flwr.protocols.transfer import downlink_checkpoint, restore_downlink

    rng = np.random.default_rng(9)
    original, restored = Broadcast(Codec("int4", 32)), Broadcast(Codec("int4", 32))
    assert downlink_checkpoint(original) == ({}, {})  # nothing sent yet: nothing to save
    master = _adapter(rng)
    for nodes in ([3, 7], [7]):
        original.advance(master)
        original.confirm(nodes)
        master = {k: v + _adapter(rng, 0.002)[k] for k, v in master.items()}
    state, adapters = downlink_checkpoint(original)
    assert state == {"downlink_holders": [7]} and list(adapters) == ["downlink"]
    restore_downlink(restored, state, adapters)
    assert restored.current_sha == original.current_sha and restored.holders == {7}
    original.advance(master)
    restored.advance(master)
    assert restored.sends_delta(7) and not restored.sends_delta(3)
    assert restored.previous_sha == original.previous_sha and restored.current_sha == original.current_sha
    assert np.array_equal(restored.delta.codes, original.delta.codes)


def test_restoring_a_broadcast_refuses_holders_that_are_not_node_ids():
    from pubswap_flwr.protocols.transfer import restore_downlink

    broadcast = Broadcast(Codec("int8", 64))
    with pytest.raises(ValueError, match="downlink_holders must be a list of node ids, got"):
        restore_downlink(broadcast, {"downlink_holders": ["3"]}, {"downlink": _adapter(np.random.default_rng(1))})
    restore_downlink(broadcast, {}, {})  # a checkpoint from before compression state was kept: whole globals next
    assert broadcast.current is None
