"""(issue 17) functional forms re-exported by `sampan.nn.functional` through `__all__`:
padding, pooling with indices, unpooling (the spatial area)."""
from __future__ import annotations

from ..ops.padding import pad
from ..ops.pool import avg_pool2d, max_pool2d
from ..ops.pool_index import adaptive_max_pool2d, max_unpool2d

__all__: list = ["pad", "max_pool2d", "avg_pool2d", "max_unpool2d", "adaptive_max_pool2d"]
