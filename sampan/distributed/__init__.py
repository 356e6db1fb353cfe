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

from . import collectives
from .collectives import TABLE, ReduceOp
from .group import (DistributedError, Future, ProcessGroup, Work, current,  # noqa: F401
                    set_process_group, set_thread_group, thread_group, use_group)
from .inproc import ReplicaError, World, spawn  # noqa: F401
from .process_group import (_MPI_ENV, _TORCH_BACKENDS, _of, _under_mpi,  # noqa: F401
                            backend, current_group, destroy, destroy_process_group,
                            get_backend, get_rank, get_world_size, init,
                            init_process_group, is_available, is_initialized, new_group,
                            rank, world_size)

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.distributed.*)

__all__ = ["init", "is_initialized", "rank", "world_size", "destroy", "spawn",
           "Work", "DistributedError", "ReplicaError", "ProcessGroup", "current_group",
           "use_group", "backend", "ReduceOp", "init_process_group", "get_rank",
           "get_world_size", "destroy_process_group", "new_group", "get_backend",
           "is_available", "Future"]

# every collective of the table, under its name (a new one is one entry there)
globals().update({name: entry.fn for name, entry in TABLE.items()})
__all__ += list(TABLE)

# data-parallel training on top of the collectives (issue 23, branch fix/dist-dp)
from .checkpoint import DistributedCheckpoint  # noqa: E402
from .data_parallel import DataParallel  # noqa: E402
from .sampler import DistributedSampler  # noqa: E402
from .sync_batchnorm import SyncBatchNorm  # noqa: E402

__all__ += ["DataParallel", "DistributedSampler", "DistributedCheckpoint", "SyncBatchNorm"]
