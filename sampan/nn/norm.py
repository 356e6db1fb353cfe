"""Normalisation layers: BatchNorm1d/2d, LayerNorm, RMSNorm, GroupNorm, InstanceNorm1d/2d/3d,
LocalResponseNorm."""
from __future__ import annotations

import numpy as np

from ..autograd import no_grad
from ..errors import SampanValueError, ShapeError, op_error
from ..ops.creation import ones, tensor, zeros
from ..ops.elementwise import cast
from ..ops.registry import STATE
from . import functional as F
from .layer import Layer, Parameter


class _RunningStatsNorm(Layer):
    """Per-channel affine parameters and running statistics (batch and instance norm)."""

    def __init__(self, num_features, eps, momentum, affine, track_running_stats, dtype):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_features, dtype=dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", tensor(0, dtype="int64"))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean._data[...] = 0
            self.running_var._data[...] = 1
            self.num_batches_tracked._data[...] = 0


class _BatchNorm(_RunningStatsNorm):
    _dims = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, dtype)

    def forward(self, x):
        name = type(self).__name__
        if x.ndim not in self._dims or x.shape[1] != self.num_features:
            raise op_error(ShapeError, name, f"input of shape {tuple(x.shape)}",
                           f"{' or '.join(f'{d}-d' for d in self._dims)} input with "
                           f"{self.num_features} channels at dim 1")
        use_batch = self.training or not self.track_running_stats
        momentum = self.momentum
        if self.training and self.track_running_stats:
            nbt = self.num_batches_tracked
            if STATE.tracer is not None:  # under sampan.jit the counter is graph state
                with no_grad():
                    nbt.add_(1)
                    if momentum is None:  # cumulative moving average, 1/n in float64
                        momentum = 1.0 / cast(nbt, "float64")
            else:
                nbt._data += 1
                if momentum is None:  # cumulative moving average
                    momentum = 1.0 / float(nbt._data)
        if use_batch and x.numel() // x.shape[1] <= 1 and self.training:
            raise op_error(SampanValueError, name, f"input of shape {tuple(x.shape)} in "
                           "training mode", "more than one value per channel")
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=use_batch, momentum=momentum, eps=self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over (N, C) or (N, C, L) input, with running statistics kept
    as buffers (used in eval mode).

    Example::

        >>> bn = nn.BatchNorm1d(16)
        >>> bn(sampan.randn(8, 16)).shape
        (8, 16)
    """
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over (N, C, H, W) input, with running statistics as buffers.

    Example: ``nn.BatchNorm2d(6)(sampan.randn(4, 6, 8, 8))``"""
    _dims = (4,)


class LayerNorm(Layer):
    """Normalise over the trailing `normalized_shape` dims, then scale and shift.

    Example::

        >>> nn.LayerNorm(256)(sampan.randn(8, 128, 256)).shape
        (8, 128, 256)
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.elementwise_affine = elementwise_affine
        self.weight = (Parameter(ones(self.normalized_shape, dtype=dtype))
                       if elementwise_affine else None)
        self.bias = (Parameter(zeros(self.normalized_shape, dtype=dtype))
                     if elementwise_affine and bias else None)

    def forward(self, x):
        n = len(self.normalized_shape)
        if tuple(x.shape[x.ndim - n:]) != self.normalized_shape:
            raise op_error(ShapeError, "LayerNorm", f"input of shape {tuple(x.shape)}",
                           f"trailing dims {self.normalized_shape}")
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(Layer):
    """x / sqrt(mean(x²) + eps) over the trailing dims, times a learned weight; `eps`
    defaults to the dtype's machine epsilon (as in PyTorch).

    Example: ``nn.RMSNorm(256)(sampan.randn(2, 256))``"""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.weight = (Parameter(ones(self.normalized_shape, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, x):
        n = len(self.normalized_shape)
        if tuple(x.shape[x.ndim - n:]) != self.normalized_shape:
            raise op_error(ShapeError, "RMSNorm", f"input of shape {tuple(x.shape)}",
                           f"trailing dims {self.normalized_shape}")
        eps = float(np.finfo(x.dtype).eps) if self.eps is None else self.eps
        return F.rms_norm(x, self.normalized_shape, self.weight, eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class GroupNorm(Layer):
    """Normalise groups of channels per sample; per-channel scale and shift.

    Example: ``nn.GroupNorm(2, 6)(sampan.randn(4, 6, 5))``"""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, dtype=None):
        super().__init__()
        if num_channels % num_groups:
            raise op_error(SampanValueError, "GroupNorm", f"num_channels={num_channels} and "
                           f"num_groups={num_groups}", "channels divisible by groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.affine = affine
        self.weight = Parameter(ones(num_channels, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_channels, dtype=dtype)) if affine else None

    def forward(self, x):
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise op_error(ShapeError, "GroupNorm", f"input of shape {tuple(x.shape)}",
                           f"{self.num_channels} channels at dim 1")
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _InstanceNorm(_RunningStatsNorm):
    _nd = 2

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, dtype)

    def forward(self, x):
        from ..ops.bagnorm import instance_norm
        from ..ops.shape import squeeze, unsqueeze
        name = type(self).__name__
        if x.ndim not in (self._nd + 1, self._nd + 2):
            raise op_error(ShapeError, name, f"input of shape {tuple(x.shape)}",
                           f"{self._nd + 1}-d (unbatched) or {self._nd + 2}-d input")
        unbatched = x.ndim == self._nd + 1
        c = x.shape[0 if unbatched else 1]
        if c != self.num_features and (self.affine or self.track_running_stats):
            raise op_error(ShapeError, name, f"input of shape {tuple(x.shape)}",
                           f"{self.num_features} channels (num_features)")
        if unbatched:
            x = unsqueeze(x, 0)
        # PyTorch: momentum=None means no running-statistics update for instance norms
        y = instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          self.training or not self.track_running_stats,
                          0.0 if self.momentum is None else self.momentum, self.eps)
        return squeeze(y, 0) if unbatched else y

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    """Normalise each channel of each sample over L ((N, C, L) or (C, L)); PyTorch's
    defaults (affine=False, track_running_stats=False).

    Example: ``nn.InstanceNorm1d(4)(sampan.randn(2, 4, 6)).shape`` is (2, 4, 6)"""
    _nd = 1


class InstanceNorm2d(_InstanceNorm):
    """Normalise each channel of each sample over (H, W).

    Example: ``nn.InstanceNorm2d(3, affine=True)(sampan.randn(2, 3, 4, 4)).shape``"""
    _nd = 2


class InstanceNorm3d(_InstanceNorm):
    """Normalise each channel of each sample over (D, H, W).

    Example: ``nn.InstanceNorm3d(2)(sampan.randn(1, 2, 3, 3, 3)).shape``"""
    _nd = 3


class LocalResponseNorm(Layer):
    """Normalise each value by the mean square over `size` neighbouring channels.

    Example: ``nn.LocalResponseNorm(3)(sampan.randn(1, 5, 4, 4)).shape`` is (1, 5, 4, 4)"""

    def __init__(self, size, alpha=1e-4, beta=0.75, k=1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x):
        from ..ops.bagnorm import local_response_norm
        return local_response_norm(x, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self):
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm1d",
           "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm"]
