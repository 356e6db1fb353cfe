"""The `sampan` command.

    sampan viz <saved-model> -o graph.svg     draw a saved program's graph
    sampan bisect <saved-model>               which pass changes a saved program's outputs?
    sampan passes                             list registered passes and pipelines
    sampan onnx export <saved-model> -o m.onnx  write a saved program as ONNX
    sampan onnx import m.onnx -o <saved-model>  an ONNX model as a saved program
    sampan onnx check m.onnx                  compare sampan with onnxruntime on the model
    sampan deploy <saved-model> -o outdir     a standalone numpy module of a saved program
"""
from __future__ import annotations

import argparse
import sys


def _viz(a):
    from .ir import render
    from .jit.program import SavedProgram
    g = SavedProgram.read(a.model).graph
    print(render(g, a.output))
    return 0


def _bisect(a):
    import numpy as np
    from .errors import SampanError
    from .passes import bisect_graph
    from .jit.program import SavedProgram
    try:
        prog = SavedProgram.read(a.model)
        g = prog.at_example_sizes()   # symbolic dims: bound to the example inputs
        ins = [np.asarray(x) for x in prog.example_feed()]
        passes = a.passes.split(",") if a.passes else "train"
        r = bisect_graph(g, ins, passes, a.tol)
    except SampanError as e:   # a bad file or pass name: one line, no trace
        print(f"sampan bisect: {e}", file=sys.stderr)
        return 2               # 1 says a pass changes the outputs
    print(r)
    return 0 if r.culprit is None else 1


def _passes(a):
    from .passes import PASSES, PIPELINES
    for n, p in sorted(PASSES.items()):
        opts = ", ".join(f"{k}={v!r}" for k, v in p.options.items())
        print(f"{n:<16} {p.doc}" + (f" (options: {opts})" if opts else ""))
    for n, ps in PIPELINES.items():
        print(f"pipeline {n}: {', '.join(ps)}")
    return 0


_COMMAND_MODULES = (
    "sampan.serving.cli",       # sampan serve
    "sampan.profiler.cli",      # sampan profile
    "sampan.backends.cli",      # sampan kernels
    "sampan.distributed.cli",   # sampan launch
)


def main(argv=None) -> int:
    """Entry point of the `sampan` script."""
    ap = argparse.ArgumentParser(prog="sampan", description="sampan command line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("viz", help="draw a saved program's graph (SVG via Graphviz, or DOT)")
    v.add_argument("model")
    v.add_argument("-o", "--output", default="graph.svg")
    v.set_defaults(fn=_viz)
    b = sub.add_parser("bisect", help="find the pass that changes a saved program's outputs")
    b.add_argument("model")
    from .passes import PASSES, PIPELINES
    b.add_argument("--passes", default="",
                   help="comma-separated pass names or pipeline names (a pipeline expands to "
                        f"its passes; default: the train pipeline). pipelines: "
                        f"{', '.join(sorted(PIPELINES))}. passes: {', '.join(sorted(PASSES))}")
    b.add_argument("--tol", type=float, default=1e-5)
    b.set_defaults(fn=_bisect)
    p = sub.add_parser("passes", help="list passes and pipelines")
    p.set_defaults(fn=_passes)
    from .onnx.cli import register as _onnx_commands
    _onnx_commands(sub)
    from .deploy.cli import add_parser as _deploy_parser
    _deploy_parser(sub)
    # further commands: each module, once it exists, adds its own with `register(sub)`
    import importlib
    import importlib.util
    for mod in _COMMAND_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod).register(sub)
    a = ap.parse_args(argv)
    from . import jit  # noqa: F401  (loads the package)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
