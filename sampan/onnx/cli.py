"""`sampan onnx ...`: the ONNX subcommands of the `sampan` command.

    sampan onnx export <saved-program> -o model.onnx [--opset N]

Each subcommand is one function here and one entry in `register`."""
from __future__ import annotations

import sys


def _export(a) -> int:
    from .export import save_model, saved_to_model
    model = saved_to_model(a.program, opset=a.opset)
    save_model(model, a.output)
    print(f"wrote {a.output} (opset {model.opset_import[0].version}, "
          f"{len(model.graph.node)} nodes)")
    return 0


def _run(fn):
    def run(a) -> int:
        from ..errors import SampanError
        try:
            return fn(a)
        except SampanError as e:     # a user's mistake or a bad file: one line, no trace
            print(f"sampan onnx {a.onnx_cmd}: {e}", file=sys.stderr)
            return 1
    return run


def register(subparsers) -> None:
    """Add `onnx` and its subcommands to the `sampan` command's subparsers."""
    p = subparsers.add_parser("onnx", help="ONNX export (and import) of sampan programs")
    sub = p.add_subparsers(dest="onnx_cmd", required=True)
    e = sub.add_parser("export", help="write a saved program (sampan.jit.save) as ONNX")
    e.add_argument("program", help="a saved program directory")
    e.add_argument("-o", "--output", default="model.onnx")
    e.add_argument("--opset", type=int, default=None,
                   help="ONNX opset (default: the newest the installed onnxruntime runs)")
    e.set_defaults(fn=_run(_export))
