"""PyTorch oracles for the ops in ``sampan/ops/sparse.py``, in the format of
``tests/ops/torch_oracle.py``: ``fn(torch, args, attrs) -> tensor``.

The op-table harness needs them once ``sparse`` is in ``sampan.ops.FAMILIES``:
``from tests.rec.torch_oracle_sparse import SPARSE_ORACLE; ORACLE.update(SPARSE_ORACLE)``.
"""


def _triu_gather(t, a, k):
    n = a[0].shape[1]
    iu = t.triu_indices(n, n, 1)
    return a[0][:, iu[0], iu[1]]


def _triu_scatter(t, a, k):
    b, n = a[0].shape[0], k["k"]
    iu = t.triu_indices(n, n, 1)
    out = t.zeros(b, n, n, dtype=a[0].dtype)
    return out.index_put((t.arange(b)[:, None], iu[0][None], iu[1][None]), a[0])


def _pair_dots(t, a, k):
    x = a[0]
    n = x.shape[1]
    iu = t.triu_indices(n, n, 1)
    return t.bmm(x, x.transpose(1, 2))[:, iu[0], iu[1]]


def _pair_dots_grad(t, a, k):
    s = _triu_scatter(t, [a[0]], {"k": a[1].shape[1]})
    return t.bmm(s + s.transpose(1, 2), a[1])


def _rows_scatter_add(t, a, k):
    out = t.zeros((k["n"], *a[0].shape[1:]), dtype=a[0].dtype)
    return out.index_add(0, a[1], a[0])


SPARSE_ORACLE = {
    "rows_gather": lambda t, a, k: a[0][a[1]],
    "rows_scatter_add": _rows_scatter_add,
    "triu_gather": _triu_gather,
    "triu_scatter": _triu_scatter,
    "pair_dots": _pair_dots,
    "pair_dots_grad": _pair_dots_grad,
}
