"""The import side's per-node machinery: `Node` (one ONNX node as the handlers of
`sampan/onnx/ops/` see it), `Context` (the values built so far), attribute reading and
its check that every attribute was read, static evaluation of nodes whose inputs are all
known, and the element-type checks of emulated types. `importer` builds the layer over
it and re-exports these names."""
from __future__ import annotations

import re

import numpy as np

from .. import dtypes as _dt
from ..ops.registry import STATE
from ..tensor import Tensor
from . import emulate as _em
from . import fold as _fold
from .values import Opt, Seq
from .ops import OnnxError


def _array(t):
    import onnx
    from onnx import numpy_helper
    if t.data_location == onnx.TensorProto.EXTERNAL:   # read_model reads every one in:
        raise OnnxError(f"sampan.onnx: tensor {t.name!r} still points at external data "
                        "(read the model with sampan.onnx.read_model, which resolves it "
                        "against the model's folder)")
    try:
        a = numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001
        raise OnnxError(f"sampan.onnx: initializer {t.name!r} cannot be read: {e}") from None
    if tuple(a.shape) != tuple(t.dims):
        raise OnnxError(f"sampan.onnx: initializer {t.name!r} has dims {list(t.dims)} but "
                        f"{a.size} values")
    return a


# ---------------------------------------------------------------------- nodes
class Node:
    """One ONNX node as handlers see it (see `sampan/onnx/ops/__init__.py`)."""

    __slots__ = ("op_type", "name", "domain", "attrs", "inputs", "outputs", "n_outputs",
                 "checked")

    def __init__(self, proto):
        from onnx import helper
        self.op_type = proto.op_type
        self.name = proto.name
        self.domain = proto.domain
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.n_outputs = len(self.outputs)
        attrs = {}
        for a in proto.attribute:
            if a.type == a.GRAPH:
                # a body (If, Loop, Scan) or a modifier (FlexAttention's score_mod): its
                # handler reads and runs it (sampan/onnx/subgraph.py: subgraph_attr)
                attrs[a.name] = a.g
                continue
            if a.type == a.GRAPHS:
                raise OnnxError(f"sampan.onnx: node {self.name!r} ({self.op_type}) has a "
                                f"list-of-graphs attribute {a.name!r}; no ONNX op sampan "
                                "reads takes one")
            v = helper.get_attribute_value(a)
            if a.type == a.FLOAT:      # float32 in the file: its shortest decimal (1e-05,
                v = _short_float(v)    # not 9.999999747378752e-06), as the exporter wrote it
            elif a.type == a.FLOATS:
                v = [_short_float(x) for x in v]
            if a.type == a.TENSOR:      # an emulated dtype's values: in its carrier
                v = _em.to_carrier(_array(v), what=f"attribute {a.name!r}")
            elif a.type == a.TENSORS:
                v = [_em.to_carrier(_array(x), what=f"attribute {a.name!r}") for x in v]
            elif isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [x.decode("utf-8", "replace") for x in v]
            attrs[a.name] = v
        self.attrs = _ReadAttrs(attrs)
        self.checked = False

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def __repr__(self):
        return f"<onnx {self.op_type} {self.name!r}>"


def _short_float(v):
    return float(str(np.float32(v))) if np.isfinite(v) else float(v)


class Context:
    """What a handler may ask of the importer."""

    def __init__(self, opsets, types=None):
        self.opsets = opsets
        self.types = types or {}   # value name -> ONNX elem type (inferred where not given)
        self.opset = opsets.get("", 1)
        self.node = None
        self._static = {}      # id(tensor) -> numpy value
        self._keep = []        # the static tensors: alive, so no other tensor reuses an id
        self._params = {}      # id(parameter) -> parameter: readable by static(), not folded
        self.folding = False   # inside _run_static: a node's outputs are being made now
        self.folded_bytes = 0  # bytes of the values folded so far
        self.fold_budget = _fold.FOLD_BUDGET_FLOOR   # the most all folded values may hold
        self._unfolded = {}    # id(tensor) -> tensor: outputs of nodes too big to fold
        self.env = None        # the values of the graph being run (a subgraph's: a ChainMap)

    def foldable(self, shape, dtype) -> bool:
        """Whether a value of `shape` and `dtype` may be made now, with numpy (a handler
        asks before it allocates from sizes in the file). While folding, a value that
        may not makes the node run as ops instead: so a handler builds it with sampan
        ops (a graph node, made when the program runs) where this answers False."""
        n = _fold.nbytes(shape, dtype)
        ok = n <= _fold.FOLD_LIMIT_BYTES and self.folded_bytes + n <= self.fold_budget
        if not ok and self.folding:
            raise _fold.Unfolded
        return ok

    def allow(self, shape, dtype, what):
        """Refuse, before numpy allocates it, a constant a handler can only build now
        (no ops make it later) when it passes the fold limit or budget."""
        if not self.foldable(shape, dtype):
            raise self.error(
                f"{what} would be a {np.dtype(dtype).name}{list(shape)} constant of "
                f"{_fold.nbytes(shape, dtype) >> 20} MiB made while the graph is built; "
                f"an import makes at most {_fold.FOLD_LIMIT_BYTES >> 20} MiB a node "
                "(sampan/onnx/fold.py)")

    def is_static(self, t) -> bool:
        return t is not None and id(t) in self._static

    def static(self, t, what="this input"):
        if t is None:
            return None
        v = self._static.get(id(t))
        if v is None and id(t) in self._params:
            # a weight read as a value (a Resize scale, say): its current data; while
            # sampan.jit traces, the array the tracer swapped for a Value
            d = t._data
            if not isinstance(d, np.ndarray):
                lifted = getattr(STATE.tracer, "lifted", {}).get(id(t))
                d = None if lifted is None else lifted.data
            v = d if isinstance(d, np.ndarray) else None
        if v is None:
            n = self.node
            if id(t) in self._unfolded:
                raise OnnxError(
                    f"sampan.onnx: node {n.name!r} ({n.op_type}, opset {self.opset}): {what} "
                    f"must be known when the graph is built, but it is a {t.dtype}"
                    f"{list(t.shape)} value too large to fold at import (a folded node makes "
                    f"at most {_fold.FOLD_LIMIT_BYTES >> 20} MiB, all of them together "
                    f"{self.fold_budget >> 20} MiB)")
            raise OnnxError(f"sampan.onnx: node {n.name!r} ({n.op_type}, opset {self.opset}): "
                            f"{what} must be known when the graph is built (a constant, an "
                            "initializer or computed from shapes), but it is computed from data")
        return v

    def make_static(self, array, dtype=None):
        a = np.asarray(array, dtype=dtype)
        t = Tensor(a)
        self._static[id(t)] = a
        self._keep.append(t)
        return t

    def onnx_type(self, k, output=False):
        """The ONNX elem type (TensorProto code, 0 if unknown) of the node's input `k` (or
        output `k`): emulated dtypes travel in a carrier, so handlers that need the
        declared type (QuantizeLinear's zero point, say) ask here."""
        names = self.node.outputs if output else self.node.inputs
        return int(self.types.get(names[k], 0)) if k < len(names) and names[k] else 0

    def error(self, msg):
        n = self.node
        return OnnxError(f"sampan.onnx: node {n.name!r} ({n.op_type}, opset {self.opset}): "
                         f"{msg}")


def _safe(name):
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return ("p_" + s) if not s or s[0].isdigit() else s


class _ReadAttrs(dict):
    """A node's attributes, remembering which ones its handler looked at."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        self.read.add(k)
        return super().get(k, default)

    def __contains__(self, k):
        self.read.add(k)
        return super().__contains__(k)

    def _all(self):
        self.read |= set(self.keys())

    def items(self):
        self._all()
        return super().items()

    def values(self):
        self._all()
        return super().values()

    def copy(self):
        self._all()
        return dict(self)

    def __iter__(self):
        self._all()
        return super().__iter__()


def _check_attrs_read(n, opset):
    """After a node's first run: an attribute its handler never read, set to something
    other than the op's default, would have been silently ignored (a newer opset's
    feature, say): refuse it."""
    n.checked = True
    unread = set(dict.keys(n.attrs)) - n.attrs.read
    if not unread or n.domain not in ("", "ai.onnx"):
        return
    import onnx
    from onnx import helper
    try:
        schema = onnx.defs.get_schema(n.op_type, opset)
    except Exception:  # noqa: BLE001 - no schema: nothing to compare with
        schema = None
    for name in sorted(unread):
        a = schema.attributes.get(name) if schema is not None else None
        if a is not None and a.default_value.type:
            d = helper.get_attribute_value(a.default_value)
            d = d.decode() if isinstance(d, bytes) else d
            v = dict.get(n.attrs, name)
            if (np.array_equal(np.asarray(v), np.asarray(d)) if not isinstance(d, str)
                    else v == d):
                continue
        raise OnnxError(f"sampan.onnx: node {n.name!r} ({n.op_type}, opset {opset}): "
                        f"attribute {name!r} = {dict.get(n.attrs, name)!r} is not handled by "
                        "sampan's importer (it would be ignored); supported: "
                        f"{sorted(n.attrs.read) or 'none'}")


def _run_static(fn, ctx, n, ins):
    """Run a node on static inputs now (tracer off): its outputs are static too. Every op
    it runs is sized by its shape rule first: one past the fold limit or budget raises
    `Unfolded` before its kernel allocates (see sampan/onnx/fold.py)."""
    from ..ops import modes
    saved = STATE.tracer
    STATE.tracer = None
    guard = _fold.guard(ctx)
    ctx.folding = True
    modes.push_mode(guard)
    try:
        vals = [None if t is None else ctx.make_static(ctx.static(t)) for t in ins]
        from ..autograd import no_grad
        with no_grad():
            outs = fn(ctx, n, *vals)
    finally:
        modes.pop_mode(guard)
        ctx.folding = False
        STATE.tracer = saved
    many = isinstance(outs, tuple) or type(outs) is list
    outs = list(outs) if many else [outs]
    res = []
    for t in outs:
        if t is None or not isinstance(t, (Tensor, np.ndarray, np.generic)):
            res.append(_static_seq(ctx, t))      # None, a sequence or an optional
            continue
        a = t._data if isinstance(t, Tensor) else np.asarray(t)
        ctx.folded_bytes += a.nbytes
        res.append(ctx.make_static(a))
    return tuple(res) if many else res[0]


def _static_seq(ctx, v):
    """A sequence (or optional) a folded node made, its tensors made static."""
    if isinstance(v, Seq):
        return Seq([_static_seq(ctx, t) for t in v], v.elem)
    if isinstance(v, Opt):
        return Opt(_static_seq(ctx, v.value))
    if isinstance(v, Tensor):
        ctx.folded_bytes += v._data.nbytes
        return ctx.make_static(v._data)
    return v


def _elem_types(model):
    """{value name: ONNX elem type} for every value onnx's shape inference types (run only
    when the model mentions an emulated dtype: the others need no intermediate types)."""
    import onnx
    inferred = model
    if _mentions_emulated(model):
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - inference is a help, the declared types remain
            inferred = model
    g = inferred.graph
    out = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type:
            out[vi.name] = int(vi.type.tensor_type.elem_type)
    for t in g.initializer:
        out.setdefault(t.name, int(t.data_type))
    return out


def _mentions_emulated(model):
    g = model.graph
    codes = {vi.type.tensor_type.elem_type for vi in (*g.input, *g.output, *g.value_info)}
    codes |= {t.data_type for t in g.initializer}
    for n in g.node:
        for a in n.attribute:
            if a.name in ("to", "output_dtype", "precision"):
                codes.add(a.i)
            elif a.type == a.TENSOR:
                codes.add(a.t.data_type)
    return any(_em.fmt(c) is not None for c in codes)


def _check_bits(ctx, n, ins, emulated):
    """uint64 rides in int64 as bits: an op whose result depends on the sign refuses an
    eager value >= 2**63 (see emulate.py)."""
    if n.op_type in _em.BITS_SAFE or (n.op_type == "BitShift" and
                                      dict.get(n.attrs, "direction") == "LEFT"):
        return
    for name, t in zip(n.inputs, ins):
        f = emulated.get(name)
        if f is not None and f.name == "UINT64" and t is not None:
            _em.check_uint64(ctx, n, name, t)


def _settle(ctx, t, f):
    """A node's output reduced to its declared emulated type; static stays static."""
    if not isinstance(t, Tensor):
        return t
    if not ctx.is_static(t):
        return _em.settle(t, f)
    saved = STATE.tracer
    STATE.tracer = None
    try:
        from ..autograd import no_grad
        with no_grad():
            r = _em.settle(Tensor(ctx.static(t)), f)
    finally:
        STATE.tracer = saved
    return ctx.make_static(r._data)


def _value_type(vi, emulated=None):
    """(numpy dtype or None, shape with dim_param names, or None) of a ValueInfoProto;
    an emulated dtype's value is typed by its carrier."""
    from onnx import helper
    tt = vi.type.tensor_type
    dtype = None
    if emulated is not None:
        dtype = emulated.carrier
    elif tt.elem_type:
        try:
            dtype = _dt.as_dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:  # noqa: BLE001 - a type sampan has no dtype for
            dtype = None
    shape = None
    if tt.HasField("shape"):
        # a dim with neither a size nor a name, a negative size (paddle2onnx writes -1 for
        # "any", which onnxruntime accepts) or the name "?" (which names no one dim): an
        # unknown size of its own, named after its input and place
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                      else d.dim_param if d.dim_param not in ("", "?")
                      else f"{vi.name}_dim{i}" for i, d in enumerate(tt.shape.dim))
    return dtype, shape
