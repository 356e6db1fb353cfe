"""Issue 34: sampan.cond / while_loop / scan eagerly and under sampan.jit (one node each,
closures as captured inputs), against numpy references and eager."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.errors import SampanError


def _r(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ops(g):
    return [n.op for n in g.nodes]


def _eq(a, b, tol=1e-6):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x.numpy() if hasattr(x, "numpy") else x),
                                   np.asarray(y.numpy() if hasattr(y, "numpy") else y),
                                   rtol=tol, atol=tol)


def test_cond_eager_and_jit_both_branches_with_closure_over_value_and_parameter():
    w = sampan.nn.Parameter(sampan.tensor(_r(4, seed=1)))

    def f(x):
        y = x * 3.0                        # an outer traced value read by a branch
        return sampan.cond(x.sum() > 0, lambda a: a * y * w, lambda a: -a + w, x)
    jf = sampan.jit(f)
    for x in (_r(4, seed=2) + 5, _r(4, seed=3) - 5):
        xt = sampan.tensor(x)
        want = x * (x * 3.0) * w.numpy() if x.sum() > 0 else -x + w.numpy()
        _eq(f(xt), want)
        _eq(jf(xt), want)
    g = jf.graph
    assert _ops(g).count("cond") == 1
    (node,) = [n for n in g.nodes if n.op == "cond"]
    then, other = node.blocks
    # operand, then the captures (y and w) after it, the same list in both blocks
    assert len(node.inputs) == 4 and node.attrs == {"n_operands": 1}
    assert len(then.inputs) == len(other.inputs) == 3
    sampan.ir.verify(g)


def test_while_loop_eager_jit_and_max_iterations():
    def f(x, n):
        i0 = sampan.zeros((), dtype=sampan.int64)
        return sampan.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, s * 2.0 + 1.0),
                                 (i0, x))
    jf = sampan.jit(f)
    x, n = sampan.tensor(_r(3)), sampan.tensor(np.array(4, np.int64))
    ref = x.numpy()
    for _ in range(4):
        ref = ref * 2 + 1
    _eq(f(x, n), (np.array(4), ref))
    _eq(jf(x, n), (np.array(4), ref))
    _eq(jf(x, sampan.tensor(np.array(1, np.int64))), (np.array(1), x.numpy() * 2 + 1))
    assert _ops(jf.graph).count("while_loop") == 1

    def capped(x):
        return sampan.while_loop(lambda s: s.sum() < 1e9, lambda s: s + 1.0, x,
                                 max_iterations=5)
    _eq(capped(x), x.numpy() + 5)
    _eq(sampan.jit(capped)(x), x.numpy() + 5)


def _rnn(h0, xs, w, reverse=False):
    h, ys = h0, [None] * len(xs)
    for i in (range(len(xs) - 1, -1, -1) if reverse else range(len(xs))):
        h = np.tanh(h @ w + xs[i])
        ys[i] = h * 2
    return h, np.stack(ys)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_eager_and_jit_with_captured_parameter(reverse):
    w = sampan.nn.Parameter(sampan.tensor(_r(4, 4, seed=5) * 0.5))

    def f(h0, xs):
        def step(h, x):
            h = (h @ w + x).tanh()
            return h, h * 2.0
        return sampan.scan(step, h0, xs, reverse=reverse)
    h0, xs = _r(2, 4, seed=6), _r(7, 2, 4, seed=7)
    want = _rnn(h0, xs, w.numpy(), reverse)
    _eq(f(sampan.tensor(h0), sampan.tensor(xs)), want, 1e-5)
    jf = sampan.jit(f)
    _eq(jf(sampan.tensor(h0), sampan.tensor(xs)), want, 1e-5)
    assert _ops(jf.graph).count("scan") == 1


def test_scan_tuple_carry_none_y_and_nested_control_flow():
    def f(a, xs):
        def step(c, x):
            s, m = c
            # a cond inside the scan body, itself closing over the outer `a`
            t = sampan.cond(x.sum() > 0, lambda u: u + a, lambda u: u - a, x)
            inner = sampan.while_loop(lambda k, v: k < 2, lambda k, v: (k + 1, v * 0.5),
                                      (sampan.zeros((), dtype=sampan.int64), t))[1]
            return (s + inner, sampan.maximum(m, inner)), None
        return sampan.scan(step, (a * 0.0, a - 100.0), xs)
    a, xs = _r(3, seed=8), _r(5, 3, seed=9)
    s, m = np.zeros(3, np.float32), np.full(3, -100, np.float32) + a
    for x in xs:
        t = (x + a if x.sum() > 0 else x - a) * 0.25
        s, m = s + t, np.maximum(m, t)
    eager = f(sampan.tensor(a), sampan.tensor(xs))
    assert eager[1] is None
    _eq(eager[0], (s, m), 1e-5)
    jf = sampan.jit(f)
    got = jf(sampan.tensor(a), sampan.tensor(xs))
    assert got[1] is None
    _eq(got[0], (s, m), 1e-5)
    (node,) = [n for n in jf.graph.nodes if n.op == "scan"]
    assert [n.op for n in node.blocks[0].nodes].count("cond") == 1
    sampan.ir.verify(jf.graph)


def test_codegen_emits_real_python_control_flow():
    @sampan.jit
    def f(x):
        x = sampan.cond(x.sum() > 0, lambda a: a * 2.0, lambda a: a * 3.0, x)
        x = sampan.while_loop(lambda s: s.sum() < 100.0, lambda s: s + 1.0, x)
        return sampan.scan(lambda h, x: (h + x, h), x, sampan.ones(4, 3))
    x = sampan.tensor(np.ones(3, np.float32))
    f(x)
    from sampan.runtime import compile_graph
    code = compile_graph(f.graph).code
    assert "    if " in code and "    else:" in code
    assert "    while " in code and "    for " in code


def test_bad_branches_and_bodies_name_the_op():
    x = sampan.tensor(_r(3))

    @sampan.jit
    def mismatched(x):
        return sampan.cond(x.sum() > 0, lambda a: a, lambda a: a.sum(), x)
    with pytest.raises(SampanError, match="cond"):
        mismatched(x)

    @sampan.jit
    def widening(x):
        return sampan.while_loop(lambda s: s.sum() < 3, lambda s: s.reshape(1, 3), x)
    with pytest.raises(SampanError, match="while_loop"):
        widening(x)
    with pytest.raises(SampanError, match="while_loop"):     # eager checks it too
        sampan.while_loop(lambda s: s.sum() < 3, lambda s: s.reshape(1, 3), x)
    with pytest.raises(SampanError, match="scan"):
        sampan.scan(lambda c, x: (c, x), x, x.sum())


def test_scan_over_a_vector_with_scalar_carry_in_debug_mode():
    def f(s, xs):
        return sampan.scan(lambda c, x: (c + x * 2.0, c * x), s, xs)
    xs = np.arange(5, dtype=np.float32)
    c, ys = 1.0, []
    for x in xs:
        ys.append(c * x)
        c = c + x * 2
    args = (sampan.tensor(np.float32(1.0)), sampan.tensor(xs))
    _eq(f(*args), (np.float32(c), np.array(ys, np.float32)))
    _eq(sampan.jit(f, debug=True)(*args), (np.float32(c), np.array(ys, np.float32)))


def test_impure_blocks_are_refused_with_the_users_line():
    acc = sampan.zeros(3)

    @sampan.jit
    def writes_outside(x):
        def body(s):
            acc.add_(s)                      # state from outside the loop
            return s + 1.0
        return sampan.while_loop(lambda s: s.sum() < 10, body, x)
    with pytest.raises(SampanError, match="writes to a tensor from outside"):
        writes_outside(sampan.ones(3))

    @sampan.jit
    def local_write(x):
        def body(s):
            t = s * 1.0
            t.add_(1.0)                      # a tensor the block made: fine
            return t
        return sampan.while_loop(lambda s: s.sum() < 10, body, x)
    _eq(local_write(sampan.ones(3)), np.full(3, 4.0, np.float32))

    @sampan.jit
    def draws(x):
        return sampan.cond(x.sum() > 0, lambda a: a + sampan.randn(3), lambda a: a, x)
    with pytest.raises(SampanError, match="random op"):
        draws(sampan.ones(3))
