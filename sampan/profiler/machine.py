"""What this machine can do, measured once per process (the advisor compares against it).

`machine_peak_gflops()` times numpy's float32 GEMM: the rate a matmul or convolution in
a trace is judged against (`advisor.gemm_below_peak`).
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["machine_peak_gflops"]

_PEAK: dict = {}


def machine_peak_gflops(n: int = 512, budget_s: float = 0.2) -> float:
    """This machine's float32 GEMM rate (GFLOP/s), measured once per process and cached:
    the best of repeated numpy sgemms of n×n within `budget_s`. Where threadpoolctl can
    pin BLAS to one thread, each sgemm is timed by its thread's CPU clock and the rate
    multiplied by the BLAS thread count: on a busy machine, wall time counts the time the
    scheduler took the cores away, CPU time does not (a GEMM's rate is compute bound)."""
    if n not in _PEAK:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        try:
            from threadpoolctl import threadpool_info, threadpool_limits
            from .. import _threads
            threads = max([int(i.get("num_threads", 1)) for i in threadpool_info()
                           if i.get("user_api") == "blas"] or [1])
            if _threads.blas_cap():
                # the oneDNN GEMM pool holds OpenBLAS at one thread; the machine's rate
                # is that of the threads the process computes with (backends/pool.py)
                threads = _threads.get_num_threads()
            with threadpool_limits(1, user_api="blas"):
                rate = _best_rate(a, b, budget_s, time.thread_time) * threads
        except ImportError:      # no way to pin the threads: wall time, best of many
            rate = _best_rate(a, b, budget_s, time.perf_counter)
        _PEAK[n] = rate
    return _PEAK[n]


def _best_rate(a, b, budget_s, clock) -> float:
    n = a.shape[0]
    a @ b
    best = float("inf")
    t_end = time.perf_counter() + budget_s
    for i in range(500):
        t = clock()
        a @ b
        best = min(best, clock() - t)
        if i >= 2 and time.perf_counter() >= t_end:
            break
    return 2.0 * n ** 3 / max(best, 1e-9) / 1e9
