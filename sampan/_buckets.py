"""The gradient-bucket policy of data parallelism, one for eager and jit.

`plan(items, bucket_mb)` lays gradients out into buckets, one all-reduce each. `items`
are (nbytes, dtype) pairs in the order the gradients are expected to be ready (eager
`DataParallel`: reverse registration order, then the order one backward measured; the
`distribute` pass: the order of the nodes that compute them). The policy, as torch's
reducer:

- a bucket holds one dtype and about `bucket_mb` megabytes (one gradient larger than
  that is a bucket of its own);
- the first bucket is small (at most `FIRST_BUCKET_MB`): its reduction starts early and
  the rest overlaps with the gradients still being computed;
- the last bucket holds only the gradients ready last (of the last one's dtype, up to
  `LAST_BUCKET_MB`, or the last one alone): its reduction starts when nothing is left
  to compute, so all of it is exposed.

This module is pure (numpy only) and sits on the lowest floor so that both the pass
(`sampan/passes/distribute.py`) and `sampan.distributed` read the same rule;
`sampan.distributed.buckets` is its public face.
"""
from __future__ import annotations

import numpy as np

BUCKET_MB = 25.0        # the default bucket size (torch's bucket_cap_mb)
FIRST_BUCKET_MB = 1.0   # the first bucket's cap (torch's reducer: 1 MB)
LAST_BUCKET_MB = 1.0    # the last bucket's cap

_MB = 2 ** 20


def plan(items, bucket_mb: float = BUCKET_MB, first_mb: float = FIRST_BUCKET_MB,
         last_mb: float = LAST_BUCKET_MB) -> list:
    """Buckets over `items` ((nbytes, dtype) in readiness order): a list of lists of
    indices into `items`, in the order the buckets are to be reduced (each bucket's
    indices in readiness order).

    Example::

        >>> plan([(4 * 2 ** 20, "float32")] * 3, bucket_mb=8)
        [[0], [1], [2]]
    """
    full = float(bucket_mb) * _MB
    items = [(int(n), np.dtype(dt)) for n, dt in items]
    tail = []
    if items:
        dt, size = items[-1][1], 0
        for i in range(len(items) - 1, -1, -1):
            n, d = items[i]
            if d != dt or (tail and size + n > min(float(last_mb) * _MB, full)):
                break
            tail.append(i)
            size += n
    head = len(items) - len(tail)
    buckets, open_ = [], {}            # dtype -> [indices, bytes] of the bucket filling
    for i in range(head):
        n, dt = items[i]
        b = open_.get(dt)
        first = b is not None and b is buckets[0]
        cap = min(float(first_mb) * _MB, full) if first else full
        if b is None or (b[0] and b[1] + n > cap):
            b = open_[dt] = [[], 0]
            buckets.append(b)
        b[0].append(i)
        b[1] += n
    out = [b[0] for b in buckets]
    if tail:
        out.append(tail[::-1])
    return out
