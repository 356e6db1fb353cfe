"""(issue 17) distance layers; each name `sampan.nn` exports from it is listed in `EXPORTS`."""
from __future__ import annotations

from ._f_linalg import cosine_similarity, pairwise_distance
from .layer import Layer

EXPORTS: list = ["CosineSimilarity", "PairwiseDistance"]


class CosineSimilarity(Layer):
    """Cosine similarity of two inputs along `dim`, as torch.nn.CosineSimilarity.
    Example: ``nn.CosineSimilarity(dim=1)(a, b)``."""

    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return cosine_similarity(x1, x2, self.dim, self.eps)

    def extra_repr(self):
        return f"dim={self.dim}, eps={self.eps}"


class PairwiseDistance(Layer):
    """||x1 - x2 + eps||_p over the last dim, as torch.nn.PairwiseDistance.
    Example: ``nn.PairwiseDistance()(a, b)``."""

    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        return pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)

    def extra_repr(self):
        return f"p={self.norm}, eps={self.eps}, keepdim={self.keepdim}"
