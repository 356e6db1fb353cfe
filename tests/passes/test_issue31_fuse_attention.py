"""`fuse_attention` (issue 31, W8): on a small SentenceEncoder the Predictor's graph holds one
`attention` node a layer and its output equals the unfused Predictor's and eager's (fp32
and dynamic int8, several batch and sequence sizes from one program); the pass is in the
list a user edits and removing it there runs the chain; graphs that do not match are
left alone."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan import inference, nn
from sampan.models import bert
from sampan.nn import functional as F
from sampan.passes import PassManager, pipeline

PASS = "fuse_attention"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cfg = bert.BertConfig(vocab_size=60, hidden_size=24, num_hidden_layers=2,
                          num_attention_heads=3, intermediate_size=40)
    sampan.manual_seed(7)
    enc = bert.SentenceEncoder(bert.BertModel(cfg)).eval()
    ids, mask = _batch(2, 8, 0)
    path = sampan.jit.save(enc, str(tmp_path_factory.mktemp("attn") / "enc.sampan"),
                           (sampan.tensor(ids), sampan.tensor(mask)), dynamic=enc.dynamic)
    return enc, path


def _batch(b, s, seed):
    r = np.random.default_rng(seed)
    ids = r.integers(1, 60, (b, s))
    mask = np.ones((b, s), np.int64)
    mask[-1, max(1, s // 2):] = 0                # the last row ends in padding
    ids[mask == 0] = 0
    return ids, mask


def _predictor(path, fused, int8=False):
    c = inference.Config(path)
    if int8:
        c.set_precision("int8", dynamic=True)
    assert PASS in c.pass_builder().all_passes()
    if not fused:
        c.pass_builder().delete_pass(PASS)
    return inference.create_predictor(c)


def _ops(p):
    return [n.op for n in p.graph.nodes]


@pytest.mark.parametrize("int8", [False, True])
def test_predictor_fused_equals_unfused(saved, int8):
    enc, path = saved
    on, off = _predictor(path, True, int8), _predictor(path, False, int8)
    assert _ops(on).count("attention") == 2 and "softmax" not in _ops(on)
    assert "attention" not in _ops(off) and _ops(off).count("softmax") == 2
    assert PASS in on.passes_run and PASS not in off.passes_run
    for b, s, seed in ((2, 8, 1), (1, 5, 2), (3, 13, 3)):     # batch 1 too
        ids, mask = _batch(b, s, seed)
        a, u = on.run([ids, mask])[0], off.run([ids, mask])[0]
        np.testing.assert_allclose(a, u, rtol=0, atol=1e-5)
        if not int8:      # eager (the unfused ops) agrees with the fused program
            with sampan.no_grad():
                e = enc(sampan.tensor(ids), sampan.tensor(mask)).numpy()
            np.testing.assert_allclose(a, e, rtol=0, atol=1e-5)


def test_in_the_predictor_list_before_fusion():
    names = pipeline("predictor")
    assert names.index("licm") < names.index(PASS) < names.index("fuse_elementwise")
    assert PASS not in pipeline("train") and PASS not in pipeline("inference")


class _NotBert(nn.Layer):
    """softmax(x @ x^T) @ x with no head split: not the chain; and a chain whose scores
    are also read elsewhere (returned): left alone. With `only_out`, the scores are not
    returned and the chain is fused (the control)."""

    def __init__(self, only_out=False):
        super().__init__()
        self.only_out = only_out

    def forward(self, x):
        p = F.softmax(x @ x.permute(0, 2, 1), -1)
        q = x.reshape(2, 4, 2, 3).permute(0, 2, 1, 3).contiguous()
        kt = (x + 1).reshape(2, 4, 2, 3).permute(0, 2, 3, 1).contiguous()
        v = (x * 2).reshape(2, 4, 2, 3).permute(0, 2, 1, 3).contiguous()
        sc = (q * 0.5) @ kt
        o = (F.softmax(sc, -1) @ v).permute(0, 2, 1, 3).reshape(2, 4, 6)
        return p @ x + o if self.only_out else (p @ x + o, sc)


def test_other_graphs_are_left_alone():
    from sampan.jit.tracing import trace
    g = trace(_NotBert(), (sampan.randn(2, 4, 6),))[0]
    before = [n.op for n in g.nodes]
    assert before.count("softmax") == 2
    g2 = PassManager([PASS], debug=True).run(g.copy())
    assert [n.op for n in g2.nodes] == before
    x = sampan.randn(2, 4, 6)
    g = trace(_NotBert(True), (x,))[0]
    g2 = PassManager([PASS], debug=True).run(g.copy())
    ops = [n.op for n in g2.nodes]
    assert ops.count("attention") == 1 and ops.count("softmax") == 1, ops
    from sampan.runtime import compile_graph
    want = _NotBert(True)(x).numpy()
    np.testing.assert_allclose(compile_graph(g2)(x.numpy())[0], want, rtol=0, atol=1e-5)
