"""Memory a process gives back: glibc's allocator keeps freed memory for reuse, and a model process's big temporary
tensors (a micro-batch's activations, GGUF de-quantization) left a SmolLM2 client holding about 2 GB it no longer
used (4819 MiB after an update, 1285 MiB after `malloc_trim(0)`). Two settings, each measured by
benchmarks/client_memory.py:
- `limit_retention()`: allocations of 64 KiB and more are mapped and unmapped on their own (mallopt
  M_MMAP_THRESHOLD), so they go back to the system when freed instead of growing the heap; called once per process
  before the model is loaded;
- `release()`: collect garbage and trim the heap (malloc_trim), after loading and after every update.
PUBSWAP_ALLOCATOR=default leaves the allocator as it is and PUBSWAP_ALLOCATOR=trim only trims (for measuring).
Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from functools import lru_cache

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD = 64 * 1024
_applied: list[bool] = []


@lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def enabled() -> bool:
    return os.environ.get("PUBSWAP_ALLOCATOR", "") != "default" and _libc() is not None


def limit_retention() -> bool:
    """Map allocations of MMAP_THRESHOLD and more on their own (once per process); True when in effect."""
    if not _applied:
        wanted = enabled() and os.environ.get("PUBSWAP_ALLOCATOR", "") != "trim"
        _applied.append(wanted and bool(_libc().mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)))
    return _applied[0]


def release() -> bool:
    """Collect young garbage and give the heap's free memory back to the system; True when the heap was trimmed."""
    # generations 0 and 1 only: tensors are freed by reference counting as soon as the update drops them, and a full
    # collection walks every object the process holds (0.29 s per call in a test process, 17% of a small run)
    gc.collect(1)
    if not enabled():
        return False
    return bool(_libc().malloc_trim(0))
