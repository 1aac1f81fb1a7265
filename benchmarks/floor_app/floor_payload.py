"""The floor's stand-in for an adapter: `size` random bytes in `arrays` arrays, distinct per `seed`."""

import numpy as np
from flwr.app import ArrayRecord


def payload(size: int, arrays: int, seed: str) -> ArrayRecord:
    # Flower sends every array (and every 5 MiB chunk of one) as its own object and stores equal objects once, so
    # the parts differ, as an adapter's tensors do, and so do different rounds' and nodes' payloads.
    data = np.random.default_rng(list(seed.encode())).integers(0, 256, size, dtype=np.uint8)
    return ArrayRecord(np.array_split(data, arrays))
