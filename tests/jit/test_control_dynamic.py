"""Issue 34: the error for a Python if/while on a traced value names sampan.cond /
sampan.while_loop; symbolic (`dynamic=`) dims inside blocks; a scan's graph holds one
body whatever its length."""
from __future__ import annotations

import numpy as np
import pytest

import sampan

W = (np.random.default_rng(1).standard_normal((6, 6)) * 0.3).astype(np.float32)


def _rnn(h, xs):
    w = sampan.tensor(W)

    def step(c, x):
        c = sampan.cond(x.sum() > 0, lambda a: (a @ w).tanh(), lambda a: a * 0.5, c + x)
        return c, c.sum(1)
    h, ys = sampan.scan(step, h, xs)
    return sampan.while_loop(lambda s: s.abs().sum() > 1.0, lambda s: s * 0.5, h), ys


def test_python_if_and_while_on_a_traced_value_name_the_fix():
    @sampan.jit
    def branchy(x):
        if x.sum() > 0:                                      # the user's line
            return x
        return -x
    with pytest.raises(sampan.jit.TracingError) as e:
        branchy(sampan.ones(3))
    msg = str(e.value)
    assert "sampan.cond" in msg and "sampan.while_loop" in msg
    assert "test_control_dynamic.py" in msg and "if x.sum() > 0:" in msg

    @sampan.jit
    def loopy(x):
        while x.sum() < 10:
            x = x * 2
        return x
    with pytest.raises(sampan.jit.TracingError, match="sampan.while_loop") as e:
        loopy(sampan.ones(3))
    assert "while x.sum() < 10:" in str(e.value)


@pytest.mark.parametrize("dynamic", [{"h": {0: "batch"}, "xs": {1: "batch"}},
                                     {"xs": {0: "seq"}}])
def test_symbolic_dims_inside_blocks(dynamic):
    jf = sampan.jit(_rnn, dynamic=dynamic)
    rng = np.random.default_rng(2)
    for b in (2, 3, 5):
        batch, seq = (b, 4) if "h" in dynamic else (2, b)
        h = sampan.tensor(rng.standard_normal((batch, 6)).astype(np.float32))
        xs = sampan.tensor(rng.standard_normal((seq, batch, 6)).astype(np.float32))
        for a, e in zip(jf(h, xs), _rnn(h, xs)):
            np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    g = jf.graph
    text = str(g)
    assert ("f32[batch,6]" if "h" in dynamic else "length='$seq'") in text
    (scan,) = [n for n in g.nodes if n.op == "scan"]
    if "h" in dynamic:     # the body's values carry the symbol too
        assert any(v.shape[:1] == ("batch",) for v in scan.blocks[0].values()
                   if v.ndim)
    sampan.ir.verify(g)


def test_scan_graph_does_not_grow_with_length():
    def count(length):
        jf = sampan.jit(_rnn)
        h = sampan.tensor(np.ones((2, 6), np.float32))
        jf(h, sampan.tensor(np.full((length, 2, 6), 0.1, np.float32)))
        return sum(len(b.nodes) for b in jf.graph.walk()), len(jf.graph.nodes)
    assert count(16) == count(512)
