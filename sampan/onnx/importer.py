"""ONNX import: a ModelProto becomes a trainable `OnnxModule` (an `nn.Layer` that runs the
graph node by node through the handlers of `sampan/onnx/ops/`) and, traced with
`sampan.jit`, a sampan `Graph`.

Floating initializers become Parameters (so an imported model fine-tunes with sampan's
autograd and optimisers); other initializers and Constant nodes are static values, and a
node whose inputs are all static runs once while the graph is built, so shape arithmetic
folds away. The model is checked before anything runs: a damaged file, a cycle, an input
no node or initializer defines, an initializer whose data disagree with its dims, an
opset newer than this sampan reads: each is an `OnnxError` naming it. Nothing in the file
is executed as code (ONNX has no code; functions and subgraphs are refused for now).

External data (weights in files beside the model) are read for every tensor that has them,
wherever it sits (initializers, Constant and other attributes, sparse tensors, subgraphs),
from the model file's folder or the `base_dir=` a model given as bytes or a ModelProto
needs; a location with `..`, an absolute path or a symbolic link is refused, and nothing is
resolved against the working directory.

Example::

    >>> layer = sampan.onnx.to_layer("model.onnx")
    >>> y = layer(x)                 # eager, differentiable
    >>> g = sampan.onnx.load("model.onnx")   # the Graph IR
"""
from __future__ import annotations

import os
import re

import numpy as np

from .. import dtypes as _dt
from ..ops.registry import STATE
from ..tensor import Tensor
from ..nn.layer import Layer, Parameter
from . import emulate as _em
from . import external as _ext
from . import fold as _fold
from .ops import OnnxError, lookup

MAX_OPSET = 28           # the newest default-domain opset the handlers were checked against (onnx 1.23)


# ---------------------------------------------------------------------- reading
def read_model(src, base_dir=None):
    """A checked ModelProto from a path, bytes or a ModelProto, with every external tensor
    read in (see `external.py`). A model given as bytes or a ModelProto whose
    tensors live in external files needs `base_dir`, the folder those files are in; a
    path's default is the model file's own folder. A ModelProto passed in is not changed."""
    import onnx
    path = src if isinstance(src, (str, os.PathLike)) else None
    if isinstance(src, onnx.ModelProto):
        model = src
    else:
        data = src
        if path is not None:
            try:
                with open(src, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise OnnxError(f"sampan.onnx: cannot read {src}: {e}") from None
        model = onnx.ModelProto()
        try:
            model.ParseFromString(data)
        except Exception as e:  # noqa: BLE001 - any protobuf decode failure
            raise OnnxError(f"sampan.onnx: {src if isinstance(src, str) else 'the model'} is "
                            f"not a valid ONNX file (protobuf decoding failed: {e})") from None
    if any(True for _ in _ext.external_tensors(model)):
        if model is src:        # the caller's proto stays as it was (its data stay outside)
            model = onnx.ModelProto()
            model.CopyFrom(src)
        if base_dir is None and path is not None:
            base_dir = os.path.dirname(os.path.abspath(path))
        _ext.read_external_data(model, base_dir, path)
    check_model(model)
    return model


def opset_of(model, domain=""):
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and domain in ("", "ai.onnx") or o.domain == domain:
            return int(o.version)
    return None


def check_model(model):
    """Structural checks with sampan errors (onnx's checker runs first where it can)."""
    import onnx
    g = model.graph
    if not g.node and not g.output:
        raise OnnxError("sampan.onnx: the model has an empty graph (no nodes, no outputs); "
                        "a truncated or damaged file?")
    ops = opset_of(model)
    if ops is None:
        # a graph of other domains' nodes only (the training ops' update steps) needs none
        if not g.node or any(n.domain in ("", "ai.onnx") for n in g.node):
            raise OnnxError("sampan.onnx: the model imports no default-domain opset")
        ops = 1
    if ops > MAX_OPSET:
        raise OnnxError(f"sampan.onnx: the model uses opset {ops}; this sampan reads opsets up "
                        f"to {MAX_OPSET}")
    if model.functions:
        raise OnnxError("sampan.onnx: models with local functions are not supported yet "
                        f"({', '.join(f.name for f in model.functions)})")
    for vi in list(g.input) + list(g.output):
        kind = vi.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            what = {"sequence_type": "sequence", "optional_type": "optional",
                    "map_type": "map", "sparse_tensor_type": "sparse tensor"}.get(kind, kind)
            raise OnnxError(f"sampan.onnx: graph {'input' if vi in g.input else 'output'} "
                            f"{vi.name!r} is of {what} type; sampan imports tensors only (it "
                            "has no sequence, optional or map values)")
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    for k, n in enumerate(g.node):
        for name in n.input:
            if name not in defined:
                raise OnnxError(f"sampan.onnx: node {n.name or k!r} ({n.op_type}) reads "
                                f"{name!r}, which no earlier node, input or initializer defines "
                                "(a cycle, a dangling name, or nodes out of order)")
        defined |= set(n.output)
    for o in g.output:
        if o.name not in defined:
            raise OnnxError(f"sampan.onnx: graph output {o.name!r} is never computed")
    for t in g.initializer:
        _array(t)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version)
              for o in model.opset_import}
    for n in g.node:   # every op known (with the list of what is) before onnx's checker
        lookup(n.domain, n.op_type, opsets.get(n.domain or "", ops), n.name)
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - the checker's own errors, restated
        raise OnnxError(f"sampan.onnx: the model fails onnx's checker: {e}") from None


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
            if a.type == a.GRAPH and self.domain not in ("", "ai.onnx"):
                # a modifier subgraph (FlexAttention's score_mod): its handler runs it
                # or refuses it (control flow never gets here: If, Loop and Scan are
                # default-domain ops, refused when the model is checked)
                attrs[a.name] = a.g
                continue
            if a.type in (a.GRAPH, a.GRAPHS):
                raise OnnxError(f"sampan.onnx: node {self.name!r} ({self.op_type}) has a "
                                "subgraph attribute; control flow is not supported yet")
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


# ---------------------------------------------------------------------- the layer
class OnnxModule(Layer):
    """An imported ONNX graph as a Layer: ``forward(*inputs)`` runs its nodes with sampan
    ops (eager or traced). Floating initializers are Parameters (`onnx_names` maps each
    parameter name back to its initializer); outputs come back as one tensor or a tuple.

    Values of an ONNX dtype sampan lacks (uint16/32/64, int4/uint4/int2/uint2, float8,
    float4) travel in a carrier dtype that holds them exactly (`sampan/onnx/emulate.py`):
    `forward` takes them as numpy/ml_dtypes arrays of the declared dtype (or carrier
    Tensors) and returns carrier Tensors, so the layer traces and composes;
    `declared(outputs)` gives numpy arrays of the declared dtypes (what
    `sampan.onnx.backend` returns)."""

    def __init__(self, model, base_dir=None):
        super().__init__()
        import onnx
        model = read_model(model, base_dir)
        g = model.graph
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version)
                       for o in model.opset_import}
        inits = {t.name: _array(t) for t in g.initializer}
        self.input_names = [i.name for i in g.input if i.name not in inits]
        self.value_types = _elem_types(model)
        # values of a dtype sampan lacks: carried in a sampan dtype (see emulate.py)
        self.emulated = {k: f for k, f in ((k, _em.fmt(c)) for k, c in
                                           self.value_types.items()) if f is not None}
        self.input_types = {i.name: _value_type(i, self.emulated.get(i.name))
                            for i in g.input if i.name not in inits}
        self.output_names = [o.name for o in g.output]
        self.nodes = [Node(n) for n in g.node]
        self.onnx_names = {}
        self._static_inits = {}
        used = set()
        for name, a in inits.items():
            if a.dtype in _em.BY_STORAGE:
                self._static_inits[name] = _em.to_carrier(a, what=f"initializer {name!r}")
            elif _dt.is_floating(a.dtype):
                p = _safe(name)
                while p in used:
                    p += "_"
                used.add(p)
                setattr(self, p, Parameter(Tensor(np.array(a))))
                self.onnx_names[p] = name
            else:
                self._static_inits[name] = np.array(a)
        self.graph_name = g.name or "onnx"
        # what folding may make: a multiple of what the file (with its external data) holds
        self.fold_budget = _fold.budget(model)
        del onnx

    @property
    def opset(self):
        return self.opsets.get("", 1)

    def forward(self, *args, **kwargs):
        if len(args) + len(kwargs) != len(self.input_names):
            raise OnnxError(f"sampan.onnx: {self.graph_name} takes {len(self.input_names)} "
                            f"inputs ({', '.join(self.input_names)}); got "
                            f"{len(args) + len(kwargs)}")
        env = {"": None}
        ctx = Context(self.opsets, self.value_types)
        ctx.fold_budget = self.fold_budget
        for name, a in zip(self.input_names, args):
            env[name] = self._input(name, a)
        for name, a in kwargs.items():
            if name not in self.input_types:
                raise OnnxError(f"sampan.onnx: {self.graph_name} has no input {name!r} "
                                f"(inputs: {', '.join(self.input_names)})")
            env[name] = self._input(name, a)
        for p, name in self.onnx_names.items():
            env[name] = getattr(self, p)
            ctx._params[id(env[name])] = env[name]
        for name, a in self._static_inits.items():
            env[name] = ctx.make_static(a)
        for n in self.nodes:
            ctx.node = n
            ins = [env[i] for i in n.inputs]
            fn = lookup(n.domain, n.op_type, self.opsets.get(n.domain or "", self.opset),
                        n.name)
            if self.emulated:
                _check_bits(ctx, n, ins, self.emulated)
            if all(t is None or ctx.is_static(t) for t in ins):
                try:
                    outs = _run_static(fn, ctx, n, ins)
                except _fold.Unfolded:     # too big to make now: the node stays ops
                    outs = fn(ctx, n, *ins)
                    for t in outs if isinstance(outs, (tuple, list)) else (outs,):
                        if isinstance(t, Tensor):
                            ctx._unfolded[id(t)] = t
            else:
                outs = fn(ctx, n, *ins)
            if not n.checked:
                _check_attrs_read(n, self.opsets.get(n.domain or "", self.opset))
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            for name, t in zip(n.outputs, outs):
                if name:            # "" is an omitted output; env[""] must stay None
                    f = self.emulated.get(name)
                    if f is not None and n.op_type not in _em.PASSTHROUGH:
                        t = _settle(ctx, t, f)
                    env[name] = t
        res = tuple(env[o] for o in self.output_names)
        return res[0] if len(res) == 1 else res

    def declared(self, outs):
        """Outputs of `forward` as numpy arrays of the model's declared dtypes: an output
        of an emulated dtype (uint16/32/64, float8, int4 …) converts from its carrier."""
        many = isinstance(outs, tuple)
        res = []
        for name, t in zip(self.output_names, outs if many else (outs,)):
            f = self.emulated.get(name)
            if t is None or f is None:
                res.append(t.numpy() if isinstance(t, Tensor) else t)
            else:
                res.append(_em.to_declared(t, f))
        return tuple(res) if many else res[0]

    def _input(self, name, a):
        f = self.emulated.get(name)
        if f is not None and not isinstance(a, Tensor):
            a = np.asarray(a)
            if a.dtype == f.storage:
                a = _em.to_carrier(a, f, what=f"input {name!r}")
            elif a.dtype != f.carrier:
                raise OnnxError(f"sampan.onnx: input {name!r} is {a.dtype}; the model wants "
                                f"{f.storage} (or its carrier {f.carrier})")
        if not isinstance(a, Tensor) and np.asarray(a).dtype not in _dt.DTYPES.values():
            raise OnnxError(f"sampan.onnx: input {name!r} is {np.asarray(a).dtype}, which sampan "
                            f"has no dtype for (it has {', '.join(_dt.DTYPES)})")
        t = a if isinstance(a, Tensor) else Tensor(np.asarray(a))
        want = self.input_types.get(name)
        if want is not None:
            dtype, shape = want
            if dtype is not None and t.dtype != dtype:
                raise OnnxError(f"sampan.onnx: input {name!r} is {t.dtype}; the model wants "
                                f"{dtype}")
            if shape is not None and (len(shape) != t.ndim or any(
                    isinstance(d, int) and d != s for d, s in zip(shape, t.shape))):
                raise OnnxError(f"sampan.onnx: input {name!r} has shape {list(t.shape)}; the "
                                f"model wants {list(shape)}")
        return t

    def example_inputs(self, dim_sizes=None):
        """Zeros of each input's type; symbolic dims take `dim_sizes[name]` (default 2)."""
        out = []
        for name in self.input_names:
            dtype, shape = self.input_types[name]
            dims = [d if isinstance(d, int) else (dim_sizes or {}).get(d, 2)
                    for d in (shape or ())]
            out.append(Tensor(np.zeros(dims, dtype or np.float32)))
        return tuple(out)


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
    many = isinstance(outs, (tuple, list))
    outs = list(outs) if many else [outs]
    res = []
    for t in outs:
        if t is None:
            res.append(None)
            continue
        a = t._data if isinstance(t, Tensor) else np.asarray(t)
        ctx.folded_bytes += a.nbytes
        res.append(ctx.make_static(a))
    return tuple(res) if many else res[0]


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
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                      for d in tt.shape.dim)
    return dtype, shape


# ---------------------------------------------------------------------- public
def to_layer(src, *, base_dir=None) -> OnnxModule:
    """An ONNX model (path, bytes or ModelProto) as a trainable sampan Layer.

    External data (weights kept beside the model) are read from the model file's folder,
    or from `base_dir` (needed when `src` is bytes or a ModelProto with external data):
    only relative paths inside that folder, never `..`, an absolute path or a symbolic
    link. Example: ``sampan.onnx.to_layer(open("m.onnx", "rb").read(), base_dir="models")``.
    """
    return OnnxModule(src, base_dir)


def load(src, *, dim_sizes=None, base_dir=None):
    """An ONNX model as a sampan `Graph` (traced in inference mode; inputs' symbolic dims
    stay symbolic through `sampan.jit`'s dynamic dims). `base_dir`: as for `to_layer`.

    Loading allocates what the file paid for, not what it declares: the trace runs on
    inputs that hold no memory of their declared shapes (the program is traced, not run),
    and folding is bounded per node and in all (sampan/onnx/fold.py: FOLD_LIMIT_BYTES …).
    Example: ``g = sampan.onnx.load("model.onnx", dim_sizes={"batch": 4})``."""
    from ..autograd import no_grad
    from ..jit import jit
    layer = to_layer(src, base_dir=base_dir)
    layer.eval()
    dyn = {}
    for k, name in enumerate(layer.input_names):
        _, shape = layer.input_types[name]
        dims = {i: _sym(d) for i, d in enumerate(shape or ()) if not isinstance(d, int)}
        if dims:
            dyn[k] = dims
    args = _fold.probe_inputs(layer, dim_sizes)
    f = jit(layer, pipeline="inference", dynamic=dyn or None)
    with no_grad():
        # traced and compiled for these inputs, not run: running would make every
        # value of the declared sizes (JitFunction.__call__ = this, then entry.run)
        f.compile(*args)
    return f.graph


def _sym(d):
    s = re.sub(r"[^0-9A-Za-z_]", "_", str(d))
    return s if s and not s[0].isdigit() else "d_" + s
