"""W5 LeNet int8, the conv + max-pool fusion alone: the same int8 program (an untrained
LeNet-5 of the W2 shape, quantised by `sampan.quant.quantize_program` on 8 planted batches)
served by two numba Predictors in one process, one with the Predictor's default pass list
(`fuse_layers` writes `qlinear_conv2d_pool`) and one with `fuse_layers` deleted (the int8
graph's only float-free difference: `qlinear_conv2d` then `max_pool2d`). Blocks
interleaved and rotated; per block the batch-1 p50 over `--calls` calls and the batch-64
samples/s over `--iters64` calls; one JSON line per (system, metric) and the per-block
ratio fused / unfused. Outputs are checked equal byte for byte before timing.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/w5_conv_pool.py [--blocks 9]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if __name__ == "__main__":  # before numpy: OpenBLAS reads its overrides when it loads
    from _blas_env import rerun_without_overrides
    rerun_without_overrides()

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import ROOT, emit  # noqa: E402

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _predictor(path, fused):
    import sampan.inference as inf
    cfg = inf.Config(path)
    cfg.set_runtime("numba")
    if not fused:
        cfg.pass_builder().delete_pass("fuse_layers")
    p = inf.create_predictor(cfg)
    h = p.get_input_handle(p.get_input_names()[0])
    o = p.get_output_handle(p.get_output_names()[0])

    def call(x):
        h.copy_from_cpu(x)
        p.run()
        return o.copy_to_cpu()
    return call, sorted({n.op for n in p.graph.nodes})


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--calls", type=int, default=1000, help="batch-1 calls per block")
    ap.add_argument("--iters64", type=int, default=60, help="batch-64 calls per block")
    a = ap.parse_args(argv)
    import sampan
    import sampan.quant as quant
    from w5_prune import lenet, planted
    sampan.manual_seed(0)
    x, _ = planted(600, 1)
    d = tempfile.mkdtemp()
    path = sampan.jit.save(lenet(), os.path.join(d, "lenet.sampan"), (sampan.tensor(x[:2]),),
                           dynamic={"x": {0: "batch"}})
    cal = [np.ascontiguousarray(x[i:i + 64]) for i in range(0, 512, 64)]
    q8 = quant.quantize_program(path, cal, os.path.join(d, "lenet-int8.sampan"))
    systems = {k: _predictor(q8, k == "fused") for k in ("fused", "unfused")}
    for k, (_, ops) in systems.items():
        print(f"# {k}: {ops}", flush=True)
    x1, x64 = np.ascontiguousarray(x[:1]), np.ascontiguousarray(x[:64])
    want = systems["unfused"][0](x64)
    if systems["fused"][0](x64).tobytes() != want.tobytes():
        raise SystemExit("fused and unfused int8 LeNet disagree")
    res = {(k, b): [] for k in systems for b in (1, 64)}
    names = list(systems)
    for blk in range(a.blocks):
        for k in (names if blk % 2 == 0 else names[::-1]):
            call = systems[k][0]
            for _ in range(50):
                call(x1)
            ts = []
            for _ in range(a.calls):
                t = time.perf_counter()
                call(x1)
                ts.append(time.perf_counter() - t)
            res[(k, 1)].append(float(np.median(ts)) * 1e6)
            call(x64)
            t = time.perf_counter()
            for _ in range(a.iters64):
                call(x64)
            res[(k, 64)].append(64 * a.iters64 / (time.perf_counter() - t))
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
    for k in names:
        emit("W5", "sampan", f"int8_{k}", "batch1_latency_us_p50", res[(k, 1)], model="LeNet",
             load=load)
        emit("W5", "sampan", f"int8_{k}", "batch64_samples_per_s", res[(k, 64)],
             model="LeNet", load=load)
    f1, u1 = np.array(res[("fused", 1)]), np.array(res[("unfused", 1)])
    f64, u64 = np.array(res[("fused", 64)]), np.array(res[("unfused", 64)])
    emit("W5", "fused/unfused", "int8", "batch1_speedup_p50", list(u1 / f1), model="LeNet",
         load=load)
    emit("W5", "fused/unfused", "int8", "batch64_throughput_ratio", list(f64 / u64),
         model="LeNet", load=load)


if __name__ == "__main__":
    main()
