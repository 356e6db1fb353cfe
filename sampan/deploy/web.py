"""`sampan deploy --target web`: a self-contained folder whose page runs the model.

The folder (`build_web`) holds `index.html` and `page.mjs` (fixed files of ours), the wasm
target's `model.mjs`, `model.wasm` and `weights.bin`, `page.json` (data: the title, the
input's drawing size and pixel range, the files below), the input it was given
(`input<i>.bin`, raw little-endian, in each input's dtype) and, unless `onnx=False`, the
program's ONNX export (`model.onnx`, by `sampan.onnx`) with onnxruntime-web's wasm build
vendored into `ort/` from a local `node_modules` (never fetched by the page). Served from
any static server, the page runs the model on the given input (or a digit drawn on its
canvas when the input is one image), shows the answer and its batch-1 latency, and the same
for onnxruntime-web (wasm backend, one thread, as model.wasm).

`serve(folder)` serves a folder on 127.0.0.1 (a free port, cross-origin isolated so that
the page's clock is fine-grained); `run_headless(folder, inputs)` opens it in headless
Chromium (Debian's `chromium`, driven by npm's `playwright-core`; no browser download) and
returns the page's outputs and timings. `node_modules()` says where the npm packages are:
`$SAMPAN_NODE_MODULES`, else `build/node/node_modules` beside the sampan package (where
`make test` installs them), else `~/.cache/sampan/node/node_modules`.

Example::

    >>> sampan.deploy.web.build_web("digits.sampan", "site", sample=x[:1])
    >>> with sampan.deploy.web.serve("site") as url: print(url)     # open it in a browser
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

import numpy as np

from .kernelsource import DeployError
from .wasm import ASSETS, _copy, build_wasm, node

PAGE_FILES = ("index.html", "page.mjs")
# onnxruntime-web's wasm build (ESM): the API module and the wasm runtime it loads
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
CHROMIUM = "/usr/bin/chromium"
# the ONNX opset of the page's export: 21 (IR version 10) loads in every onnxruntime-web
# since 1.20, whereas the newest opset of the Python onnxruntime may be past the npm one's
WEB_OPSET = 21


@dataclass
class WebBuilt:
    """What `build_web` wrote: the folder, and bytes of each part."""
    folder: str
    wasm_bytes: int
    weights_bytes: int
    onnx_bytes: int
    ort_bytes: int
    wasm_warnings: str = ""

    def report(self) -> str:
        kb = 1024
        s = (f"{self.folder}: index.html + model.wasm {self.wasm_bytes / kb:.1f} KiB + "
             f"weights {self.weights_bytes / kb:.1f} KiB")
        if self.onnx_bytes:
            s += (f"; for comparison: model.onnx {self.onnx_bytes / kb:.1f} KiB + "
                  f"onnxruntime-web {self.ort_bytes / kb / kb:.1f} MiB")
        return s


def node_modules(required: bool = True):
    """The folder holding the npm packages (playwright-core, onnxruntime-web), or None."""
    env = os.environ.get("SAMPAN_NODE_MODULES")
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for d in ([env] if env else []) + [os.path.join(here, "build", "node", "node_modules"),
                                       os.path.expanduser("~/.cache/sampan/node/node_modules")]:
        if d and os.path.isdir(d):
            return d
    if required:
        raise DeployError("sampan deploy --target web: no node_modules with onnxruntime-web "
                          "and playwright-core: run `make web-deps` (npm install --prefix "
                          "build/node playwright-core onnxruntime-web) or set "
                          "SAMPAN_NODE_MODULES")
    return None


def has_package(name: str) -> bool:
    d = node_modules(required=False)
    return bool(d) and os.path.isfile(os.path.join(d, name, "package.json"))


def chromium() -> str | None:
    """The system Chromium (`$CHROMIUM` or /usr/bin/chromium), or None."""
    c = os.environ.get("CHROMIUM", CHROMIUM)
    return c if os.path.isfile(c) and os.access(c, os.X_OK) else None


def build_web(program: str | None, out_dir: str, *, c_dir: str | None = None,
              prefix: str = "model", sample=None, onnx=True, title: str | None = None,
              image=None, pixel_max: float | None = None, simd: bool = True,
              **c_options) -> WebBuilt:
    """Write the web folder of saved program `program` to `out_dir`. The C target is
    generated (`c_options` go to it) unless `c_dir` names one already written. `sample`:
    the input the page runs first, at batch 1 (an array, or a tuple with one per input;
    zeros when None). `image=(H, W)`: the
    drawing pad's size; by default the input's last two dims when it is one 2-D image (or a
    perfect square of pixels). `pixel_max`: the value of a white pixel (default the sample's
    maximum, else 1). `onnx`: the comparison's ONNX file (a path), True to export the
    program with `sampan onnx export` (opset `WEB_OPSET`), False for none."""
    with contextlib.ExitStack() as stack:
        if c_dir is None:
            if program is None:
                raise DeployError("sampan deploy --target web: give a program or a C folder")
            from .c import generate_c
            c_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="sampan-web-"))
            prefix = generate_c(program, c_dir, prefix=prefix, **c_options).prefix
        w = build_wasm(c_dir, out_dir, prefix=prefix, simd=simd)
    for f in PAGE_FILES:
        _copy(os.path.join(ASSETS, f), os.path.join(out_dir, f))
    descs = _inputs_of(out_dir)
    desc = descs[0]
    cfg = {"title": title or f"sampan: {os.path.basename(os.path.normpath(program or c_dir))}",
           "inputs": descs, "samples": [], "onnx": None, "ort": None, "ort_dir": None,
           "image": list(image) if image else _image_of(desc["shape"]), "pixel_max": 1.0}
    if sample is not None:
        given = list(sample) if isinstance(sample, (tuple, list)) else [sample]
        if len(given) != len(descs):
            raise DeployError(f"sampan deploy --target web: sample has {len(given)} arrays; "
                              f"the model has {len(descs)} inputs "
                              f"({', '.join(d['name'] for d in descs)})")
        for i, (x, d) in enumerate(zip(given, descs)):
            a = _sample_array(x, d)
            _write(os.path.join(out_dir, f"input{i}.bin"),
                   a.astype(a.dtype.newbyteorder("<")).tobytes())
            cfg["samples"].append(f"input{i}.bin")
        a0 = np.asarray(given[0])
        cfg["pixel_max"] = float(a0.max()) if a0.size and a0.max() > 0 else 1.0
    if pixel_max is not None:
        cfg["pixel_max"] = float(pixel_max)
    onnx_bytes = ort_bytes = 0
    if onnx is not False and onnx is not None and (
            program is not None or not isinstance(onnx, bool)):
        onnx_bytes = _export_onnx(program, onnx, os.path.join(out_dir, "model.onnx"))
        ort_bytes = _vendor_ort(os.path.join(out_dir, "ort"))
        cfg.update(onnx="model.onnx", ort="./ort/ort.wasm.min.mjs", ort_dir="ort/")
    _write(os.path.join(out_dir, "page.json"), json.dumps(cfg, indent=1).encode())
    return WebBuilt(out_dir, w.wasm_bytes, w.weights_bytes, onnx_bytes, ort_bytes, w.warnings)


def _write(path: str, data: bytes) -> None:
    from .. import _atomic
    _atomic.write_file(path, lambda f: f.write(data))


def _sample_array(x, d) -> np.ndarray:
    """One given input as the descriptor's dtype, at batch 1 (checked, not reshaped)."""
    a = np.asarray(x)
    want = [1 if s < 0 else s for s in d["shape"]]
    if a.size != int(np.prod(want)):
        raise DeployError(f"sampan deploy --target web: the sample for input {d['name']} has "
                          f"shape {list(a.shape)}; expected {want} (batch 1)")
    if a.dtype.kind != np.dtype(d["dtype"]).kind and not (
            a.dtype.kind in "iu" and np.dtype(d["dtype"]).kind in "iu"):
        raise DeployError(f"sampan deploy --target web: the sample for input {d['name']} is "
                          f"{a.dtype}; expected {d['dtype']}")
    return np.ascontiguousarray(a, dtype=np.dtype(d["dtype"]))


def _inputs_of(folder: str) -> list:
    """The model's input descriptors, asked of model.wasm itself (in Node)."""
    r = subprocess.run([node(), "--no-warnings", "--input-type=module", "-e",
                        "const [d] = process.argv.slice(1);"
                        "const { load } = await import(new URL('model.mjs', 'file://' + d + '/'));"
                        "const m = await load(d + '/model.wasm', d + '/weights.bin');"
                        "console.log(JSON.stringify(m.inputs));",
                        os.path.abspath(folder)], capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise DeployError(f"sampan deploy --target web: model.wasm did not load in Node: "
                          f"{(r.stderr or r.stdout).strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _image_of(shape) -> list | None:
    """(H, W) when the input is one single-channel image: [-1, 1, H, W], [-1, H, W], or
    [-1, H*W] with H*W a perfect square."""
    dims = [d for d in shape[1:] if d != 1]
    if len(dims) == 2:
        return dims
    if len(dims) == 1 and dims[0] >= 64 and int(round(dims[0] ** 0.5)) ** 2 == dims[0]:
        r = int(round(dims[0] ** 0.5))
        return [r, r]
    return None


def _export_onnx(program: str, onnx, path: str) -> int:
    """model.onnx: the file given (`onnx` a path), or the program exported by the `sampan
    onnx export` command (a separate process: deploy and onnx are features of one floor
    that do not import each other)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    if isinstance(onnx, (str, os.PathLike)):
        _copy(os.fspath(onnx), path)
        return os.path.getsize(path)
    r = subprocess.run([sys.executable, "-c", "import sys; from sampan.cli import main; "
                        "sys.exit(main())", "onnx", "export", program, "-o", tmp,
                        "--opset", str(WEB_OPSET)], capture_output=True, text=True, timeout=300)
    if r.returncode or not os.path.isfile(tmp):
        raise DeployError("sampan deploy --target web: `sampan onnx export` failed (pass "
                          "onnx=False or --no-onnx to leave out the comparison): "
                          f"{(r.stderr or r.stdout).strip()[-2000:]}")
    os.replace(tmp, path)
    return os.path.getsize(path)


def _vendor_ort(dst: str) -> int:
    src = os.path.join(node_modules(), "onnxruntime-web", "dist")
    missing = [f for f in ORT_FILES if not os.path.isfile(os.path.join(src, f))]
    if missing:
        raise DeployError(f"sampan deploy --target web: {src} lacks {', '.join(missing)}: "
                          "expected onnxruntime-web >= 1.19 (npm install onnxruntime-web)")
    os.makedirs(dst, exist_ok=True)
    for f in ORT_FILES:
        _copy(os.path.join(src, f), os.path.join(dst, f))
    return sum(os.path.getsize(os.path.join(dst, f)) for f in ORT_FILES)


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".mjs": "text/javascript", ".js": "text/javascript",
                      ".wasm": "application/wasm", ".json": "application/json",
                      ".onnx": "application/octet-stream", ".bin": "application/octet-stream"}

    def end_headers(self):
        # cross-origin isolated: performance.now() at microsecond resolution
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def serve(folder: str):
    """Serve `folder` on 127.0.0.1 (a free port) in a thread; yields its URL."""
    if not os.path.isfile(os.path.join(folder, "index.html")):
        raise DeployError(f"sampan deploy: {folder!r} has no index.html: expected a folder "
                          "`sampan deploy --target web` wrote")
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=os.path.abspath(folder)))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join()


def run_headless(folder: str, inputs=None, *, reps: int = 0, ort: bool = False,
                 screenshot: str | None = None, click_run: bool = False,
                 timeout: float = 180) -> dict:
    """Open `folder`'s page in headless Chromium; run the model on `inputs` (numpy arrays,
    descriptor order) in the page, and onnxruntime-web too when `ort`. Returns {"answer":
    what the page showed for its given input, "sampan": {"outputs": [arrays], "us": [...]},
    "ort": the same or None, "browser": version}; with `click_run`, also "drawn": the
    answers after pressing the drawing pad's Run on what it shows."""
    return run_pages([dict(folder=folder, inputs=inputs, reps=reps, ort=ort,
                           screenshot=screenshot, click_run=click_run)], timeout=timeout)[0]


def run_pages(jobs, *, timeout: float = 300) -> list:
    """`run_headless` for several folders in one Chromium (one launch): `jobs` is a list of
    dicts of run_headless's arguments (`folder` and the keywords); one result each."""
    if chromium() is None:
        raise DeployError(f"sampan deploy: no Chromium at {CHROMIUM} (apt-get install chromium)")
    mods = node_modules()
    if not has_package("playwright-core"):
        raise DeployError(f"sampan deploy: {mods} has no playwright-core (npm install playwright-core)")
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="sampan-chromium-"))
        pages = []
        for j in jobs:
            inputs = j.get("inputs")
            pages.append({"url": stack.enter_context(serve(j["folder"])),
                          "inputs": [np.asarray(a).ravel().tolist() for a in inputs]
                          if inputs is not None else None,
                          "reps": int(j.get("reps", 0)), "ort": bool(j.get("ort", False)),
                          "screenshot": j.get("screenshot"),
                          "click_run": bool(j.get("click_run", False))})
        rp = os.path.join(tmp, "request.json")
        with open(rp, "w") as f:
            json.dump({"pages": pages}, f)
        env = dict(os.environ, CHROMIUM=chromium())
        r = subprocess.run([node(), "--no-warnings", os.path.join(ASSETS, "drive.mjs"), mods, rp],
                           capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode:
            raise DeployError(f"sampan deploy: the page failed in headless Chromium: "
                              f"{(r.stderr or r.stdout).strip()[-3000:]}")
        results = json.loads(r.stdout.strip().splitlines()[-1])
    for res in results:
        for k in ("sampan", "ort"):
            if res.get(k):
                res[k]["outputs"] = [np.asarray(o["data"], dtype=o["dtype"]).reshape(o["shape"])
                                     for o in res[k]["outputs"]]
    return results


__all__ = ["build_web", "WebBuilt", "serve", "run_headless", "run_pages", "node_modules",
           "chromium", "has_package", "WEB_OPSET"]


def main(argv=None) -> int:
    """`python -m sampan.deploy.web DIR`: serve a web folder on 127.0.0.1 until Ctrl-C (with
    the MIME types and cross-origin isolation the page wants, which a plain static server
    may not give)."""
    import argparse
    import time
    ap = argparse.ArgumentParser(prog="python -m sampan.deploy.web", description=main.__doc__)
    ap.add_argument("folder")
    a = ap.parse_args(argv)
    try:
        with serve(a.folder) as url:
            print(f"serving {a.folder} at {url} (Ctrl-C to stop)", flush=True)
            while True:
                time.sleep(3600)
    except DeployError as e:
        print(e)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
