"""Collectives as ops (issue 23): all_reduce, broadcast, reduce, all_gather, reduce_scatter.

Functional (a new output; the input is untouched) and differentiable, so eager code,
autograd and `sampan.jit` graphs all see them: a traced graph holds an `all_reduce` node
whose kernel runs, when the graph executes, through the process group current at that
moment (`sampan.distributed`: an MPI rank's, or an in-process replica's). Without a group
(or with a single rank) every collective is the identity; that is what the op table's
samples check, and it lets a model with collectives run unchanged on one process.

Gradient rules, for a loss that is the sum of every rank's local loss:
  all_reduce(sum)   -> all_reduce(sum) of the gradient (mean -> mean; max/min -> the
                       summed gradient where the input equals the result)
  broadcast(src)    <-> reduce(dst=src)  (reduce: the sum on dst, zeros elsewhere)
  all_gather        <-> reduce_scatter(sum)  (all_gather concatenates equal-size first dims)
The shape rules read the current world size, so a traced graph is specialised to it.
FLOPs 0 (communication, not arithmetic); no ONNX mapping.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng
from .registry import NO_ONNX, Spec, defop

_REDUCE = ("sum", "mean", "max", "min")


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


# The current process group comes from the floor above (`sampan.distributed` registers
# its lookup when it is imported); until then there is no group: every collective is the
# identity on one rank.
_SOURCE = {"current": lambda: None, "error": RuntimeError}


def set_group_source(current, error=RuntimeError) -> None:
    """Register `current() -> group or None` (the process group the collective ops run
    through) and the exception class of a failed collective (`sampan.distributed` does
    this on import)."""
    _SOURCE["current"], _SOURCE["error"] = current, error


def _group():
    g = _SOURCE["current"]()
    return None if g is None or g.size == 1 else g


def _size():
    g = _SOURCE["current"]()
    return 1 if g is None else g.size


def _check_op(name, op, allowed=_REDUCE):
    if op not in allowed:
        raise op_error(ShapeError, name, f"op={op!r}", f"one of {allowed}")


def _zero(*a, **k):
    return 0


def _run(name, x, **attrs):
    g = _group()
    return g.run(name, np.ascontiguousarray(x).copy(), **attrs).wait()


# ---------------------------------------------------------------------- all_reduce
def _all_reduce_rule(x, op):
    _check_op("all_reduce", op)
    return Spec(tuple(x.shape), x.dtype)


def _all_reduce_kernel(x, op):
    if _group() is None:
        return x.copy()
    return _run("all_reduce", x, op=op)


def _all_reduce_grad(g, y, x, op):
    from .elementwise import where
    if op in ("sum", "mean"):
        return all_reduce(g, op)
    from .creation import zeros_like
    return where(x == y, all_reduce(g, "sum"), zeros_like(g))


def _samples_reduce():
    r = rng(230)
    return [Sample((randf(r, 3, 4),), {"op": "sum"}), Sample((randf(r, 5),), {"op": "mean"}),
            Sample((randf(r, 2, 3),), {"op": "max"}), Sample((randf(r, 4),), {"op": "min"})]


ALL_REDUCE = defop("all_reduce", _all_reduce_rule, kernel=_all_reduce_kernel,
                   grad=_all_reduce_grad, saves=(0,), save_output=True, flops=_zero,
                   onnx=NO_ONNX, samples=_samples_reduce,
                   doc="Reduce over every rank of the current process group.")


def all_reduce(x, op="sum"):
    """Reduce `x` over every rank (op "sum", "mean", "max", "min"); a new tensor, recorded
    by autograd and the tracer. Example: ``loss = all_reduce(local_loss, "mean")``."""
    return apply(ALL_REDUCE, (_t(x),), {"op": op})


# ---------------------------------------------------------------- broadcast / reduce
def _peer_rule(name, key):
    def rule(x, **attrs):
        r = attrs[key]
        n = _size()
        if not isinstance(r, (int, np.integer)) or not 0 <= r < n:
            raise op_error(ShapeError, name, f"{key}={r!r}", f"a rank in 0..{n - 1}")
        return Spec(tuple(x.shape), x.dtype)
    return rule


def _broadcast_kernel(x, src):
    if _group() is None:
        return x.copy()
    return _run("broadcast", x, src=src)


def _reduce_kernel(x, dst):
    g = _group()
    if g is None:
        return x.copy()
    y = _run("all_reduce", x, op="sum")
    if g.rank != dst:
        y[...] = 0
    return y


def _samples_peer(key):
    return lambda: [Sample((randf(rng(231), 3, 2),), {key: 0})]


BROADCAST = defop("broadcast", _peer_rule("broadcast", "src"), kernel=_broadcast_kernel,
                  grad=lambda g, y, x, src: reduce(g, dst=src), saves=(), flops=_zero,
                  onnx=NO_ONNX, samples=_samples_peer("src"),
                  doc="Rank src's value on every rank.")
REDUCE = defop("reduce", _peer_rule("reduce", "dst"), kernel=_reduce_kernel,
               grad=lambda g, y, x, dst: broadcast(g, src=dst), saves=(), flops=_zero,
               onnx=NO_ONNX, samples=_samples_peer("dst"),
               doc="The sum over every rank on rank dst, zeros on the others.")


def broadcast(x, src=0):
    """Rank `src`'s `x` on every rank (a new tensor; differentiable: the gradient is the
    sum of every rank's gradient, on `src`)."""
    return apply(BROADCAST, (_t(x),), {"src": int(src)})


def reduce(x, dst=0):
    """The sum of `x` over every rank on rank `dst`; zeros on the other ranks."""
    return apply(REDUCE, (_t(x),), {"dst": int(dst)})


# ------------------------------------------------------- all_gather / reduce_scatter
def _all_gather_rule(x):
    if len(x.shape) == 0:
        raise op_error(ShapeError, "all_gather", "a 0-d input", "at least one dim")
    n = _size()
    d = x.shape[0]
    d = d * n if isinstance(d, int) else (d if n == 1 else f"{d}*{n}")
    return Spec((d,) + tuple(x.shape[1:]), x.dtype)


def _all_gather_kernel(x):
    if _group() is None:
        return x.copy()
    parts = _run("all_gather", x)
    sizes = [p.shape[0] for p in parts]
    if len(set(sizes)) > 1:
        raise _SOURCE["error"](f"all_gather (the op): got first dims {sizes} by rank; "
                               "expected equal ones (sampan.distributed.all_gather returns "
                               "uneven parts as a list)")
    return np.concatenate(parts)


def _reduce_scatter_rule(x, op):
    _check_op("reduce_scatter", op, ("sum", "mean"))
    n = _size()
    if len(x.shape) == 0 or (isinstance(x.shape[0], int) and x.shape[0] % n):
        raise op_error(ShapeError, "reduce_scatter", f"shape {tuple(x.shape)}",
                       f"a first dim divisible by the world size {n}")
    d = x.shape[0]
    d = d // n if isinstance(d, int) else (d if n == 1 else f"{d}/{n}")
    return Spec((d,) + tuple(x.shape[1:]), x.dtype)


def _reduce_scatter_kernel(x, op):
    if _group() is None:
        return x.copy()
    return _run("reduce_scatter", x, op=op)


def _reduce_scatter_grad(g, y, x, op):
    out = all_gather(g)
    return out / _size() if op == "mean" else out


ALL_GATHER = defop("all_gather", _all_gather_rule, kernel=_all_gather_kernel,
                   grad=lambda g, y, x: reduce_scatter(g, "sum"), saves=(), flops=_zero,
                   onnx=NO_ONNX,
                   samples=lambda: [Sample((randf(rng(232), 2, 3),)),
                                    Sample((randf(rng(233), 4),))],
                   doc="Every rank's input concatenated along the first dim, by rank.")
REDUCE_SCATTER = defop("reduce_scatter", _reduce_scatter_rule, kernel=_reduce_scatter_kernel,
                       grad=_reduce_scatter_grad, saves=(), flops=_zero, onnx=NO_ONNX,
                       samples=lambda: [Sample((randf(rng(234), 4, 3),), {"op": "sum"}),
                                        Sample((randf(rng(235), 2),), {"op": "mean"})],
                       doc="The reduction over every rank, this rank's slice of dim 0.")


def all_gather(x):
    """Every rank's `x` concatenated along dim 0 in rank order (equal first dims; the
    gradient is reduce_scatter of the gradient)."""
    return apply(ALL_GATHER, (_t(x),), {})


def reduce_scatter(x, op="sum"):
    """Reduce `x` over every rank and keep this rank's slice of dim 0 (a first dim
    divisible by the world size; the gradient is all_gather of the gradient)."""
    return apply(REDUCE_SCATTER, (_t(x),), {"op": op})
