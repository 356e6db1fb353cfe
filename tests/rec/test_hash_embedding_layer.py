"""sampan.rec.HashEmbedding in the ordinary loop: opt.zero_grad(); loss.backward(); opt.step()."""
import numpy as np
import pytest

import sampan
from sampan import rec
from sampan.nn import functional as F
from sampan.rec.data import ClickStream
from sampan.rec.optim import SparseAdam, SparseSGD


def _model(cls, seed=0):
    sampan.manual_seed(seed)
    kw = {"optimizer_factory": lambda: SparseAdam(0.01)}
    if cls is rec.DLRM:
        return cls(n_fields=4, n_dense=3, dim=4, bottom=(8, 4), top=(8,), **kw)
    return cls(n_fields=4, n_dense=3, dim=4, hidden=(8,), **kw)


def _batches(n=5):
    stream = ClickStream(n_fields=4, n_dense=3, seed=1)
    return [stream.batch(i, 64) for i in range(n)]


def _tables(model):
    out = []
    for layer in model.modules():
        if isinstance(layer, rec.HashEmbedding):
            ids = np.sort(np.concatenate([s.table.ids() for s in layer.emb.shards]))
            out.append((ids, layer.emb.read(ids)))
    return out


@pytest.mark.parametrize("cls", [rec.DLRM, rec.DeepFM])
def test_ordinary_loop_equals_train_step(cls):
    a, b = _model(cls), _model(cls)
    opt_a = sampan.optim.Adam(a.parameters(), lr=0.01)
    opt_b = sampan.optim.Adam(b.parameters(), lr=0.01)
    for batch in _batches():
        ids, dense, labels = batch.ids_matrix(), batch.dense, batch.labels
        logits = a(ids, dense)
        loss = F.binary_cross_entropy_with_logits(logits, sampan.tensor(labels))
        opt_a.zero_grad()
        loss.backward()
        opt_a.step()
        rec.train_step(b, opt_b, ids, dense, labels)
    ta, tb = _tables(a), _tables(b)
    assert len(ta) == len(tb) >= 1
    for (ia, va), (ib, vb) in zip(ta, tb):
        assert ia.tolist() == ib.tolist() and len(ia) > 0
        assert np.array_equal(va, vb)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and np.array_equal(pa.numpy(), pb.numpy()), na
    assert a.embedding.step == b.embedding.step == 5


def test_optimizer_step_pushes_the_rows_and_only_once():
    emb = rec.HashEmbedding(3, optimizer_factory=lambda: SparseSGD(1.0))
    assert "sparse_table" in dict(emb.named_parameters())
    opt = sampan.optim.SGD(emb.parameters(), lr=0.1)
    ids = np.array([[5, 9]], np.int64)
    out = emb(ids)  # creates the rows
    before = emb.emb.read(np.array([5, 9]))
    opt.zero_grad()
    (out * sampan.tensor(np.ones((1, 2, 3), np.float32))).sum().backward()
    opt.step()
    np.testing.assert_allclose(emb.emb.read(np.array([5, 9])), before - 1.0, rtol=1e-6)
    opt.step()  # nothing pending: no second push, the step counter stays
    np.testing.assert_allclose(emb.emb.read(np.array([5, 9])), before - 1.0, rtol=1e-6)
    assert emb.step == 1 and emb.sparse_table.shape == (0,)


def test_train_step_still_pushes_when_the_optimiser_lacks_the_table():
    model = _model(rec.DLRM)
    dense = [p for n, p in model.named_parameters() if not n.endswith("sparse_table")]
    opt = sampan.optim.Adam(dense, lr=0.01)
    batch = _batches(1)[0]
    rec.train_step(model, opt, batch.ids_matrix(), batch.dense, batch.labels)
    assert model.embedding.step == 1 and not model.embedding._pending
