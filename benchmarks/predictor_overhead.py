"""Per-call Predictor overhead (issue 31: <= 5 us), measured on a no-op model: an identity
program (`forward(x) = x`, saved with a symbolic batch), whose executor runs no kernel,
so what a call costs is the Predictor's own path (handles, input checks, the executor
look-up, the output tree).

Side by side in one run, in blocks whose order rotates (load on the machine falls on
every system alike), p50 of per-call wall time over `--calls` calls per block:

- sampan "zero_copy": `share_external_data(x)` once, then `run()` per call;
- sampan "copy": `copy_from_cpu(x); run(); copy_to_cpu()` per call (w5_inference.py's
  call, what a server does per request);
- sampan "run_list": `run([x])` (copies in, returns copies);
- onnxruntime: an ONNX Identity model, `session.run(None, {"x": x})`;
- python: a plain Python function returning its argument (the floor of any call).

One JSON line per (system, mode) as WORKLOADS.md asks, plus the ratio of each sampan mode
to onnxruntime's and `meets_target` (p50 <= 5 us).

    python benchmarks/predictor_overhead.py [--calls 20000] [--blocks 5] [--batch 1]
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

from common import blas_info, emit  # noqa: E402

TARGET_US = 5.0


def identity_program(folder, features):
    """An identity model saved as a sampan program (batch symbolic)."""
    import sampan
    from sampan import nn

    class Identity(nn.Layer):
        def forward(self, x):
            return x
    return sampan.jit.save(Identity(), os.path.join(folder, "identity.sampan"),
                           (sampan.randn(2, features),), dynamic={"x": {0: "batch"}})


def identity_onnx(folder, features):
    import onnx
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", features])
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = os.path.join(folder, "identity.onnx")
    onnx.save(m, path)
    return path


def systems(folder, x):
    """{(system, mode): call()} for the input `x`."""
    import sampan.inference as inf
    path = identity_program(folder, x.shape[1])
    out = {}
    p = inf.create_predictor(inf.Config(path))
    h = p.get_input_handle("x")
    h.share_external_data(x)
    out[("sampan", "zero_copy")] = p.run
    q = p.clone()
    hq = q.get_input_handle("x")
    oq = q.get_output_handle(q.get_output_names()[0])

    def copy():
        hq.copy_from_cpu(x)
        q.run()
        return oq.copy_to_cpu()
    out[("sampan", "copy")] = copy
    r = p.clone()
    xs = [x]
    out[("sampan", "run_list")] = lambda: r.run(xs)
    try:
        import onnxruntime as ort
        s = ort.InferenceSession(identity_onnx(folder, x.shape[1]),
                                 providers=["CPUExecutionProvider"])
        feed = {"x": x}
        out[("onnxruntime", "fp32")] = lambda: s.run(None, feed)
    except Exception as e:  # noqa: BLE001 - the peer is optional: say why it is missing
        print(f"# onnxruntime unavailable: {type(e).__name__}: {e}", flush=True)

    def ident(a):
        return a
    out[("python", "call")] = lambda: ident(x)
    return out, p


def time_blocks(calls_by, calls, blocks):
    keys = list(calls_by)
    res = {k: [] for k in keys}
    for f in calls_by.values():          # warm-up (compilation happened at the first run)
        for _ in range(max(100, calls // 20)):
            f()
    ts = np.empty(calls, np.int64)
    clock = time.perf_counter_ns
    for b in range(blocks):
        j = b % len(keys)
        for k in keys[j:] + keys[:j]:
            f = calls_by[k]
            for i in range(calls):
                t = clock()
                f()
                ts[i] = clock() - t
            res[k].append(float(np.percentile(ts, 50)) / 1e3)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per block and system")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--features", type=int, default=784)
    a = ap.parse_args(argv)
    x = np.random.default_rng(0).standard_normal((a.batch, a.features)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="sampan-overhead-") as folder:
        calls_by, p = systems(folder, x)
        executor_nodes = len(p.graph.nodes)
        res = time_blocks(calls_by, a.calls, a.blocks)
    info = dict(blas_info(), batch=a.batch, features=a.features, calls=a.calls,
                executor_nodes=executor_nodes)
    for (system, mode), v in res.items():
        extra = dict(info)
        if system == "sampan":
            extra.update(target_us=TARGET_US, meets_target=bool(np.median(v) <= TARGET_US))
        emit("predictor_overhead", system, mode, "call_us_p50", v, lower_is_better=True,
             **extra)
    ort = res.get(("onnxruntime", "fp32"))
    for (system, mode), v in res.items():
        if system == "sampan" and ort:
            emit("predictor_overhead", f"sampan_{mode}/onnxruntime_fp32", mode,
                 "call_p50_ratio", [s / o for s, o in zip(v, ort)], lower_is_better=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
