"""Spin-wait interference between numpy's OpenBLAS and oneDNN's OpenMP threads, the
measurement behind sampan's GEMM pool (sampan/backends/pool.py) and its default OpenMP
wait policy (sampan/_threads.py WAIT_POLICY).

Per OpenMP wait policy (each in its own process: libgomp reads it once, when loaded):
- ``dnn_after_blas``: a oneDNN GEMM timed right after a threaded OpenBLAS GEMM;
- ``dnn_after_pause``: the same call after OpenBLAS's workers had 0.3 s to go to sleep;
- ``dnn_blas_capped``: right after an OpenBLAS GEMM on one thread (the "onednn" pool);
- ``blas_after_dnn``: an OpenBLAS GEMM timed right after a oneDNN one;
- ``step_onednn_pool`` / ``step_mixed``: a W1-like sequence of GEMMs and elementwise
  work, all GEMMs on oneDNN with OpenBLAS capped, against every other GEMM on OpenBLAS.
Ratios in the same process are the result (``interference = dnn_after_blas /
dnn_after_pause``); microseconds are for reading only.

    python thread_pools.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import common  # noqa: F401  (puts the repository on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = {"PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}, "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
            "libgomp-default": {"GOMP_SPINCOUNT": "300000"},
            # bounded spins (libgomp: about 100 000 spins a millisecond)
            "spin-1e3": {"GOMP_SPINCOUNT": "1000"}, "spin-1e4": {"GOMP_SPINCOUNT": "10000"},
            "spin-1e5": {"GOMP_SPINCOUNT": "100000"}}


def _child(reps):
    import numpy as np

    from sampan import _threads
    from sampan.backends import onednn
    if not onednn.available():
        print(json.dumps({"skip": onednn.why_unavailable()}))
        return
    _threads.set_num_threads(2)
    r = np.random.default_rng(0)
    a, b = r.standard_normal((128, 512), np.float32), r.standard_normal((512, 512), np.float32)
    big = r.standard_normal((512, 512), np.float32)
    dnn = onednn.matmul
    for _ in range(5):
        dnn(a, b), a @ b

    def timed(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    res = {k: [] for k in ("dnn_after_blas", "dnn_after_pause", "dnn_blas_capped",
                           "blas_after_dnn", "blas_alone")}
    for _ in range(reps):
        big @ big
        res["dnn_after_blas"].append(timed(lambda: dnn(a, b)))
        time.sleep(0.3)
        res["dnn_after_pause"].append(timed(lambda: dnn(a, b)))
        dnn(a, b)
        res["blas_after_dnn"].append(timed(lambda: a @ b))
        time.sleep(0.3)
        res["blas_alone"].append(timed(lambda: a @ b))
        _threads.cap_blas(1)
        big @ big
        res["dnn_blas_capped"].append(timed(lambda: dnn(a, b)))
        _threads.cap_blas(None)

    ws = [r.standard_normal(s, np.float32) for s in ((784, 512), (512, 512), (512, 10))]
    x = r.standard_normal((128, 784), np.float32)

    def step(mixed):
        h = x
        for i, w in enumerate(ws):
            h = (h @ w) if (mixed and i % 2) else dnn(h, w)
            h = np.maximum(h, 0) * np.float32(1.01)
        return h

    def seq(mixed, n=20):
        step(mixed)
        t = time.perf_counter()
        for _ in range(n):
            step(mixed)
        return (time.perf_counter() - t) / n

    for _ in range(max(1, reps // 2)):
        _threads.cap_blas(1)
        res.setdefault("step_onednn_pool", []).append(seq(False))
        _threads.cap_blas(None)
        res.setdefault("step_mixed", []).append(seq(True))
    print(json.dumps({k: min(v) * 1e6 for k, v in res.items()}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child)
    from common import emit
    reps = 4 if args.quick else 10
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for name, extra in POLICIES.items():
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(reps)],
                             env=dict(base, **extra), cwd=HERE, capture_output=True, text=True)
        try:
            us = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            print(f"# {name}: child failed: {out.stderr.strip()[-300:]}")
            continue
        if "skip" in us:
            print(f"# oneDNN unavailable: {us['skip']}")
            return
        us = {k: round(v, 1) for k, v in us.items()}
        emit("thread_pools", "sampan", name, "dnn_interference_after_openblas",
             [us["dnn_after_blas"] / us["dnn_after_pause"]], omp_policy=name, us=us)
        emit("thread_pools", "sampan", name, "dnn_after_capped_openblas_vs_pause",
             [us["dnn_blas_capped"] / us["dnn_after_pause"]], omp_policy=name)
        emit("thread_pools", "sampan", name, "openblas_interference_after_dnn",
             [us["blas_after_dnn"] / us["blas_alone"]], omp_policy=name)
        emit("thread_pools", "sampan", name, "step_mixed_vs_onednn_pool",
             [us["step_mixed"] / us["step_onednn_pool"]], omp_policy=name)


if __name__ == "__main__":
    main()
