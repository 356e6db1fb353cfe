"""Fused numba kernels vs the same graphs run op by op with numpy, in one run.

Prints one JSON line per (chain, fast_math): fused and numpy medians and their ratio, plus
one line per compiled kernel with its compile time. Kernels go to a fresh cache dir, so
the compile times are real compilations. Usage:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/fusion_kernels.py
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("SAMPAN_CACHE_DIR", tempfile.mkdtemp(prefix="sampan-kernels-"))
import sampan  # noqa: E402
from sampan.backends.numba import kernelgen as KG  # noqa: E402
from sampan.passes import PassManager, pipeline  # noqa: E402
from sampan.passes.fuse import set_fast_math  # noqa: E402
from sampan.jit.api import trace  # noqa: E402
from sampan.runtime import compile_graph  # noqa: E402

N = (1024, 4096)     # 4M float32 elements per tensor
CHAINS = {
    "arith4": lambda a, b: ((a * b + 1.0) * a - b),
    "tanh": lambda a, b: sampan.tanh(a * b + 1.0),
    "gelu": lambda a, b: sampan.gelu(a + b),
    "layer_norm": lambda a, b: sampan.layer_norm(a, N[1], b[0], b[1]),
    "softmax": lambda a, b: sampan.softmax(a + b, -1),
    "log_softmax": lambda a, b: sampan.log_softmax(a, -1) * b,
}


def _median(f, reps=7):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2], ts[0], ts[-1]


def main():
    r = np.random.default_rng(0)
    a = r.standard_normal(N).astype(np.float32)
    b = r.standard_normal(N).astype(np.float32)
    unfused = [p for p in pipeline("train") if p != "fuse_elementwise"]
    for fast in (False, True):
        set_fast_math(fast)
        for name, fn in CHAINS.items():
            bb = b[:2] if name == "layer_norm" else b
            g = trace(fn, (sampan.tensor(a), sampan.tensor(bb)))[0]
            ref = compile_graph(PassManager(unfused).run(g))
            t0 = time.perf_counter()
            fg = PassManager("train").run(g)
            fused = compile_graph(fg)
            build = time.perf_counter() - t0
            x = ref(a, bb)[0]
            y = fused(a, bb)[0]
            err = float(np.max(np.abs(x - y) / (1 + np.abs(x))))
            tn = _median(lambda: ref(a, bb))
            tf = _median(lambda: fused(a, bb))
            print(json.dumps({"workload": f"fusion:{name}", "system": "sampan",
                              "mode": "fast_math" if fast else "exact", "metric":
                              "numpy_over_fused", "value": round(tn[0] / tf[0], 3),
                              "fused_ms": round(tf[0] * 1e3, 2), "numpy_ms": round(tn[0] * 1e3, 2),
                              "min": round(tn[1] / tf[2], 3), "max": round(tn[2] / tf[1], 3),
                              "fused_nodes": sum(n.op == "fused" for n in fg.nodes),
                              "nodes": len(fg.nodes), "unfused_nodes": len(ref_nodes(g, unfused)),
                              "build_s": round(build, 2), "max_rel_err": err}), flush=True)
    for k, v in KG.STATS["kernels"].items():
        print(json.dumps({"workload": "fusion:compile", "system": "sampan", "mode": "numba",
                          "metric": "compile_s", "value": v["compile_s"], "kernel": k,
                          "cache_hit": v["cache_hit"]}))
    print(json.dumps({"workload": "fusion:compile", "system": "sampan", "metric": "kernels",
                      "value": KG.STATS["compiled"], "cache_hits": KG.STATS["cache_hits"],
                      "threads": int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count()))}))
    return 0


def ref_nodes(g, passes):
    return PassManager(passes).run(g).nodes


if __name__ == "__main__":
    sys.exit(main())
