"""Layout ops beyond the op harness: einsum on many equations against PyTorch (values and
gradients), its error messages, einsum under jit, diagonal as a view, integer and bool
inputs, the creation functions and the data-dependent repeat_interleave."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import sampan
from sampan.autograd import gradgradcheck
from sampan.errors import SampanError, SampanValueError, ShapeError

# (equation, operand shapes)
EQUATIONS = [
    ("ii->i", [(3, 3)]),
    ("ii", [(4, 4)]),
    ("bii->bi", [(2, 3, 3)]),
    ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("ba", [(2, 3)]),
    ("i,i->", [(4,), (4,)]),
    ("i,j->ij", [(2,), (3,)]),
    ("ij,ij->ij", [(2, 3), (2, 3)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("...ij,...jk", [(2, 1, 2, 3), (4, 3, 2)]),          # batch broadcast over '...'
    ("...ij,...jk->...ik", [(3, 2, 4), (4, 2)]),
    ("...i->...", [(2, 3, 4)]),
    ("ij,jk->ik", [(2, 1), (3, 2)]),                     # a size-1 dim broadcasts (torch)
    ("iji->j", [(3, 2, 3)]),                             # a repeated letter, not adjacent
    ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]),
    ("a,a,a->a", [(3,), (3,), (3,)]),                    # three operands
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),      # a bilinear form
    (" i j , j k -> i k ", [(2, 3), (3, 2)]),            # spaces
    ("ij,k->ijk", [(2, 2), (0,)]),                       # a zero-size dim
]


def _inputs(shapes, seed=0):
    r = np.random.default_rng(seed)
    return [r.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("eq,shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum_matches_torch(eq, shapes):
    arrays = _inputs(shapes)
    xs = [sampan.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = sampan.einsum(eq, *xs)
    ty = torch.einsum(eq, *ts)
    assert tuple(y.shape) == tuple(ty.shape)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    cot = np.random.default_rng(1).standard_normal(tuple(ty.shape))
    gs = sampan.grad(y, xs, sampan.tensor(cot))
    tgs = torch.autograd.grad(ty, ts, torch.tensor(cot))
    for g, tg in zip(gs, tgs):
        np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-12, atol=1e-12)
    # the list form gives the same
    np.testing.assert_array_equal(sampan.einsum(eq, xs).numpy(), y.numpy())


@pytest.mark.parametrize("eq,shapes", [("iij,jk->ik", [(2, 2, 3), (3, 2)]),
                                       ("bij,bjk->bk", [(2, 2, 3), (2, 3, 2)])])
def test_einsum_second_order(eq, shapes):
    xs = [sampan.tensor(a, requires_grad=True) for a in _inputs(shapes, 2)]
    assert gradgradcheck(lambda *v: sampan.einsum(eq, *v), xs)


def test_einsum_integers():
    a = np.arange(6).reshape(2, 3)
    b = np.arange(12).reshape(3, 4) - 5
    y = sampan.einsum("ij,jk->ik", sampan.tensor(a), sampan.tensor(b))
    assert y.dtype == sampan.int64
    np.testing.assert_array_equal(y.numpy(), torch.einsum("ij,jk->ik", torch.tensor(a),
                                                          torch.tensor(b)).numpy())


@pytest.mark.parametrize("eq,shapes,cls,words", [
    ("ij,jk->ik", [(2, 3)], SampanValueError, "2 operand"),
    ("ij->i", [(2, 3), (3,)], SampanValueError, "1 operand"),
    ("ijk->i", [(2, 3)], ShapeError, "operand 0 has 2 dim"),
    ("ij,jk->ik", [(2, 3), (4, 2)], ShapeError, "'j' is 3"),
    ("ij->iki", [(2, 3)], SampanValueError, "output"),
    ("ij->ii", [(2, 2)], SampanValueError, "appears 2 times"),
    ("i1->i", [(2, 3)], SampanValueError, "'1'"),
    ("i->j->i", [(2,)], SampanValueError, "'->'"),
])
def test_einsum_errors_name_the_equation(eq, shapes, cls, words):
    xs = [sampan.zeros(*s) for s in shapes]
    with pytest.raises(cls) as e:
        sampan.einsum(eq, *xs)
    msg = str(e.value)
    assert "einsum" in msg and repr(eq) in msg and words in msg, msg


def test_einsum_under_jit():
    r = np.random.default_rng(3)
    a, b, w = r.standard_normal((2, 3, 4)), r.standard_normal((2, 4, 5)), r.standard_normal(5)

    def f(x, y, v):
        z = sampan.einsum("bij,bjk->bik", x, y)
        s = sampan.einsum("bik,k->bi", z.tanh(), v)
        loss = sampan.einsum("bi,bi->", s, s)
        return (loss,) + tuple(sampan.grad(loss, [x, y, v]))

    def fresh():
        return [sampan.tensor(t, requires_grad=True) for t in (a, b, w)]
    eager = f(*fresh())
    jf = sampan.jit(f)
    got = jf(*fresh())
    for e, g in zip(eager, got):
        np.testing.assert_allclose(e.numpy(), g.numpy(), rtol=1e-10)
    assert "einsum" in str(jf.graph)


def test_diagonal_is_a_view():
    x = sampan.arange(12.0).reshape(3, 4)
    d = x.diagonal(1)
    d.fill_(-1.0)
    t = torch.arange(12.0).reshape(3, 4)
    t.diagonal(1).fill_(-1.0)
    np.testing.assert_array_equal(x.numpy(), t.numpy())
    # an in-place write through the view of a non-leaf is recorded on the base's history
    w = sampan.tensor(np.ones((3, 3)), requires_grad=True)
    tw = torch.ones(3, 3, dtype=torch.float64, requires_grad=True)
    for v, lib in ((w, sampan), (tw, torch)):
        y = v * 2.0
        y.diagonal().mul_(3.0)
        (y * y).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy())


def test_matrix_products_integers_and_shapes():
    a, b = np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2)
    for f in ("mm", "matmul"):
        y = getattr(sampan, f)(sampan.tensor(a), sampan.tensor(b))
        assert y.dtype == sampan.int64
        np.testing.assert_array_equal(y.numpy(), a @ b)
    assert sampan.tensor(a).mm(sampan.tensor(b)).dtype == sampan.int64
    with pytest.raises(ShapeError, match="mm"):
        sampan.mm(sampan.zeros(2, 2, 3), sampan.zeros(3, 2))
    with pytest.raises(ShapeError, match="bmm"):
        sampan.bmm(sampan.zeros(2, 2, 3), sampan.zeros(3, 3, 2))
    with pytest.raises(ShapeError, match="dot"):
        sampan.dot(sampan.zeros(3), sampan.zeros(4))
    # beta=0 ignores the input (its NaN does not spread), as torch
    y = sampan.addmm(sampan.full((2, 2), float("nan")), sampan.ones(2, 3), sampan.ones(3, 2),
                     beta=0)
    np.testing.assert_array_equal(y.numpy(), np.full((2, 2), 3.0))


@pytest.mark.parametrize("row,col,off", [(4, 4, 0), (3, 5, 1), (5, 3, -1), (0, 3, 0),
                                         (3, 3, 5)])
def test_tri_indices(row, col, off):
    for name in ("triu_indices", "tril_indices"):
        y = getattr(sampan, name)(row, col, off)
        ty = getattr(torch, name)(row, col, off)
        assert y.dtype == sampan.int64 and tuple(y.shape) == tuple(ty.shape)
        np.testing.assert_array_equal(y.numpy(), ty.numpy())


def test_repeat_interleave_data_dependent():
    x = np.arange(6.0).reshape(3, 2)
    r = np.array([2, 0, 1])
    y = sampan.repeat_interleave(sampan.tensor(x), sampan.tensor(r), dim=0)
    np.testing.assert_array_equal(y.numpy(), torch.repeat_interleave(
        torch.tensor(x), torch.tensor(r), dim=0).numpy())
    np.testing.assert_array_equal(sampan.repeat_interleave(sampan.tensor(r)).numpy(),
                                  [0, 0, 2])
    np.testing.assert_array_equal(sampan.tensor(x).repeat_interleave(2).numpy(),
                                  np.repeat(x.reshape(-1), 2))
    with pytest.raises(SampanValueError, match="counts >= 0"):
        sampan.repeat_interleave(sampan.tensor(x), sampan.tensor([1, -1, 0]), dim=0)
    with pytest.raises(ShapeError, match="one count per slice"):
        sampan.repeat_interleave(sampan.tensor(x), sampan.tensor([1, 1]), dim=0)

    def f(a, k):
        return sampan.repeat_interleave(a, k, dim=0)
    with pytest.raises(sampan.jit.TracingError, match="depends on the data"):
        sampan.jit(f)(sampan.tensor(x), sampan.tensor(r))

    def g(a, k):
        return sampan.repeat_interleave(a, k, dim=0, output_size=3)
    np.testing.assert_array_equal(sampan.jit(g)(sampan.tensor(x), sampan.tensor(r)).numpy(),
                                  y.numpy())


def test_methods_and_small_semantics():
    x = sampan.arange(6).reshape(2, 3)
    tx = torch.arange(6).reshape(2, 3)
    pairs = [
        (x.t(), tx.t()), (x.repeat(2, 1, 2), tx.repeat(2, 1, 2)),
        (x.reshape_as(sampan.zeros(3, 2)), tx.reshape_as(torch.zeros(3, 2))),
        (x.roll(1), tx.roll(1)), (x.roll((1, -1), (0, 1)), tx.roll((1, -1), (0, 1))),
        (x.movedim(0, 1), tx.movedim(0, 1)), (x.tile((2,)), tx.tile((2,))),
        (x.triu(1), tx.triu(1)), (x.tril(-1), tx.tril(-1)), (x.ravel(), tx.ravel()),
        (x.take(sampan.tensor([-1, 0])), tx.take(torch.tensor([-1, 0]))),
        (x.trace(), tx.trace()), (x.flipud(), tx.flipud()), (x.rot90(), tx.rot90()),
        (sampan.hstack([x, x]), torch.hstack([tx, tx])),
        (sampan.column_stack([x[0], x[1]]), torch.column_stack([tx[0], tx[1]])),
        (sampan.tril(sampan.ones(2, 3, 3, dtype=sampan.bool_)),
         torch.tril(torch.ones(2, 3, 3, dtype=torch.bool))),
        (sampan.diag(sampan.tensor([1, 2])), torch.diag(torch.tensor([1, 2]))),
        (sampan.kron(x, x), torch.kron(tx, tx)),
        (sampan.cartesian_prod(x[0], x[1]), torch.cartesian_prod(tx[0], tx[1])),
    ]
    for a, b in pairs:
        assert str(a.dtype) == str(b.dtype).replace("torch.", ""), (a.dtype, b.dtype)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    gi, gj = sampan.meshgrid(sampan.arange(2), sampan.arange(3))   # "ij" by default
    assert tuple(gi.shape) == (2, 3) and tuple(gj.shape) == (2, 3)
    assert isinstance(sampan.atleast_2d(x[0], x), tuple)
    assert tuple(sampan.atleast_3d(x).shape) == (2, 3, 1)
    rows = x.unbind(1)
    assert len(rows) == 3 and tuple(rows[0].shape) == (2,)
    y = sampan.ones(3, 3)
    y.triu_(1)
    np.testing.assert_array_equal(y.numpy(), np.triu(np.ones((3, 3)), 1))
    with pytest.raises(ShapeError, match="t"):
        sampan.zeros(2, 2, 2).t()
    with pytest.raises(SampanError, match="cross"):
        sampan.cross(sampan.zeros(2, 4), sampan.zeros(2, 4))


def test_einsum_sublist_form():
    a, b = _inputs([(2, 3), (3, 4)], 4)
    y = sampan.einsum(sampan.tensor(a), [0, 1], sampan.tensor(b), [1, 2], [0, 2])
    np.testing.assert_allclose(y.numpy(), a @ b)
    y = sampan.einsum(sampan.tensor(a), [Ellipsis, 1], sampan.tensor(b), [1, 2])
    ty = torch.einsum(torch.tensor(a), [Ellipsis, 1], torch.tensor(b), [1, 2])
    np.testing.assert_allclose(y.numpy(), ty.numpy())


def test_numpy_axis_spellings():
    x = sampan.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(x.roll(1, axis=1).numpy(), np.roll(x.numpy(), 1, axis=1))
    assert len(x.unbind(axis=1)) == 3
    np.testing.assert_array_equal(sampan.repeat_interleave(x, 2, axis=0).numpy(),
                                  np.repeat(x.numpy(), 2, axis=0))
    with pytest.raises(SampanValueError, match="both"):
        x.roll(1, dims=0, axis=0)
