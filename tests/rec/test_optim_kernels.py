"""Sparse optimisers against dense numpy references; pooling and dedupe against numpy."""

import numpy as np
import pytest

from sampan.rec.kernels import bag_pool, bag_pool_backward, segment_sum, unique_inverse
from sampan.rec.optim import SparseAdagrad, SparseAdam, SparseFTRL, SparseSGD
from sampan.rec.table import HashEmbeddingTable

DIM, N = 6, 40


def _dense_step(name, w, s, rows, g, hp):
    """Reference update of dense arrays on the touched rows (rows unique)."""
    if name == "sgd":
        w[rows] -= hp["lr"] * g
    elif name == "adagrad":
        s["acc"][rows] += g * g
        w[rows] -= hp["lr"] * g / (np.sqrt(s["acc"][rows]) + 1e-10)
    elif name == "adam":
        b1, b2 = 0.9, 0.999
        s["t"][rows] += 1
        t = s["t"][rows][:, None]
        s["m"][rows] = b1 * s["m"][rows] + (1 - b1) * g
        s["v"][rows] = b2 * s["v"][rows] + (1 - b2) * g * g
        mh, vh = s["m"][rows] / (1 - b1**t), s["v"][rows] / (1 - b2**t)
        w[rows] -= hp["lr"] * mh / (np.sqrt(vh) + 1e-8)
    else:
        a, beta, l1, l2 = hp["alpha"], 1.0, hp["l1"], 0.01
        n_new = s["n"][rows] + g * g
        sigma = (np.sqrt(n_new) - np.sqrt(s["n"][rows])) / a
        s["z"][rows] += g - sigma * w[rows]
        s["n"][rows] = n_new
        z = s["z"][rows]
        w[rows] = np.where(np.abs(z) <= l1, 0.0,
                           -(z - np.sign(z) * l1) / ((beta + np.sqrt(n_new)) / a + l2))


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam", "ftrl"])
def test_sparse_optimisers_match_dense_reference(name):
    hp = {"lr": 0.1, "alpha": 0.5, "l1": 0.002}
    opt = {"sgd": SparseSGD(0.1), "adagrad": SparseAdagrad(0.1), "adam": SparseAdam(0.1),
           "ftrl": SparseFTRL(alpha=0.5, l1=0.002, l2=0.01)}[name]
    rng = np.random.default_rng(0)
    ids = rng.integers(-2**62, 2**62, N)
    t = HashEmbeddingTable(DIM, init_std=0.1)
    w = t.lookup(ids).astype(np.float64)
    s = {k: np.zeros((N, DIM)) for k in ["acc", "m", "v", "z", "n"]}
    s["t"] = np.zeros(N)
    for step in range(8):
        pick = rng.integers(0, N // 2 if step % 2 else N, 30)  # duplicates, partial touch
        g = rng.standard_normal((30, DIM)).astype(np.float32)
        opt.apply(t, ids[pick], g, step=step)
        rows = np.unique(pick)
        gsum = np.zeros((N, DIM))
        np.add.at(gsum, pick, g.astype(np.float64))
        _dense_step(name, w, s, rows, gsum[rows], hp)
        np.testing.assert_allclose(t.read(ids), w, rtol=2e-4, atol=2e-6)
    assert (t.meta["updated"][t.rows_for(ids[pick], create=False)] == 7).all()


def test_optimiser_skips_ids_without_rows_and_checks_width():
    t = HashEmbeddingTable(3)
    t.lookup([1, 2])
    before = t.read([1, 2])
    assert SparseSGD(1.0).apply(t, [2, 99], np.ones((2, 3))) == 1
    np.testing.assert_allclose(t.read([1, 2]), before - np.array([0, 1])[:, None])
    assert len(t) == 2
    with pytest.raises(ValueError, match="width 4"):
        SparseSGD(1.0).apply(t, [1], np.ones((1, 4)))


def test_unique_inverse_and_segment_sum_match_numpy():
    rng = np.random.default_rng(1)
    keys = rng.choice(np.array([0, -1, 2**63 - 1, -2**63, 5, 7], np.int64), 1000)
    u, inv = unique_inverse(keys)
    np.testing.assert_array_equal(u[inv], keys)
    assert sorted(u.tolist()) == np.unique(keys).tolist()
    vals = rng.standard_normal((1000, 3)).astype(np.float32)
    ref = np.zeros((u.size, 3))
    np.add.at(ref, inv, vals)
    np.testing.assert_allclose(segment_sum(inv, vals, u.size), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bag_pool_forward_backward_match_numpy(mode):
    rng = np.random.default_rng(2)
    src = rng.standard_normal((30, 5)).astype(np.float32)
    lens = rng.integers(0, 5, 50)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    idx = rng.integers(0, 30, offsets[-1])
    out, arg = bag_pool(src, idx, offsets, mode)
    g = rng.standard_normal(out.shape).astype(np.float32)
    ref_out = np.zeros_like(out)
    ref_grad = np.zeros_like(src)
    for b in range(50):
        rows = idx[offsets[b]:offsets[b + 1]]
        if rows.size == 0:
            continue
        x = src[rows]
        if mode == "max":
            ref_out[b] = x.max(0)
            am = x.argmax(0)
            ref_grad[rows[am], np.arange(5)] += g[b]
        else:
            scale = 1.0 if mode == "sum" else 1.0 / rows.size
            ref_out[b] = x.sum(0) * scale
            np.add.at(ref_grad, rows, np.broadcast_to(g[b] * scale, x.shape))
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    got = bag_pool_backward(g, idx, offsets, 30, mode, arg)
    np.testing.assert_allclose(got, ref_grad, rtol=1e-5, atol=1e-5)


def test_bag_pool_rejects_bad_csr():
    src = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="offsets"):
        bag_pool(src, [0, 1], [0, 3])
    with pytest.raises(ValueError, match="idx"):
        bag_pool(src, [0, 7], [0, 2])
    with pytest.raises(ValueError, match="mode"):
        bag_pool(src, [0], [0, 1], "median")


@pytest.mark.parametrize("make", [lambda: SparseSGD(0.1), lambda: SparseAdagrad(0.05),
                                  lambda: SparseAdam(0.01),
                                  lambda: SparseFTRL(0.1, l1=0.01)])
def test_apply_rows_is_apply_without_the_lookup(make):
    """apply_rows on rows resolved beforehand gives apply's bytes (weights and slots);
    rows outside the table are refused, named."""
    rng = np.random.default_rng(7)
    tabs = [HashEmbeddingTable(DIM, seed=3) for _ in range(2)]
    ids = rng.choice(1000, size=N, replace=False).astype(np.int64)
    for t in tabs:
        t.lookup(ids)
    a, b = make(), make()
    for step in range(3):
        g = rng.standard_normal((N, DIM)).astype(np.float32)
        a.apply(tabs[0], ids, g, step, summed=True)
        with tabs[1].lock:
            b.apply_rows(tabs[1], tabs[1].map.get(ids), g)
    rows = tabs[0].map.get(ids)
    np.testing.assert_array_equal(tabs[0].weights.gather(rows), tabs[1].weights.gather(rows))
    np.testing.assert_array_equal(tabs[0].slots.gather(rows), tabs[1].slots.gather(rows))
    with pytest.raises(IndexError, match="apply_rows"):
        b.apply_rows(tabs[1], np.array([tabs[1].weights.capacity]), np.zeros((1, DIM)))
    with pytest.raises(ValueError, match="width"):
        b.apply_rows(tabs[1], rows[:1], np.zeros((1, DIM + 1)))
