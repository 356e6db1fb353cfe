"""(issue 17) functional forms re-exported by `sampan.nn.functional` through `__all__`:
distances between vectors (the composites of `sampan/ops/decomp_norms.py`)."""
from __future__ import annotations

from ..ops.decomp_norms import cosine_similarity, pairwise_distance, pdist

__all__: list = ["cosine_similarity", "pairwise_distance", "pdist"]
