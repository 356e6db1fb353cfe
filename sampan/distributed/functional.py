"""Differentiable, traceable collectives: ops in the op table (`sampan/ops/collective.py`).

Each returns a new tensor and is recorded by autograd and by `sampan.jit` (a traced graph
holds the collective as a node that runs through the group current when it executes):

    from sampan.distributed import functional as F
    loss = F.all_reduce(local_loss, "mean")   # d loss / d local_loss: all_reduce of grads
    full = F.all_gather(shard)                # gradient: reduce_scatter
"""
from ..ops.collective import all_gather, all_reduce, broadcast, reduce, reduce_scatter

__all__ = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"]
