"""Blocks of work that threads claim one at a time: `run_claimed(nblk, block, parts)`
calls `block(i, t)` for every i < nblk, on the calling thread (t = 0) and `parts - 1`
helper threads (t = 1, 2, ...), each taking the next unclaimed block when it is free.
The caller returns once no block is left and none is in progress: a helper that a busy
machine starts late finds the blocks done and returns, instead of being waited for (an
OpenMP region or a fixed split waits for its slowest thread). `block` must release the
GIL for the threads to overlap (nogil numba kernels, ctypes calls, numpy's loops). The
first error a block raises stops the claiming and is raised to the caller.

`wrap(t)`, when given, is a context manager entered around each thread's share (e.g.
oneDNN on that thread alone, `onednn.int8.one_thread`).
"""
from __future__ import annotations

import threading

_POOL: dict = {}


def _pool(n):
    p = _POOL.get("pool")
    if p is None or _POOL.get("n", 0) < n:
        from concurrent.futures import ThreadPoolExecutor
        p = _POOL["pool"] = ThreadPoolExecutor(n, thread_name_prefix="sampan-blocks")
        _POOL["n"] = n
    return p


def threads() -> int:
    """sampan's thread count (1 where it cannot be read)."""
    from ..._threads import get_num_threads
    try:
        return max(1, int(get_num_threads()))
    except Exception:  # noqa: BLE001
        return 1


def run_claimed(nblk, block, parts, wrap=None):
    parts = max(1, min(int(parts), int(nblk)))
    if nblk <= 0:
        return
    cond = threading.Condition()
    st = [0, 0, None]             # next block, blocks in progress, first error

    def claim():
        with cond:
            i = st[0]
            if i >= nblk or st[2] is not None:
                return -1
            st[0] = i + 1
            st[1] += 1
            return i

    def work(t):
        while True:
            i = claim()
            if i < 0:
                return
            try:
                block(i, t)
            except BaseException as e:  # noqa: BLE001 - raised by the caller
                with cond:
                    st[2] = st[2] or e
            finally:
                with cond:
                    st[1] -= 1
                    cond.notify_all()

    def share(t):
        if wrap is None:
            work(t)
        else:
            with wrap(t):
                work(t)
    if parts > 1:
        pool = _pool(parts - 1)
        for t in range(1, parts):
            pool.submit(share, t)
    share(0)
    with cond:
        while st[1]:
            cond.wait()
    if st[2] is not None:
        raise st[2]
