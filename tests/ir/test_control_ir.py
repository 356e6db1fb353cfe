"""Issue 34: Graphs whose nodes hold blocks: copy, equality, text round trip, verifier,
DOT clusters."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.ir import Graph, VerifyError, parse, verify


def _traced():
    w = sampan.nn.Parameter(sampan.tensor(np.linspace(-1, 1, 4, dtype=np.float32)))
    big = sampan.tensor(np.arange(40, dtype=np.float32).reshape(10, 4))

    @sampan.jit
    def f(x, xs):
        y = sampan.cond(x.sum() > 0, lambda a: a * w, lambda a: a - w, x)
        _, s = sampan.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s * 0.5 + y),
                                 (sampan.zeros((), dtype=sampan.int64), y))

        def step(h, x):
            inner = sampan.cond(x.sum() > 0, lambda u: u + big[0], lambda u: u, h)
            return (inner + x).tanh(), inner
        return sampan.scan(step, s, xs)
    f(sampan.tensor(np.ones(4, np.float32)), sampan.tensor(np.ones((3, 4), np.float32)))
    return f.graph


def _consts(g):
    return {c.name: c.const for b in g.walk() for c in b.consts if c.name is not None}


def test_round_trip_copy_and_equality_with_nested_blocks():
    g = _traced()
    verify(g)
    text = str(g)
    assert "graph then(" in text and "graph body(" in text and text.count("graph ") == 8
    back = parse(text, _consts(g))
    assert back == g and str(back) == text
    verify(back)
    c = g.copy()
    assert c == g and c.nodes[-1].blocks[0] is not g.nodes[-1].blocks[0]
    # blocks take part in equality
    c.nodes[-1].blocks[0].nodes[-1].op = "sin" if c.nodes[-1].blocks[0].nodes[-1].op != \
        "sin" else "cos"
    assert c != g


def _cond_graph(else_dtype="float32", else_shape=(3,)):
    g = Graph()
    p, x = g.add_input((), "bool"), g.add_input((3,), "float32")
    then, other = Graph("then"), Graph("else")
    a = then.add_input((3,), "float32")
    then.outputs = [then.add_node("relu", [a], {}).output]
    b = other.add_input((3,), "float32")
    other.outputs = [other.add_node("cast", [b], {"dtype": else_dtype}).output]
    if else_shape != (3,):
        other.outputs = [other.add_node("reshape", other.outputs, {"shape": else_shape}).output]
    return g, p, x, then, other


def test_verifier_checks_branches_carry_and_block_isolation():
    g, p, x, then, other = _cond_graph()
    n = g.add_node("cond", [p, x], {"n_operands": 1}, blocks=[then, other])
    g.outputs = n.outputs
    verify(g)
    # the branches disagree on their output type
    g2, p, x, then, other = _cond_graph("float64")
    with pytest.raises(sampan.errors.SampanError, match="cond"):
        g2.add_node("cond", [p, x], {"n_operands": 1}, blocks=[then, other])
    from sampan.ops.registry import Spec
    n2 = g2.add_node("cond", [p, x], {"n_operands": 1}, blocks=[then, other],
                     out_specs=[Spec((3,), np.dtype("float32"))])
    g2.outputs = n2.outputs
    with pytest.raises(VerifyError, match="cond"):
        verify(g2)
    # a block reading a value of the enclosing graph
    g3, p, x, then, other = _cond_graph()
    then.nodes[0].inputs = [x]
    n3 = g3.add_node("cond", [p, x], {"n_operands": 1}, blocks=[then, other],
                     out_specs=[Spec((3,), np.dtype("float32"))])
    g3.outputs = n3.outputs
    with pytest.raises(VerifyError, match="another graph|defined"):
        verify(g3)
    # a while body that changes its carry's type
    g4 = Graph()
    s = g4.add_input((3,), "float32")
    cnd, body = Graph("cond"), Graph("body")
    c = cnd.add_input((3,), "float32")
    cnd.outputs = [cnd.add_node("gt", [cnd.add_node("sum", [c], {"axis": None, "keepdims": False}
                                                    ).output, cnd.add_const(np.float32(0))],
                                {}).output]
    bi = body.add_input((3,), "float32")
    body.outputs = [body.add_node("cast", [bi], {"dtype": "float64"}).output]
    with pytest.raises(sampan.errors.SampanError, match="while_loop"):
        g4.add_node("while_loop", [s], {"n_carry": 1, "max_iterations": None},
                    blocks=[cnd, body])


def test_dot_draws_blocks_as_nested_clusters():
    dot = _traced().to_dot()
    assert dot.count("subgraph cluster_") >= 5
    assert "cond: then" in dot and "scan: body" in dot and "while_loop: body" in dot
    assert dot.count("{") == dot.count("}")


def test_constant_names_are_unique_across_blocks():
    g = Graph()
    x = g.add_input((20,), "float32")
    w = g.add_const(np.ones(20, np.float32), name="w")
    then, other = Graph("then"), Graph("else")
    for b, val in ((then, 2.0), (other, 3.0)):     # the same name, other data
        a = b.add_input((20,), "float32")
        b.outputs = [b.add_node("mul", [a, b.add_const(np.full(20, val, np.float32),
                                                       name="w")], {}).output]
    s = g.add_node("sum", [x], {"axis": None, "keepdims": False}).output
    p = g.add_node("gt", [s, g.add_const(np.float32(0))], {}).output
    y = g.add_node("mul", [x, w], {}).output
    g.outputs = g.add_node("cond", [p, y], {"n_operands": 1}, blocks=[then, other]).outputs
    text = str(g)
    names = [c.name for b in g.walk() for c in b.consts if c.name]
    assert len(set(names)) == 3 and all(f"ref={n!r}" in text for n in names)
    back = parse(text, _consts(g))
    assert back == g
