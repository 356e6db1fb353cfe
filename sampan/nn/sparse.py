"""(issue 17) EmbeddingBag: sums, means or maxima of bags of embedding rows without the
(bags, length, dim) intermediate a user would build from Embedding."""
from __future__ import annotations

from ..errors import SampanValueError
from ..ops.creation import zeros
from . import init
from .layer import Layer, Parameter


class EmbeddingBag(Layer):
    """A lookup table whose forward reduces bags of rows: a 2-d input is one bag a row, a
    1-d input is split at `offsets`; mode "sum", "mean" (default) or "max";
    per_sample_weights (mode "sum"); padding_idx entries are left out; N(0, 1) init.
    `sparse=True` is accepted, but the weight's gradient is dense (as for sparse=False).

    Example::

        >>> bag = nn.EmbeddingBag(10, 3, mode="sum")
        >>> bag(sampan.tensor([1, 2, 4, 5, 4]), sampan.tensor([0, 2])).shape
        (2, 3)
    """

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, mode="mean", sparse=False, _weight=None,
                 include_last_offset=False, padding_idx=None, device=None, dtype=None):
        super().__init__()
        if mode not in ("sum", "mean", "max"):
            raise SampanValueError(f"EmbeddingBag: got mode={mode!r}; expected 'sum', "
                                   "'mean' or 'max'")
        if max_norm is not None or scale_grad_by_freq:
            raise SampanValueError("EmbeddingBag: got max_norm or scale_grad_by_freq; "
                                   "expected neither (not implemented in sampan)")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise SampanValueError(f"EmbeddingBag: got padding_idx={padding_idx}; "
                                       f"expected an index in [-{num_embeddings}, "
                                       f"{num_embeddings})")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.mode, self.sparse, self.padding_idx = mode, sparse, padding_idx
        self.include_last_offset = include_last_offset
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        if _weight is None:
            self.weight = Parameter(zeros(num_embeddings, embedding_dim, dtype=dtype,
                                          device=device))
            init.normal_(self.weight)
            if padding_idx is not None:
                self.weight._data[padding_idx] = 0
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise SampanValueError(f"EmbeddingBag: got _weight of shape "
                                       f"{tuple(_weight.shape)}; expected "
                                       f"{(num_embeddings, embedding_dim)}")
            self.weight = Parameter(_weight)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, mode="mean", sparse=False,
                        include_last_offset=False, padding_idx=None):
        """An EmbeddingBag over a copy of `embeddings` (rows, dim); frozen by default.

        Example: ``nn.EmbeddingBag.from_pretrained(sampan.randn(10, 3), mode="max")``"""
        from ..ops.shape import clone
        if embeddings.ndim != 2:
            raise SampanValueError(f"EmbeddingBag.from_pretrained: got embeddings of shape "
                                   f"{tuple(embeddings.shape)}; expected a 2-d tensor")
        rows, dim = embeddings.shape
        bag = cls(rows, dim, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                  clone(embeddings.detach()), include_last_offset, padding_idx)
        bag.weight.requires_grad_(not freeze)
        return bag

    def forward(self, input, offsets=None, per_sample_weights=None):
        from ..ops.bagnorm import embedding_bag
        return embedding_bag(input, self.weight, offsets, mode=self.mode,
                             per_sample_weights=per_sample_weights,
                             include_last_offset=self.include_last_offset,
                             padding_idx=self.padding_idx)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
        return s + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


EXPORTS: list = ["EmbeddingBag"]
