"""Linear, Bilinear, Embedding, Identity, Flatten, Dropout."""
from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import SampanValueError
from ..ops.creation import empty
from ..ops.registry import STATE
from ..ops.shape import flatten
from . import functional as F
from . import init
from .layer import Layer, Parameter


def _check_positive(layer, **kw):
    for k, v in kw.items():
        if not isinstance(v, int) or v <= 0:
            raise SampanValueError(f"{layer}: got {k}={v!r}; expected a positive int")


class Linear(Layer):
    """``y = x @ weight + bias`` with weight of shape (in_features, out_features).

    Weights and bias start as U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default).

    Example::

        >>> fc = nn.Linear(784, 10)
        >>> fc(sampan.randn(32, 784)).shape
        (32, 10)
    """

    def __init__(self, in_features, out_features, bias=True, dtype=None):
        super().__init__()
        _check_positive("Linear", in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(empty(in_features, out_features, dtype=dtype))
        self.bias = Parameter(empty(out_features, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.in_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Bilinear(Layer):
    """``y[k] = x1 @ weight[k] @ x2 + bias[k]``, weight (out, in1, in2) as in PyTorch.

    Example::

        >>> nn.Bilinear(3, 5, 4)(sampan.randn(2, 3), sampan.randn(2, 5)).shape
        (2, 4)
    """

    def __init__(self, in1_features, in2_features, out_features, bias=True, dtype=None):
        super().__init__()
        _check_positive("Bilinear", in1_features=in1_features, in2_features=in2_features,
                        out_features=out_features)
        self.in1_features, self.in2_features = in1_features, in2_features
        self.out_features = out_features
        self.weight = Parameter(empty(out_features, in1_features, in2_features, dtype=dtype))
        self.bias = Parameter(empty(out_features, dtype=dtype)) if bias else None
        bound = 1.0 / math.sqrt(in1_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x1, x2):
        return F.bilinear(x1, x2, self.weight, self.bias)

    def extra_repr(self):
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class Embedding(Layer):
    """A lookup table of `num_embeddings` rows of size `embedding_dim` (N(0, 1) init;
    the `padding_idx` row starts at zero and never gets a gradient).

    With ``sparse=True`` the weight's gradient is row-sparse, as PyTorch's: ``weight.grad``
    stays a dense Tensor (zeros outside the rows looked up), and the rows the backward
    passes touched since the gradient was last cleared (sorted, without `padding_idx`)
    are in `sampan.nn.linear.sparse_grad_rows(weight)`. `optim.SparseAdam` updates only those rows;
    `SGD` and `Adagrad` accept such gradients (without weight decay), and other
    optimisers refuse them, as in PyTorch.

    Example::

        >>> emb = nn.Embedding(1000, 64, padding_idx=0)
        >>> emb(sampan.tensor([[1, 2, 0]])).shape
        (1, 3, 64)
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, dtype=None, *,
                 sparse=False):
        super().__init__()
        self.sparse = bool(sparse)
        _check_positive("Embedding", num_embeddings=num_embeddings,
                        embedding_dim=embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise SampanValueError(f"Embedding: got padding_idx={padding_idx}; expected "
                                       f"an index in [-{num_embeddings}, {num_embeddings})")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        self.weight = Parameter(empty(num_embeddings, embedding_dim, dtype=dtype))
        init.normal_(self.weight)
        if padding_idx is not None:
            self.weight._data[padding_idx] = 0

    def forward(self, ids):
        out = F.embedding(ids, self.weight, self.padding_idx)
        if self.sparse and out.requires_grad and STATE.tracer is None:
            _track_rows(self.weight, out, ids, self.padding_idx)
        return out

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        s += f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return s + (", sparse=True" if self.sparse else "")


def sparse_grad_rows(weight):
    """The rows a sparse `Embedding`'s current ``weight.grad`` covers (sorted int64), or
    None when the gradient is dense or absent.

    Example::

        >>> emb = nn.Embedding(10, 3, sparse=True); emb(sampan.tensor([4, 1, 4])).sum().backward()
        >>> sparse_grad_rows(emb.weight)
        array([1, 4])
    """
    if weight.grad is None:
        return None
    return getattr(weight, "_sparse_grad_rows", None)


def _track_rows(weight, out, ids, padding_idx):
    """Note the rows of this lookup when its output gets a gradient; when the weight's
    gradient arrives, add them to the rows its (accumulated) gradient covers."""
    rows = np.unique(np.asarray(ids._data if hasattr(ids, "_data") else ids, np.int64))
    if padding_idx is not None:
        rows = rows[rows != padding_idx]
    settler = weight.__dict__.get("_sparse_settler")
    if settler is None or settler.weight is not weight:
        settler = weight._sparse_settler = _RowSettler(weight)
        weight.register_hook(settler)
    out.register_hook(functools.partial(_note_rows, settler, rows))


def _note_rows(settler, rows, g):
    settler.pending.append(rows)


class _RowSettler:
    """The weight's gradient hook: turns the rows noted during a backward into the rows
    the weight's gradient covers. An object, not a closure, so a deep-copied layer's
    hook points at the copy's weight."""

    def __init__(self, weight):
        self.weight = weight
        self.pending = []

    def __call__(self, g):
        w = self.weight
        new = np.unique(np.concatenate(self.pending)) if self.pending else np.zeros(0, np.int64)
        self.pending.clear()
        old = getattr(w, "_sparse_grad_rows", None)
        # a gradient that was dropped or zeroed (zero_grad) starts afresh, as torch's sparse
        # gradient does (zero_() leaves it with no entries)
        if w.grad is None or old is None or not w.grad._data.any():
            w._sparse_grad_rows = new
        else:
            w._sparse_grad_rows = np.union1d(old, new)


class Identity(Layer):
    """Returns its input. Example: ``nn.Identity()(x) is x``."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Flatten(Layer):
    """Merge dims start_dim..end_dim (default: all but the batch dim).

    Example: ``nn.Flatten()(sampan.randn(2, 3, 4)).shape`` is (2, 12)"""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Dropout(Layer):
    """Zero elements with probability `p` in training mode (identity in eval mode);
    `inplace` writes the result into the input.

    Example: ``nn.Dropout(0.1)``"""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise SampanValueError(f"{type(self).__name__}: got p={p}; expected a probability "
                                   "in [0, 1]")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"   # as PyTorch prints it


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["Linear", "Bilinear", "Embedding", "Identity", "Flatten", "Dropout"]
