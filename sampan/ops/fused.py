"""The `fused` op: a group of elementwise nodes that the fusion pass merged into one
kernel. Its subgraph is plain data in the attributes, so it prints and parses with
the rest of the IR:

    %9: f32[8,64], %10: f32[8,64] = fused(%2, %5, body=(('mul', (0, 1)), ('tanh', (2,))),
                                          outputs=(2, 3))

`body` lists (op, argument indices[, attributes as (key, value) pairs]); index i < number
of inputs names input i, index n_inputs + k the result of body entry k. `outputs` picks
the results the node returns (every value read outside the group).

The numpy kernel here interprets the body with the table's numpy kernels (the reference);
compiled mode binds a generated numba kernel instead (`sampan.backends.numba`)."""
from __future__ import annotations

import numpy as np

from ._util import Sample, randf, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, OPS, defop


def body_attrs(entry) -> dict:
    """Attributes of one body entry as a dict."""
    return dict(entry[2]) if len(entry) > 2 else {}


def _index(i, n, what):
    """A body index: an int naming one of the `n` values so far (inputs, then earlier
    entries). Kernel generators write `t{i}` from it, so nothing else may pass."""
    if type(i) is not int or not 0 <= i < n:
        from ..errors import SampanValueError
        raise SampanValueError(f"fused: {what} reads value {i!r}; expected an index in "
                               f"0..{n - 1} (the inputs, then earlier body entries)")
    return i


def _rule(*specs, body, outputs):
    vals = list(specs)
    for k, e in enumerate(body):
        op = OPS[e[0]]
        ins = [vals[_index(i, len(vals), f"body entry {k} ({e[0]})")] for i in e[1]]
        vals.append(op.shape_rule(*ins, **body_attrs(e)))
    return [vals[_index(i, len(vals), "outputs")] for i in outputs]


def run_body(arrays, body, outputs):
    """Evaluate a fused body with numpy kernels; returns the `outputs` values as a tuple."""
    vals = list(arrays)
    for e in body:
        op = OPS[e[0]]
        vals.append(np.asarray(op.kernel(*[vals[i] for i in e[1]], **body_attrs(e))))
    return tuple(vals[i] for i in outputs)


def _kernel(*arrays, body, outputs):
    return run_body(arrays, body, outputs)


def _flops(*specs, body, outputs):
    vals = list(specs)
    n = 0
    for e in body:
        op = OPS[e[0]]
        ins = [vals[i] for i in e[1]]
        s = op.shape_rule(*ins, **body_attrs(e))
        n += op.flops(*ins, **body_attrs(e)) if op.flops else 0
        vals.append(s)
    return n


def _samples():
    r = rng(11)
    body = (("mul", (0, 1)), ("tanh", (2,)), ("add", (3, 0)))
    return [Sample((randf(r, 3, 4), randf(r, 4)), {"body": body, "outputs": (3, 4)})]


FUSED = defop("fused", _rule, kernel=_kernel, kind="opaque", grad=NOT_DIFFERENTIABLE,
              flops=_flops, onnx=NO_ONNX, samples=_samples, n_out=None,
              doc="a group of elementwise nodes run as one generated kernel")
