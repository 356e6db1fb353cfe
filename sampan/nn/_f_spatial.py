"""(issue 17) functional forms re-exported by `sampan.nn.functional` through `__all__`:
padding, pooling with indices, unpooling, 1-d and 3-d conv and pooling (the spatial area)."""
from __future__ import annotations

from ..ops.bagnorm import embedding_bag, instance_norm, local_response_norm
from ..ops.grid import affine_grid, grid_sample
from ..ops.padding import pad
from ..ops.pool3d import adaptive_avg_pool3d, avg_pool3d, conv3d, max_pool3d
from ..ops.pool_index import adaptive_max_pool2d, max_unpool2d
from ..ops.resample import (channel_shuffle, fold, interpolate, pixel_shuffle, pixel_unshuffle,
                            unfold, upsample)
from ..ops.spatial1d import (adaptive_avg_pool1d, adaptive_max_pool1d, avg_pool1d,
                             conv_transpose1d, lp_pool1d, lp_pool2d, max_pool1d, max_unpool1d)

# (max_pool2d and avg_pool2d, with their new ceil_mode/return_indices/divisor_override,
# are exported by functional.py itself)
__all__: list = ["pad", "max_unpool2d", "adaptive_max_pool2d",
                 "conv3d", "max_pool3d", "avg_pool3d", "adaptive_avg_pool3d", "max_pool1d",
                 "avg_pool1d", "adaptive_avg_pool1d", "adaptive_max_pool1d", "max_unpool1d",
                 "conv_transpose1d", "interpolate", "upsample", "upsample_nearest",
                 "upsample_bilinear", "pixel_shuffle", "pixel_unshuffle", "unfold", "fold",
                 "grid_sample", "affine_grid", "instance_norm", "local_response_norm",
                 "embedding_bag", "channel_shuffle", "lp_pool1d", "lp_pool2d"]


def upsample_nearest(input, size=None, scale_factor=None):
    """`interpolate(..., mode="nearest")` (PyTorch's older name)."""
    return interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """`interpolate(..., mode="bilinear", align_corners=True)` (PyTorch's older name)."""
    return interpolate(input, size, scale_factor, "bilinear", True)
