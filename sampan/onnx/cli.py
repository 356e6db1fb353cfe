"""`sampan onnx ...`: the ONNX subcommands of the `sampan` command.

    sampan onnx export <saved-program> -o model.onnx [--opset N]
    sampan onnx import model.onnx -o <saved-program> [--dim N=4]
    sampan onnx check model.onnx [--tol 1e-4] [--dim N=2] [--seed 0]

Each subcommand is one function here and one entry in `register`."""
from __future__ import annotations

import re
import sys


def _export(a) -> int:
    from .export import save_model, saved_to_model
    model = saved_to_model(a.program, opset=a.opset)
    save_model(model, a.output)
    print(f"wrote {a.output} (opset {model.opset_import[0].version}, "
          f"{len(model.graph.node)} nodes)")
    return 0


def _dims(pairs) -> dict:
    """`--dim NAME=SIZE` options as {name: size}."""
    from .ops import OnnxError
    out = {}
    for p in pairs or ():
        m = re.fullmatch(r"([^=]+)=(\d+)", p)
        if not m or int(m.group(2)) < 1:
            raise OnnxError(f"--dim {p!r}: expected NAME=SIZE with a positive size "
                            "(e.g. --dim batch=4)")
        out[m.group(1)] = int(m.group(2))
    return out


def _import(a) -> int:
    """Traced on inputs of the declared shapes that hold one element each (zero-strided,
    as `sampan.onnx.load` traces), which the saved program stores as their value and
    shape: a 77-byte model declaring f32[65536, 65536] costs neither 16 GiB of memory nor
    16 GiB of disk (sampan/onnx/fold.py). The examples it keeps are zeros."""
    from .importer import save_program
    path, f = save_program(a.model, a.output, dim_sizes=_dims(a.dim))
    layer, dyn = f.layer, f.dynamic or {}
    syms = sorted({s for d in dyn.values() for s in d.values()})
    print(f"wrote {path} ({len(layer.input_names)} inputs, {len(layer.output_names)} "
          f"outputs, {len(list(layer.parameters()))} parameters"
          + (f", symbolic dims {', '.join(syms)}" if syms else "")
          + (f", concrete dims {', '.join(f.concrete_dims)}" if f.concrete_dims else "")
          + ")")
    return 0


def random_inputs(layer, dim_sizes=None, seed=0, int_high=5):
    """Random inputs of each declared type: normal floats, integers in [0, int_high),
    random bools; symbolic dims take `dim_sizes[name]` (default 2)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for name in layer.input_names:
        dtype, shape = layer.input_types[name]
        if shape is None:
            from .ops import OnnxError
            raise OnnxError(f"sampan onnx check: input {name!r} declares no shape; "
                            "cannot make a random input for it")
        dims = [d if isinstance(d, int) else (dim_sizes or {}).get(d, 2) for d in shape]
        dt = np.dtype(dtype or np.float32)
        if dt.kind == "f":
            a = rng.standard_normal(dims).astype(dt)
        elif dt.kind == "b":
            a = rng.random(dims) < 0.5
        else:
            a = rng.integers(0, int_high, dims).astype(dt)
        out.append(a)
    return out


def _check(a) -> int:
    import numpy as np
    from ..autograd import no_grad
    from ..tensor import Tensor
    from .importer import read_model, to_layer
    from .ops import OnnxError
    model = read_model(a.model)
    layer = to_layer(model)
    layer.eval()
    xs = random_inputs(layer, _dims(a.dim), a.seed, a.int_high)
    with no_grad():
        got = layer(*[Tensor(x) for x in xs])
    got = [t.numpy() for t in (got if isinstance(got, tuple) else (got,))]
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        want = sess.run(None, dict(zip(layer.input_names, xs)))
    except Exception as e:  # noqa: BLE001 - the reference could not run it
        raise OnnxError(f"onnxruntime cannot run {a.model}: "
                        f"{(str(e).strip().splitlines() or [''])[0][:300]}") from None
    worst, bad = 0.0, False
    for name, g, w in zip(layer.output_names, got, want):
        w = np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            print(f"{name}: sampan gives {g.dtype}{list(g.shape)}, onnxruntime "
                  f"{w.dtype}{list(w.shape)}")
            bad = True
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))   # equal infs and NaNs: 0
        err = float(np.max(np.where(same, 0.0, np.abs(g64 - w64)), initial=0.0))
        worst = max(worst, err)
        ok = err <= a.tol
        bad |= not ok
        print(f"{name}: {g.dtype}{list(g.shape)} max abs error {err:.3g}"
              + ("" if ok else f"  > tolerance {a.tol:g}"))
    print(("FAIL" if bad else "ok") + f": {len(got)} outputs, worst max abs error "
          f"{worst:.3g} (tolerance {a.tol:g})")
    return 1 if bad else 0


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
    p = subparsers.add_parser("onnx", help="ONNX export, import and check")
    sub = p.add_subparsers(dest="onnx_cmd", required=True)
    e = sub.add_parser("export", help="write a saved program (sampan.jit.save) as ONNX")
    e.add_argument("program", help="a saved program directory")
    e.add_argument("-o", "--output", default="model.onnx")
    e.add_argument("--opset", type=int, default=None,
                   help="ONNX opset (default: the newest the installed onnxruntime runs)")
    e.set_defaults(fn=_run(_export))
    i = sub.add_parser("import", help="import an ONNX model as a saved program "
                       "(traced with sampan.jit, written with sampan.jit.save)")
    i.add_argument("model", help="an .onnx file")
    i.add_argument("-o", "--output", required=True, help="the saved-program directory")
    i.add_argument("--dim", action="append", metavar="NAME=SIZE",
                   help="size of a symbolic dim while tracing (default 2; a dim that "
                   "cannot stay symbolic is saved at it); repeatable")
    i.set_defaults(fn=_run(_import))
    c = sub.add_parser("check", help="import, run on random inputs, compare with "
                       "onnxruntime (exit 1 over the tolerance)")
    c.add_argument("model", help="an .onnx file")
    c.add_argument("--tol", type=float, default=1e-4, help="max abs error allowed per output")
    c.add_argument("--dim", action="append", metavar="NAME=SIZE",
                   help="size of a symbolic dim (default 2); repeatable")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--int-high", type=int, default=5,
                   help="integer inputs are drawn from [0, INT_HIGH)")
    c.set_defaults(fn=_run(_check))
