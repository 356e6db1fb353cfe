"""Batch-1 latency of the W1 MLP (784-512-512-10) and the W2 LeNet-5 through the Predictor's numba runtime,
its onnxruntime runtime (the whole graph in one engine node), `enable_onnxruntime_offload`
on the numba runtime, and a bare onnxruntime session on the model `sampan.onnx.export`
writes, measured interleaved (round-robin blocks of calls) in one run: p50 and p99 per call.

Usage: python benchmarks/offload_latency.py [--calls N] [--rounds N] [--threads N]"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sampan  # noqa: E402
from sampan import nn  # noqa: E402
from sampan.inference import Config, create_predictor  # noqa: E402


def mlp():
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
    m.eval()
    return m


def lenet():
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                      nn.Linear(84, 10))
    m.eval()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200, help="calls per block")
    ap.add_argument("--rounds", type=int, default=15, help="blocks per runner")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        sampan.set_num_threads(a.threads)
    bench("W1 MLP", mlp(), (784,), a)
    bench("W2 LeNet", lenet(), (1, 28, 28), a)


def bench(label, m, shape, a):
    import onnxruntime as ort
    d = tempfile.mkdtemp(prefix="offload-bench-")
    ex = (sampan.randn(4, *shape),)
    path = sampan.jit.save(m, os.path.join(d, "m.sampan"), ex, dynamic="batch")
    onnx_path = os.path.join(d, "m.onnx")
    sampan.onnx.export(m, ex, onnx_path, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    x = np.random.default_rng(1).standard_normal((1, *shape)).astype(np.float32)
    runners = {}
    for name, runtime, off in (("sampan numba", "numba", None),
                               ("sampan onnxruntime runtime", "onnxruntime", None),
                               ("sampan numba + offload(3)", "numba", 3)):
        c = Config(path)
        c.set_runtime(runtime)
        if off:
            c.enable_onnxruntime_offload(off)
        if a.threads:
            c.set_num_threads(a.threads)
        p = create_predictor(c)
        h = p.get_input_handle(p.get_input_names()[0])
        h.share_external_data(x)
        runners[name] = p.run
    so = ort.SessionOptions()
    if a.threads:
        so.intra_op_num_threads = a.threads
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    feed = {iname: x}
    runners["bare onnxruntime session"] = lambda: sess.run(None, feed)
    ref = sess.run(None, feed)[0]
    for name, fn in runners.items():          # warm-up and a numeric check
        for _ in range(50):
            fn()
    times = {k: [] for k in runners}
    for _ in range(a.rounds):
        for name, fn in runners.items():
            for _ in range(a.calls):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    c = Config(path)
    got = create_predictor(c).run([x])[0]
    print(f"{label} batch 1, {a.rounds} interleaved rounds x {a.calls} calls; onnxruntime "
          f"{ort.__version__}; max |sampan - ort| = {float(np.abs(got - ref).max()):.2e}")
    base = np.percentile(times["bare onnxruntime session"], 50)
    for name, ts in times.items():
        p50, p99 = np.percentile(ts, 50) * 1e6, np.percentile(ts, 99) * 1e6
        print(f"  {name:<30} p50 {p50:8.1f} us   p99 {p99:8.1f} us   "
              f"{p50 / (base * 1e6):5.2f}x bare ort")


if __name__ == "__main__":
    main()
