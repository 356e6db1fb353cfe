"""The few collective calls DataParallel makes, in place on numpy arrays, over the
current group of `sampan.distributed`; with no group the world is one rank and every
call is a no-op (a model wrapped outside any launch trains as a single process)."""
from __future__ import annotations

import numpy as np

from . import collectives as _coll
from . import process_group as _pg


def world_size() -> int:
    return _pg.world_size() if _pg.is_initialized() else 1


def rank() -> int:
    return _pg.rank() if _pg.is_initialized() else 0


def barrier() -> None:
    if world_size() > 1:
        _coll.barrier()


def all_reduce_mean(a: np.ndarray):
    """Start an asynchronous mean all-reduce of `a` in place; a handle for `wait`."""
    if world_size() == 1:
        return None
    return _coll.all_reduce(a, op="mean", async_op=True)


def broadcast_(a: np.ndarray, src: int = 0) -> None:
    """Copy rank `src`'s `a` into every rank's `a`."""
    if world_size() > 1:
        _coll.broadcast(a, src=src)
