"""Wire codecs: adapters as fp16 ArrayRecords, structured text payloads as size-limited JSON in ConfigRecords.

Nothing received is unpickled or evaluated: arrays go through numpy (Flower saves them with allow_pickle=False)
and text payloads through `json.loads` with a size limit.
"""

from __future__ import annotations

import io
import json
from typing import Annotated, Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.app.typing import MetricRecordValues
from msgspec import Meta

from ..schema import parse

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


PACKED_KEY, INDEX_KEY = "packed", "index"
# the packed adapter's index: [name, shape] per tensor, a shape of at most 8 sizes in [0, 2**31)
AdapterIndex = list[tuple[str, Annotated[list[Annotated[int, Meta(ge=0, lt=2**31)]], Meta(max_length=8)]]]
MAX_INDEX_BYTES = 4 * 1024 * 1024  # names and shapes of the packed tensors (SmolLM2's 420 LoRA tensors: ~40 KB)


def adapter_record(state: dict[str, np.ndarray]) -> ArrayRecord:
    """Every adapter tensor in one fp16 array (peft names sorted) with a JSON index of names and shapes.

    Flower moves each array of a record as an object of its own, one request per array and hop (server, SuperLink,
    SuperNode, ClientApp), so one array per LoRA tensor made a deployed SmolLM2 round 85 s slower than the same 9.8
    MB as one array (docs/results/deployment/run-5-smollm2.txt). `adapter_from_record` also reads the per-tensor
    form."""
    names = sorted(state)
    parts = [np.ascontiguousarray(state[k], dtype=np.float16).ravel() for k in names]
    packed = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float16)
    index = json.dumps([[k, [int(d) for d in np.shape(state[k])]] for k in names], separators=(",", ":"))
    return ArrayRecord({PACKED_KEY: Array(packed),
                        INDEX_KEY: Array(np.frombuffer(index.encode("utf-8"), dtype=np.uint8).copy())})


def _unpack(record: ArrayRecord) -> dict[str, np.ndarray]:
    raw = _checked_numpy(INDEX_KEY, record[INDEX_KEY])
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size > MAX_INDEX_BYTES:
        raise WireError(f"adapter index must be at most {MAX_INDEX_BYTES} bytes of uint8 JSON")
    try:
        index = parse(json.loads(raw.tobytes().decode("utf-8")), AdapterIndex, "adapter index", WireError)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise WireError(f"adapter index is not JSON text: {err}") from None
    names = [name for name, _ in index]
    if len(set(names)) != len(names):
        raise WireError("adapter index names a tensor twice")
    packed = _checked_numpy(PACKED_KEY, record[PACKED_KEY])
    sizes = [int(np.prod(shape, dtype=np.int64)) for _, shape in index]
    if packed.ndim != 1 or packed.size != sum(sizes):
        raise WireError(f"packed adapter has {packed.size} values, its index describes {sum(sizes)}")
    if packed.dtype.kind != "f":
        raise WireError(f"packed adapter has dtype {packed.dtype}, expected floating point")
    out, start = {}, 0
    for (name, shape), size in zip(index, sizes):
        out[name] = packed[start:start + size].reshape(shape)
        start += size
    return out


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
    """Adapter tensors by peft name, from the packed form (`adapter_record`) or one array per tensor."""
    if set(record.keys()) == {PACKED_KEY, INDEX_KEY}:
        return _unpack(record)
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


RecordT = TypeVar("RecordT", ArrayRecord, ConfigRecord, MetricRecord)


def record_of(content: RecordDict, key: str, kind: type[RecordT]) -> RecordT:
    """content[key] (a KeyError when absent), which must be a `kind` record (WireError otherwise)."""
    record = content[key]
    if not isinstance(record, kind):
        raise WireError(f"record {key!r} must be {kind.__name__}, got {type(record).__name__}")
    return record


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
    clean: dict[str, MetricRecordValues] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            clean[key] = int(value)
        elif isinstance(value, (int, float)):
            clean[key] = value if np.isfinite(value) else 0.0
    return MetricRecord(clean)
