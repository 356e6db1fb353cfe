"""CTR models on sampan autograd: a differentiable hash-embedding lookup, DLRM, DeepFM and
Wide&Deep, and a training step that updates dense and sparse parameters.

:class:`HashEmbedding` turns ids into a tensor: it pulls the batch's unique ids from a
:class:`ShardedEmbedding`, wraps their vectors as a leaf ``E`` that requires grad, and
returns ``rows_gather(E, inverse)``. After ``backward`` the gradient of ``E`` is exactly
(unique ids, summed row gradients); :meth:`HashEmbedding.push` sends it to the shards,
whose sparse optimiser updates only those rows.

The layer's zero-size parameter ``sparse_table`` hands the table to whatever optimiser
gets ``model.parameters()``: its ``step()`` pushes the pending sparse gradients, so a CTR
loop reads like any other::

    >>> model = DLRM(n_fields=2, n_dense=3, dim=4, bottom=(8, 4), top=(8,))
    >>> opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)   # dense weights
    >>> logits = model(np.ones((5, 2), np.int64), np.zeros((5, 3), np.float32))
    >>> loss = F.binary_cross_entropy_with_logits(logits, sampan.tensor(np.ones(5)))
    >>> opt.zero_grad(); loss.backward(); opt.step()   # dense update + sparse push
"""

from __future__ import annotations

import itertools

import numpy as np

import sampan
from sampan import nn
from sampan.nn import functional as F
from sampan.ops.sparse import pair_dots, rows_gather, rows_scatter_add
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import PulledBatch, ShardedEmbedding

__all__ = ["DLRM", "DeepFM", "HashEmbedding", "WideAndDeep", "predict", "train_step"]


class HashEmbedding(nn.Layer):
    """Differentiable lookup of raw int64 ids in a sharded, collisionless hash table.

    >>> e = HashEmbedding(4); e(np.array([[1, 2], [3, 1]])).shape
    (2, 2, 4)
    """

    def __init__(self, dim: int, n_shards: int = 1, lr: float = 0.05, optimizer_factory=None,
                 emb: ShardedEmbedding | None = None, **table_kwargs):
        super().__init__()
        make = optimizer_factory or (lambda: SparseAdagrad(lr))
        # `emb or ...` would test len(emb): an empty table is falsy
        self.emb = emb if emb is not None else ShardedEmbedding(dim, n_shards, make,
                                                                **table_kwargs)
        self.dim = dim
        self.step = 0
        self._pending: list[tuple[np.ndarray, sampan.Tensor]] = []
        # zero-size: it carries no numbers, only the table into model.parameters(); an
        # optimiser's step() calls its `_table_step` (the push) besides its dense update.
        # The rows' arithmetic stays with the table's own sparse optimiser.
        self.sparse_table = nn.Parameter(sampan.zeros(0))
        self.sparse_table._table_step = self.push

    def forward(self, ids=None, pulled: PulledBatch | None = None):
        """``(B, F, dim)`` tensor for a ``(B, F)`` id array (or a prefetched batch)."""
        if pulled is not None:
            uniq, inverse, vecs = pulled.uniq, pulled.inverse, pulled.vectors
            shape = np.shape(ids) if ids is not None else (len(pulled.batch), -1)
        else:
            ids = np.asarray(ids)
            shape = ids.shape
            if not self.training or not sampan.is_grad_enabled():
                return sampan.tensor(self.emb.read(ids).reshape(shape + (self.dim,)))
            uniq, inverse, vecs = self.emb.pull(ids, self.step)
        leaf = sampan.tensor(vecs, requires_grad=True)
        self._pending.append((uniq, leaf))
        return sampan.reshape(rows_gather(leaf, inverse), *shape, self.dim)

    def bags(self, offsets, ids, mode: str = "sum"):
        """EmbeddingBag: pool the vectors of each CSR bag (``sum`` or ``mean``) -> (B, dim).

        Built from the two sparse ops (gather the rows, scatter-add them into their bag),
        so it is differentiable; empty bags give zeros.
        """
        if mode not in ("sum", "mean"):
            raise ValueError(f"differentiable bag pooling supports 'sum' and 'mean', got {mode!r}")
        offsets = np.asarray(offsets, np.int64)
        lens = np.diff(offsets)
        bag_of = np.repeat(np.arange(lens.size), lens)
        rows = sampan.reshape(self(np.asarray(ids, np.int64)), -1, self.dim)
        pooled = rows_scatter_add(rows, bag_of, lens.size)
        if mode == "mean":
            pooled = pooled * sampan.tensor(1.0 / np.maximum(lens, 1)[:, None].astype(np.float32))
        return pooled

    def push(self) -> None:
        """Apply the sparse gradients of every lookup since the last push (`optimizer.step()`
        over the model's parameters calls it; with nothing pending it does nothing)."""
        if not self._pending:
            return
        for uniq, leaf in self._pending:
            if leaf.grad is not None:
                self.emb.push(uniq, leaf.grad.numpy(), self.step)
        self._pending.clear()
        self.step += 1


def _mlp(sizes, last_relu: bool) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Layer):
    """DLRM: bottom MLP on dense features, pairwise dots of all vectors, top MLP.

    Defaults are WORKLOADS.md W4: 26 fields, 13 dense, dim 16, bottom 13-64-16,
    interaction 351 dots + bottom output = 367, top 367-256-1.

    >>> m = DLRM(n_fields=2, n_dense=3, dim=4, bottom=(8, 4), top=(8,))
    >>> m(np.zeros((5, 2), np.int64), np.zeros((5, 3), np.float32)).shape
    (5,)
    """

    def __init__(self, n_fields: int = 26, n_dense: int = 13, dim: int = 16,
                 bottom=(64, 16), top=(256,), embedding: HashEmbedding | None = None,
                 **emb_kwargs):
        super().__init__()
        if bottom[-1] != dim:
            raise ValueError(f"bottom MLP must end at the embedding dim {dim}, got {bottom}")
        self.embedding = embedding or HashEmbedding(dim, **emb_kwargs)
        self.bottom = _mlp((n_dense, *bottom), last_relu=True)
        k = n_fields + 1
        self.top = _mlp((k * (k - 1) // 2 + dim, *top, 1), last_relu=False)

    def forward(self, ids, dense, pulled: PulledBatch | None = None):
        """Logits ``(B,)`` for ``(B, F)`` ids and ``(B, n_dense)`` features."""
        x = self.bottom(sampan.tensor(dense))
        e = self.embedding(ids, pulled)
        t = sampan.concat([sampan.unsqueeze(x, 1), e], axis=1)
        pairs = pair_dots(t)
        z = self.top(sampan.concat([x, pairs], axis=1))
        return sampan.reshape(z, -1)


class DeepFM(nn.Layer):
    """DeepFM: first-order weights + FM second-order term + deep MLP on the embeddings.

    >>> DeepFM(n_fields=2, n_dense=3, dim=4)(np.ones((5, 2), np.int64),
    ...                                      np.zeros((5, 3), np.float32)).shape
    (5,)
    """

    def __init__(self, n_fields: int = 26, n_dense: int = 13, dim: int = 16, hidden=(256, 128),
                 **emb_kwargs):
        super().__init__()
        self.embedding = HashEmbedding(dim, **emb_kwargs)
        self.first_order = HashEmbedding(1, init_std=0.0, **emb_kwargs)
        self.dense_linear = nn.Linear(n_dense, 1)
        self.deep = _mlp((n_fields * dim + n_dense, *hidden, 1), last_relu=False)

    def forward(self, ids, dense, pulled=None):
        """Logits ``(B,)``."""
        d = sampan.tensor(dense)
        e = self.embedding(ids, pulled)  # (B, F, dim)
        first = sampan.sum(sampan.reshape(self.first_order(ids), len(d), -1), axis=1)
        s = sampan.sum(e, axis=1)
        fm = 0.5 * sampan.sum(s * s - sampan.sum(e * e, axis=1), axis=1)
        deep = self.deep(sampan.concat([sampan.reshape(e, len(d), -1), d], axis=1))
        return first + fm + sampan.reshape(deep + self.dense_linear(d), -1)

    def push(self):
        """Apply both embeddings' sparse gradients."""
        self.embedding.push()
        self.first_order.push()


class WideAndDeep(nn.Layer):
    """Wide (per-id weights + linear dense) plus deep (MLP over embeddings and dense).

    >>> WideAndDeep(n_fields=2, n_dense=3, dim=4)(np.ones((5, 2), np.int64),
    ...                                           np.zeros((5, 3), np.float32)).shape
    (5,)
    """

    def __init__(self, n_fields: int = 26, n_dense: int = 13, dim: int = 16, hidden=(256, 128),
                 **emb_kwargs):
        super().__init__()
        self.embedding = HashEmbedding(dim, **emb_kwargs)
        self.wide = HashEmbedding(1, init_std=0.0, **emb_kwargs)
        self.wide_dense = nn.Linear(n_dense, 1)
        self.deep = _mlp((n_fields * dim + n_dense, *hidden, 1), last_relu=False)

    def forward(self, ids, dense, pulled=None):
        """Logits ``(B,)``."""
        d = sampan.tensor(dense)
        e = self.embedding(ids, pulled)
        wide = sampan.sum(sampan.reshape(self.wide(ids), len(d), -1), axis=1)
        deep = self.deep(sampan.concat([sampan.reshape(e, len(d), -1), d], axis=1))
        return wide + sampan.reshape(deep + self.wide_dense(d), -1)

    def push(self):
        """Apply both embeddings' sparse gradients."""
        self.embedding.push()
        self.wide.push()


def _push(model) -> None:
    if hasattr(model, "push"):
        model.push()
    else:
        model.embedding.push()


def train_step(model, dense_opt, ids, dense, labels, pulled: PulledBatch | None = None):
    """One step: forward, BCE-with-logits (mean), backward, sparse push, dense update.

    A convenience for ``opt.zero_grad(); loss.backward(); opt.step()``, which gives the
    same tables and weights; it also pushes when `dense_opt` does not hold the tables'
    ``sparse_table`` parameters. Returns the loss as a float.
    """
    logits = model(ids, dense, pulled) if pulled is not None else model(ids, dense)
    loss = F.binary_cross_entropy_with_logits(logits, sampan.tensor(labels))
    dense_opt.zero_grad()
    loss.backward()
    dense_opt.step()
    _push(model)  # a no-op when dense_opt.step() pushed already
    return float(loss.numpy())


def predict(model, ids, dense) -> np.ndarray:
    """Click probabilities for a batch, without creating rows or recording a tape."""
    model.eval()
    try:
        with sampan.no_grad():
            z = model(ids, dense).numpy().astype(np.float64)
    finally:
        model.train()
    return 1.0 / (1.0 + np.exp(-z))
