"""ONNX import: a ModelProto becomes a trainable `OnnxModule` (an `nn.Layer` that runs the
graph node by node through the handlers of `sampan/onnx/ops/`) and, traced with
`sampan.jit`, a sampan `Graph`. The per-node machinery (Node, Context, attribute checks,
static evaluation) is in `nodes.py`.

Floating initializers become Parameters (so an imported model fine-tunes with sampan's
autograd and optimisers); other initializers and Constant nodes are static values, and a
node whose inputs are all static runs once while the graph is built, so shape arithmetic
folds away. The model is checked before anything runs: a damaged file, a cycle, an input
no node or initializer defines, an initializer whose data disagree with its dims, an
opset newer than this sampan reads: each is an `OnnxError` naming it. Nothing in the file
is executed as code (ONNX has no code; local functions are refused for now).

Control flow (If, Loop, Scan) runs its subgraphs through the same table
(`subgraph.py`, `ops/control.py`): eagerly as Python, under `sampan.jit` as cond /
while_loop / scan nodes. Sequences and optionals are imported as lists of tensors whose
length is known when the graph is built (`ops/sequence.py`).

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
from ..tensor import Tensor
from ..nn.layer import Layer, Parameter
from . import emulate as _em
from . import external as _ext
from . import fold as _fold
from .nodes import (Context, Node, _array, _check_attrs_read, _check_bits,  # noqa: F401
                    _elem_types, _run_static, _safe, _settle, _value_type)
from .ops import OnnxError, lookup
from .subgraph import Opt, Seq, run_nodes

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
        kind = _kind(vi.type)
        if kind not in ("tensor", "sequence", "optional"):
            raise OnnxError(f"sampan.onnx: graph {'input' if vi in g.input else 'output'} "
                            f"{vi.name!r} is of {kind} type; sampan imports tensors, "
                            "sequences of tensors and optionals of those only")
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
    for n in _all_nodes(g):  # every op known (with the list of what is) before onnx's checker
        lookup(n.domain, n.op_type, opsets.get(n.domain or "", ops), n.name)
        _check_body(n)
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - the checker's own errors, restated
        raise OnnxError(f"sampan.onnx: the model fails onnx's checker: {e}") from None


def _all_nodes(g):
    """The nodes of GraphProto `g` and of every subgraph in it (If, Loop, Scan bodies)."""
    for n in g.node:
        yield n
        for a in n.attribute:
            for sub in ([a.g] if a.type == a.GRAPH else list(a.graphs)):
                yield from _all_nodes(sub)


def _check_body(n):
    """A Loop's body takes (iteration, condition, one input per loop-carried value) and
    gives (condition, the new values, scan outputs); If's branches give as many outputs."""
    bodies = {a.name: a.g for a in n.attribute if a.type == a.GRAPH}
    where = f"sampan.onnx: node {n.name!r} ({n.op_type})"
    if n.op_type == "Loop" and "body" in bodies:
        b, k = bodies["body"], max(len(n.input) - 2, 0)
        if len(b.input) != 2 + k or len(b.output) < 1 + k:
            raise OnnxError(f"{where}: the body takes {len(b.input)} inputs and gives "
                            f"{len(b.output)} outputs; with {k} loop-carried values it must "
                            f"take {2 + k} (iteration, condition, values) and give at least "
                            f"{1 + k}")
    if n.op_type == "If" and {"then_branch", "else_branch"} <= set(bodies):
        t, e = len(bodies["then_branch"].output), len(bodies["else_branch"].output)
        if t != e or t != len(n.output):
            raise OnnxError(f"{where}: then_branch gives {t} outputs, else_branch {e}, the "
                            f"node has {len(n.output)}; they must agree")


def _kind(tp):
    """'tensor', 'sequence' (of tensors), 'optional' (of those), or what else a
    TypeProto is ('map', 'sparse tensor', a sequence of maps ...)."""
    kind = tp.WhichOneof("value")
    if kind in (None, "tensor_type"):
        return "tensor"
    if kind == "sequence_type":
        return "sequence" if _kind(tp.sequence_type.elem_type) == "tensor" else \
            "sequence of " + _kind(tp.sequence_type.elem_type)
    if kind == "optional_type":
        inner = _kind(tp.optional_type.elem_type)
        return "optional" if inner in ("tensor", "sequence") else "optional " + inner
    return {"map_type": "map", "sparse_tensor_type": "sparse tensor"}.get(kind, kind)


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
        self.input_kinds = {i.name: _kind(i.type) for i in g.input if i.name not in inits}
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
        run_nodes(ctx, self.nodes, env, self.emulated)
        res = tuple(env[o] for o in self.output_names)
        return res[0] if len(res) == 1 else res

    def declared(self, outs):
        """Outputs of `forward` as numpy arrays of the model's declared dtypes: an output
        of an emulated dtype (uint16/32/64, float8, int4 …) converts from its carrier."""
        many = isinstance(outs, tuple)
        res = []
        for name, t in zip(self.output_names, outs if many else (outs,)):
            f = self.emulated.get(name)
            if isinstance(t, (Seq, Opt)):
                res.append(_value_out(t))
            elif t is None or f is None:
                res.append(t.numpy() if isinstance(t, Tensor) else t)
            else:
                res.append(_em.to_declared(t, f))
        return tuple(res) if many else res[0]

    def _input(self, name, a):
        kind = self.input_kinds.get(name, "tensor")
        if kind != "tensor" or isinstance(a, (Seq, Opt, list)) or a is None:
            return _value_in(self, name, a, kind)
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


def _value_in(layer, name, a, kind):
    """A fed sequence (a list of arrays) or optional (None, or its value) as the
    importer's Seq / Opt."""
    if kind == "optional":
        if isinstance(a, Opt):
            return a
        if a is None:
            return Opt(None)
        if isinstance(a, (list, tuple, Seq)):
            return Opt(_value_in(layer, name, a, "sequence"))
        return Opt(a if isinstance(a, Tensor) else Tensor(np.asarray(a)))
    if kind == "sequence":
        if not isinstance(a, (list, tuple, Seq)):
            raise OnnxError(f"sampan.onnx: input {name!r} is a sequence; it is fed a "
                            f"{type(a).__name__} (expected a list of arrays)")
        return Seq([t if isinstance(t, Tensor) else Tensor(np.asarray(t)) for t in a])
    raise OnnxError(f"sampan.onnx: input {name!r} is a tensor; it is fed "
                    f"{'None' if a is None else 'a ' + type(a).__name__}")


def _value_out(v):
    """A Seq output as a list of numpy arrays, an Opt as its value or None."""
    if isinstance(v, Opt):
        return None if v.value is None else _value_out(v.value)
    if isinstance(v, Seq):
        return [_value_out(t) for t in v]
    return v.numpy() if isinstance(v, Tensor) else v


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

    A named dim that cannot stay symbolic (an image side through a strided conv and a
    reshape, a side that must stay a multiple of 32) is concrete in the graph, at its
    `dim_sizes` size (default 2; `compile_layer` says which and serves every size, compiled
    once per size). An unnamed dim, one named "?" or one declared -1 (as paddle2onnx
    writes them) is a size of its own, named `<input>_dim<k>`.

    A model that cannot run at the default size (an image side of 2 through two 2x2
    pools) raises its shape error with the dims left at 2 named, to pass in `dim_sizes`.

    Loading allocates what the file paid for, not what it declares: the trace runs on
    inputs that hold no memory of their declared sizes (the program is traced, not run),
    and folding is bounded per node and in all (sampan/onnx/fold.py: FOLD_LIMIT_BYTES …).
    Example: ``g = sampan.onnx.load("model.onnx", dim_sizes={"batch": 4})``."""
    from ..autograd import no_grad
    from ..errors import ShapeError
    layer = to_layer(src, base_dir=base_dir)
    layer.eval()
    args = _fold.probe_inputs(layer, dim_sizes)
    with no_grad():
        # traced and compiled for these inputs, not run: running would make every
        # value of the declared sizes (JitFunction.__call__ = this, then entry.run)
        try:
            return compile_layer(layer, args).graph
        except ShapeError as e:
            left = sorted({d for n in layer.input_names
                           for d in layer.input_types[n][1] or () if not isinstance(d, int)}
                          - set(dim_sizes or {}))
            if not left:
                raise
            raise type(e)(f"{e}\n(sampan.onnx.load traced the model with {left} at the "
                          f"default size 2; pass dim_sizes={{name: size}} at a size the "
                          f"model runs at)") from e


def declared_dims(layer) -> dict:
    """{input position: {dim: symbol}} of `layer`'s inputs' symbolic dims, as `sampan.jit`'s
    dynamic= takes them."""
    dyn = {}
    for k, name in enumerate(layer.input_names):
        _, shape = layer.input_types[name]
        dims = {i: _sym(d) for i, d in enumerate(shape or ()) if not isinstance(d, int)}
        if dims:
            dyn[k] = dims
    return dyn


def _sizes(dyn, args) -> dict:
    return {s: args[k].shape[i] for k, dims in dyn.items() for i, s in dims.items()}


def _keep(dyn, symbols) -> dict:
    out = {k: {i: s for i, s in dims.items() if s in symbols} for k, dims in dyn.items()}
    return {k: d for k, d in out.items() if d}


def compile_layer(layer, args, *, pipeline="inference", symbols=None):
    """`sampan.jit(layer, dynamic=...)` compiled for `args` (traced, not run), with the
    declared dims (`declared_dims`; `symbols`: only these) that can stay symbolic kept so:
    all of them where one program serves every size; otherwise those that can, found one
    symbol at a time. The others are concrete per call: the jitted layer traces and
    compiles once per size of them (cached by `sampan.jit`); `f.concrete_dims` names them.
    A failure at the sizes of `args` themselves (a model that cannot run at them) is
    raised as it is. Example: ``f = compile_layer(layer, (x,)); y = f(x); f.concrete_dims``"""
    from ..ir import verify
    from ..jit import jit
    dyn = declared_dims(layer)
    every = sorted({s for d in dyn.values() for s in d.values()})

    def attempt(kept):
        f = jit(layer, pipeline=pipeline, dynamic=_keep(dyn, kept) or None)
        f.compile(*args)
        if kept:
            # the traces at a size and at one more agree by chance where a side goes
            # through a stride ((7-1)//2 == (8-1)//2): the shape rules must also hold at
            # sizes far from both, or a size served later would fail
            verify(f.graph, {s: 2 * n + 3 for s, n in _sizes(dyn, args).items()})
        f.concrete_dims = [s for s in every if s not in kept]
        return f

    return _choose(attempt, every if symbols is None else sorted(symbols))


def _choose(attempt, symbols):
    """attempt(every symbol) where it succeeds; else attempt(no symbol) (whose failure is
    raised) and then the symbols added one at a time while attempts succeed. Returns the
    last successful attempt's result."""
    if symbols:
        try:
            return attempt(set(symbols))
        except Exception:  # noqa: BLE001 - any failure of a probe trace: not symbolic
            pass
    out = attempt(set())
    kept = set()
    for s in symbols:
        try:
            out = attempt(kept | {s})
            kept.add(s)
        except Exception:  # noqa: BLE001 - as above
            pass
    return out


def save_program(src, path, *, dim_sizes=None, base_dir=None):
    """Import `src` and write it as a saved program (`sampan.jit.save`) at `path`, for the
    Predictor: traced on inputs of the declared shapes that hold one element each (symbolic
    dims at `dim_sizes`, default 2); the declared dims that stay symbolic do
    (`compile_layer`, and `sampan.jit.save` must keep them too), the others are saved at
    their `dim_sizes` size. Returns (the program's path, the compiled layer: `.dynamic`,
    `.concrete_dims`).
    Example: ``save_program("det.onnx", "det.sampan", dim_sizes={"h": 640, "w": 640})``"""
    from ..autograd import no_grad
    from ..jit import save
    layer = to_layer(src, base_dir=base_dir)
    layer.eval()
    args = _fold.probe_inputs(layer, dim_sizes)
    with no_grad():
        f = compile_layer(layer, args)
        dyn = f.dynamic or {}
        kept = sorted({s for d in dyn.values() for s in d.values()})
        # save folds more than a jitted call keeps (a position table gathered by a range
        # of the sequence length): the symbols that still save, as compile_layer chooses
        written = {}

        def attempt(symbols):
            written["path"] = save(layer, path, args, dynamic=_keep(dyn, symbols) or None)
            written["symbols"] = set(symbols)
            return written["path"]

        out = _choose(attempt, kept)
        if written["symbols"] != set(kept):
            f = compile_layer(layer, args, symbols=written["symbols"])
        return out, f


def _sym(d):
    s = re.sub(r"[^0-9A-Za-z_]", "_", str(d))
    return s if s and not s[0].isdigit() else "d_" + s
