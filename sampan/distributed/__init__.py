"""Data-parallel training (issue 23): process groups and collectives over MPI and
in-process replicas, the `sampan launch` command.

    import sampan.distributed as dist
    dist.init()                       # "auto": MPI under mpiexec/sampan launch, else 1 rank
    dist.all_reduce(grad, op="mean")  # in place, on a numpy array or a tensor's data
    h = dist.all_reduce(buf, async_op=True); ...; h.wait()
    dist.spawn(fn, 2)                 # 2 in-process replicas (threads), each its own rank

torch.distributed's spellings work too (`init_process_group(backend=...)`, `get_rank()`,
`get_world_size()`, `destroy_process_group()`, `ReduceOp`, `all_reduce(t, op=...)`,
`new_group`), so a torch script ports by renaming the import. The collectives are the
entries of one table (`sampan.distributed.collectives.TABLE`).

The in-place functions here are not recorded by autograd or the tracer (as torch's);
`sampan.distributed.functional` holds the differentiable, traceable collectives (ops in
the op table). Importing this package is cheap: mpi4py loads on `init("mpi")`.
"""
from __future__ import annotations

import os

from . import collectives
from .collectives import TABLE, ReduceOp
from .group import (DistributedError, Future, ProcessGroup, Work, current,
                    set_process_group, set_thread_group, thread_group, use_group)
from .inproc import ReplicaError, World, spawn

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.distributed.*)

__all__ = ["init", "is_initialized", "rank", "world_size", "destroy", "spawn",
           "Work", "DistributedError", "ReplicaError", "ProcessGroup", "current_group",
           "use_group", "backend", "ReduceOp", "init_process_group", "get_rank",
           "get_world_size", "destroy_process_group", "new_group", "get_backend",
           "is_available", "Future"]

# every collective of the table, under its name (a new one is one entry there)
globals().update({name: entry.fn for name, entry in TABLE.items()})
__all__ += list(TABLE)

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
    g = current(required=False)
    if g is None:
        return
    if thread_group() is g:
        set_thread_group(None)
    else:
        set_process_group(None)
        g.destroy()


# ------------------------------------------------------- torch.distributed spellings
_TORCH_BACKENDS = {None: "auto", "gloo": "auto", "auto": "auto", "mpi": "mpi",
                   "inproc": "inproc"}


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1,
                       rank=-1, **kwargs) -> ProcessGroup:
    """`init` under torch.distributed's name, so a torch script ports by renaming the
    import: backend "gloo" (torch's CPU backend) or None means "auto" (MPI under
    `sampan launch`/`mpiexec`, else this process, or the replica of `spawn`), "mpi" and
    "inproc" as `init`; "nccl" is refused. `timeout` may be seconds or a
    `datetime.timedelta`. `world_size` and `rank`, when given, are checked against the
    group joined (the launcher decides them). `init_method` and torch's other keywords
    (store, group_name, pg_options, device_id) are accepted and unused: the launcher
    brings the ranks together.

    Example::

        >>> import sampan.distributed as dist
        >>> dist.init_process_group("gloo"); dist.get_rank(), dist.get_world_size()
        (0, 1)
    """
    unknown = set(kwargs) - {"store", "group_name", "pg_options", "device_id"}
    if unknown:
        raise DistributedError(f"init_process_group: got unexpected keyword(s) "
                               f"{sorted(unknown)}")
    if backend not in _TORCH_BACKENDS:
        raise DistributedError(f"init_process_group: got backend={backend!r}; expected "
                               "'gloo', 'mpi', 'inproc', 'auto' or None")
    if timeout is not None and hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    g = init(_TORCH_BACKENDS[backend], timeout)
    for what, want, got in (("world_size", world_size, g.size), ("rank", rank, g.rank)):
        if want is not None and int(want) >= 0 and int(want) != got:
            raise DistributedError(f"init_process_group: got {what}={want} but the group "
                                   f"joined has {what} {got} (the launcher sets it)")
    return g


def is_available() -> bool:
    """True: sampan's collectives are always there (torch.distributed.is_available)."""
    return True


def _of(group, what):
    return current(what=what) if group is None else group


def get_rank(group=None) -> int:
    """This rank in `group` (default the current group), as torch.distributed.get_rank."""
    return _of(group, "get_rank()").rank


def get_world_size(group=None) -> int:
    """The number of ranks of `group` (default the current group)."""
    return _of(group, "get_world_size()").size


def get_backend(group=None) -> str:
    """The backend of `group` (default the current group): "mpi" or "inproc"."""
    return _of(group, "get_backend()").backend


def destroy_process_group(group=None) -> None:
    """Leave the current group (`destroy`), or free `group` (one from `new_group`)."""
    if group is None or group is current(required=False):
        destroy()
    else:
        group.destroy()


def new_group(ranks=None, timeout=None, backend=None) -> ProcessGroup | None:
    """A group of `ranks` (ranks of the current group; default all of them), as
    torch.distributed.new_group: every rank of the current group must call it, in the
    same order; a rank not in `ranks` gets None. Pass it as `group=` to a collective;
    within it the ranks are numbered 0.. in increasing order of their rank here (torch
    sorts `ranks` too).

    Example::

        >>> pair = dist.new_group([0, 1])
        >>> dist.all_reduce(x, group=pair)
    """
    g = current(what="new_group()")
    if backend not in (None, g.backend):
        raise DistributedError(f"new_group: got backend={backend!r}; this rank's group "
                               f"is {g.backend}")
    members = list(range(g.size)) if ranks is None else [int(r) for r in ranks]
    if not members or len(set(members)) != len(members) or \
            not all(0 <= r < g.size for r in members):
        raise DistributedError(f"new_group: got ranks={ranks!r}; expected distinct ranks "
                               f"in 0..{g.size - 1}")
    if timeout is not None and hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    return g.new_group(sorted(members), g.timeout if timeout is None else float(timeout))


# data-parallel training on top of the collectives (issue 23, branch fix/dist-dp)
from .checkpoint import DistributedCheckpoint  # noqa: E402
from .data_parallel import DataParallel  # noqa: E402
from .sampler import DistributedSampler  # noqa: E402
from .sync_batchnorm import SyncBatchNorm  # noqa: E402

__all__ += ["DataParallel", "DistributedSampler", "DistributedCheckpoint", "SyncBatchNorm"]
