"""Batch buckets: the few batch sizes a served model is compiled for.

A program with a symbolic batch dim is compiled once per batch size it sees; under
dynamic batching that is every size from 1 to ``max_batch_size``. A model kind that pads
a batch with zero rows up to the next bucket (and drops the extra rows from its outputs)
compiles at most log2(max_batch_size) + 1 executors; this assumes rows are independent,
which batching assumes anyway. Used by the "program"/"onnxruntime" kinds (`program.py`)
and the "dlrm" kind (`rec.py`).

    >>> buckets(48)
    [1, 2, 4, 8, 16, 32, 48]
    >>> bucket_of([1, 2, 4], 3), bucket_of([1, 2, 4], 9)
    (4, 9)
"""
from __future__ import annotations

import numpy as np


def buckets(max_batch_size, preferred=()) -> list:
    """Batch sizes a padded batch is rounded up to: powers of two, the preferred sizes
    (ints in ``(0, max_batch_size]``; others are ignored) and `max_batch_size` itself."""
    out, b = {max_batch_size}, 1
    while b < max_batch_size:
        out.add(b)
        b *= 2
    out.update(p for p in preferred if isinstance(p, int) and not isinstance(p, bool)
               and 0 < p <= max_batch_size)
    return sorted(out)


def bucket_of(sizes, n) -> int:
    """The smallest of `sizes` (sorted) that holds `n` rows; `n` itself when none does
    (or `sizes` is empty or None)."""
    return next((b for b in sizes or () if b >= n), n)


def pad_rows(a, size):
    """`a` with zero rows appended up to `size` rows (`a` itself when it has them)."""
    n = a.shape[0]
    if size <= n:
        return a
    p = np.zeros((size,) + a.shape[1:], a.dtype)
    p[:n] = a
    return p


def preferred_sizes(config) -> tuple:
    """A model config's ``dynamic_batching.preferred_batch_sizes`` (() when none)."""
    return tuple((config.get("dynamic_batching") or {}).get("preferred_batch_sizes") or ())
