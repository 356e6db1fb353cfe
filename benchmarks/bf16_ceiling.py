"""The ceiling of bfloat16 training on this CPU: the rate of each GEMM kernel sampan can run
a bf16 product on, beside float32 sgemm, on the products of W1-W3's steps (forward and the
two backward products), timed in one interleaved run.

W1-W3 spend most of a step in GEMMs, so a bf16 step can only beat its float32 twin by what
its GEMMs gain: where the bf16 kernels run no faster than float32 sgemm (an AVX512-BF16 core
without AMX retires one 32-pair `vdpbf16ps` where it retires two 16-lane float32 FMAs),
"bf16 >= 1.3x fp32" is out of reach whatever the casts and layouts. This prints, per shape
and kernel, GFLOP/s and the ratio to numpy float32, and a summary line with the FLOP-weighted
ratio of the fastest bf16 kernel to float32 over all the shapes (the GEMM part's bound on
the bf16 / fp32 step ratio).

Kernels: `numpy_f32` (np.matmul, OpenBLAS), `onednn_f32`, `onednn_bf16` (plain layouts, as
sampan calls it), `onednn_bf16_f32out` (bf16 inputs, float32 output), `numpy_bf16` (sampan's
numpy kernel for bf16: float32 sgemm of the widened operands, rounded: what the bf16
calibration races oneDNN against), and `onednn_f16` for comparison (AVX512-FP16).

Also W2's two convolutions forward in oneDNN's own (blocked) layouts, float32 against
bfloat16 (`format_tag_any` for source, weights and destination, operands already in those
layouts, so only the kernel is timed): the ceiling of a blocked bf16 LeNet path.

`--cpu-clock` times per CPU second of the process: run single-threaded on a shared machine
(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1), where wall time measures the scheduler.

Usage: python bf16_ceiling.py [--blocks N] [--cpu-clock]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import emit

import sampan  # noqa: F401  (sampan's OpenMP policy before anything loads libgomp)

# (m, k) @ (k, n) of the steps: W1 forward / input-grad / weight-grad, W3 (batch 8 x 128
# tokens, d 256) projections and MLP, attention (32 heads-x-batch of 128 x 64 x 128)
SHAPES = {
    "W1 fwd 784-512": ((128, 784), (784, 512)),
    "W1 fwd 512-512": ((128, 512), (512, 512)),
    "W1 dX 512-784": ((128, 512), (512, 784)),
    "W1 dW 784x512": ((784, 128), (128, 512)),
    "W3 qkv": ((1024, 256), (256, 768)),
    "W3 fc": ((1024, 256), (256, 1024)),
    "W3 out": ((1024, 1024), (1024, 256)),
    "W3 dW fc": ((256, 1024), (1024, 1024)),
    "W3 attn": ((32, 128, 64), (32, 64, 128)),
}


def kernels():
    from sampan import dtypes as D
    from sampan.backends.onednn import primitives as P
    from sampan.ops.linalg import _matmul_kernel
    bf = D.bfloat16
    return {
        "numpy_f32": (np.float32, np.matmul),
        "onednn_f32": (np.float32, P.matmul),
        "onednn_bf16": (bf, P.matmul),
        "onednn_bf16_f32out": (bf, lambda a, b: P.matmul(a, b, out_dtype=np.float32)),
        "numpy_bf16": (bf, _matmul_kernel),
        "onednn_f16": (np.float16, P.matmul),
    }


# W2's convolutions: (input, weight, padding)
CONVS = {"W2 conv1": ((64, 1, 28, 28), (6, 1, 5, 5), 2),
         "W2 conv2": ((64, 6, 14, 14), (16, 6, 5, 5), 0)}


def blocked_conv(xs, ws, pad, dtype):
    """A oneDNN forward convolution in the layouts it picks for `dtype` ("f32"/"bf16"),
    with zeroed operand buffers in those layouts: (run(), its implementation name)."""
    import ctypes

    from sampan.backends.onednn import _lib as L
    from sampan.backends.onednn import blocked as B
    from sampan.backends.onednn import primitives as P
    B._protos()
    dll, dt = L.lib(), {"f32": L.F32, "bf16": L.BF16}[dtype]
    ho, wo = xs[2] + 2 * pad - ws[2] + 1, xs[3] + 2 * pad - ws[3] + 1
    ys = (xs[0], ws[0], ho, wo)

    def any_md(shape):
        md = ctypes.c_void_p()
        L.check(dll.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(shape),
                                                     P._dims(shape), dt, B._FORMAT_ANY), "md")
        return md
    st, dl, pl, pr = P._conv_params(xs[2:], ys[2:], ws[2:], (1, 1), (pad, pad), (1, 1))
    attr = P._attr()
    try:
        pd = P._pd(dll.dnnl_convolution_forward_primitive_desc_create, "conv forward",
                   L.engine(), L.FORWARD_TRAINING, L.CONVOLUTION_DIRECT, any_md(xs),
                   any_md(ws), None, any_md(ys), st, dl, pl, pr, attr)
    finally:
        dll.dnnl_primitive_attr_destroy(attr)
    mds = [B._query(pd, q) for q in (B._Q_SRC, B._Q_WEIGHTS, B._Q_DST)]
    bufs = [np.zeros(int(dll.dnnl_memory_desc_get_size(m)), np.uint8) for m in mds]
    prim = P._Prim(pd, [L.ARG_SRC, L.ARG_WEIGHTS, L.ARG_DST], mds)
    flops = 2 * int(np.prod(ys)) * int(np.prod(ws[1:]))
    return (lambda: prim.run(bufs)), prim.impl, flops


def convs(blocks, clock):
    for name, (xs, ws, pad) in CONVS.items():
        runs = {d: blocked_conv(xs, ws, pad, d) for d in ("f32", "bf16")}
        times = {d: [] for d in runs}
        for blk in range(blocks):
            for d in (("f32", "bf16") if blk % 2 == 0 else ("bf16", "f32")):
                run = runs[d][0]
                run()
                t = clock()
                for _ in range(20):
                    run()
                times[d].append((clock() - t) / 20)
        gf = {d: runs[d][2] / statistics.median(v) / 1e9 for d, v in times.items()}
        for d in runs:
            emit(name, "sampan", f"onednn_blocked_{d}", "gflops", [gf[d]], impl=runs[d][1],
                 ratio_vs_f32=round(gf[d] / gf["f32"], 3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--cpu-clock", action="store_true")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_clock else time.perf_counter
    ks = kernels()
    r = np.random.default_rng(0)
    best = {}
    for name, (sa, sb) in SHAPES.items():
        a = r.standard_normal(sa).astype(np.float32)
        b = r.standard_normal(sb).astype(np.float32)
        flops = 2 * a.size // sa[-1] * sa[-1] * sb[-1]
        ops = {k: (fn, a.astype(dt), b.astype(dt)) for k, (dt, fn) in ks.items()}
        for fn, x, y in ops.values():          # warm-up: primitive builds
            fn(x, y)
        # enough calls per block for ~20 ms of float32 work
        t = clock()
        np.matmul(a, b)
        inner = max(3, min(200, int(0.02 / max(clock() - t, 1e-5))))
        times = {k: [] for k in ops}
        order = list(ops)
        for blk in range(args.blocks):
            for k in order[blk % len(order):] + order[:blk % len(order)]:
                fn, x, y = ops[k]
                t = clock()
                for _ in range(inner):
                    fn(x, y)
                times[k].append((clock() - t) / inner)
        gf = {k: flops / max(statistics.median(v), 1e-9) / 1e9 for k, v in times.items()}
        for k, v in gf.items():
            emit(name, "sampan", k, "gflops", [v], ratio_vs_numpy_f32=round(
                v / gf["numpy_f32"], 3))
        fastest_bf16 = max(("onednn_bf16", "numpy_bf16"), key=gf.get)
        best[name] = (flops, flops / gf["numpy_f32"], flops / gf[fastest_bf16], fastest_bf16)
    total_f32 = sum(v[1] for v in best.values())
    total_bf16 = sum(v[2] for v in best.values())
    emit("W1-W3 GEMMs", "sampan", "fastest_bf16/numpy_f32", "speed_ratio",
         [total_f32 / total_bf16], per_shape={k: v[3] for k, v in best.items()},
         clock="cpu" if args.cpu_clock else "wall")
    convs(args.blocks, clock)


if __name__ == "__main__":
    main()
