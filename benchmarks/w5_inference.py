"""W5 inference side by side: the W1 MLP and the W2 LeNet-5, trained on the planted 10-class
28x28 task (w5_prune.planted), saved with `sampan.jit.save(..., dynamic={"x": {0: "batch"}})`
and served by

- the sampan Predictor (`sampan.inference`), runtimes "numba" and "numpy" (and
  "onnxruntime" where `Config.set_runtime("onnxruntime")` is available),
- onnxruntime on the same model exported by `sampan.onnx.export`,
- PyTorch eager on the same weights (sampan's Linear weight is (in, out): transposed),

all in one run: batch-1 latency (us, p50 and p99 of per-call wall time, thousands of calls
after warm-up) and batch-64 throughput (samples/s), in blocks interleaved and rotated so
that load on the machine falls on every system alike (as w1_w3_train.py). Each timed line
carries the system's accuracy on the planted test set; the ratio lines pair each block of
a sampan system with the same block of a peer (Predictor p50 / onnxruntime p50, ...).
int8 rows (sampan.quant's `quantize_program`, and onnxruntime's static QDQ quantisation of
the same export) appear where `sampan.quant` exists; otherwise a `#` line says so.

A Predictor call is what a server does per request: `copy_from_cpu(x)`, `run()`,
`copy_to_cpu()`; onnxruntime's is `session.run(None, {"x": x})`, PyTorch's
`model(torch.from_numpy(x))` under `torch.inference_mode()`.

    python benchmarks/w5_inference.py [--calls 2000] [--blocks 5] [--models MLP LeNet]
"""
from __future__ import annotations

import argparse
import json
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

import models as M  # noqa: E402
from common import ROOT, emit  # noqa: E402

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RUNTIMES = ("numba", "numpy", "onnxruntime")
EVAL_BATCH = 64


def first_line(e, n=200):
    msg = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {msg[:n]}"


# ---------------------------------------------------------------------- models
def mlp_layer():
    from sampan import nn
    net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 10))
    w = M.w1_weights()
    for i, k in enumerate((0, 2, 4)):
        net[k].weight._data[...] = w[f"w{i}"]
        net[k].bias._data[...] = w[f"b{i}"]
    return net


def torch_model(name, net):
    """The PyTorch twin of a trained sampan Sequential (Linear weights transposed)."""
    import torch
    tn = torch.nn
    if name == "MLP":
        t = tn.Sequential(tn.Linear(784, 512), tn.ReLU(), tn.Linear(512, 512), tn.ReLU(),
                          tn.Linear(512, 10))
    else:
        t = tn.Sequential(tn.Conv2d(1, 6, 5, padding=2), tn.ReLU(), tn.MaxPool2d(2),
                          tn.Conv2d(6, 16, 5), tn.ReLU(), tn.MaxPool2d(2), tn.Flatten(),
                          tn.Linear(400, 120), tn.ReLU(), tn.Linear(120, 84), tn.ReLU(),
                          tn.Linear(84, 10))
    with torch.no_grad():
        for a, b in zip(net, t):
            if hasattr(b, "weight"):
                w = a.weight.numpy()
                b.weight.copy_(torch.from_numpy(w.T.copy() if w.ndim == 2 else w))
                b.bias.copy_(torch.from_numpy(a.bias.numpy()))
    return t.eval()


def data(name, n_train, n_test):
    from w5_prune import planted
    xtr, ytr = planted(n_train, 1)
    xte, yte = planted(n_test, 2)
    if name == "MLP":
        xtr, xte = xtr.reshape(len(xtr), 784), xte.reshape(len(xte), 784)
    return xtr, ytr, xte, yte


def trained(name, steps, n_train, n_test):
    import sampan
    from w5_prune import lenet, train
    xtr, ytr, xte, yte = data(name, n_train, n_test)
    sampan.manual_seed(0)
    net = mlp_layer() if name == "MLP" else lenet()
    t = time.perf_counter()
    train(net, xtr, ytr, steps, 1e-3)
    print(f"# {name}: trained {steps} steps in {time.perf_counter() - t:.1f} s", flush=True)
    return net, xtr, xte, yte


# ---------------------------------------------------------------------- systems
class System:
    """One way of serving a model: `call(x)` -> logits (numpy) for any batch size."""

    def __init__(self, name, mode, call1, call64, note=None):
        self.name, self.mode, self.call1, self.call64 = name, mode, call1, call64
        self.note = note or {}


def predictor_system(path, runtime, mode, threads=None):
    import sampan.inference as inf
    cfg = inf.Config(path)
    cfg.set_runtime(runtime)
    if threads:
        cfg.set_num_threads(threads)
    p1 = inf.create_predictor(cfg)
    p64 = p1.clone()
    ops = {}
    for n in p1.graph.nodes:                 # what serves the model (fuse_layers' nodes)
        ops[n.op] = ops.get(n.op, 0) + 1

    def caller(p):
        h = p.get_input_handle(p.get_input_names()[0])
        o = p.get_output_handle(p.get_output_names()[0])

        def call(x):
            h.copy_from_cpu(x)
            p.run()
            return o.copy_to_cpu()
        return call
    return System("sampan", mode, caller(p1), caller(p64), {"runtime": runtime,
                                                            "graph_ops": ops})


def ort_system(onnx_path, mode, threads=None):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    s = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    iname, oname = s.get_inputs()[0].name, s.get_outputs()[0].name

    def call(x):
        return s.run([oname], {iname: x})[0]
    return System("onnxruntime", mode, call, call, {"onnxruntime": ort.__version__,
                                                     "ort_threads": threads or "default"})


def torch_system(tmodel):
    import torch

    def call(x):
        with torch.inference_mode():
            return tmodel(torch.from_numpy(x)).numpy()
    return System("pytorch", "eager", call, call, {"torch": torch.__version__,
                                                     "torch_threads": torch.get_num_threads()})


def ort_int8(onnx_path, out_path, cal):
    """onnxruntime's static QDQ quantisation (per-channel int8 weights, uint8 activations,
    min-max calibration) of the same export."""
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": b} for b in cal])

        def get_next(self):
            return next(self.it, None)
    q.quantize_static(onnx_path, out_path, Reader(), quant_format=q.QuantFormat.QDQ,
                      per_channel=True, weight_type=q.QuantType.QInt8,
                      activation_type=q.QuantType.QUInt8)
    return out_path


def build_systems(name, net, xtr, xte, folder, log, threads=None):
    """Every system serving `net`; the skipped ones print a `#` line saying why."""
    import sampan
    ex = (sampan.tensor(xte[:2]),)
    path = sampan.jit.save(net, os.path.join(folder, f"{name}.sampan"), ex,
                           dynamic={"x": {0: "batch"}})
    systems = []
    for rt in RUNTIMES:
        try:
            systems.append(predictor_system(path, rt, f"predictor_{rt}", threads))
        except Exception as e:  # onnxruntime runtime not in this sampan yet
            log(f"# {name}: Predictor runtime {rt!r} unavailable: {first_line(e)}")
    onnx_path = os.path.join(folder, f"{name}.onnx")
    sampan.onnx.export(net, ex, onnx_path, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    systems.append(ort_system(onnx_path, "fp32", threads))
    systems.append(torch_system(torch_model(name, net)))
    quant = quant_module()
    if quant is None:
        log(f"# {name}: int8 not available: sampan.quant is not in this sampan")
    if quant is not None:
        cal = [np.ascontiguousarray(xtr[i:i + 64]) for i in range(0, 8 * 64, 64)]
        try:
            q8 = quant.quantize_program(path, cal, os.path.join(folder, f"{name}-int8.sampan"))
        except Exception as e:
            q8 = None
            log(f"# {name}: sampan.quant.quantize_program failed: {first_line(e)}")
        for rt in RUNTIMES if q8 else ():
            try:
                systems.append(predictor_system(q8, rt, f"predictor_{rt}_int8", threads))
            except Exception as e:
                log(f"# {name}: int8 Predictor runtime {rt!r} unavailable: {first_line(e)}")
        try:
            # opset 21: onnxruntime 1.32 has no QuantizeLinear kernel at the newest opset
            # that sampan.onnx.export picks (28), and quantize_static keeps the model's
            o21 = os.path.join(folder, f"{name}-21.onnx")
            sampan.onnx.export(net, ex, o21, opset=21, input_names=["x"],
                               dynamic_axes={"x": {0: "batch"}})
            qo = ort_int8(o21, os.path.join(folder, f"{name}-int8.onnx"), cal)
            systems.append(ort_system(qo, "int8_qdq", threads))
        except Exception as e:
            log(f"# {name}: onnxruntime int8 quantisation failed: {first_line(e)}")
    return systems


def quant_module():
    """`sampan.quant` when this sampan has it (an editable install can resolve the name in
    another checkout's tree: that one does not count), else None."""
    import importlib.util

    import sampan
    spec = importlib.util.find_spec("sampan.quant")
    home = os.path.realpath(os.path.dirname(sampan.__file__))
    if spec is None or not spec.origin or not os.path.realpath(spec.origin).startswith(
            home + os.sep):
        return None
    import sampan.quant
    return sampan.quant


def accuracy(call, x, y):
    """Top-1 accuracy over x in batches of EVAL_BATCH (the last one padded)."""
    correct = 0
    for i in range(0, len(x), EVAL_BATCH):
        b = x[i:i + EVAL_BATCH]
        n = len(b)
        if n < EVAL_BATCH:
            b = np.concatenate([b, np.zeros((EVAL_BATCH - n,) + b.shape[1:], b.dtype)])
        pred = call(np.ascontiguousarray(b))[:n].argmax(-1)
        correct += int((pred == y[i:i + n]).sum())
    return correct / len(x)


# ---------------------------------------------------------------------- timing
def time_blocks(systems, x1, x64, calls, iters64, blocks, pause):
    """Per block and system: the p50 and p99 of `calls` batch-1 calls (us) and the
    samples/s of `iters64` batch-64 calls; blocks rotate the order of the systems."""
    res = {id(s): {"p50": [], "p99": [], "sps": []} for s in systems}
    for s in systems:                      # warm-up: compilation, caches, thread pools
        for _ in range(max(20, calls // 10)):
            s.call1(x1)
        for _ in range(max(3, iters64 // 10)):
            s.call64(x64)
    ts = np.empty(calls, np.int64)
    clock = time.perf_counter_ns
    for r in range(blocks):
        k = r % len(systems)
        for s in systems[k:] + systems[:k]:
            time.sleep(pause)              # the previous system's thread pools go idle
            f = s.call1
            for i in range(calls):
                t = clock()
                f(x1)
                ts[i] = clock() - t
            res[id(s)]["p50"].append(float(np.percentile(ts, 50)) / 1e3)
            res[id(s)]["p99"].append(float(np.percentile(ts, 99)) / 1e3)
            g = s.call64
            time.sleep(pause)              # its own batch-1 threads too (BLAS, OpenMP)
            t = clock()
            for _ in range(iters64):
                g(x64)
            res[id(s)]["sps"].append(64 * iters64 * 1e9 / (clock() - t))
    return res


def run_model(name, args, info, folder, log):
    import sampan
    net, xtr, xte, yte = trained(name, args.steps[name], args.train, args.test)
    net.eval()
    systems = build_systems(name, net, xtr, xte, folder, log, args.threads)
    # correctness first: every system's logits on a fixed batch against sampan eager
    with sampan.no_grad():
        ref = net(sampan.tensor(xte[:EVAL_BATCH])).numpy()
    kept = []
    for s in systems:
        got = s.call64(np.ascontiguousarray(xte[:EVAL_BATCH]))
        err = float(np.abs(got - ref).max())
        s.note["max_abs_err_vs_eager"] = round(err, 6)
        tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
        if "int8" in s.mode or err <= tol:
            kept.append(s)
        else:
            log(f"# {name} {s.name} {s.mode}: logits differ from sampan eager by {err:.2e} "
                f"(> {tol:.1e}): excluded from timing")
    for s in kept:
        s.note["accuracy"] = round(accuracy(s.call64, xte, yte), 4)
    x1 = np.ascontiguousarray(xte[:1])
    x64 = np.ascontiguousarray(xte[:64])
    res = time_blocks(kept, x1, x64, args.calls, args.iters64, args.blocks, args.pause)
    common = dict(model=name, threads=sampan.get_num_threads(), **info)
    for s in kept:
        r = res[id(s)]
        extra = dict(common, **s.note)
        emit("W5", s.name, s.mode, "batch1_latency_us_p50", r["p50"], calls=args.calls,
             **extra)
        emit("W5", s.name, s.mode, "batch1_latency_us_p99", r["p99"], calls=args.calls,
             **extra)
        emit("W5", s.name, s.mode, "batch64_samples_per_s", r["sps"], iters=args.iters64,
             **extra)
    peers = [s for s in kept if s.name != "sampan"]
    for s in kept:
        if s.name != "sampan":
            continue
        for p in peers:
            if ("int8" in s.mode) != ("int8" in p.mode) and p.name != "pytorch":
                continue               # int8 against int8, fp32 against fp32 (and torch)
            a, b = res[id(s)], res[id(p)]
            tag = f"sampan_{s.mode}/{p.name}_{p.mode}"
            emit("W5", tag, s.mode, "batch1_p50_ratio", [x / y for x, y in
                                                          zip(a["p50"], b["p50"])],
                 model=name, lower_is_better=True)
            emit("W5", tag, s.mode, "batch64_throughput_ratio",
                 [x / y for x, y in zip(a["sps"], b["sps"])], model=name,
                 higher_is_better=True)
            print(json.dumps({"workload": "W5", "system": tag, "mode": s.mode,
                              "metric": "accuracy_delta", "model": name,
                              "value": round(s.note["accuracy"] - p.note["accuracy"], 4)}),
                  flush=True)
        if "int8" in s.mode:
            fp = next((f for f in kept if f.mode == s.mode.replace("_int8", "")), None)
            if fp is not None:
                emit("W5", f"sampan_{s.mode}/sampan_{fp.mode}", s.mode,
                     "batch64_throughput_ratio",
                     [x / y for x, y in zip(res[id(s)]["sps"], res[id(fp)]["sps"])],
                     model=name, accuracy_delta=round(s.note["accuracy"]
                                                      - fp.note["accuracy"], 4),
                     target=2.0, higher_is_better=True)
                # issue 31: int8 against its own fp32 at batch 1 too (speedup, p50)
                emit("W5", f"sampan_{s.mode}/sampan_{fp.mode}", s.mode, "batch1_speedup_p50",
                     [y / x for x, y in zip(res[id(s)]["p50"], res[id(fp)]["p50"])],
                     model=name, target=1.3, higher_is_better=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["MLP", "LeNet"], choices=["MLP", "LeNet"])
    ap.add_argument("--calls", type=int, default=2000, help="batch-1 calls per block")
    ap.add_argument("--iters64", type=int, default=100, help="batch-64 calls per block")
    ap.add_argument("--blocks", type=int, default=5, help="timed blocks per system")
    ap.add_argument("--pause", type=float, default=0.2,
                    help="seconds idle before each timed loop (thread pools of the loop "
                         "before go to sleep: a busy 2-core machine showed 1.3 ms and 15 ms "
                         "for the same batch-64 call right after PyTorch ran)")
    ap.add_argument("--mlp-steps", type=int, default=600, help="MLP training steps")
    ap.add_argument("--lenet-steps", type=int, default=800, help="LeNet training steps")
    ap.add_argument("--train", type=int, default=12000, help="planted training images")
    ap.add_argument("--test", type=int, default=3000, help="planted test images")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for every system (sampan's BLAS and kernels, onnxruntime's "
                         "intra-op pool, torch); default: sampan's own count, onnxruntime's "
                         "default pool")
    args = ap.parse_args(argv)
    args.steps = {"MLP": args.mlp_steps, "LeNet": args.lenet_steps}
    import sampan  # before torch: sampan's OpenMP wait policy is set before torch's
    import torch   # bundled libgomp loads (a libgomp loaded first keeps spinning)
    from onnx_conformance import machine
    if args.threads:
        sampan.set_num_threads(args.threads)
    torch.set_num_threads(sampan.get_num_threads())   # the same threads as sampan's
    info = machine()

    def log(msg):
        print(msg, flush=True)
    with tempfile.TemporaryDirectory(prefix="sampan-w5-") as folder:
        for name in args.models:
            run_model(name, args, info, folder, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
