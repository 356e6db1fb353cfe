"""How much an ONNX import may allocate.

Import-time folding (a node whose inputs are all known runs once while the graph is
built) makes only what the file paid for: one folded node's outputs hold at most
FOLD_LIMIT_BYTES (onnxruntime stops at 1 GiB; 64 MiB keeps shape arithmetic and real
constant tables, not a ConstantOfShape([65536, 65536])), and all folded values of one
import together at most FOLD_BUDGET_FLOOR + FOLD_BUDGET_FACTOR x the model's bytes
(the file plus its external weights). A node past either stays an op of the graph and
runs when the program runs. Sizes are counted with Python ints before numpy allocates.
`sampan.onnx.load` and `sampan onnx import` trace on inputs that hold no memory of their
declared shape (zero-strided views; the probes of dynamic dims stay zero-strided), and the
saved program stores such an input as its one value and shape, so declared input sizes
are never materialised, in memory or on disk.
"""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor

FOLD_LIMIT_BYTES = 64 << 20
FOLD_BUDGET_FLOOR = 256 << 20
FOLD_BUDGET_FACTOR = 2


class Unfolded(BaseException):
    """Raised while folding a node whose outputs would pass the fold limit or budget: the
    node then runs as ops (a BaseException, so that no handler's `except Exception`
    mistakes it for a failure of its own)."""


def nbytes(shape, dtype) -> int:
    """Bytes of an array of `shape` and `dtype`, in Python ints (no overflow, nothing
    allocated); a negative or non-integer dim counts as 0."""
    n = int(np.dtype(dtype).itemsize)
    for d in shape:
        d = int(d) if isinstance(d, (int, np.integer)) else 0
        n *= max(d, 0)
    return n


def guard(ctx):
    """A dispatch mode for a fold (see sampan/ops/modes.py): each op is sized by its shape
    rule before its kernel runs, and one whose outputs would pass FOLD_LIMIT_BYTES or what
    is left of the budget raises `Unfolded` instead of allocating."""
    def mode(op, inputs, attrs, call_next):
        try:
            spec = op.shape_rule(*[t._data for t in inputs], **attrs)
        except Exception:  # noqa: BLE001 - the op's own check reports it when it runs
            spec = None
        specs = spec if isinstance(spec, (tuple, list)) else (spec,)
        size = sum(nbytes(x.shape, x.dtype) for x in specs if hasattr(x, "shape"))
        if size > FOLD_LIMIT_BYTES or ctx.folded_bytes + size > ctx.fold_budget:
            raise Unfolded
        return call_next(op, inputs, attrs)
    return mode


def probe_inputs(layer, dim_sizes=None):
    """Inputs to trace `layer` on: each of its declared dtype and shape (symbolic dims at
    `dim_sizes`, default 2) but holding one element (a zero-strided view), so a declared
    f32[65536, 65536] costs nothing. The dynamic dims' probes (one size more per symbol,
    see sampan/jit/dynamic.py: resized) stay zero-strided, and `jit.save` stores such an
    input as its one value and its shape."""
    out = []
    for name in layer.input_names:
        dtype, shape = layer.input_types[name]
        dt = np.dtype(dtype or np.float32)
        dims = [d if isinstance(d, int) else int((dim_sizes or {}).get(d, 2))
                for d in (shape or ())]
        out.append(Tensor(np.broadcast_to(np.zeros((), dt), dims)))
    return tuple(out)


def budget(model) -> int:
    """The most all folded values of one import of `model` may hold: FOLD_BUDGET_FLOOR +
    FOLD_BUDGET_FACTOR x its bytes (external data already read in)."""
    return FOLD_BUDGET_FLOOR + FOLD_BUDGET_FACTOR * model.ByteSize()
