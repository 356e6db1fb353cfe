"""Convolution and pooling layers over the conv ops of `sampan.ops.conv`.

Conv weights are (out, in / groups, *kernel) as in PyTorch; ConvTranspose2d weights
are (in, out / groups, kh, kw)."""
from __future__ import annotations

import math

from ..errors import SampanError, SampanValueError
from ..ops.creation import empty
from . import init
from .layer import Layer, Parameter


def _pair(v, n=2):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _fn(name):
    from . import functional as F
    f = getattr(F, name, None)
    if f is None:
        raise SampanError(f"nn.{name}: the op sampan.ops.conv.{name} is not available in this "
                          "build of sampan")
    return f


class _ConvNd(Layer):
    _nd = 2
    _op = "conv2d"
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, output_padding=0, dtype=None):
        super().__init__()
        name = type(self).__name__
        if in_channels % groups or out_channels % groups:
            raise SampanValueError(f"{name}: got in_channels={in_channels}, out_channels="
                                   f"{out_channels}, groups={groups}; expected both channel "
                                   "counts divisible by groups")
        n = self._nd
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size, n), _pair(stride, n)
        self.padding = padding if isinstance(padding, str) else _pair(padding, n)
        self.dilation, self.groups = _pair(dilation, n), groups
        self.output_padding = _pair(output_padding, n)
        if self._transposed:
            shape = (in_channels, out_channels // groups) + self.kernel_size
        else:
            shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(empty(shape, dtype=dtype))
        self.bias = Parameter(empty(out_channels, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = weight.shape[1] * kernel area
        (PyTorch's default)."""
        fan_in = self.weight.shape[1] * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def _args(self):
        return dict(stride=self._unpair(self.stride), padding=self._unpair(self.padding),
                    dilation=self._unpair(self.dilation), groups=self.groups)

    def _unpair(self, v):
        return v[0] if self._nd == 1 and isinstance(v, tuple) else v

    def forward(self, x):
        return _fn(self._op)(x, self.weight, self.bias, **self._args())

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding not in ((0,) * self._nd, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


class Conv1d(_ConvNd):
    """1-d convolution over (N, C, L) input.

    Example: ``nn.Conv1d(4, 8, 3, padding=1)(sampan.randn(2, 4, 10)).shape`` is (2, 8, 10)"""
    _nd = 1
    _op = "conv1d"


class Conv2d(_ConvNd):
    """2-d convolution over (N, C, H, W) input (stride, padding, dilation, groups).

    Example::

        >>> conv = nn.Conv2d(1, 6, 5, padding=2)
        >>> conv(sampan.randn(8, 1, 28, 28)).shape
        (8, 6, 28, 28)
    """


class ConvTranspose2d(_ConvNd):
    """Transposed 2-d convolution (the gradient of Conv2d with respect to its input);
    weight (in, out / groups, kh, kw).

    Example: ``nn.ConvTranspose2d(8, 4, 2, stride=2)(sampan.randn(1, 8, 5, 5))`` is
    (1, 4, 10, 10)"""
    _op = "conv_transpose2d"
    _transposed = True

    def _args(self):
        a = super()._args()
        a["output_padding"] = self.output_padding
        return a


class _Pool2d(Layer):
    _op = "max_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(stride)
        self.padding = _pair(padding)

    def forward(self, x):
        return _fn(self._op)(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """Max over kernel windows (stride defaults to the kernel size).

    Example: ``nn.MaxPool2d(2)(sampan.randn(1, 6, 28, 28)).shape`` is (1, 6, 14, 14)"""


class AvgPool2d(_Pool2d):
    """Mean over kernel windows (stride defaults to the kernel size).

    Example: ``nn.AvgPool2d(2)(sampan.randn(1, 6, 28, 28)).shape`` is (1, 6, 14, 14)"""
    _op = "avg_pool2d"


class AdaptiveAvgPool2d(Layer):
    """Average-pool to a fixed output size.

    Example: ``nn.AdaptiveAvgPool2d(1)(sampan.randn(2, 8, 7, 7)).shape`` is (2, 8, 1, 1)"""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = _pair(output_size)

    def forward(self, x):
        return _fn("adaptive_avg_pool2d")(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["Conv1d", "Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"]
