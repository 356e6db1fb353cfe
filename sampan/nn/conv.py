"""Convolution and pooling layers over the conv ops of `sampan.ops.conv`.

Conv weights are (out, in / groups, *kernel) as in PyTorch; ConvTranspose2d weights
are (in, out / groups, kh, kw)."""
from __future__ import annotations

import math

from ..errors import SampanError, SampanValueError
from ..ops.creation import zeros
from . import init
from .layer import Layer, Parameter


PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


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
                 dilation=1, groups=1, bias=True, padding_mode="zeros", device=None,
                 dtype=None, output_padding=0):
        super().__init__()
        name = type(self).__name__
        if in_channels % groups or out_channels % groups:
            raise SampanValueError(f"{name}: got in_channels={in_channels}, out_channels="
                                   f"{out_channels}, groups={groups}; expected both channel "
                                   "counts divisible by groups")
        modes = ("zeros",) if self._transposed else PADDING_MODES
        if padding_mode not in modes:
            raise SampanValueError(f"{name}: got padding_mode={padding_mode!r}; expected one "
                                   f"of {modes}")
        if isinstance(padding, str) and (padding not in ("same", "valid") or (
                padding == "same" and _pair(stride, self._nd) != (1,) * self._nd)):
            raise SampanValueError(f"{name}: got padding={padding!r}, stride={stride}; "
                                   "expected 'valid', or 'same' with stride 1, or ints")
        self.padding_mode = padding_mode
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
        self.weight = Parameter(zeros(shape, dtype=dtype, device=device))
        self.bias = (Parameter(zeros(out_channels, dtype=dtype, device=device)) if bias
                     else None)
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

    def _mode_pad(self):
        """PyTorch's amounts for a non-zeros padding_mode, last dim first (F.pad's order):
        'same' puts the odd one on the right."""
        if self.padding == "valid":
            return None
        if self.padding == "same":
            tot = [d * (k - 1) for k, d in zip(self.kernel_size, self.dilation)]
            pairs = [(t // 2, t - t // 2) for t in tot]
        else:
            pairs = [(p, p) for p in self.padding]
        return tuple(v for pr in reversed(pairs) for v in pr)

    def forward(self, x):
        args = self._args()
        if self.padding_mode != "zeros":
            from . import functional as F
            amounts = self._mode_pad()
            if amounts is not None:
                x = F.pad(x, amounts, mode=self.padding_mode)
            args["padding"] = 0
        return _fn(self._op)(x, self.weight, self.bias, **args)

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding not in ((0,) * self._nd, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
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

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype, output_padding)

    def _args(self):
        a = super()._args()
        a["output_padding"] = self._unpair(self.output_padding)
        return a

    def _output_padding(self, x, output_size):
        """PyTorch's output_padding for a requested output_size (its last dims): the
        amount past the smallest size, which must stay below the stride."""
        n = self._nd
        size = tuple(int(v) for v in tuple(output_size)[-n:])
        if len(tuple(output_size)) not in (n, n + 2):
            raise SampanValueError(f"{type(self).__name__}: got output_size={output_size}; "
                                   f"expected {n} or {n + 2} sizes")
        out = []
        for d in range(n):
            lo = ((x.shape[x.ndim - n + d] - 1) * self.stride[d] - 2 * self.padding[d]
                  + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            if not lo <= size[d] < lo + self.stride[d]:
                raise SampanValueError(
                    f"{type(self).__name__}: got output_size={tuple(output_size)} for input "
                    f"{tuple(x.shape)}; expected dim {d} in [{lo}, {lo + self.stride[d] - 1}]")
            out.append(size[d] - lo)
        return tuple(out)

    def forward(self, x, output_size=None):
        args = self._args()
        if output_size is not None:
            args["output_padding"] = self._unpair(self._output_padding(x, output_size))
        return _fn(self._op)(x, self.weight, self.bias, **args)


class MaxPool2d(Layer):
    """Max over kernel windows (stride defaults to the kernel size); PyTorch's arguments:
    ceil_mode keeps a last partial window, return_indices also returns the int64 flat
    per-plane indices of the maxima (for MaxUnpool2d).

    Example: ``nn.MaxPool2d(2)(sampan.randn(1, 6, 28, 28)).shape`` is (1, 6, 14, 14)"""
    _nd = 2
    _op = "max_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        n = self._nd
        self.kernel_size = _pair(kernel_size, n)
        self.stride = self.kernel_size if stride is None else _pair(stride, n)
        self.padding, self.dilation = _pair(padding, n), _pair(dilation, n)
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        return _fn(self._op)(x, self.kernel_size, self.stride, self.padding, self.dilation,
                             ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
                f", dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Layer):
    """Mean over kernel windows (stride defaults to the kernel size), with PyTorch's
    ceil_mode, count_include_pad and divisor_override.

    Example: ``nn.AvgPool2d(2)(sampan.randn(1, 6, 28, 28)).shape`` is (1, 6, 14, 14)"""
    _nd = 2
    _op = "avg_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        n = self._nd
        self.kernel_size = _pair(kernel_size, n)
        self.stride = self.kernel_size if stride is None else _pair(stride, n)
        self.padding = _pair(padding, n)
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        kw = {"divisor_override": self.divisor_override} if self._nd != 1 else {}
        return _fn(self._op)(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                             self.count_include_pad, **kw)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool2d(Layer):
    """The partial inverse of MaxPool2d: values back at their indices, zeros elsewhere.

    Example::

        >>> y, i = nn.MaxPool2d(2, return_indices=True)(sampan.randn(1, 1, 4, 4))
        >>> nn.MaxUnpool2d(2)(y, i).shape
        (1, 1, 4, 4)
    """
    _nd = 2
    _op = "max_unpool2d"

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        n = self._nd
        self.kernel_size = _pair(kernel_size, n)
        self.stride = self.kernel_size if stride is None else _pair(stride, n)
        self.padding = _pair(padding, n)

    def forward(self, x, indices, output_size=None):
        return _fn(self._op)(x, indices, self.kernel_size, self.stride, self.padding,
                             output_size)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class ConvTranspose1d(ConvTranspose2d):
    """Transposed 1-d convolution over (N, C, L); weight (in, out / groups, k).

    Example: ``nn.ConvTranspose1d(4, 2, 3, stride=2)(sampan.randn(1, 4, 5)).shape`` is
    (1, 2, 11)"""
    _nd = 1
    _op = "conv_transpose1d"


class Conv3d(_ConvNd):
    """3-d convolution over (N, C, D, H, W) input (a composite of window slices and one
    matmul: for small volumes).

    Example: ``nn.Conv3d(2, 4, 3, padding=1)(sampan.randn(1, 2, 4, 4, 4)).shape`` is
    (1, 4, 4, 4, 4)"""
    _nd = 3
    _op = "conv3d"


class MaxPool1d(MaxPool2d):
    """Max over windows along L (PyTorch's arguments).

    Example: ``nn.MaxPool1d(2)(sampan.randn(2, 3, 8)).shape`` is (2, 3, 4)"""
    _nd = 1
    _op = "max_pool1d"


class MaxPool3d(MaxPool2d):
    """Max over kd x kh x kw windows of (N, C, D, H, W) input (PyTorch's arguments).

    Example: ``nn.MaxPool3d(2)(sampan.randn(1, 2, 4, 4, 4)).shape`` is (1, 2, 2, 2, 2)"""
    _nd = 3
    _op = "max_pool3d"


class AvgPool1d(AvgPool2d):
    """Mean over windows along L (PyTorch's arguments).

    Example: ``nn.AvgPool1d(2)(sampan.randn(2, 3, 8)).shape`` is (2, 3, 4)"""
    _nd = 1
    _op = "avg_pool1d"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)


class AvgPool3d(AvgPool2d):
    """Mean over kd x kh x kw windows (PyTorch's arguments).

    Example: ``nn.AvgPool3d(2)(sampan.randn(1, 2, 4, 4, 4)).shape`` is (1, 2, 2, 2, 2)"""
    _nd = 3
    _op = "avg_pool3d"


class MaxUnpool1d(MaxUnpool2d):
    """The partial inverse of MaxPool1d.

    Example: ``nn.MaxUnpool1d(2)(*nn.MaxPool1d(2, return_indices=True)(x))``"""
    _nd = 1
    _op = "max_unpool1d"


class _Adaptive(Layer):
    _nd = 2
    _op = "adaptive_avg_pool2d"
    _indices = False

    def __init__(self, output_size, return_indices=False):
        super().__init__()
        if return_indices and not self._indices:
            raise SampanValueError(f"{type(self).__name__}: got return_indices=True; "
                                   "expected it only on the adaptive max poolings")
        self.output_size = (output_size if self._nd == 1 or isinstance(output_size, tuple)
                            else _pair(output_size, self._nd))
        self.return_indices = return_indices

    def forward(self, x):
        if self._indices:
            return _fn(self._op)(x, self.output_size, self.return_indices)
        return _fn(self._op)(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveAvgPool2d(_Adaptive):
    """Average-pool to a fixed output size (None keeps that dim).

    Example: ``nn.AdaptiveAvgPool2d(1)(sampan.randn(2, 8, 7, 7)).shape`` is (2, 8, 1, 1)"""

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveAvgPool1d(_Adaptive):
    """Average-pool along L to a fixed length.

    Example: ``nn.AdaptiveAvgPool1d(3)(sampan.randn(2, 4, 7)).shape`` is (2, 4, 3)"""
    _nd = 1
    _op = "adaptive_avg_pool1d"

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveAvgPool3d(_Adaptive):
    """Average-pool to a fixed (D, H, W) size.

    Example: ``nn.AdaptiveAvgPool3d(1)(sampan.randn(1, 2, 3, 4, 5)).shape`` is (1, 2, 1, 1, 1)"""
    _nd = 3
    _op = "adaptive_avg_pool3d"

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveMaxPool1d(_Adaptive):
    """Max-pool along L to a fixed length; return_indices also gives the positions.

    Example: ``nn.AdaptiveMaxPool1d(3)(sampan.randn(2, 4, 7)).shape`` is (2, 4, 3)"""
    _nd = 1
    _op = "adaptive_max_pool1d"
    _indices = True


class AdaptiveMaxPool2d(_Adaptive):
    """Max-pool to a fixed output size; return_indices also gives the int64 flat
    per-plane indices of the maxima.

    Example: ``nn.AdaptiveMaxPool2d(2)(sampan.randn(2, 4, 7, 5)).shape`` is (2, 4, 2, 2)"""
    _indices = True
    _op = "adaptive_max_pool2d"


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["Conv1d", "Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
           "MaxUnpool2d", "ConvTranspose1d", "Conv3d", "MaxPool1d", "MaxPool3d", "AvgPool1d",
           "AvgPool3d", "MaxUnpool1d", "AdaptiveAvgPool1d", "AdaptiveAvgPool3d",
           "AdaptiveMaxPool1d", "AdaptiveMaxPool2d"]
