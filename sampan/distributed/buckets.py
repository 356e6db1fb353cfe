"""Gradient buckets: the one policy `DataParallel` and the `distribute` pass share.

`plan(items, bucket_mb)` is the layout rule (readiness order, one dtype a bucket, a
small first bucket of `FIRST_BUCKET_MB` and a small last bucket of `LAST_BUCKET_MB`; see
`sampan._buckets`, where it lives on the lowest floor so that the pass can read it too).
`Bucket` is eager DataParallel's record of one bucket: its parameters, their offsets in
the flat buffer, and the reduction in flight.

Example::

    >>> from sampan.distributed.buckets import plan
    >>> plan([(3 * 2 ** 20, "float32"), (2 ** 20, "float32"), (8, "float32")], 25)
    [[0], [1], [2]]
"""
from __future__ import annotations

import numpy as np

from .._buckets import BUCKET_MB, FIRST_BUCKET_MB, LAST_BUCKET_MB, plan

__all__ = ["plan", "Bucket", "make_buckets", "BUCKET_MB", "FIRST_BUCKET_MB",
           "LAST_BUCKET_MB"]


class Bucket:
    """One bucket of parameters: `params`, each one's `offsets` into the flat buffer
    `flat` (a fresh one every step), `size` in elements, the reduction `work` in flight
    and its timestamps."""

    __slots__ = ("index", "dtype", "params", "offsets", "size", "flat", "work", "left",
                 "t_launch", "t_done")

    def __init__(self, index, dtype):
        self.index, self.dtype = index, dtype
        self.params, self.offsets, self.size = [], [], 0
        self.flat = self.work = None

    def add(self, p):
        self.params.append(p)
        self.offsets.append(self.size)
        self.size += int(p._data.size)

    def nbytes(self):
        return self.size * np.dtype(self.dtype).itemsize


def make_buckets(order, bucket_mb: float = BUCKET_MB) -> list:
    """`Bucket`s over the parameters `order` (in the order their gradients are expected
    to be ready), laid out by `plan`."""
    out = []
    for idx in plan([(p._data.nbytes, p._data.dtype) for p in order], bucket_mb):
        b = Bucket(len(out), order[idx[0]]._data.dtype)
        for i in idx:
            b.add(order[i])
        out.append(b)
    return out
