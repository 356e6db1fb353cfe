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

Running is the onnxruntime provider's (`sampan/backends/onnxruntime/`): it builds the ONNX
model of the body for concrete input shapes, hands it to the engine (a registry:
`ENGINES`, "onnxruntime" now) and caches the session. Compiled mode binds one session per
node and input shapes, with the node's constant inputs as initializers (the provider's
`bind`); this numpy kernel (eager, the op-table tests) builds one with every input a model
input, through the session builder the provider installs (`set_runner_for`): `ops/` sits
below `backends/` and imports nothing from it.
"""
from __future__ import annotations

import numpy as np

from ._util import Sample, randf, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, OPS, Spec, defop
from ..errors import SampanError


class EngineError(SampanError):
    """An engine node could not be built or run (names the engine, node and cause)."""


# ------------------------------------------------------------------ engines (plug-ins)
# name -> runner class: `cls(model_bytes, n_inputs, threads)` with `.run(arrays)`. The
# onnxruntime provider (`sampan/backends/onnxruntime/`) registers "onnxruntime" and the
# session builder below; ops/ sits below backends/, so it is handed in, never imported.
ENGINES: dict = {}
_HOOKS = {"runner_for": None}


def register_engine(name: str, runner_cls) -> None:
    """Make `runner_cls(model_bytes, n_inputs, threads)` (with `.run(arrays)`) the engine
    `name`, usable by engine nodes. Example: ``register_engine("openvino", OVRunner)``"""
    ENGINES[name] = runner_cls


def set_runner_for(fn) -> None:
    """Install `fn(engine, inputs, body, outputs, threads=None) -> runner` (the provider's
    cached session builder) that this op's kernel runs its subgraph with."""
    _HOOKS["runner_for"] = fn


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


def _result(outs, out_specs):
    res = []
    for a, e in zip(outs, out_specs):
        a = np.asarray(a)
        dt = _spec(e).dtype
        res.append(a if a.dtype == dt else a.astype(dt))
    return tuple(res)


def _kernel(*arrays, engine, body, outputs, in_specs, out_specs):
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if _HOOKS["runner_for"] is None:
        raise EngineError(f"engine {engine!r}: no session builder is installed (the "
                          "onnxruntime provider, sampan.backends.onnxruntime, installs it)")
    r = _HOOKS["runner_for"](engine, [(a.shape, a.dtype) for a in arrays], body, outputs)
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
