"""(issue 17) Resampling and padding layers: Upsample (and its fixed-mode forms),
PixelShuffle, PixelUnshuffle, ChannelShuffle, Unfold and Fold over the functions of
`sampan.ops.resample`; the padding layers (ZeroPad2d, ReflectionPad2d, … in 1, 2 and 3
dims) over `F.pad`."""
from __future__ import annotations

from ..ops import resample as _R
from .layer import Layer


class Upsample(Layer):
    """`F.interpolate` as a layer: a target `size` or a `scale_factor`, PyTorch's modes.

    Example::

        >>> nn.Upsample(scale_factor=2, mode="bilinear")(sampan.randn(1, 3, 4, 4)).shape
        (1, 3, 8, 8)
    """

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return _R.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                              self.recompute_scale_factor)

    def extra_repr(self):
        what = f"size={self.size}" if self.size is not None else \
            f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour 2-d upsampling. Example: ``nn.UpsamplingNearest2d(scale_factor=2)``"""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, "nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear 2-d upsampling with align_corners=True (PyTorch's choice for this layer).

    Example: ``nn.UpsamplingBilinear2d(scale_factor=2)(sampan.randn(1, 1, 3, 3))``"""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, "bilinear", True)


class PixelShuffle(Layer):
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r).

    Example: ``nn.PixelShuffle(2)(sampan.randn(1, 8, 3, 3)).shape`` is (1, 2, 6, 6)"""

    def __init__(self, upscale_factor):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x):
        return _R.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self):
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Layer):
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W).

    Example: ``nn.PixelUnshuffle(2)(sampan.randn(1, 2, 6, 6)).shape`` is (1, 8, 3, 3)"""

    def __init__(self, downscale_factor):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x):
        return _R.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self):
        return f"downscale_factor={self.downscale_factor}"


class Unfold(Layer):
    """Sliding local blocks (im2col): (N, C, H, W) -> (N, C*kh*kw, L).

    Example: ``nn.Unfold(2)(sampan.randn(1, 2, 4, 4)).shape`` is (1, 8, 9)"""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size, self.dilation = kernel_size, dilation
        self.padding, self.stride = padding, stride

    def forward(self, x):
        return _R.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


class Fold(Layer):
    """Sum sliding local blocks into an image (col2im): (N, C*kh*kw, L) -> (N, C, H, W).

    Example: ``nn.Fold((4, 4), 2)(sampan.randn(1, 8, 9)).shape`` is (1, 2, 4, 4)"""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, x):
        return _R.fold(x, self.output_size, self.kernel_size, self.dilation, self.padding,
                       self.stride)

    def extra_repr(self):
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, padding={self.padding}, stride={self.stride}")


class ChannelShuffle(Layer):
    """Interleave the channels of `groups` groups: (N, C, *) with C = g * k becomes
    channel order (0, k, 2k, …, 1, k + 1, …), as PyTorch's.

    Example: ``nn.ChannelShuffle(2)(sampan.randn(1, 4, 2, 2)).shape`` is (1, 4, 2, 2)"""

    def __init__(self, groups):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        return _R.channel_shuffle(x, self.groups)

    def extra_repr(self):
        return f"groups={self.groups}"


class _PadNd(Layer):
    _nd = 2
    _mode = "constant"

    def __init__(self, padding, value=0.0):
        super().__init__()
        from ..errors import SampanValueError
        if isinstance(padding, int):
            padding = (padding,) * (2 * self._nd)
        padding = tuple(int(p) for p in padding)
        if len(padding) != 2 * self._nd:
            raise SampanValueError(f"{type(self).__name__}: got padding={padding}; expected "
                                   f"an int or {2 * self._nd} amounts (last dim first)")
        self.padding, self.value = padding, value

    def forward(self, x):
        from ..ops.padding import pad
        if self._mode == "constant":
            return pad(x, self.padding, "constant", self.value)
        return pad(x, self.padding, self._mode)

    def extra_repr(self):
        return f"{self.padding}" + (f", value={self.value}" if self._mode == "constant" else "")


def _pad_layer(name, nd, mode, doc):
    """One padding layer class: ConstantPad*d take (padding, value), the others padding."""
    if mode == "constant" and not name.startswith("Zero"):
        def init(self, padding, value):
            _PadNd.__init__(self, padding, value)
    else:
        def init(self, padding):
            _PadNd.__init__(self, padding)
    cls = type(name, (_PadNd,), {"_nd": nd, "_mode": mode, "__doc__": doc, "__init__": init})
    cls.__module__ = __name__
    return cls


_PAD_LAYERS = {}
for _nd in (1, 2, 3):
    for _kind, _mode in (("Zero", "constant"), ("Constant", "constant"),
                         ("Reflection", "reflect"), ("Replication", "replicate"),
                         ("Circular", "circular")):
        _name = f"{_kind}Pad{_nd}d"
        _PAD_LAYERS[_name] = _pad_layer(
            _name, _nd, _mode, f"Pad the last {_nd} dim(s) (F.pad mode {_mode!r}"
            f"{', zeros' if _kind == 'Zero' else ''}); padding is an int or {2 * _nd} amounts,"
            f" last dim first.\n\n    Example: ``nn.{_name}(1)``")
globals().update(_PAD_LAYERS)


class LPPool1d(Layer):
    """Power-average pooling along L: (sum of x**p over each window) ** (1/p).

    Example: ``nn.LPPool1d(2, 3)(sampan.rand(1, 2, 7)).shape`` is (1, 2, 2)"""
    _op = "lp_pool1d"

    def __init__(self, norm_type, kernel_size, stride=None, ceil_mode=False):
        super().__init__()
        self.norm_type, self.kernel_size = norm_type, kernel_size
        self.stride, self.ceil_mode = stride, ceil_mode

    def forward(self, x):
        from . import functional as F
        return getattr(F, self._op)(x, self.norm_type, self.kernel_size, self.stride,
                                    self.ceil_mode)

    def extra_repr(self):
        return (f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, ceil_mode={self.ceil_mode}")


class LPPool2d(LPPool1d):
    """Power-average pooling over (H, W) windows.

    Example: ``nn.LPPool2d(2, 2)(sampan.rand(1, 2, 4, 4)).shape`` is (1, 2, 2, 2)"""
    _op = "lp_pool2d"


EXPORTS: list = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle",
                 "PixelUnshuffle", "ChannelShuffle", "Unfold", "Fold", "LPPool1d",
                 "LPPool2d"] + sorted(_PAD_LAYERS)
