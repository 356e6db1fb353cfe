"""int8 post-training quantisation of saved programs with a symbolic batch dim: the
verifier checks each op's shape rule on the graph at a concrete size per symbol (it used
to hand 'batch' to the rules, and getitem's rejected it), and the int8 program serves
every batch size."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
import sampan.nn as nn
import sampan.nn.functional as F
from sampan.ir import VerifyError, verify
from sampan.ir.text import parse

# the int8 layers fuse_quant writes (issue 31 added the requantising ones)
INT8_LAYERS = ("qmatmul", "qdense", "qlinear_dense", "qconv2d", "qlinear_conv2d")


class _Pick(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x[:, 0])


def _close_int8(got, ref):
    # int8 weights and activations: within a few percent of the output's scale
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 0.04 * np.abs(ref).max() + 1e-3


def test_int8_program_with_getitem_serves_every_batch(tmp_path):
    sampan.manual_seed(0)
    m = _Pick()
    m.eval()
    rng = np.random.default_rng(0)
    p = sampan.jit.save(m, str(tmp_path / "p.sampan"), (sampan.randn(2, 5, 4),),
                        dynamic="batch")
    # uniform data, so that the calibrated range covers the inputs checked below
    cal = [(sampan.Tensor(rng.uniform(-1, 1, (b, 5, 4)).astype(np.float32)),)
           for b in (32, 64)]
    out = sampan.quant.quantize_program(p, cal, str(tmp_path / "q.sampan"))
    g, _, _ = sampan.jit.serialize.read(out)
    assert g.inputs[0].shape[0] == "batch"            # still one program for every batch
    ops = {n.op for n in g.nodes}
    assert "quantize" in ops and ops & set(INT8_LAYERS)     # int8 activations too
    q = sampan.jit.load(out)
    w = m.fc.weight.numpy().astype(np.float64)          # (in, out)
    bias = m.fc.bias.numpy().astype(np.float64)
    for b in (1, 3, 8):
        x = rng.uniform(-1, 1, (b, 5, 4)).astype(np.float32)
        ref = x[:, 0].astype(np.float64) @ w + bias     # numpy float64 reference
        _close_int8(q(sampan.Tensor(x)).numpy(), ref)


class _GRUClassifier(nn.Layer):
    """The README tour's classifier, smaller."""

    def __init__(self, vocab=50, d=16, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(4 * d, d), nn.ReLU(), nn.Linear(d, classes))

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        pooled = sampan.cat([h.mean(dim=1), h.amax(dim=1)], dim=-1)
        return self.head(F.normalize(pooled, dim=-1))


def test_int8_gru_classifier_serves_every_batch(tmp_path):
    sampan.manual_seed(0)
    m = _GRUClassifier()
    m.eval()
    rng = np.random.default_rng(1)
    ids = sampan.Tensor(rng.integers(0, 50, (8, 6)))
    p = sampan.jit.save(m, str(tmp_path / "gru.sampan"), (ids,), dynamic={"ids": {0: "batch"}})
    cal = [(sampan.Tensor(rng.integers(0, 50, (b, 6))),) for b in (4, 9)]
    out = sampan.quant.quantize_program(p, cal, str(tmp_path / "gru-int8.sampan"))
    g, _, _ = sampan.jit.serialize.read(out)
    assert g.inputs[0].shape[0] == "batch" and {n.op for n in g.nodes} & set(INT8_LAYERS)
    f = sampan.jit.load(p)
    q = sampan.jit.load(out)
    for b in (1, 5, 11):
        x = sampan.Tensor(rng.integers(0, 50, (b, 6)))
        ref = m(x).numpy()                           # eager float
        np.testing.assert_allclose(f(x).numpy(), ref, rtol=1e-4, atol=1e-5)
        _close_int8(q(x).numpy(), ref)


def test_small_gru_saves_with_a_symbolic_batch(tmp_path):
    # hidden 8, batch 4: reshape used to drop the symbolic size (int(d), np.prod), so the
    # zero initial state was a constant fill at each traced size, and freeze_state +
    # fold_constants folded matmul(zeros, w_hh) + b into a constant unify cannot generalise
    sampan.manual_seed(0)
    m = _GRUClassifier(d=8)
    m.eval()
    rng = np.random.default_rng(2)
    p = sampan.jit.save(m, str(tmp_path / "gru8.sampan"),
                        (sampan.Tensor(rng.integers(0, 50, (4, 6))),), dynamic="batch")
    g, _, _ = sampan.jit.serialize.read(p)
    assert g.inputs[0].shape[0] == "batch"
    f = sampan.jit.load(p)
    for b in (1, 7):
        x = sampan.Tensor(rng.integers(0, 50, (b, 6)))
        np.testing.assert_allclose(f(x).numpy(), m(x).numpy(), rtol=1e-4, atol=1e-5)


def _sym_graph(declared):
    return parse("graph main(%0: f32[batch,5,4]) {\n"
                 f"  %1: f32[{declared}] = getitem(%0, index=(('s', None, None, None), "
                 "('i', 0)))\n  return (%1)\n}\n")


def test_verifier_runs_shape_rules_on_symbolic_graphs():
    verify(_sym_graph("batch,4"))               # getitem's rule took 'batch' as an int
    with pytest.raises(VerifyError, match="getitem"):
        verify(_sym_graph("2*batch,4"))         # a symbolic dim is checked too
    with pytest.raises(VerifyError, match="getitem"):
        verify(_sym_graph("batch,5"))


def test_verifier_checks_symbolic_graphs_at_the_sizes_given():
    # x[:4] of a batch traced at 8: valid from batch 4 on (the saved guards say so)
    g = parse("graph main(%0: f32[batch,5]) {\n"
              "  %1: f32[4,5] = getitem(%0, index=(('s', None, 4, None),))\n"
              "  return (%1)\n}\n")
    verify(g)
    verify(g, {"batch": 8})
    with pytest.raises(VerifyError, match="batch=2"):
        verify(g, {"batch": 2})
