"""`sampan deploy --target wasm`: the C target's `model.c` compiled to WebAssembly.

The C library `sampan deploy --target c` writes (portable C99 and libc) is compiled with
`zig cc -target wasm32-wasi` (the `ziglang` package from PyPI: `pip install
'sampan[edge]'`) as a WASI *reactor* (no `main`; `_initialize` sets up libc), with SIMD128
unless `simd=False`, together with `web_assets/wasm_glue.c`: a fixed file of ours that
exports the model's C API under stable names (`sw_create`, `sw_run`, the descriptors ...)
for `model.mjs`. The folder it writes:

- `model.wasm`: the model's kernels, its static buffers and the bits of libc it calls;
- `model.mjs`: the JS loader (Node >= 18 and browsers): `await load(wasmUrl, weightsUrl)`
  returns `{inputs, outputs, run(arrays), close()}`; it answers the module's few WASI calls
  itself (a minimal shim) or takes Node's own WASI (`{wasi: new WASI({version:
  "preview1"})}`);
- `weights.bin`: the C target's checksummed weights, handed to the model as bytes (the
  generated code checks them, as natively).

`run_node(folder, inputs)` runs the module under Node (the tests and `benchmarks/edge.py`
use it). Nothing read from the program is pasted into any file written here: the C is
the C target's, the glue and the loader are fixed files, and the model prefix reaches the
compiler as a `-D` definition that `sampan.runtime.emit.name` checked.

Example::

    >>> sampan.deploy.wasm.generate_wasm("lenet.sampan", "out")   # needs ziglang
    >>> # node: const m = await load("out/model.wasm", "out/weights.bin"); m.run([x])
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from .kernelsource import DeployError

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web_assets")
WASM, LOADER, WEIGHTS = "model.wasm", "model.mjs", "weights.bin"
# the C target writes model.c / model.h / weights.bin; the glue is ours
_C_FILES = ("model.c", "model.h")


@dataclass
class WasmBuilt:
    """What `build_wasm` wrote: the folder, the module's and the weights' sizes (bytes)."""
    folder: str
    wasm_bytes: int
    weights_bytes: int
    simd: bool
    warnings: str = ""       # what zig cc (-Wall -Wextra) printed; empty for sampan's C

    def report(self) -> str:
        return (f"{os.path.join(self.folder, WASM)}: {self.wasm_bytes / 1024:.1f} KiB "
                f"(wasm32-wasi{', SIMD128' if self.simd else ''}); {WEIGHTS}: "
                f"{self.weights_bytes / 1024:.1f} KiB; loader {LOADER}")


def zig() -> list:
    """The command that runs zig (`python -m ziglang`), or a DeployError saying how to get it."""
    if importlib.util.find_spec("ziglang") is None:
        raise DeployError("sampan deploy --target wasm: the wasm toolchain is missing: "
                          "pip install ziglang (or: pip install 'sampan[edge]')")
    return [sys.executable, "-m", "ziglang"]


def node() -> str:
    """The `node` executable (Node.js >= 18), or a DeployError."""
    n = shutil.which("node")
    if n is None:
        raise DeployError("sampan deploy: Node.js (`node`) is not on PATH; install it "
                          "(Debian: apt-get install nodejs) to run the wasm module")
    return n


# extra -D flags for model.c in wasm. The C target's 16-float vector-extension kernels stay
# on (no -DSP_NO_VECTORS): in V8 (Node 20, under load) its conv through them ran LeNet 2.2x
# faster at batch 1 than the plain loops. The GEMMs pick their blocking for wasm themselves
# (`__wasm_simd128__`: half panels, 4 rows x 8 floats, see templates.py's SP_GEMM_NARROW),
# and every kernel stays a function of its own there (files.py's SP_KERNEL: noinline).
WASM_DEFINES: list = []


def compile_flags(simd: bool = True) -> list:
    """zig cc's flags for model.wasm (also what `warm_toolchain` builds libc for)."""
    return ["cc", "-target", "wasm32-wasi", "-O3", "-mexec-model=reactor", "-s",
            "-std=c99", "-Wall", "-Wextra"] + (["-msimd128"] if simd else [])


def build_wasm(c_dir: str, out_dir: str, *, prefix: str = "model", simd: bool = True,
               timeout: float = 600) -> WasmBuilt:
    """Compile the C target in `c_dir` (model.c, model.h, weights.bin) to `out_dir`/model.wasm
    beside model.mjs and weights.bin. `prefix` is the C API's prefix (model.h's names)."""
    from ..runtime import emit
    pfx = str(emit.name(prefix, "C prefix"))
    for f in _C_FILES + (WEIGHTS,):
        if not os.path.isfile(os.path.join(c_dir, f)):
            raise DeployError(f"sampan deploy --target wasm: {c_dir!r} has no {f}: expected "
                              "the folder `sampan deploy --target c` writes")
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".{WASM}.{os.getpid()}.tmp")
    cmd = zig() + compile_flags(simd) + WASM_DEFINES + [
        f"-DSW_PREFIX={pfx}", f"-DSW_PREFIX_UPPER={pfx.upper()}", "-I", c_dir, os.path.join(c_dir, "model.c"),
        os.path.join(ASSETS, "wasm_glue.c"), "-lm", "-o", tmp]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeployError(f"sampan deploy --target wasm: zig cc ran over {timeout:.0f} s") from None
    if r.returncode != 0 or not os.path.exists(tmp):
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise DeployError("sampan deploy --target wasm: zig cc failed:\n" +
                          (r.stderr or r.stdout).strip()[-4000:])
    os.replace(tmp, os.path.join(out_dir, WASM))
    for src, name in ((os.path.join(ASSETS, LOADER), LOADER),
                      (os.path.join(c_dir, WEIGHTS), WEIGHTS)):
        dst = os.path.join(out_dir, name)
        if os.path.abspath(src) != os.path.abspath(dst):
            _copy(src, dst)
    return WasmBuilt(out_dir, os.path.getsize(os.path.join(out_dir, WASM)),
                     os.path.getsize(os.path.join(out_dir, WEIGHTS)), simd,
                     (r.stderr or "").strip())


def _copy(src: str, dst: str) -> None:
    """Copy atomically (`sampan._atomic`: a temporary file beside `dst`, then rename)."""
    from .. import _atomic

    def write(f):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f)
    _atomic.write_file(dst, write)


def generate_wasm(program: str, out_dir: str, *, simd: bool = True, **c_options) -> WasmBuilt:
    """`sampan deploy PROGRAM --target wasm -o OUT`: the C target into a temporary folder
    (`c_options` go to it), compiled to `out_dir`."""
    from .c import generate_c
    with tempfile.TemporaryDirectory(prefix="sampan-wasm-") as c_dir:
        g = generate_c(program, c_dir, **c_options)
        return build_wasm(c_dir, out_dir, prefix=g.prefix, simd=simd)


def run_node(folder: str, inputs, *, reps: int = 0, wasi: bool = False,
             timeout: float = 120) -> dict:
    """Run `folder`'s model.wasm in Node on `inputs` (numpy arrays, descriptor order):
    {"outputs": [arrays], "us": [per-call microseconds of `reps` timed calls]}. `wasi=True`
    uses Node's own WASI (node:wasi) instead of the loader's shim."""
    with tempfile.TemporaryDirectory(prefix="sampan-node-") as tmp:
        spec = _write_inputs(tmp, inputs)
        cmd = [node(), "--no-warnings", os.path.join(ASSETS, "run_node.mjs"), folder, tmp,
               str(int(reps)), "wasi" if wasi else "shim"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise DeployError(f"sampan deploy: the wasm model failed in Node: "
                              f"{(r.stderr or r.stdout).strip()[-2000:]}")
        return _read_outputs(tmp, json.loads(r.stdout.strip().splitlines()[-1]), spec)


def _write_inputs(tmp: str, inputs) -> list:
    spec = []
    for i, a in enumerate(inputs):
        a = np.ascontiguousarray(a)
        a.astype(a.dtype.newbyteorder("<"), copy=False).tofile(os.path.join(tmp, f"in{i}.bin"))
        spec.append(str(a.dtype))
    return spec


def _read_outputs(tmp: str, res: dict, spec) -> dict:
    outs = []
    for j, o in enumerate(res["outputs"]):
        a = np.fromfile(os.path.join(tmp, f"out{j}.bin"), dtype=np.dtype(o["dtype"]).newbyteorder("<"))
        outs.append(a.astype(a.dtype.newbyteorder("="), copy=False).reshape(o["shape"]))
    return {"outputs": outs, "us": res.get("us", []), "inputs": spec}


def warm_toolchain(simd: bool = True) -> None:
    """Build zig's wasm32-wasi libc for `compile_flags(simd)` once (zig caches it: the first
    build takes tens of seconds), by compiling an empty reactor."""
    with tempfile.TemporaryDirectory(prefix="sampan-zig-") as d:
        src = os.path.join(d, "w.c")
        with open(src, "w") as f:
            f.write("#include <math.h>\n#include <stdlib.h>\n"
                    "__attribute__((export_name(\"w\"))) float w(float x) "
                    "{ void *p = malloc(4); free(p); return expf(x); }\n")
        subprocess.run(zig() + compile_flags(simd) + [src, "-lm", "-o", os.path.join(d, "w.wasm")],
                       check=True, capture_output=True)


__all__ = ["build_wasm", "generate_wasm", "run_node", "WasmBuilt", "zig", "node",
           "compile_flags", "warm_toolchain"]
