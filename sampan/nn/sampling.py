"""(issue 17) Resampling layers: Upsample (and its fixed-mode forms), PixelShuffle,
PixelUnshuffle, Unfold and Fold, over the functions of `sampan.ops.resample`."""
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


EXPORTS: list = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle",
                 "PixelUnshuffle", "Unfold", "Fold"]
