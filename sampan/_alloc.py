"""Allocation policy for large arrays: keep freed memory in the process (glibc).

glibc serves an allocation above its mmap threshold (128 KiB, raised adaptively) with a
fresh mapping and unmaps it on free, and trims the heap top beyond 128 KiB; every such
array then pays a page fault per 4 KiB page when first written. A training step frees
and reallocates the same multi-megabyte activations every step, and on the VMs we
measure, page faults are dear: with the policy below a W3 eager step went from 397 ms
to 246 ms, W3 jit 205 -> 155 ms, W1 eager 9.5 -> 7.2 ms and the W4 step 102 -> 68 ms.
Frameworks with their own allocators (a caching allocator, jemalloc/tcmalloc) get the
same effect; sampan sets glibc's knobs instead:

- arrays up to 64 MiB come from the heap (larger ones, e.g. embedding tables, are still
  mapped and returned to the system when freed);
- up to 512 MiB of free heap top is kept instead of being returned;
- the heap grows 64 MiB at a time.

The cost is that a process keeps up to ~512 MiB of freed memory for reuse. Set
``SAMPAN_MALLOC=system`` to leave glibc's defaults, and explicit ``MALLOC_*_``
environment variables always win. Other platforms and C libraries are left alone.
"""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
POLICY = {M_MMAP_THRESHOLD: 64 << 20, M_TRIM_THRESHOLD: 512 << 20, M_TOP_PAD: 64 << 20}
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
applied = False


def tune() -> bool:
    """Apply POLICY through glibc's mallopt; returns whether it was applied."""
    global applied
    if (sys.platform != "linux" or os.environ.get("SAMPAN_MALLOC", "") == "system"
            or any(k in os.environ for k in _ENV)):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # glibc only (musl has no such knobs)
    except (OSError, AttributeError):
        return False
    applied = all(libc.mallopt(k, v) == 1 for k, v in POLICY.items())
    return applied
