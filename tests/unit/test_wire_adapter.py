"""Adapters on the wire: one packed fp16 array with a JSON index of names and shapes (Flower moves every array of a
record as an object of its own), read back exactly; the per-tensor form still read; a malformed index refused with a
WireError naming what is wrong."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from pubswap_flwr.wire.codecs import INDEX_KEY, PACKED_KEY, WireError, adapter_from_record, adapter_record

STATE = {"b.lora_B.weight": np.arange(12, dtype=np.float32).reshape(4, 3) / 7,
         "a.lora_A.weight": -np.ones((3, 5), dtype=np.float32) * 1e-3, "c.scalar": np.array(2.5, dtype=np.float32)}


def test_packed_round_trip_is_the_fp16_values_in_their_shapes():
    record = adapter_record(STATE)
    assert set(record.keys()) == {PACKED_KEY, INDEX_KEY}  # two arrays, whatever the number of tensors
    back = adapter_from_record(record)
    assert list(back) == sorted(STATE)
    for key, value in STATE.items():
        assert back[key].shape == value.shape and back[key].dtype == np.float16
        assert np.array_equal(back[key], value.astype(np.float16))
    assert adapter_from_record(adapter_record({})) == {}


def test_the_per_tensor_form_is_still_read():
    record = ArrayRecord({k: Array(v.astype(np.float16)) for k, v in STATE.items()})
    back = adapter_from_record(record)
    assert set(back) == set(STATE)
    assert np.array_equal(back["a.lora_A.weight"], STATE["a.lora_A.weight"].astype(np.float16))


def _record(index, packed=None) -> ArrayRecord:
    raw = index if isinstance(index, np.ndarray) else np.frombuffer(json.dumps(index).encode(), dtype=np.uint8).copy()
    packed = np.zeros(6, dtype=np.float16) if packed is None else packed
    return ArrayRecord({PACKED_KEY: Array(packed), INDEX_KEY: Array(raw)})


@pytest.mark.parametrize("record,message", [
    (_record([["a", [2, 3]], ["a", [0]]]), "names a tensor twice"),
    (_record([["a", [2, 4]]]), "packed adapter has 6 values, its index describes 8"),
    (_record([["a", [-1, 6]]]), "^adapter index\\[0\\]\\[1\\]\\[0\\]: expected `int` >= 0$"),
    (_record([["a", [2, 3.0]]]), "^adapter index\\[0\\]\\[1\\]\\[1\\]: expected `int`, got `float`$"),
    (_record([["a", [1] * 9]]), "^adapter index\\[0\\]\\[1\\]: expected `array` of length <= 8$"),
    (_record([["a", [6], "extra"]]), "^adapter index\\[0\\]: expected `array` of length 2, got 3$"),
    (_record({"a": [6]}), "^adapter index: expected `array`, got `object`$"),
    (_record([["a", [6]]], np.zeros(6, dtype=np.int32)), "expected floating point"),
    (_record(np.zeros(3, dtype=np.float32)), "at most 4194304 bytes of uint8 JSON"),
    (_record(np.frombuffer(b"[[" * 100_000, dtype=np.uint8).copy()), "not JSON text"),
    (_record(np.frombuffer(b"\xff\xfe", dtype=np.uint8).copy()), "not JSON text"),
])
def test_a_malformed_index_is_refused_naming_what_is_wrong(record, message):
    with pytest.raises(WireError, match=message):
        adapter_from_record(record)
