"""The lowering context: what a lowering function sees while the exporter walks a Graph.

It collects ONNX nodes as plain tuples (op type, input names, output names, attributes)
and initializers as arrays, so lowerings never build protos or import onnx themselves;
`sampan.onnx.export.graph_to_model` turns them into a ModelProto at the end. Symbolic
sizes ('batch', '8*batch', '0.5/batch', see `sampan.jit.dynamic`) become tensors computed
from the inputs' shapes (`ints`, `expr`, `scalar`).
"""
from __future__ import annotations


import numpy as np

from ...ir import symbolic as _sym
from ...ops.registry import NO_ONNX, OPS, Spec
from ..errors import OnnxError

LOC = "__sampan_loc__"     # the source line of a node, kept beside its attributes


class Ctx:
    """What a lowering sees: emit nodes, make initializers, read specs and the opset."""

    def __init__(self, opset: int, dims: dict):
        self.opset = opset
        self.nodes = []            # (op_type, inputs, outputs, attrs)
        self.inits = {}            # name -> ndarray
        self.specs = {}            # ONNX name of a sampan value -> Spec
        self.dims = dims           # symbol -> (input name, dim)
        self._n = 0
        self.used = set()          # every name given out (inputs, weights, values)
        self._consts = {}
        self._dim_cache = {}
        self.op, self.loc = "", ""
        self.out = []              # Specs of the outputs of the op being lowered
        self.outer_reads = set()   # names of this graph that subgraphs (If/Loop/Scan) read

    @property
    def out_dtype(self):
        """dtype of the (first) output of the op being lowered."""
        return np.dtype(self.out[0].dtype)

    def dims_inputs(self) -> set:
        return {src for src, _ in self.dims.values()}

    # names and specs
    def fresh(self, hint="t") -> str:
        while True:
            self._n += 1
            name = f"{hint}_{self._n}"
            if name not in self.used:
                self.used.add(name)
                return name

    def spec(self, name) -> Spec:
        """Shape and dtype of a sampan value (a lowering's inputs)."""
        return self.specs[name]

    def fail(self, why: str):
        """Raise the export error for the current node (`why`: what is not supported)."""
        raise OnnxError(f"sampan.onnx.export: op {self.op!r} at {self.loc or '?'} cannot be "
                        f"written as ONNX at opset {self.opset}: {why}")

    # nodes
    def emit(self, op_type: str, inputs, n_out: int = 1, **attrs):
        """Add an ONNX node; returns its output name (a list when n_out != 1). An input of
        None is an omitted optional input."""
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        ins = ["" if i is None else i for i in inputs]
        while ins and ins[-1] == "":
            ins.pop()
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if self.loc:     # the user's line, for the node's doc_string (see graph_to_model)
            attrs[LOC] = self.loc
        self.nodes.append((op_type, ins, outs, attrs))
        return outs[0] if n_out == 1 else outs

    # constants
    def const(self, array, hint="c", exact=False) -> str:
        """An initializer holding `array` (small ones are shared by value); named `hint`
        itself with `exact` when that name is free."""
        a = np.asarray(array)
        key = None
        if a.size <= 16 and not exact:
            key = (a.dtype.str, a.shape, a.tobytes())
            if key in self._consts:
                return self._consts[key]
        name = hint if exact and hint not in self.used else self.fresh(hint)
        self.used.add(name)
        self.inits[name] = a
        if key is not None:
            self._consts[key] = name
        return name

    def scalar(self, value, dtype) -> str:
        """A 0-d initializer of `dtype`; a "$expr" value (a symbolic size) is computed."""
        if _sym.is_attr(value):
            return self.emit("Squeeze", [self.cast(self.expr(_sym.attr_text(value)), dtype),
                                         self.ints([0])])
        return self.const(np.asarray(value, dtype=dtype))

    def ints(self, values) -> str:
        """A 1-D int64 tensor of `values`; "$expr" entries (symbolic sizes) are computed
        from the inputs' shapes at run time."""
        values = list(values)
        if all(not isinstance(v, str) for v in values):
            return self.const(np.asarray(values, np.int64).reshape(len(values)), "ints")
        parts, run = [], []
        for v in values:
            if isinstance(v, str):
                if run:
                    parts.append(self.const(np.asarray(run, np.int64), "ints"))
                    run = []
                parts.append(self.expr(_sym.attr_text(v)))
            else:
                run.append(int(v))
        if run:
            parts.append(self.const(np.asarray(run, np.int64), "ints"))
        return parts[0] if len(parts) == 1 else self.emit("Concat", parts, axis=0)

    def expr(self, expr: str) -> str:
        """An int64 [1] tensor (a float64 one for a quotient) holding a symbolic size such
        as 'batch', '8*batch*seq' or '(batch-1)//2' (read by `sampan.ir.symbolic.parse`,
        see `sampan.jit.dynamic`), computed from the inputs' shapes."""
        if expr in self._dim_cache:
            return self._dim_cache[expr]
        try:
            tree = _sym.parse(expr)
        except _sym.ExprError as e:
            raise OnnxError(f"sampan.onnx.export: {e}") from None
        missing = sorted(_sym.symbols(tree) - set(self.dims))
        if missing:
            raise OnnxError(f"sampan.onnx.export: symbolic size {expr!r} names "
                            f"{missing[0]!r}, which no input binds")
        val = self._dim_cache[expr] = self._tree(tree)[0]
        return val

    def _tree(self, e):
        """(ONNX name, is float64) of symbolic-size expression tree `e`."""
        if e[0] == "p":
            return self._poly(e[1])
        op, a, b = e
        (x, fx), (y, fy) = self._tree(a), self._tree(b)
        if op in ("/", "//") or fx or fy:
            x = x if fx else self.cast(x, np.float64)
            y = y if fy else self.cast(y, np.float64)
            fx = fy = True
        if op == "//":     # floor, exact in float64 for any size an array can have
            return self.cast(self.emit("Floor", [self.emit("Div", [x, y])]), np.int64), False
        onnx_op = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "%": "Mod"}[op]
        attrs = {"fmod": 1} if op == "%" and fx else {}   # int Mod: Python's sign rule
        return self.emit(onnx_op, [x, y], **attrs), fx

    def _poly(self, terms):
        is_float = any(not isinstance(c, int) for _, c in terms)
        dt = np.float64 if is_float else np.int64
        total = None
        for mono, c in terms:
            if mono:
                t = self._product([self._dim(s) for s in mono])
                if is_float:
                    t = self.cast(t, np.float64)
                if c != 1:
                    t = self.emit("Mul", [t, self.const(np.asarray([c], dt),
                                                        "c" if is_float else "ints")])
            else:
                t = self.const(np.asarray([c], dt), "c" if is_float else "ints")
            total = t if total is None else self.emit("Add", [total, t])
        if total is None:
            total = self.const(np.asarray([0], dt), "ints")
        return total, is_float

    def _dim(self, sym) -> str:
        key = ("dim", sym)
        if key not in self._dim_cache:
            src, d = self.dims[sym]
            self._dim_cache[key] = self.emit("Shape", [src], start=d, end=d + 1)
        return self._dim_cache[key]

    def _product(self, names) -> str:
        val = names[0]
        for t in names[1:]:
            val = self.emit("Mul", [val, t])
        return val

    def cast(self, name, dtype) -> str:
        return self.emit("Cast", [name], to=onnx_dtype(np.dtype(dtype)))

    def onnx_dtype(self, dtype) -> int:
        return onnx_dtype(np.dtype(dtype))

    # other ops
    def lower(self, op_name, inputs, attrs, out_specs=None):
        """Lower sampan op `op_name` on ONNX names `inputs` (input specs must be known);
        returns its outputs' names. Lowerings built from other ops' lowerings use this."""
        from ...ir.graph import infer
        op = OPS[op_name]
        if out_specs is None:
            out_specs = infer(op_name, [self.specs[i] for i in inputs], attrs)
        fn = op.onnx
        if fn is None or fn == NO_ONNX:
            self.fail(f"the op {op_name!r} has no ONNX mapping")
        saved, self.out = self.out, list(out_specs)
        try:
            if isinstance(fn, str):
                outs = self.emit(fn, list(inputs), n_out=len(out_specs))
            else:
                outs = fn(self, *inputs, **attrs)
        finally:
            self.out = saved
        outs = [outs] if isinstance(outs, str) else list(outs)
        for n, s in zip(outs, out_specs):
            self.specs.setdefault(n, Spec(tuple(s.shape), np.dtype(s.dtype)))
        return outs


def onnx_dtype(dt: np.dtype) -> int:
    from onnx import helper
    if dt.name == "bfloat16":
        from onnx import TensorProto
        return TensorProto.BFLOAT16
    try:
        return helper.np_dtype_to_tensor_dtype(dt)
    except (KeyError, TypeError, ValueError):
        raise OnnxError(f"sampan.onnx.export: dtype {dt} has no ONNX type") from None
