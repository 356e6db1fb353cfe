"""The `engine` op: a subgraph that a third-party runtime (onnxruntime) runs as one node.

The `onnxruntime_offload` pass (`sampan/passes/offload.py`) makes these nodes. Like `fused`,
the subgraph is plain data in the attributes, so the node prints, parses and copies with
the rest of the IR, and the weights it reads stay graph constants (inputs of the node,
shared by every clone of a predictor):

    %7: f32[B,16] = engine(%0, %1, %2, engine='onnxruntime',
                           body=(('matmul', (0, 1), (), 1), ('add', (3, 2), (), 1)),
                           outputs=(4,), in_specs=(...), out_specs=(('float32', ('$B', 16)),))

`body` lists (op, argument indices, attributes as (key, value) pairs, number of outputs);
index i < number of inputs names input i, later indices the outputs of the body entries in
order. `outputs` picks the values the node returns. `in_specs` / `out_specs` are
(dtype name, shape) pairs; a symbolic dim is kept as "$expr" so that `concrete()` gives it
its size. The shape rule reads `out_specs` (checking the inputs against `in_specs`); it
never runs the body.

Running: the ONNX model of the body is built with `sampan.onnx.export.graph_to_model` for
concrete input shapes and handed to the engine (a registry: `ENGINES`, "onnxruntime"
now). Compiled mode binds one session per node and input shapes, with the node's constant
inputs as initializers (`passes/offload.py` registers that binder in the runtime); this
numpy kernel (eager, the op-table tests) builds one with every input a model input.
Sessions are cached by what they were built from, so clones share them (onnxruntime's
`run` is thread-safe). `ops/` sits below `onnx/`: the export is imported when a session
is first built, never at load.
"""
from __future__ import annotations

import threading

import numpy as np

from ._util import Sample, randf, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, OPS, Spec, defop
from ..errors import SampanError


class EngineError(SampanError):
    """An engine node could not be built or run (names the engine, node and cause)."""


# ------------------------------------------------------------------ engines (plug-ins)
class _OrtRunner:
    """One onnxruntime InferenceSession: `run(list of arrays) -> list of arrays`."""

    def __init__(self, model_bytes, n_inputs, threads=None):
        import onnxruntime as ort
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = int(threads)
        so.log_severity_level = 3          # warnings about unused initializers are noise
        self.session = ort.InferenceSession(model_bytes, so,
                                            providers=["CPUExecutionProvider"])
        self.in_names = [i.name for i in self.session.get_inputs()]
        self.out_names = [o.name for o in self.session.get_outputs()]
        self._run = self.session.run

    def run(self, arrays):
        return self._run(self.out_names, dict(zip(self.in_names, arrays)))


ENGINES: dict = {"onnxruntime": _OrtRunner}


def register_engine(name: str, runner_cls) -> None:
    """Make `runner_cls(model_bytes, n_inputs, threads)` (with `.run(arrays)`) the engine
    `name`, usable by engine nodes. Example: ``register_engine("openvino", OVRunner)``"""
    ENGINES[name] = runner_cls


# ------------------------------------------------------------------ attributes <-> specs
def spec_attr(shape, dtype) -> tuple:
    """(dtype name, shape) with symbolic dims as "$expr" (what `concrete()` evaluates)."""
    from ..dtypes import dtype_name
    from ..ir.symbolic import attr
    return (dtype_name(np.dtype(dtype)),
            tuple(d if isinstance(d, int) else attr(d) for d in shape))


def _spec(entry) -> Spec:
    dt, shape = entry
    from ..dtypes import as_dtype
    from ..ir.symbolic import attr_text
    return Spec(tuple(attr_text(d) for d in shape), as_dtype(dt))


def _rule(*specs, engine, body, outputs, in_specs, out_specs):
    if engine not in ENGINES:
        raise EngineError(f"engine: unknown engine {engine!r}; registered: {sorted(ENGINES)}")
    if len(specs) != len(in_specs):
        raise EngineError(f"engine: got {len(specs)} inputs; the subgraph takes "
                          f"{len(in_specs)}")
    for i, (s, e) in enumerate(zip(specs, in_specs)):
        want = _spec(e)
        ok = s.dtype == want.dtype and len(s.shape) == len(want.shape) and all(
            not (isinstance(a, int) and isinstance(b, int)) or a == b
            for a, b in zip(s.shape, want.shape))
        if not ok:
            raise EngineError(f"engine: input {i} is {Spec(tuple(s.shape), s.dtype)!r}; the "
                              f"subgraph was built for {want!r}")
    if len(outputs) != len(out_specs):
        raise EngineError(f"engine: {len(outputs)} outputs but {len(out_specs)} out_specs")
    return [_spec(e) for e in out_specs]


# ------------------------------------------------------------------ subgraph -> model
def subgraph(inputs, body, outputs):
    """A Graph of the body. `inputs`: per input an ndarray (becomes a named constant, an
    initializer of the model) or a (shape, dtype) pair (a graph input). Returns (graph,
    {graph input position: ONNX input name})."""
    from ..ir.graph import Graph
    g = Graph("engine")
    vals, args = [], {}
    for i, x in enumerate(inputs):
        if isinstance(x, np.ndarray):
            vals.append(g.add_const(x, name=f"w{i}"))
        else:
            args[len(g.inputs)] = f"x{i}"
            vals.append(g.add_input(x[0], x[1], name=f"x{i}"))
    for e in body:
        op, idx, attrs, n_out = e
        n = g.add_node(op, [vals[k] for k in idx], dict(attrs))
        if len(n.outputs) != n_out:
            raise EngineError(f"engine: body entry {op!r} has {len(n.outputs)} outputs; the "
                              f"node says {n_out}")
        vals.extend(n.outputs)
    g.outputs = [vals[k] for k in outputs]
    return g, args


def build_model(inputs, body, outputs, opset=None):
    """The ONNX ModelProto of an engine body (see `subgraph` for `inputs`)."""
    from ..onnx.export import graph_to_model
    g, args = subgraph(inputs, body, outputs)
    return graph_to_model(g, args, {}, opset=opset,
                          output_names=[f"y{k}" for k in range(len(outputs))],
                          name="sampan_engine")


_CACHE: dict = {}              # key -> (runner, the constant arrays, kept alive for the key)
_CACHE_MAX = 256
_LOCK = threading.Lock()


def runner_for(engine, inputs, body, outputs, threads=None):
    """The cached runner of a body for these inputs (arrays by identity, specs by value)."""
    key = (engine, body, outputs, threads,
           tuple(("w", id(x)) if isinstance(x, np.ndarray) else
                 (tuple(x[0]), np.dtype(x[1]).str) for x in inputs))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit[0]
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit[0]
        try:
            model = build_model(inputs, body, outputs)
            runner = ENGINES[engine](model.SerializeToString(),
                                     sum(not isinstance(x, np.ndarray) for x in inputs),
                                     threads)
        except SampanError as e:
            raise EngineError(f"engine {engine!r}: cannot build the subgraph of "
                              f"{[b[0] for b in body]}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the runtime refused the model: say which
            raise EngineError(f"engine {engine!r}: {type(e).__name__} building a session "
                              f"for the subgraph of {[b[0] for b in body]}: {e}") from None
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (runner, [x for x in inputs if isinstance(x, np.ndarray)])
        return runner


def clear_cache() -> None:
    """Drop every cached session (they are rebuilt on the next call)."""
    with _LOCK:
        _CACHE.clear()


def _result(outs, out_specs):
    res = []
    for a, e in zip(outs, out_specs):
        a = np.asarray(a)
        dt = _spec(e).dtype
        res.append(a if a.dtype == dt else a.astype(dt))
    return tuple(res)


def _kernel(*arrays, engine, body, outputs, in_specs, out_specs):
    arrays = [np.ascontiguousarray(a) for a in arrays]
    r = runner_for(engine, [(a.shape, a.dtype) for a in arrays], body, outputs)
    return _result(r.run(arrays), out_specs)


def _flops(*specs, engine, body, outputs, in_specs, out_specs):
    vals = list(specs)
    n = 0
    for op_name, idx, attrs, _ in body:
        op = OPS[op_name]
        ins = [vals[i] for i in idx]
        out = op.shape_rule(*ins, **dict(attrs))
        n += op.flops(*ins, **dict(attrs)) if op.flops else 0
        vals.extend(out if op.n_out != 1 else [out])
    return n


def _samples():
    r = rng(12)
    x, w = randf(r, 3, 4), randf(r, 4, 5)
    body = (("matmul", (0, 1), (), 1), ("relu", (2,), (), 1), ("add", (3, 2), (), 1))
    attrs = {"engine": "onnxruntime", "body": body, "outputs": (4, 3),
             "in_specs": (spec_attr(x.shape, x.dtype), spec_attr(w.shape, w.dtype)),
             "out_specs": (spec_attr((3, 5), x.dtype), spec_attr((3, 5), x.dtype))}
    return [Sample((x, w), attrs)]


ENGINE = defop("engine", _rule, kernel=_kernel, kind="opaque", grad=NOT_DIFFERENTIABLE,
               flops=_flops, onnx=NO_ONNX, samples=_samples, n_out=None,
               doc="a subgraph run by a third-party runtime (onnxruntime) as one node")
