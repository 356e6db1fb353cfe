"""The collectives of `sampan.distributed`, in place on numpy arrays or tensors, and the
one table (`TABLE`) that says which exist.

Every public collective is one entry here: a function decorated with `@collective(name,
fallback=...)`. `sampan.distributed` exports the table's functions; the MPI backend's
signature check numbers collectives by their place in it; `ProcessGroup.run` calls the
backend's native kernel (`inproc.KERNELS`, `mpi.KERNELS`) when it has one, else the
entry's `fallback(group, array, **attrs) -> Work`, written with the collectives every
backend has. So a new collective is one entry here (with its fallback) plus, if it is
to be differentiable and traceable, its op in `sampan/ops/collective.py`; a backend may
later add a faster native kernel under the same name.

Spelled as torch.distributed: ``all_reduce(t, op=ReduceOp.SUM, group=None,
async_op=False)``; `group` (a group from `new_group`, default the current one) comes
after the other arguments here, so older calls that pass `async_op` by position still
work. The in-place functions are not recorded by autograd or the tracer (as torch's);
`sampan.distributed.functional` holds the differentiable ones.

Example::

    >>> import sampan.distributed as dist
    >>> dist.all_reduce(grad, op=dist.ReduceOp.AVG)
    >>> h = dist.all_reduce(buf, async_op=True); ...; h.wait()
"""
from __future__ import annotations

import numpy as np

from .group import TABLE, DistributedError, current

__all__ = ["ReduceOp", "Collective", "TABLE", "collective", "all_reduce", "broadcast",
           "reduce", "all_gather", "reduce_scatter", "barrier", "send", "recv"]


class ReduceOp:
    """Reduction operators, as `torch.distributed.ReduceOp`: each is the string the
    collectives take (``op=ReduceOp.AVG`` is ``op="mean"``)."""
    SUM = "sum"
    AVG = "mean"
    PRODUCT = "prod"
    MAX = "max"
    MIN = "min"


class Collective:
    """A table entry: `name`, the public function `fn`, and `fallback(group, array,
    **attrs) -> Work` for backends without a native kernel (None: every backend must
    have one)."""

    __slots__ = ("name", "fn", "fallback")

    def __init__(self, name, fn, fallback=None):
        self.name, self.fn, self.fallback = name, fn, fallback

    def __repr__(self):
        return f"<Collective {self.name}>"


# TABLE (imported above; the groups read it) maps each name to its `Collective`


def collective(name, fallback=None):
    """Decorator: enter the public function of collective `name` in `TABLE`."""
    def deco(fn):
        if name in TABLE:
            raise DistributedError(f"collective {name!r} is already in the table")
        TABLE[name] = Collective(name, fn, fallback)
        return fn
    return deco


# ------------------------------------------------------------------- array plumbing
def _target(x, name):
    """(contiguous ndarray the kernel works on, finisher mapping it back to x's type)."""
    if type(x) is np.ndarray:                           # the hot path: no Tensor import
        a = x
        if a.flags.c_contiguous and a.flags.writeable:
            return a, _same
    from ..ops.registry import STATE
    from ..tensor import Tensor
    if isinstance(x, Tensor):
        if STATE.tracer is not None:
            raise DistributedError(f"{name}: the in-place collective cannot be traced; use "
                                   f"sampan.distributed.functional.{name}")
        a = x._data
        if not isinstance(a, np.ndarray):
            raise DistributedError(f"{name}: got a tensor without concrete data")
    elif isinstance(x, np.ndarray):
        a = x
    else:
        raise DistributedError(f"{name}: got {type(x).__name__}; expected a numpy array or a "
                               "sampan Tensor")
    if a.flags.c_contiguous and a.flags.writeable:
        return a, _done_inplace(x, a, None)
    if not a.flags.writeable:
        raise DistributedError(f"{name}: got a read-only array; expected a writeable one "
                               "(the result is written in place)")
    tmp = np.ascontiguousarray(a)
    return tmp, _done_inplace(x, a, tmp)


def _same(res):
    return res


def _done_inplace(x, a, tmp):
    def finish(_res=None):
        if tmp is not None:
            np.copyto(a, tmp)
        if not isinstance(x, np.ndarray):
            from ..autograd.tape import bump_version
            bump_version(x)
        return x
    return finish


def _wrap_like(x, arr):
    if isinstance(x, np.ndarray):
        return arr
    from ..tensor import wrap
    return wrap(arr)


def _group(group, name):
    if group is None:
        return current(what=name)
    if not hasattr(group, "run"):
        raise DistributedError(f"{name}: got group={group!r}; expected a process group "
                               "(from new_group) or None (the current group)")
    return group


def _run(name, x, async_op, attrs, finish, group=None):
    g = _group(group, name)
    w = g.run(name, x, **attrs)
    w.then(finish)
    return w if async_op else w.wait()


# ---------------------------------------------------------------------- collectives
@collective("all_reduce")
def all_reduce(x, op="sum", async_op=False, group=None):
    """Reduce `x` over all ranks in place (op "sum", "mean", "prod", "max" or "min", or
    a `ReduceOp`); returns `x`, or the `Work` when `async_op` (then `x` holds the result
    after `wait()`)."""
    a, fin = _target(x, "all_reduce")
    return _run("all_reduce", a, async_op, {"op": op}, fin, group)


@collective("broadcast")
def broadcast(x, src=0, async_op=False, group=None):
    """Overwrite `x` on every rank with rank `src`'s `x`; returns `x` (or the Work)."""
    a, fin = _target(x, "broadcast")
    return _run("broadcast", a, async_op, {"src": src}, fin, group)


def _reduce_fallback(g, arr, dst=0, op="sum"):
    """reduce through all_reduce: every rank reduces, the others put their input back."""
    keep = None if g.rank == dst else arr.copy()
    w = g.run("all_reduce", arr, op=op)

    def restore(res):
        if keep is not None:
            np.copyto(arr, keep)
        return arr
    return w.then(restore)


@collective("reduce", fallback=_reduce_fallback)
def reduce(x, dst=0, op="sum", async_op=False, group=None):
    """Reduce `x` over all ranks into rank `dst`'s `x` (in place; the other ranks' `x`
    is left as it was, as torch's); returns `x` (or the Work)."""
    a, fin = _target(x, "reduce")
    return _run("reduce", a, async_op, {"dst": dst, "op": op}, fin, group)


@collective("all_gather")
def all_gather(x, tensor=None, async_op=False, group=None):
    """Every rank's `x`, as a list by rank (first dims may differ between ranks).

    torch's form, ``all_gather(tensor_list, tensor)``, works too: `x` is then a list of
    one array or tensor per rank, filled in place with every rank's `tensor` (and the
    call returns None, or the Work). An old call ``all_gather(x, True)`` still means
    ``async_op=True``."""
    if isinstance(tensor, bool):
        tensor, async_op = None, tensor
    if tensor is None:
        a, _ = _target(x, "all_gather")
        return _run("all_gather", a, async_op, {},
                    lambda res: [_wrap_like(x, r) for r in res], group)
    outs = x
    if not isinstance(outs, (list, tuple)):
        raise DistributedError(f"all_gather: got {type(outs).__name__} with a tensor; "
                               "expected all_gather(tensor_list, tensor) (torch's form)")
    a, _ = _target(tensor, "all_gather")
    targets = [_target(o, "all_gather") for o in outs]

    def fill(res):
        if len(res) != len(targets):
            raise DistributedError(f"all_gather: got a list of {len(targets)}; expected "
                                   f"one entry per rank ({len(res)})")
        for (t, fin), r in zip(targets, res):
            if t.shape != r.shape:
                raise DistributedError(f"all_gather: an entry of tensor_list has shape "
                                       f"{list(t.shape)}; a rank sent {list(r.shape)}")
            np.copyto(t, r)
            fin()
        return None
    return _run("all_gather", a, async_op, {}, fill, group)


@collective("reduce_scatter")
def reduce_scatter(x, op="sum", async_op=False, group=None):
    """Reduce `x` (first dim divisible by the world size) over all ranks and return this
    rank's slice of the result along the first dim (a new array or tensor)."""
    a, _ = _target(x, "reduce_scatter")
    return _run("reduce_scatter", a, async_op, {"op": op}, lambda res: _wrap_like(x, res),
                group)


@collective("barrier")
def barrier(async_op=False, group=None):
    """Wait until every rank reaches this point."""
    g = _group(group, "barrier")
    w = g.kernels["barrier"](g, None)
    return w if async_op else w.wait()


@collective("send")
def send(x, dst, async_op=False, group=None):
    """Send `x` to rank `dst` (matched, in order, by a `recv(..., src=this rank)`)."""
    a, _ = _target(x, "send")
    return _run("send", a, async_op, {"dst": dst}, lambda res: None, group)


@collective("recv")
def recv(x_or_shape, src, dtype=None, async_op=False, group=None):
    """Receive from rank `src` into the array/tensor `x`, or into a new array of shape
    `x_or_shape` (a tuple; dtype float32 unless given); returns it."""
    if isinstance(x_or_shape, (tuple, list)):
        from ..dtypes import as_dtype
        x_or_shape = np.empty(tuple(x_or_shape), dtype=as_dtype(dtype))
    a, fin = _target(x_or_shape, "recv")
    return _run("recv", a, async_op, {"src": src}, fin, group)
