"""Scatter, masked, index, unique, scan and order-statistic ops against PyTorch beyond the
op-table harness: duplicate scatter indices for every reduce mode, ties (which index
torch picks), every flag of unique, every quantile interpolation, searchsorted/bucketize
on boundary values, both argument orders of gather/scatter_add/index_add, in-place
methods, and index validation (out-of-range and negative indices raise, naming the op)."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import SampanError, SampanIndexError


def _s(a, grad=False):
    return sampan.tensor(np.array(a), requires_grad=grad)


def _t(a, grad=False):
    return torch.tensor(np.array(a), requires_grad=grad)


def _eq(ours, theirs, exact=False):
    a = ours.numpy() if hasattr(ours, "numpy") else np.asarray(ours)
    b = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert a.shape == b.shape, (a.shape, b.shape)
    if exact or a.dtype.kind in "iub":
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True)


def _grads(f_ours, f_torch, arrays, seed=0):
    """Forward and gradients of every float input, ours against torch's (float64)."""
    ins = [_s(a, np.asarray(a).dtype.kind == "f") for a in arrays]
    tins = [_t(a, np.asarray(a).dtype.kind == "f") for a in arrays]
    y, ty = f_ours(*ins), f_torch(*tins)
    _eq(y, ty)
    g = np.random.default_rng(seed).standard_normal(tuple(y.shape))
    diff = [k for k, a in enumerate(arrays) if np.asarray(a).dtype.kind == "f"]
    ours = sampan.grad(y, [ins[k] for k in diff], sampan.tensor(g), allow_unused=True)
    theirs = torch.autograd.grad(ty, [tins[k] for k in diff], torch.tensor(g),
                                 allow_unused=True)
    for a, b in zip(ours, theirs):
        if b is None:
            assert a is None or not np.any(a.numpy())
        else:
            _eq(a, b)


R = np.random.default_rng(7)
X = R.standard_normal((3, 5))
DUP = np.array([[0, 0, 1, 0], [2, 2, 2, 2], [4, 1, 4, 1]])   # duplicates in every row


# ---------------------------------------------------------------------- scatter
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_duplicates(reduce, include_self):
    src = R.standard_normal((3, 4))
    src[0, 1] = src[1, 2] = src[1, 3] = 0.0        # zeros for prod's gradient
    src[2, 0] = src[2, 2] = 1.25                    # a tie at one target for amax/amin
    x = X.copy()
    x[2, 4] = 1.25
    _grads(lambda a, s: sampan.scatter_reduce(a, 1, _s(DUP), s, reduce,
                                              include_self=include_self),
           lambda a, s: a.scatter_reduce(1, _t(DUP), s, reduce, include_self=include_self),
           [x, src])


@pytest.mark.filterwarnings("ignore:The reduce argument")
@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
def test_scatter_src_value_and_reduce(reduce):
    src = R.standard_normal((3, 4))
    idx = DUP if reduce else np.array([[0, 3, 1, 2], [4, 2, 1, 0], [1, 0, 3, 4]])
    kw = {} if reduce is None else {"reduce": reduce}
    _eq(sampan.scatter(_s(X), 1, _s(idx), _s(src), **kw),
        torch.scatter(_t(X), 1, _t(idx), _t(src), **kw))
    _eq(sampan.scatter(_s(X), 1, _s(idx), 2.5, **kw),
        torch.scatter(_t(X), 1, _t(idx), 2.5, **kw))
    _eq(sampan.scatter(_s(X), 1, _s(idx), value=-1.0, **kw),
        torch.scatter(_t(X), 1, _t(idx), value=-1.0, **kw))
    if reduce is None:
        _grads(lambda a, s: sampan.scatter(a, 1, _s(idx), s),
               lambda a, s: torch.scatter(a, 1, _t(idx), s), [X, src])


def test_scatter_add_both_orders_and_duplicates():
    src = R.standard_normal((3, 4))
    want = torch.scatter_add(_t(X), 1, _t(DUP), _t(src))
    _eq(sampan.scatter_add(_s(X), 1, _s(DUP), _s(src)), want)       # torch's order
    _eq(sampan.scatter_add(_s(X), _s(DUP), _s(src), 1), want)       # numpy's order
    _eq(sampan.scatter_add(_s(X), dim=1, index=_s(DUP), src=_s(src)), want)
    _eq(_s(X).scatter_add(1, _s(DUP), _s(src)), want)
    _grads(lambda a, s: sampan.scatter_add(a, 1, _s(DUP), s),
           lambda a, s: torch.scatter_add(a, 1, _t(DUP), s), [X, src])


def test_gather_both_orders():
    idx = np.array([[0, 4], [2, 2], [1, 0]])
    want = torch.gather(_t(X), 1, _t(idx))
    _eq(sampan.gather(_s(X), 1, _s(idx)), want)
    _eq(sampan.gather(_s(X), _s(idx), 1), want)
    _eq(sampan.gather(_s(X), dim=1, index=_s(idx)), want)
    _eq(_s(X).gather(1, _s(idx)), want)
    _eq(sampan.take_along_dim(_s(X), _s(idx[:1]), 1), torch.take_along_dim(_t(X), _t(idx[:1]),
                                                                           1))


def test_index_add_copy_fill_select():
    i = np.array([2, 0, 2])
    src = R.standard_normal((3, 3))
    x = X[:, :3].copy()
    _eq(sampan.index_add(_s(x), 1, _s(i), _s(src), alpha=2.0),
        torch.index_add(_t(x), 1, _t(i), _t(src), alpha=2.0))
    _eq(sampan.index_add(_s(x), _s(i), _s(src.T), 0), torch.index_add(_t(x), 0, _t(i),
                                                                        _t(src.T)))
    _eq(_s(x).index_select(1, _s(i)), _t(x).index_select(1, _t(i)))
    _eq(sampan.index_select(_s(x), _s(i), 1), torch.index_select(_t(x), 1, _t(i)))
    _grads(lambda a, s: sampan.index_copy(a, 0, _s(np.array([2, 0])), s),
           lambda a, s: a.index_copy(0, _t(np.array([2, 0])), s), [x, src[:2]])
    _grads(lambda a, v: sampan.index_fill(a, 1, _s(i), v),
           lambda a, v: a.index_fill(1, _t(i), v), [x, np.array(0.5)])


def test_masked_ops():
    m = R.uniform(size=(3, 5)) > 0.4
    _grads(lambda a, v: sampan.masked_fill(a, _s(m), v), lambda a, v: a.masked_fill(_t(m), v),
           [X, np.array(-2.0)])
    _eq(_s(X).masked_fill(_s(m[0]), 3.0), _t(X).masked_fill(_t(m[0]), 3.0))
    _grads(lambda a: sampan.masked_select(a, _s(m[1])),
           lambda a: torch.masked_select(a, _t(m[1])), [X])
    src = R.standard_normal((4, 5))
    _grads(lambda a, s: sampan.masked_scatter(a, _s(m), s),
           lambda a, s: a.masked_scatter(_t(m), s), [X, src])
    with pytest.raises(SampanError, match="masked_scatter"):
        sampan.masked_scatter(_s(X), _s(m), _s(src[:1, :2]))


def test_inplace_methods():
    m = X > 0
    x = _s(X, True)
    y = x * 1.0
    y.masked_fill_(_s(m), 0.0)
    (y * y).sum().backward()
    t = _t(X, True)
    ty = t * 1.0
    ty.masked_fill_(_t(m), 0.0)
    (ty * ty).sum().backward()
    _eq(y, ty)
    _eq(x.grad, t.grad)
    idx = np.array([[0, 4], [2, 2], [1, 0]])
    for name, args in [("scatter_", (1, idx, 7.0)), ("scatter_add_", (1, idx, X[:, :2])),
                       ("index_add_", (0, np.array([1]), X[:1])),
                       ("index_fill_", (1, np.array([3]), -1.0)),
                       ("index_copy_", (0, np.array([2]), X[:1] * 3)),
                       ("scatter_reduce_", (1, idx, X[:, :2], "amax"))]:
        a, b = _s(X), _t(X)
        getattr(a, name)(*[_s(v) if isinstance(v, np.ndarray) else v for v in args])
        getattr(b, name)(*[_t(v) if isinstance(v, np.ndarray) else v for v in args])
        _eq(a, b)


# ---------------------------------------------------------------------- index validation
def test_index_put():
    i, j = np.array([2, 0, 2, -1]), np.array([[1], [4]])
    v = R.standard_normal((2, 4))
    for acc in (True, False):
        jj = j if acc else np.array([1, 4, 0, 3])     # no duplicates without accumulate
        vv = v if acc else v[0]
        _grads(lambda a, b: sampan.index_put(a, (_s(i), _s(jj)), b, accumulate=acc),
               lambda a, b: a.index_put((_t(i), _t(jj)), b, accumulate=acc), [X, vv])
    a, b = _s(X), _t(X)
    a.index_put_((_s(i[:2]),), _s(np.array(3.0)), accumulate=True)
    b.index_put_((_t(i[:2]),), _t(np.array(3.0)), accumulate=True)
    _eq(a, b)


@pytest.mark.parametrize("bad", [5, -1, -6])
def test_out_of_range_indices_raise(bad):
    i2 = np.array([[0, bad], [1, 1], [2, 0]])
    i1 = np.array([0, bad])
    src = np.ones((3, 2))
    calls = {
        "take_along_axis": lambda: sampan.gather(_s(X), 1, _s(i2)),
        "scatter_add": lambda: sampan.scatter_add(_s(X), 1, _s(i2), _s(src)),
        "scatter": lambda: sampan.scatter(_s(X), 1, _s(i2), _s(src)),
        "scatter_reduce": lambda: sampan.scatter_reduce(_s(X), 1, _s(i2), _s(src), "amax"),
        "index_select": lambda: sampan.index_select(_s(X), 1, _s(i1)),
        "index_add": lambda: sampan.index_add(_s(X), 1, _s(i1), _s(src)),
        "index_add ": lambda: sampan.index_add(_s(X.T.copy()), 0, _s(i1), _s(src.T.copy())),
        "index_copy": lambda: sampan.index_copy(_s(X), 1, _s(i1), _s(src)),
        "index_fill": lambda: sampan.index_fill(_s(X), 1, _s(i1), 0.0),
        "take_along_dim": lambda: sampan.take_along_dim(_s(X), _s(i2), 1),
        "index_put": lambda: sampan.index_put(_s(X), (_s(i1 * 0), _s(i1)), _s(1.0),
                                              accumulate=True),
    }
    if bad == -1:    # index_put counts negative indices from the end, as PyTorch
        del calls["index_put"]
    for op, call in calls.items():
        with pytest.raises(SampanIndexError) as e:
            call()
        name = op.strip()
        want = "take_along_axis" if name == "take_along_dim" else (
            "scatter" if name in ("index_copy", "index_fill") else name)
        assert want in str(e.value), (op, str(e.value))
    with pytest.raises(SampanError, match="bincount"):
        sampan.bincount(_s(np.array([1, -1])))


# ---------------------------------------------------------------------- data-dependent
def test_nonzero_unique_bincount():
    a = np.array([[0, 3, 0], [4, 0, 0]])
    _eq(sampan.nonzero(_s(a)), torch.nonzero(_t(a)))
    for o, t in zip(sampan.nonzero(_s(a), as_tuple=True), torch.nonzero(_t(a), as_tuple=True)):
        _eq(o, t)
    _eq(sampan.argwhere(_s(a)), torch.argwhere(_t(a)))
    _eq(sampan.count_nonzero(_s(a), dim=0), torch.count_nonzero(_t(a), dim=0))
    _eq(sampan.count_nonzero(_s(a)), torch.count_nonzero(_t(a)))
    w = np.array([0.5, 1.0, 2.0, 4.0])
    v = np.array([1, 3, 1, 0])
    _eq(sampan.bincount(_s(v)), torch.bincount(_t(v)))
    _eq(sampan.bincount(_s(v), _s(w), minlength=6), torch.bincount(_t(v), _t(w), minlength=6))
    _eq(sampan.bincount(_s(v), _s(w.astype(np.float32))),
        torch.bincount(_t(v), _t(w.astype(np.float32))))
    _eq(sampan.histc(_s(np.array([0.0, 1.0, 1.0, 3.0])), bins=4),
        torch.histc(_t(np.array([0.0, 1.0, 1.0, 3.0])), bins=4))

    xn = np.array([1.0, np.nan, 2.0, np.nan, 1.0])    # each NaN is its own value
    for o, t in zip(sampan.unique(_s(xn), return_inverse=True, return_counts=True),
                    torch.unique(_t(xn), return_inverse=True, return_counts=True)):
        _eq(o, t)

    def f(x):
        return sampan.nonzero(x)
    with pytest.raises(sampan.jit.TracingError, match="depends on the data"):
        sampan.jit(f)(_s(a))


@pytest.mark.parametrize("sorted_", [True, False])
@pytest.mark.parametrize("inverse", [True, False])
@pytest.mark.parametrize("counts", [True, False])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_unique_flags(sorted_, inverse, counts, dim):
    a = np.array([[1, 2, 1], [3, 0, 3], [1, 2, 1], [3, 0, 2]])
    kw = {"return_inverse": inverse, "return_counts": counts}
    ours = sampan.unique(_s(a), sorted=sorted_, dim=dim, **kw)
    theirs = torch.unique(_t(a), sorted=sorted_, dim=dim, **kw)
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs):
        _eq(o, t, exact=True)
    uc = sampan.unique_consecutive(_s(a), dim=dim, **kw)
    tc = torch.unique_consecutive(_t(a), dim=dim, **kw)
    for o, t in zip(uc if isinstance(uc, tuple) else (uc,), tc if isinstance(tc, tuple)
                    else (tc,)):
        _eq(o, t, exact=True)


# ---------------------------------------------------------------------- ties
TIES = np.array([[2.0, 1.0, 2.0, 1.0, 5.0, 1.0], [3.0, 3.0, 3.0, 3.0, 1.0, 1.0],
                 [0.5, 0.5, 0.5, 0.5, 0.5, 0.5], [4.0, np.nan, 1.0, np.nan, 1.0, 4.0]])


def _vi(ours, theirs):
    _eq(ours.values, theirs.values)
    _eq(ours.indices, theirs.indices, exact=True)


def test_tie_indices_match_torch():
    s, t = _s(TIES), _t(TIES)
    _vi(sampan.median(s, 1), torch.median(t, 1))
    _vi(sampan.nanmedian(s, 1), torch.nanmedian(t, 1))
    _vi(sampan.mode(s[:3], 1), torch.mode(t[:3], 1))
    for k in range(1, 7):
        _vi(sampan.kthvalue(s, k, 1), torch.kthvalue(t, k, 1))
    _vi(sampan.cummax(s, 1), torch.cummax(t, 1))
    _vi(sampan.cummin(s, 1), torch.cummin(t, 1))
    _vi(sampan.mode(s[:3], 0, keepdim=True), torch.mode(t[:3], 0, keepdim=True))
    r = np.random.default_rng(3)
    for _ in range(20):   # tie-heavy random rows
        a = r.integers(0, 3, size=(4, int(r.integers(1, 9)))).astype(np.float64)
        k = int(r.integers(1, a.shape[1] + 1))
        _vi(sampan.kthvalue(_s(a), k, 1), torch.kthvalue(_t(a), k, 1))
        _vi(sampan.mode(_s(a), 1), torch.mode(_t(a), 1))
        _vi(sampan.median(_s(a), 1), torch.median(_t(a), 1))


def test_tie_gradients_match_torch():
    a = TIES[:3]
    for f, g in [(lambda x: sampan.median(x, 1).values, lambda x: torch.median(x, 1).values),
                 (lambda x: sampan.mode(x, 1).values, lambda x: torch.mode(x, 1).values),
                 (lambda x: sampan.kthvalue(x, 3, 1).values,
                  lambda x: torch.kthvalue(x, 3, 1).values),
                 (lambda x: sampan.cummax(x, 1).values, lambda x: torch.cummax(x, 1).values),
                 (lambda x: sampan.cummin(x, 0).values, lambda x: torch.cummin(x, 0).values),
                 (lambda x: sampan.median(x), lambda x: torch.median(x)),
                 (lambda x: sampan.nanmedian(x), lambda x: torch.nanmedian(x))]:
        _grads(f, g, [a])
    assert sampan.median(_s(np.array([4.0, 1.0, 3.0, 2.0]))).item() == 2.0   # the lower one


# ---------------------------------------------------------------------- quantile
@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile_every_interpolation(interpolation):
    x = R.standard_normal((4, 7))
    for q in (0.0, 0.5, 0.37, 1.0, np.array([0.1, 0.25, 0.75])):
        for dim, keepdim in ((None, False), (None, True), (1, False), (0, True)):
            qs, qt = (_s(q), _t(q)) if isinstance(q, np.ndarray) else (q, q)
            _grads(lambda a: sampan.quantile(a, qs, dim, keepdim, interpolation=interpolation),
                   lambda a: torch.quantile(a, qt, dim, keepdim, interpolation=interpolation),
                   [x])
    xn = x.copy()
    xn[1, 2] = xn[3, :] = np.nan
    for f in ("quantile", "nanquantile"):
        _eq(getattr(sampan, f)(_s(xn), 0.3, 1, interpolation=interpolation),
            getattr(torch, f)(_t(xn), 0.3, 1, interpolation=interpolation))


# ---------------------------------------------------------------------- searchsorted
def test_searchsorted_bucketize_edges():
    b = np.array([1.0, 2.0, 2.0, 2.0, 5.0])
    v = np.array([[0.0, 1.0, 2.0], [3.0, 5.0, 9.0]])    # below, on every boundary, above
    for right in (False, True):
        _eq(sampan.searchsorted(_s(b), _s(v), right=right),
            torch.searchsorted(_t(b), _t(v), right=right))
        _eq(sampan.bucketize(_s(v), _s(b), right=right),
            torch.bucketize(_t(v), _t(b), right=right))
    _eq(sampan.searchsorted(_s(b), _s(v), side="right"),
        torch.searchsorted(_t(b), _t(v), side="right"))
    _eq(sampan.searchsorted(_s(b), _s(v), out_int32=True),
        torch.searchsorted(_t(b), _t(v), out_int32=True))
    unsorted = np.array([5.0, 1.0, 2.0])
    order = np.argsort(unsorted)
    _eq(sampan.searchsorted(_s(unsorted), _s(v), sorter=_s(order)),
        torch.searchsorted(_t(unsorted), _t(v), sorter=_t(order)))
    rows = np.array([[1, 3, 3, 7], [0, 2, 4, 6]])
    vals = np.array([[3, 7, 0, 8], [4, 6, -1, 1]])
    _eq(sampan.searchsorted(_s(rows), _s(vals)), torch.searchsorted(_t(rows), _t(vals)))
    _eq(sampan.searchsorted(_s(b), 2.0), torch.searchsorted(_t(b), 2.0))
    with pytest.raises(SampanError, match="searchsorted"):
        sampan.searchsorted(_s(rows), _s(vals[:1]))


# ---------------------------------------------------------------------- scans
def test_cumprod_gradient_with_zeros():
    x = np.array([[1.5, 0.0, 2.0, -1.0, 0.5], [0.0, 0.0, 3.0, 1.0, 2.0],
                  [2.0, -0.5, 1.5, 1.2, 0.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    _grads(lambda a: sampan.cumprod(a, 1), lambda a: torch.cumprod(a, 1), [x])
    _grads(lambda a: sampan.cumprod(a, dim=0), lambda a: torch.cumprod(a, dim=0), [x])


def test_logcumsumexp_diff_msort():
    x = np.array([[-40.0, 2.0, 60.0, 1.0], [800.0, 1.0, -3.0, 799.0]])
    _grads(lambda a: sampan.logcumsumexp(a, 1), lambda a: torch.logcumsumexp(a, 1), [x])
    y = R.standard_normal((3, 5))
    _grads(lambda a: sampan.diff(a, n=2, dim=1), lambda a: torch.diff(a, n=2, dim=1), [y])
    _grads(lambda a, p, q: sampan.diff(a, dim=0, prepend=p, append=q),
           lambda a, p, q: torch.diff(a, dim=0, prepend=p, append=q), [y, y[:1], y[:2]])
    _eq(sampan.diff(_s(np.array([True, False, False]))), torch.diff(_t(np.array([True, False,
                                                                                  False]))))
    _eq(sampan.msort(_s(y)), torch.msort(_t(y)))
