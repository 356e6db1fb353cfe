"""Shared benchmark plumbing: timing (median of repetitions, min–max), JSON lines in the
WORKLOADS.md format, and the BLAS kernel that actually ran."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def blas_info() -> dict:
    """Which BLAS numpy uses and its kernel (OpenBLAS coretype), via threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
        for p in threadpool_info():
            if p.get("internal_api") in ("openblas", "mkl", "blis"):
                return {"blas": p.get("internal_api"), "blas_kernel": p.get("architecture"),
                        "blas_threads": p.get("num_threads")}
    except Exception:
        pass
    return {"blas": "unknown"}


_MACHINE: dict = {}


def machine_info() -> dict:
    """The machine every line was measured on: CPU model, its AVX-512/AMX flags, and the
    kernel provider the kernel choice (sampan/backends/choice.py) picked per op so far."""
    if not _MACHINE:
        from sampan.backends import choice
        flags = choice.cpu_flags()
        _MACHINE.update(cpu=choice.cpu_model(),
                        cpu_flags=[f for f in flags if f.startswith(("avx512", "amx"))])
    from sampan.backends import choice, pool
    pref = choice.preferred(None)
    # preferred: every op with a choice runs there where it has a kernel for the call
    kernels = choice.providers() if pref is None else {
        op: pref for op in choice.OPS_WITH_CHOICE}
    from sampan import _threads
    return dict(_MACHINE, kernels=kernels, kernel_choice=pref or "measured",
                gemm_pool=pool.current(), gemm_pool_bf16=pool.current("bfloat16"),
                omp_wait_policy=_threads.openmp_wait_policy())


def timeit(fn, reps=7, warmup=2, inner=1):
    """Run fn `warmup` times, then `reps` timed runs of `inner` calls; seconds per call."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        ts.append((time.perf_counter() - t) / inner)
    return ts


def emit(workload, system, mode, metric, values, **extra):
    """Print one JSON line: median, min and max of `values` (already in the metric's unit)."""
    rec = {"workload": workload, "system": system, "mode": mode, "metric": metric,
           "value": round(statistics.median(values), 4), "min": round(min(values), 4),
           "max": round(max(values), 4)}
    rec.update(extra)
    rec.setdefault("machine", machine_info())
    print(json.dumps(rec), flush=True)
    return rec


def add_kernel_args(ap) -> None:
    """--kernels and --pool: how sampan picks its GEMM and convolution kernels."""
    ap.add_argument("--kernels", default="measured", choices=("measured", "numpy", "onednn"),
                    help="sampan's kernel provider: measured per op (default) or preferred")
    ap.add_argument("--pool", default="measured", choices=("measured", "openblas", "onednn"),
                    help="the GEMM thread pool (sampan/backends/pool.py): calibrated per "
                         "machine (default) or forced")
    ap.add_argument("--pool-bf16", default="measured", choices=("measured", "openblas", "onednn"),
                    help="the library of bfloat16 GEMMs/convolutions: calibrated per machine "
                         "apart from float32 (default) or forced")


def apply_kernel_args(args) -> None:
    if args.pool != "measured":
        from sampan.backends import pool
        pool.set_pool(args.pool)
    if getattr(args, "pool_bf16", "measured") != "measured":
        from sampan.backends import pool
        pool.set_pool(args.pool_bf16, "bfloat16")
    if args.kernels != "measured":
        from sampan.backends import choice
        choice.prefer(args.kernels)
