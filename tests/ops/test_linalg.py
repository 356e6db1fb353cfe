"""sampan.linalg and the norms/distances beyond the op-table harness (which checks every op's
forward, gradients and gradcheck against torch): torch's argument rules, invariants of the
factorisations in the shapes the samples skip, gauge-invariant gradients, and errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import sampan
from sampan.errors import SampanError

torch = pytest.importorskip("torch")
r = np.random.default_rng(17)


def T(a, grad=False):
    return sampan.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def tt(a, grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def close(a, b, tol=1e-8):
    a = a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=tol, atol=tol)


def test_solve_follows_torch_vector_and_batch_rules():
    A = r.uniform(-1, 1, (2, 3, 3)) + 3 * np.eye(3)
    for b in (r.uniform(size=3), r.uniform(size=(2, 3)), r.uniform(size=(3, 2)),
              r.uniform(size=(2, 3, 4))):
        close(sampan.linalg.solve(T(A), T(b)), torch.linalg.solve(tt(A), tt(b)))
    b = r.uniform(size=(4, 3))
    close(sampan.linalg.solve(T(A[0]), T(b), left=False),
          torch.linalg.solve(tt(A[0]), tt(b), left=False))


@pytest.mark.parametrize("shape", [(4, 3), (3, 4), (2, 3, 3)])
def test_qr_modes(shape):
    A = r.uniform(-1, 1, shape)
    for mode in ("reduced", "complete"):
        Q, R = sampan.linalg.qr(T(A), mode=mode)
        tq, tr = torch.linalg.qr(tt(A), mode=mode)
        assert Q.shape == tuple(tq.shape) and R.shape == tuple(tr.shape)
        close(Q.numpy() @ R.numpy(), A)
        close(np.swapaxes(Q.numpy(), -1, -2) @ Q.numpy(), np.broadcast_to(
            np.eye(Q.shape[-1]), Q.shape[:-2] + (Q.shape[-1],) * 2))
        assert (np.diagonal(R.numpy(), 0, -2, -1) >= 0).all()
        close(np.abs(R.numpy()), np.abs(tr.numpy()))
    Q, R = sampan.linalg.qr(T(A), mode="r")
    assert Q.shape == (0,) and R.shape == tuple(torch.linalg.qr(tt(A), mode="r")[1].shape)


@pytest.mark.parametrize("shape", [(3, 4), (4, 2), (2, 3, 3)])
def test_svd_full_and_reduced(shape):
    A = r.uniform(-1, 1, shape)
    for full in (True, False):
        U, S, Vh = sampan.linalg.svd(T(A), full_matrices=full)
        tu, ts, tvh = torch.linalg.svd(tt(A), full_matrices=full)
        assert (U.shape, S.shape, Vh.shape) == (tuple(tu.shape), tuple(ts.shape),
                                                tuple(tvh.shape))
        k = S.shape[-1]
        close(S, ts)
        close((U.numpy()[..., :k] * S.numpy()[..., None, :]) @ Vh.numpy()[..., :k, :], A)
        close(np.abs(U.numpy()[..., :k]), np.abs(tu.numpy()[..., :k]))
    assert sampan.linalg.svd(T(A)).U is not None       # named fields


def test_eigh_and_named_results():
    X = r.uniform(-1, 1, (2, 3, 3))
    A = X + np.swapaxes(X, -1, -2)
    w, V = sampan.linalg.eigh(T(A))
    close(w, torch.linalg.eigh(tt(A)).eigenvalues)
    close(V.numpy() @ (w.numpy()[..., None] * np.swapaxes(V.numpy(), -1, -2)), A)
    res = sampan.linalg.eigh(T(A), UPLO="U")
    close(res.eigenvalues, w)
    close(sampan.linalg.eigvalsh(T(A)), w)
    s = sampan.linalg.slogdet(T(A))
    ts = torch.linalg.slogdet(tt(A))
    close(s.sign, ts.sign)
    close(s.logabsdet, ts.logabsdet)


def _grads(f_s, f_t, *arrays):
    xs = [T(a, True) for a in arrays]
    ts = [tt(a, True) for a in arrays]
    gs = sampan.grad(f_s(*xs), xs)
    f_t(*ts).backward()
    for g, t in zip(gs, ts):
        close(g, t.grad, 1e-7)


def test_gauge_invariant_svd_gradients_wide_and_tall():
    W = r.standard_normal((3, 5))
    for A in (r.uniform(-1, 1, (3, 5)), r.uniform(-1, 1, (5, 3)).T.copy()):
        def fs(a, lib=sampan):
            U, S, Vh = lib.linalg.svd(a, full_matrices=False)
            proj = U[:, :1] @ Vh[:1, :]                      # invariant under the sign gauge
            return (proj * lib.tensor(W)).sum() + (S * S).sum()
        _grads(fs, lambda a: fs(a, torch), A)


def test_eigh_and_cholesky_gradients_match_torch_for_symmetric_inputs_built_upstream():
    X = r.uniform(-1, 1, (3, 3))
    W = r.standard_normal((3, 3))

    def eig(x, lib=sampan):
        a = x @ x.mT + x.mT
        a = (a + a.mT) * 0.5
        w, V = lib.linalg.eigh(a)
        return (V[:, -1:] @ V[:, -1:].mT * lib.tensor(W)).sum() + (w * w).sum()
    _grads(eig, lambda x: eig(x, torch), X)

    def chol(x, lib=sampan):
        a = x @ x.mT + lib.tensor(3 * np.eye(3))
        return (lib.linalg.cholesky(a) * lib.tensor(W)).sum() + \
            (lib.linalg.cholesky(a, upper=True) * lib.tensor(W)).sum()
    _grads(chol, lambda x: chol(x, torch), X)


@pytest.mark.parametrize("ord", [2, 1, 3.5, 0.5, math.inf, -math.inf, 0])
def test_vector_norm_ords(ord):
    x = r.uniform(-1, 1, (2, 3, 4))
    for dim, keep in ((None, False), (-1, True), ((0, 2), False)):
        close(sampan.linalg.vector_norm(T(x), ord, dim, keep),
              torch.linalg.vector_norm(tt(x), ord, dim, keep))
    y = sampan.linalg.vector_norm(sampan.tensor(x.astype(np.float32)), ord, dtype="float64")
    assert y.dtype == np.float64


@pytest.mark.parametrize("ord", ["fro", "nuc", 2, -2, 1, -1, math.inf, -math.inf])
def test_matrix_norm_ords(ord):
    A = r.uniform(-1, 1, (2, 3, 4))
    close(sampan.linalg.matrix_norm(T(A), ord), torch.linalg.matrix_norm(tt(A), ord))
    close(sampan.linalg.matrix_norm(T(A), ord, dim=(2, 0), keepdim=True),
          torch.linalg.matrix_norm(tt(A), ord, dim=(2, 0), keepdim=True))
    close(sampan.linalg.norm(T(A[0]), ord), torch.linalg.norm(tt(A[0]), ord))


def test_torch_norm_and_method():
    x = r.uniform(-1, 1, (3, 4))
    for kw in ({}, {"p": 1}, {"dim": 1}, {"p": "fro", "dim": (0, 1)}, {"p": "nuc"},
               {"p": math.inf, "dim": 0, "keepdim": True}):
        close(sampan.norm(T(x), **kw), torch.norm(tt(x), **kw))
        close(T(x).norm(**kw), tt(x).norm(**kw))


def test_norm_gradient_at_zero_is_zero_as_torch():
    x = T(np.zeros((2, 3)), True)
    g, = sampan.grad(sampan.linalg.vector_norm(x, dim=1).sum(), [x])
    assert np.all(g.numpy() == 0)
    a = r.uniform(-1, 1, (3, 2))
    _grads(lambda x: sampan.cdist(x, x).sum(), lambda x: torch.cdist(x, x).sum(), a)


def test_distances_and_layers():
    a, b = r.uniform(-1, 1, (2, 4, 3)), r.uniform(-1, 1, (2, 5, 3))
    for p in (2.0, 1.0, 0.0, math.inf, 3.0):
        close(sampan.cdist(T(a), T(b), p), torch.cdist(tt(a), tt(b), p), 1e-7)
    big = r.uniform(-1, 1, (30, 3))                     # above 25 rows: the mm path, as torch
    _grads(lambda u, v: (sampan.cdist(u, v) ** 3).sum(),
           lambda u, v: (torch.cdist(u, v) ** 3).sum(), big, b[0])
    close(sampan.cdist(T(big), T(big)), torch.cdist(tt(big), tt(big)), 1e-7)
    x, y = r.uniform(-1, 1, (4, 3)), r.uniform(-1, 1, (4, 3))
    x[1] = 0.0
    y[2] = 1e-9                                              # below eps: clamped
    tF = torch.nn.functional
    close(sampan.nn.functional.cosine_similarity(T(x), T(y)), tF.cosine_similarity(tt(x), tt(y)))
    close(sampan.nn.CosineSimilarity(dim=0)(T(x), T(y)), torch.nn.CosineSimilarity(0)(tt(x),
                                                                                      tt(y)))
    _grads(lambda u, v: sampan.cosine_similarity(u, v).sum(),
           lambda u, v: tF.cosine_similarity(u, v).sum(), x, y)
    close(sampan.nn.PairwiseDistance(p=1.0, keepdim=True)(T(x), T(y)),
          torch.nn.PairwiseDistance(p=1.0, keepdim=True)(tt(x), tt(y)))
    close(sampan.pairwise_distance(T(x[0]), T(y[0])), tF.pairwise_distance(tt(x[0]), tt(y[0])))
    close(sampan.nn.functional.pdist(T(a[0]), 1.0), tF.pdist(tt(a[0]), 1.0))
    assert "CosineSimilarity" in repr(sampan.nn.CosineSimilarity())


def test_aliases_products_and_pinv():
    A = r.uniform(-1, 1, (2, 3, 3)) + 2 * np.eye(3)
    close(sampan.det(T(A)), torch.det(tt(A)))
    close(sampan.inverse(T(A)), torch.inverse(tt(A)))
    close(T(A).det(), tt(A).det())
    close(T(A).inverse(), tt(A).inverse())
    S = A @ np.swapaxes(A, -1, -2)
    close(sampan.cholesky(T(S), upper=True), torch.linalg.cholesky(tt(S), upper=True))
    close(T(S).cholesky(), torch.linalg.cholesky(tt(S)))      # torch.cholesky is deprecated
    for n in (0, 1, 4, -3):
        close(sampan.linalg.matrix_power(T(A), n), torch.linalg.matrix_power(tt(A), n))
    ms = [r.uniform(size=3), r.uniform(size=(3, 4)), r.uniform(size=(4, 2)), r.uniform(size=2)]
    close(sampan.linalg.multi_dot([T(m) for m in ms]),
          torch.linalg.multi_dot([tt(m) for m in ms]))
    B = r.uniform(-1, 1, (4, 3)) @ np.diag([1.0, 1.0, 0.0]) @ r.uniform(-1, 1, (3, 3))
    close(sampan.linalg.pinv(T(B)), torch.linalg.pinv(tt(B)), 1e-6)


def test_errors_name_the_op():
    sing = np.ones((3, 3))
    cases = [(lambda: sampan.linalg.inv(T(sing)), "linalg.inv"),
             (lambda: sampan.linalg.solve(T(sing), T(np.ones(3))), "linalg.solve"),
             (lambda: sampan.linalg.cholesky(T(-np.eye(3))), "linalg.cholesky"),
             (lambda: sampan.linalg.det(T(np.ones((2, 3)))), "linalg.det"),
             (lambda: sampan.linalg.inv(sampan.tensor(np.eye(2, dtype=np.int64))),
              "linalg.inv"),
             (lambda: sampan.linalg.eigh(T(np.eye(2)), UPLO="X"), "linalg.eigh"),
             (lambda: sampan.linalg.qr(T(np.eye(2)), mode="full"), "linalg.qr"),
             (lambda: sampan.linalg.matrix_norm(T(np.eye(2)), "bad"), "linalg.matrix_norm"),
             (lambda: sampan.linalg.vector_norm(T(np.eye(2)), "fro"), "linalg.vector_norm"),
             (lambda: sampan.cdist(T(np.ones((2, 3))), T(np.ones((2, 4)))), "cdist")]
    for f, name in cases:
        with pytest.raises(SampanError, match=name.replace(".", r"\.")):
            f()
    x = T(r.uniform(size=(3, 2)), True)
    q, _ = sampan.linalg.qr(x, mode="complete")
    with pytest.raises(SampanError, match="linalg.qr"):
        sampan.grad(q.sum(), [x])


def test_jit_traces_a_decomposition():
    A = r.uniform(-1, 1, (3, 3)) + 2 * np.eye(3)

    def f(a):
        S = sampan.linalg.svd(a, full_matrices=False).S
        return S.sum() + sampan.linalg.det(a) + sampan.linalg.vector_norm(a, 3.0)
    close(sampan.jit(f)(T(A)), f(T(A)))


def test_det_gradient_at_singular_matrices_and_second_order():
    from sampan.autograd import gradgradcheck
    # the gradient of det is the cofactor matrix, also where det(A) = 0 (torch's singular
    # branch returns 0 for some rank-deficient inputs: compared with the cofactors instead)
    g = np.random.default_rng(5)
    X = g.uniform(-1, 1, (3, 2))
    for A in (X @ g.uniform(-1, 1, (2, 3)), np.outer(X[:, 0], X[:, 1])):
        cof = [[(-1) ** (i + j) * np.linalg.det(np.delete(np.delete(A, i, 0), j, 1))
                for j in range(3)] for i in range(3)]
        x = T(A, True)
        close(sampan.grad(sampan.linalg.det(x), [x])[0], np.array(cof), 1e-10)
    _grads(lambda a: sampan.linalg.det(a).sum(), lambda a: torch.linalg.det(a).sum(),
           g.uniform(-1, 1, (2, 3, 3)))
    x = T(r.uniform(-1, 1, (3, 3)) + np.eye(3), True)
    assert gradgradcheck(sampan.linalg.det, [x])
    assert gradgradcheck(lambda a: sampan.linalg.inv(a), [x])


def test_second_order_gradients_of_every_linalg_op():
    """The gradient rules are written with ops, so they differentiate again (the harness
    checks second order only for a fixed list of ops)."""
    from sampan.autograd import gradgradcheck
    from sampan.ops.registry import OPS
    from sampan.tensor import apply

    from . import harness as H
    for name in sorted(n for n in OPS if n.startswith("linalg_")):
        for s in OPS[name].samples():
            args = H.to64(s.args)
            ins = H.make_inputs(args, tuple(range(len(args))))
            assert gradgradcheck(lambda *xs, op=OPS[name], at=s.attrs: apply(op, xs, dict(at)),
                                 ins), name


@pytest.mark.parametrize("driver", [None, "gels", "gelsd", "gelss"])
def test_lstsq_drivers(driver):
    A, B = r.uniform(-1, 1, (2, 5, 3)), r.uniform(-1, 1, (2, 5, 2))
    got = sampan.linalg.lstsq(T(A), T(B), driver=driver)
    want = torch.linalg.lstsq(tt(A), tt(B), driver=driver)
    for a, b in zip(got, want):
        assert a.dtype == np.dtype(str(b.dtype).replace("torch.", ""))
        close(a, b)
    rank_def = r.uniform(-1, 1, (4, 2)) @ r.uniform(-1, 1, (2, 3))
    b = r.uniform(-1, 1, (4, 1))
    got = sampan.linalg.lstsq(T(rank_def), T(b), driver=driver)
    assert got.solution.shape == (3, 1)
    close(got.solution, np.linalg.lstsq(rank_def, b, rcond=None)[0])
    _grads(lambda a, y: sampan.linalg.lstsq(a, y).solution.sum(),
           lambda a, y: torch.linalg.lstsq(a, y).solution.sum(), A[0], B[0])


def test_logdet_and_matrix_rank():
    A = np.stack([r.uniform(-1, 1, (3, 3)) + 2 * np.eye(3), -np.eye(3), np.zeros((3, 3))])
    close(sampan.logdet(T(A)), torch.logdet(tt(A)))
    close(T(A[:1]).logdet(), tt(A[:1]).logdet())
    B = np.stack([r.uniform(-1, 1, (4, 2)) @ r.uniform(-1, 1, (2, 3)), np.eye(4)[:, :3]])
    for kw in ({}, {"atol": 0.5}, {"rtol": 0.9}, {"hermitian": False}):
        got = sampan.linalg.matrix_rank(T(B), **kw)
        want = torch.linalg.matrix_rank(tt(B), **kw)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got.numpy(), want.numpy())
