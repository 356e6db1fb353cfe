"""The `sampan deploy` subcommand (hooked into `sampan/cli.py`)."""
from __future__ import annotations


def _sizes(items):
    out = {}
    for it in items or ():
        k, _, v = it.partition("=")
        if not k or not v.isdigit():
            raise ValueError(f"--size {it!r}: expected NAME=N, e.g. seq=128")
        out[k] = int(v)
    return out


def _sample(path):
    """(web) the page's given input: a .npy file, read without pickles."""
    if path is None:
        return None
    import numpy as np
    return np.load(path, allow_pickle=False)


def _run(a) -> int:
    from . import DeployError, generate, report
    from ..jit.serialize import LoadError
    try:
        if a.report:
            print(report(a.report))
            return 0
        if not a.model:
            raise ValueError("give a saved program to deploy (or --report DIR)")
        if a.target != "numpy":
            extra = {}
            if a.target == "c":
                extra["threads"] = a.threads
            if a.target in ("wasm", "web"):       # one thread in wasm
                extra["simd"] = not a.no_simd
            if a.target == "web":
                extra.update(onnx=not a.no_onnx, sample=_sample(a.sample))
            r = generate(a.model, a.output, target=a.target, prefix=a.prefix,
                         max_batch=a.max_batch, sizes=_sizes(a.size), **extra)
        else:
            r = generate(a.model, a.output)
    except (DeployError, LoadError, ValueError, OSError) as e:
        print(f"sampan deploy: {e}")
        return 1
    print(r.report())
    return 0


def add_parser(sub) -> None:
    d = sub.add_parser("deploy", help="write a saved program as one numpy-only Python module "
                                      "plus its weights (.npz), or as a C library (--target c)")
    d.add_argument("model", nargs="?", help="a directory written by sampan.jit.save")
    d.add_argument("-o", "--output", default="deploy", help="output directory")
    d.add_argument("--target", choices=("numpy", "c", "wasm", "web"), default="numpy",
                   help="numpy: one Python module; c: model.h/model.c/weights.bin/Makefile; "
                        "wasm: model.wasm + model.mjs (zig cc); web: a page running it")
    d.add_argument("--max-batch", type=int, default=64,
                   help="(c) the largest batch the C library takes (its buffers' size)")
    d.add_argument("--size", action="append", metavar="NAME=N",
                   help="(c) fix a symbolic dim other than the batch, e.g. --size seq=128")
    d.add_argument("--prefix", default="model", help="(c) the prefix of the exported C names")
    d.add_argument("--threads", type=int, default=1,
                   help="(c) threads splitting the big GEMM loops (OpenMP where the compiler "
                        "has it)")
    d.add_argument("--report", metavar="DIR",
                   help="summarise a folder written by --target c: its ops and kernels "
                        "against the op table, code and weight sizes")
    d.add_argument("--no-simd", action="store_true", help="(wasm, web) no SIMD128")
    d.add_argument("--sample", metavar="X.npy",
                   help="(web) the input the page runs first (one batch, .npy)")
    d.add_argument("--no-onnx", action="store_true",
                   help="(web) leave out the onnxruntime-web comparison")
    d.set_defaults(fn=_run)
