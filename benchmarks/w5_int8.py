"""W5, int8 part: the W1 MLP (784-512-512-10) as a saved fp32 program and after
`sampan.quant.quantize_program`, and onnxruntime's static QDQ int8 of the same weights
(`quantize_static`, the same calibration batches): batch-64 throughput in one run
(samples/s, median of repetitions with min-max; and per-call p10 / median latency, calls
alternated), batch-1 per-call latency, the int8/fp32 and int8/onnxruntime-int8 ratios
(targets 1.3x at batch 1, 2.0x at batch 64, 1.0x), the int8 ops of the program, the
argmax agreement and largest output difference against fp32. Every line carries the
machine (benchmarks/common.py: machine_info) as `make bench`'s other lines do.
fp32 is also timed with one BLAS/numba thread: on a shared 2-core machine two-thread BLAS
loses most to other load, so the ratio against it swings most. Weights are W1's initial weights (accuracy is measured
by tests/quant on a trained model); calibration is 8 batches of the W1 input distribution.

    OPENBLAS_CORETYPE= OPENBLAS_L2_SIZE= python benchmarks/w5_int8.py [--reps 7]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


def _rates(fns, x, reps, inner):
    """Samples/s of each of `fns` (median, min, max), repetitions interleaved so that a
    busy moment of a shared machine falls on all of them alike."""
    for f in fns.values():
        f(x)
    out = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(inner):
                f(x)
            out[k].append(x.shape[0] * inner / (time.perf_counter() - t))
    return {k: (float(np.median(v)), float(min(v)), float(max(v))) for k, v in out.items()}


def _per_call(fns, x, n=400):
    """Per-call wall time (us) of each of `fns`, calls alternated: the 10th percentile (the
    machine's own speed, least disturbed by other load) and the median."""
    ts = {k: [] for k in fns}
    for _ in range(n):
        for k, f in fns.items():
            t = time.perf_counter()
            f(x)
            ts[k].append(time.perf_counter() - t)
    return {k: (float(np.percentile(v, 10)) * 1e6, float(np.median(v)) * 1e6)
            for k, v in ts.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--inner", type=int, default=50)
    a = ap.parse_args(argv)
    import sys

    import sampan
    from sampan import nn
    from sampan.backends.numba import qkernels as K
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from models import w1_weights
    w = w1_weights()
    m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
    for i, k in enumerate((0, 2, 4)):
        m[k].weight._data[...] = w[f"w{i}"]
        m[k].bias._data[...] = w[f"b{i}"]
    m.eval()
    r = np.random.default_rng(1)
    x = r.standard_normal((64, 784)).astype(np.float32)
    d = tempfile.mkdtemp()
    f32 = os.path.join(d, "w1.sampan")
    sampan.jit.save(m, f32, (sampan.Tensor(x),), dynamic="batch")
    cal = [r.standard_normal((64, 784)).astype(np.float32) for _ in range(8)]
    q8 = sampan.quant.quantize_program(f32, cal, os.path.join(d, "w1-int8.sampan"))
    pf, pq = sampan.jit.load(f32), sampan.jit.load(q8)
    xt = sampan.Tensor(x)
    err = float(np.abs(pf(xt).numpy() - pq(xt).numpy()).max())
    threads = sampan.get_num_threads()

    def f32_one_thread(t):
        sampan.set_num_threads(1)
        try:
            return pf(t)
        finally:
            sampan.set_num_threads(threads)
    fns = {"fp32": pf, "fp32_1thread": f32_one_thread, "int8": pq}
    ort8 = _ort_int8(m, x, cal, d)
    if ort8 is not None:
        fns["ort_int8"] = lambda t: ort8(t.numpy())
    res = _rates(fns, xt, a.reps, a.inner)
    calls = _per_call(fns, xt)
    x1 = sampan.Tensor(x[:1])
    calls1 = _per_call(fns, x1, n=2000)          # batch 1: per-call latency
    from common import machine_info     # the machine every line ran on (make bench)
    base = {"workload": "W5", "model": "W1 MLP", "batch": 64, "metric": "samples_per_s",
            "cpu": _cpu(), "threads": threads, "machine": machine_info()}
    for mode, v in res.items():
        print(json.dumps(dict(base, system="onnxruntime" if mode == "ort_int8" else "sampan",
                              mode=mode, value=v[0], min=v[1], max=v[2],
                              call_us_p10=calls[mode][0], call_us_median=calls[mode][1])))
        print(json.dumps(dict(base, batch=1, metric="batch1_latency_us_p50",
                              system="onnxruntime" if mode == "ort_int8" else "sampan",
                              mode=mode, value=calls1[mode][1], p10=calls1[mode][0])))
    agree = float((pf(xt).numpy().argmax(1) == pq(xt).numpy().argmax(1)).mean())
    out = {"workload": "W5", "metric": "int8_over_fp32",
           "value": res["int8"][0] / res["fp32"][0],
           "batch1_int8_over_fp32_p50": calls1["fp32"][1] / calls1["int8"][1],
           "int8_over_fp32_1thread": res["int8"][0] / res["fp32_1thread"][0],
           "int8_over_fp32_per_call_p10": calls["fp32"][0] / calls["int8"][0],
           "targets": {"batch1": 1.3, "batch64": 2.0, "vs_onnxruntime_int8": 1.0},
           "gemm_path": {"x".join(map(str, key[:3])): c for key, c in K._CHOICE.items()},
           "int8_layers": sorted({n.op for n in sampan.jit.serialize.read(q8)[0].nodes}),
           "argmax_agreement_int8_fp32": agree, "max_abs_diff": err, "cpu": _cpu(),
           "machine": base["machine"]}
    if ort8 is not None:
        out["int8_over_onnxruntime_int8_batch64"] = res["int8"][0] / res["ort_int8"][0]
        out["int8_over_onnxruntime_int8_batch1_p50"] = calls1["ort_int8"][1] / calls1["int8"][1]
    print(json.dumps(out))


def _ort_int8(m, x, cal, d):
    """onnxruntime's static QDQ int8 (per-channel int8 weights, uint8 activations,
    min-max calibration on the same batches) of the same weights, or None."""
    try:
        import onnxruntime as ort
        from onnxruntime import quantization as q

        import sampan
        src = os.path.join(d, "w1-21.onnx")
        # opset 21: onnxruntime has no QuantizeLinear kernel at the newest opset
        sampan.onnx.export(m, (sampan.Tensor(x[:2]),), src, opset=21, input_names=["x"],
                           dynamic_axes={"x": {0: "batch"}})

        class Reader(q.CalibrationDataReader):
            def __init__(self):
                self.it = iter([{"x": b} for b in cal])

            def get_next(self):
                return next(self.it, None)
        dst = os.path.join(d, "w1-int8.onnx")
        q.quantize_static(src, dst, Reader(), quant_format=q.QuantFormat.QDQ,
                          per_channel=True, weight_type=q.QuantType.QInt8,
                          activation_type=q.QuantType.QUInt8)
        s = ort.InferenceSession(dst, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime missing or refusing: say so
        print(f"# onnxruntime int8 unavailable: {type(e).__name__}: {e}")
        return None
    return lambda a: s.run(None, {"x": a})[0]


def _cpu():
    from sampan.backends.choice import cpu_model
    return cpu_model()


if __name__ == "__main__":
    main()
