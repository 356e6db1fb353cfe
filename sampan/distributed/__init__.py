"""Data-parallel training (issue 23): process groups and collectives over MPI and
in-process replicas, the `sampan launch` command.

    import sampan.distributed as dist
    dist.init()                       # "auto": MPI under mpiexec/sampan launch, else 1 rank
    dist.all_reduce(grad, op="mean")  # in place, on a numpy array or a tensor's data
    h = dist.all_reduce(buf, async_op=True); ...; h.wait()
    dist.spawn(fn, 2)                 # 2 in-process replicas (threads), each its own rank

The in-place functions here are not recorded by autograd or the tracer (as torch's);
`sampan.distributed.functional` holds the differentiable, traceable collectives (ops in
the op table). Importing this package is cheap: mpi4py loads on `init("mpi")`.
"""
from __future__ import annotations

import os

import numpy as np

from .group import (DistributedError, ProcessGroup, Work, current, set_process_group,
                    set_thread_group, use_group)
from .inproc import ReplicaError, World, spawn

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.distributed.*)

__all__ = ["init", "is_initialized", "rank", "world_size", "barrier", "all_reduce",
           "broadcast", "all_gather", "reduce_scatter", "send", "recv", "destroy", "spawn",
           "Work", "DistributedError", "ReplicaError", "ProcessGroup", "current_group",
           "use_group", "backend"]

_MPI_ENV = ("PMI_SIZE", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def _under_mpi() -> bool:
    if any(k in os.environ for k in _MPI_ENV):
        return True
    return int(os.environ.get("SAMPAN_WORLD_SIZE", "1") or 1) > 1


def init(backend="auto", timeout=None) -> ProcessGroup:
    """Join the process group and make it current; returns it.

    backend: "mpi" (mpi4py over the MPI that `sampan launch`/`mpiexec` started), "inproc"
    (a single-rank group here; `spawn` makes multi-rank ones) or "auto" (mpi when MPI's
    environment variables are set, else a single-rank group). `timeout` (seconds; default
    $SAMPAN_TIMEOUT, which `sampan launch --timeout` sets, else 60) bounds every wait: a
    collective a peer does not join fails with an error naming that peer.
    Inside a `spawn` replica, or when already initialised, returns the current group."""
    if backend not in ("auto", "mpi", "inproc"):
        raise DistributedError(f"init: got backend={backend!r}; expected 'auto', 'mpi' or "
                               "'inproc'")
    g = current(required=False)
    if g is not None:
        if backend not in ("auto", g.backend):
            raise DistributedError(f"init: got backend={backend!r} but this rank is already "
                                   f"in a {g.backend} group; call destroy() first")
        return g
    if timeout is None:
        timeout = float(os.environ.get("SAMPAN_TIMEOUT") or 60.0)
    if backend == "auto":
        backend = "mpi" if _under_mpi() else "inproc"
    if backend == "mpi":
        from .mpi import MPIGroup
        g = MPIGroup.create(float(timeout))
    else:
        g = World(1, timeout).groups[0]
    set_process_group(g)
    return g


def is_initialized() -> bool:
    return current(required=False) is not None


def current_group() -> ProcessGroup:
    """The current group (raises `DistributedError` when there is none)."""
    return current(what="current_group()")


def rank() -> int:
    return current(what="rank()").rank


def world_size() -> int:
    return current(what="world_size()").size


def backend() -> str:
    return current(what="backend()").backend


def destroy() -> None:
    """Leave the current group (this thread's replica group, else the process's)."""
    from .group import _LOCAL
    g = current(required=False)
    if g is None:
        return
    if _LOCAL.group is g:
        set_thread_group(None)
    else:
        set_process_group(None)
        g.destroy()


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


def _run(name, x, async_op, attrs, finish):
    g = current(what=name)
    w = g.run(name, x, **attrs)
    w.then(finish)
    return w if async_op else w.wait()


# ---------------------------------------------------------------------- collectives
def all_reduce(x, op="sum", async_op=False):
    """Reduce `x` over all ranks in place (op "sum", "mean", "max" or "min"); returns `x`,
    or the `Work` when `async_op` (then `x` holds the result after `wait()`)."""
    a, fin = _target(x, "all_reduce")
    return _run("all_reduce", a, async_op, {"op": op}, fin)


def broadcast(x, src=0, async_op=False):
    """Overwrite `x` on every rank with rank `src`'s `x`; returns `x` (or the Work)."""
    a, fin = _target(x, "broadcast")
    return _run("broadcast", a, async_op, {"src": src}, fin)


def all_gather(x, async_op=False):
    """Every rank's `x`, as a list by rank (first dims may differ between ranks)."""
    a, _ = _target(x, "all_gather")
    return _run("all_gather", a, async_op, {}, lambda res: [_wrap_like(x, r) for r in res])


def reduce_scatter(x, op="sum", async_op=False):
    """Reduce `x` (first dim divisible by the world size) over all ranks and return this
    rank's slice of the result along the first dim (a new array or tensor)."""
    a, _ = _target(x, "reduce_scatter")
    return _run("reduce_scatter", a, async_op, {"op": op}, lambda res: _wrap_like(x, res))


def barrier(async_op=False):
    """Wait until every rank reaches this point."""
    g = current(what="barrier")
    w = g.kernels["barrier"](g, None)
    return w if async_op else w.wait()


def send(x, dst, async_op=False):
    """Send `x` to rank `dst` (matched, in order, by a `recv(..., src=this rank)`)."""
    a, _ = _target(x, "send")
    return _run("send", a, async_op, {"dst": dst}, lambda res: None)


def recv(x_or_shape, src, dtype=None, async_op=False):
    """Receive from rank `src` into the array/tensor `x`, or into a new array of shape
    `x_or_shape` (a tuple; dtype float32 unless given); returns it."""
    if isinstance(x_or_shape, (tuple, list)):
        from ..dtypes import as_dtype
        x_or_shape = np.empty(tuple(x_or_shape), dtype=as_dtype(dtype))
    a, fin = _target(x_or_shape, "recv")
    return _run("recv", a, async_op, {"src": src}, fin)

# data-parallel training on top of the collectives (issue 23, branch fix/dist-dp)
from .checkpoint import DistributedCheckpoint  # noqa: E402
from .data_parallel import DataParallel  # noqa: E402
from .sampler import DistributedSampler  # noqa: E402
from .sync_batchnorm import SyncBatchNorm  # noqa: E402

__all__ += ["DataParallel", "DistributedSampler", "DistributedCheckpoint", "SyncBatchNorm"]
