"""Wire codecs: adapters as fp16 ArrayRecords, structured text payloads as size-limited JSON in ConfigRecords.

Nothing received is unpickled or evaluated: arrays go through numpy (Flower saves them with allow_pickle=False)
and text payloads through `json.loads` with a size limit.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

ADAPTER_KEY = "adapter"
QUANTIZED_KEY = "adapter-q"  # strategy.compression: an adapter delta as blockwise codes and scales
CONFIG_KEY = "config"
# stamped by the exchange: the last round whose reply from this node was accepted, or, to a node id it does not
# know yet (first contact, or new ids after a resume under Flower's Ray engine), the rounds of every node index
NODE_ROUND_KEY = "node-round"
NODE_ROUNDS_KEY = "node-rounds"  # JSON text {"<node index>": round}
METRICS_KEY = "metrics"
PAYLOAD_KEY = "payload"
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024


class WireError(ValueError):
    """A received record does not have the expected form."""


def adapter_record(state: dict[str, np.ndarray]) -> ArrayRecord:
    """fp16 copies of adapter tensors, keyed by their peft names."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v, dtype=np.float16)) for k, v in state.items()})


def _checked_numpy(key: str, array: Array) -> np.ndarray:
    """The array's values, after checking its .npy header against the bytes it carries: a declared shape larger
    than the data (which numpy would allocate before noticing) or an object dtype is refused before loading."""
    data = array.data
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read_header(stream)
    except (ValueError, TypeError, EOFError, SyntaxError) as err:
        raise WireError(f"adapter tensor {key!r} is not a readable .npy array: {err}") from None
    if dtype.hasobject:
        raise WireError(f"adapter tensor {key!r} has an object dtype")
    declared = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    carried = len(data) - stream.tell()
    if declared != carried:
        raise WireError(f"adapter tensor {key!r} declares {declared} bytes of values but carries {carried}")
    return np.load(io.BytesIO(data), allow_pickle=False)


def adapter_from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    out = {}
    for key, array in record.items():
        value = _checked_numpy(key, array)
        if value.dtype.kind != "f":
            raise WireError(f"adapter tensor {key!r} has dtype {value.dtype}, expected floating point")
        out[key] = value
    return out


def quantized_record(codes: np.ndarray, scales: np.ndarray) -> ArrayRecord:
    """A compressed adapter delta: its `codes` (int8, or uint8 int4 pairs) and fp16 `scales`, both flat."""
    return ArrayRecord({"codes": Array(np.ascontiguousarray(codes)), "scales": Array(np.ascontiguousarray(scales))})


def quantized_from_record(record: ArrayRecord) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) of a compressed delta record: exactly those two arrays, read as their .npy headers allow
    (dtypes, sizes and values are checked against the reference adapter by the codec)."""
    if set(record.keys()) != {"codes", "scales"}:
        raise WireError(f"a compressed adapter holds arrays 'codes' and 'scales', got {sorted(record.keys())[:4]}")
    return _checked_numpy("codes", record["codes"]), _checked_numpy("scales", record["scales"])


def payload_record(obj: Any) -> ConfigRecord:
    """Structured payload (dicts/lists of text and numbers) as one JSON string."""
    return ConfigRecord({"json": json.dumps(obj, separators=(",", ":"), ensure_ascii=False)})


def payload_from_record(record: ConfigRecord, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Any:
    text = record.get("json")
    if not isinstance(text, str):
        raise WireError("payload record has no 'json' text")
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise WireError(f"payload is {size} bytes, over the {max_bytes}-byte limit")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise WireError(f"payload is not valid JSON: {err.msg}") from err


def record_bytes(content: RecordDict) -> int:
    """Bytes a message's records occupy (arrays' raw bytes plus config/metric values)."""
    total = 0
    for record in content.values():
        if isinstance(record, ArrayRecord):
            total += sum(len(a.data) for a in record.values())
        elif isinstance(record, (ConfigRecord, MetricRecord)):
            for key, value in record.items():
                total += len(key)
                if isinstance(value, str):
                    total += len(value.encode("utf-8"))
                elif isinstance(value, bytes):
                    total += len(value)
                elif isinstance(value, list):
                    total += 8 * len(value)
                else:
                    total += 8
    return total


def metrics_record(values: dict[str, float | int]) -> MetricRecord:
    """MetricRecord of finite scalars (bools become 0/1, which MetricRecord requires)."""
    clean: dict[str, float | int] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            clean[key] = int(value)
        elif isinstance(value, (int, float)):
            clean[key] = value if np.isfinite(value) else 0.0
    return MetricRecord(clean)
