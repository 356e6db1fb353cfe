"""Joining, reading and leaving the process group: `init`, `rank`, `world_size`,
`destroy` ..., and torch.distributed's spellings of them (`init_process_group`,
`get_rank`, `get_world_size`, `destroy_process_group`, `new_group`). Exported by
`sampan.distributed`; defined here, below the package, so that its modules (`_comm`,
`checkpoint`, `sync_batchnorm` ...) read them without importing the package back.
"""
from __future__ import annotations

import os

from .group import (DistributedError, ProcessGroup, current, set_process_group,
                    set_thread_group, thread_group)
from .inproc import World

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
