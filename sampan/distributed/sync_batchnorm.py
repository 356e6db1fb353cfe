"""`SyncBatchNorm`: batch normalisation whose training statistics cover the global batch.

In training mode each rank reduces its per-channel sums over every rank with the
differentiable `all_reduce` op (sampan.distributed.functional), first for the mean and
then for the centred squares (two passes, as precise as the one-process BatchNorm).
The gradient of that op is the all-reduce of the gradients, so backward through the
statistics is exact too: N ranks with SyncBatchNorm under `DataParallel` compute what one
process computes with BatchNorm on the global batch. Running statistics are then the
same on every rank. Outside training, or on one rank, it is the plain BatchNorm.
"""
from __future__ import annotations

import numpy as np

from ..autograd import no_grad
from ..nn.layer import Layer
from ..nn.norm import _BatchNorm
from ..ops.registry import STATE
from . import _comm
from . import collectives as _coll

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over (N, C, ...) input with statistics over all ranks' batches.

    Example::

        >>> model = SyncBatchNorm.convert_sync_batchnorm(model)   # every BatchNorm*d
        >>> dp = DataParallel(model)
    """
    _dims = (2, 3, 4, 5)

    def forward(self, x):
        if not self.training or _comm.world_size() == 1 or STATE.tracer is not None:
            return super().forward(x)
        from .functional import all_reduce
        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        count = np.array([x.numel() // x.shape[1]], np.float64)
        _coll.all_reduce(count, op="sum")     # in place, on the array
        n = float(count[0])
        mean = all_reduce(x.sum(axes), "sum") / n
        xc = x - mean.reshape(shape)
        var = all_reduce((xc * xc).sum(axes), "sum") / n
        y = xc / (var.reshape(shape) + self.eps).sqrt()
        if self.affine:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        if self.track_running_stats:
            with no_grad():
                self.num_batches_tracked._data += 1
                m = self.momentum
                m = 1.0 / float(self.num_batches_tracked._data) if m is None else m
                rm, rv = self.running_mean._data, self.running_var._data
                rm[...] = (1 - m) * rm + m * mean._data.astype(rm.dtype)
                unbiased = var._data * (n / max(n - 1, 1))
                rv[...] = (1 - m) * rv + m * unbiased.astype(rv.dtype)
        return y

    @classmethod
    def convert_sync_batchnorm(cls, layer: Layer) -> Layer:
        """`layer` with every BatchNorm1d/2d (at any depth) replaced by a SyncBatchNorm
        holding the same parameters and buffers; returns the new root if it was one."""
        if isinstance(layer, _BatchNorm) and not isinstance(layer, cls):
            new = cls(layer.num_features, layer.eps, layer.momentum, layer.affine,
                      layer.track_running_stats)
            for name in ("weight", "bias"):
                if getattr(layer, name, None) is not None:
                    setattr(new, name, getattr(layer, name))
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                if getattr(layer, name, None) is not None:
                    setattr(new, name, getattr(layer, name))
            new.train(layer.training)
            return new
        for name, child in list(layer.named_children()):
            conv = cls.convert_sync_batchnorm(child)
            if conv is not child:       # in place in the registry: Sequential keeps order
                layer.__dict__["_layers"][name] = conv
        return layer
