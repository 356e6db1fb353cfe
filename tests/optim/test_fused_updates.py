"""The one-pass optimiser kernels (sampan.optim._fused) give bit-identical results to the
numpy sequence they replace, for float32 and float64, over several steps."""
import numpy as np
import pytest

import sampan
from sampan.optim import _fused

CASES = [("SGD", dict(lr=0.1, momentum=0.9)), ("SGD", dict(lr=0.1)),
         ("Adam", dict(lr=1e-2)), ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
         ("Adam", dict(lr=1e-2, weight_decay=0.05)), ("Adagrad", dict(lr=0.05)),
         ("Adagrad", dict(lr=0.05, lr_decay=0.01, weight_decay=0.01))]


def _run(name, kw, dtype, fused, monkeypatch):
    monkeypatch.setattr(_fused, "usable", _fused.usable if fused else (lambda *a: False))
    r = np.random.default_rng(0)
    ps = [sampan.tensor(r.standard_normal(s).astype(dtype), requires_grad=True)
          for s in [(7, 5), (5,), (3, 4, 2)]]
    opt = getattr(sampan.optim, name)(ps, **kw)
    for step in range(4):
        opt.zero_grad()
        loss = sum(((p * p).sum() * (step + 1.0) + p.sum() for p in ps), sampan.tensor(0.0).to(dtype))
        loss.backward()
        opt.step()
    return [p.numpy().copy() for p in ps], opt


@pytest.mark.skipif(not _fused.HAVE_NUMBA, reason="needs numba")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,kw", CASES)
def test_fused_update_bit_identical(name, kw, dtype, monkeypatch):
    got, opt = _run(name, kw, dtype, True, monkeypatch)
    ref, ref_opt = _run(name, kw, dtype, False, monkeypatch)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    for (pa, sa), (pb, sb) in zip(opt.state.items(), ref_opt.state.items()):
        for k in sa:
            np.testing.assert_array_equal(np.asarray(sa[k]), np.asarray(sb[k]))


def test_usable_refuses_mixed_layouts():
    a = np.zeros(6, np.float32)
    assert _fused.usable(a, np.zeros(6, np.float32)) == _fused.HAVE_NUMBA
    assert not _fused.usable(a, np.zeros(6, np.float64))
    assert not _fused.usable(np.zeros((3, 4), np.float32)[:, ::2], np.zeros(6, np.float32))
    assert not _fused.usable(np.zeros(6, np.int64))
