"""Graph text round trip, parser errors, verifier, DOT."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.ir import Graph, ParseError, VerifyError, parse, verify


def _roundtrip(g):
    g2 = parse(str(g), {c.name: c.const for c in g.consts if c.name})
    verify(g2)
    assert g2 == g
    assert str(g2) == str(g)


def test_roundtrip_of_test_models():
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    jm = sampan.jit(m)
    jm(sampan.randn(3, 4))
    _roundtrip(jm.graph)
    _roundtrip(jm.raw_graph)

    def f(x):
        y = sampan.softmax(x, -1) + sampan.layer_norm(x, 5)
        return y[:, 1:4], sampan.where(x > 0, x, float("-inf")), x.argmax(-1)
    jf = sampan.jit(f)
    jf(sampan.randn(2, 5))
    _roundtrip(jf.raw_graph)
    _roundtrip(jf.graph)


def test_text_format_is_readable():
    g = parse("""graph f(%0: f32[B,10] 'x') {
      %1: f32[B,10] = relu(%0)  # model.py:12
      return (%1)
    }""")
    assert "%1: f32[B,10] = relu(%0)  # model.py:12" in str(g)
    assert g.inputs[0].shape == ("B", 10) and g.inputs[0].name == "x"
    verify(g)


@pytest.mark.parametrize("text,match", [
    ("graph f(%0: f32[3]) {\n  %1: f32[3] = relu(%7)\n  return (%1)\n}", "not defined"),
    ("graph f(%0: f32[3]) {\n  %1: f32[3] = nope(%0)\n  return (%1)\n}", "unknown op"),
    ("graph f(%0: f32[3]) {\n  %1: f32[3] = relu(%0)\n", "truncated"),
    ("graph f(%0: q9[3]) {\n}", "bad type"),
    ("graph f(%0: f32[3]) {\n  %1: f32[3] = const(ref='w')\n  return (%1)\n}", "'w'"),
])
def test_parse_errors_name_the_line(text, match):
    with pytest.raises(ParseError, match=match):
        parse(text)


def test_verifier_catches_type_and_ssa_errors():
    g = parse("graph f(%0: f32[3]) {\n  %1: f32[4] = relu(%0)\n  return (%1)\n}")
    with pytest.raises(VerifyError, match="shape rule"):
        verify(g)
    g = Graph()
    x = g.add_input((3,), "float32")
    n = g.add_node("relu", [x], {})
    g.add_node("exp", [n.output], {})
    g.nodes.reverse()                          # use before definition
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(g)
    g.nodes.reverse()
    g.outputs = [n.output]
    verify(g)
    n.outputs[0].id = x.id                     # defined twice
    with pytest.raises(VerifyError, match="twice"):
        verify(g)


def test_to_dot_and_render(tmp_path):
    jf = sampan.jit(lambda x: (x * 2).exp().sum())
    jf(sampan.ones(2, 3))
    jf.graph.nodes[0].meta["group"] = "fused0"
    dot = jf.graph.to_dot()
    assert dot.startswith("digraph") and "f32[2,3]" in dot and "cluster_0" in dot
    msg = sampan.ir.render(jf.graph, str(tmp_path / "g.svg"))
    import shutil
    if shutil.which("dot"):
        assert (tmp_path / "g.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    else:
        assert "dot" in msg and (tmp_path / "g.dot").exists()


def test_attribute_literals_roundtrip():
    from sampan.ir.text import fmt_lit, _eval_lit
    import ast
    for v in [None, True, 3, -2.5, float("inf"), ("s", 1, None, 2), ((1, 0), (2, 1)), "f32",
              (("t", 0),)]:
        assert _eval_lit(ast.parse(fmt_lit(v), mode="eval").body) == v
    assert np.isnan(_eval_lit(ast.parse(fmt_lit(float("nan")), mode="eval").body))


def test_splice_replaces_drops_renames_and_prunes():
    """Graph.splice, the one rewrite the passes end with: relu(x) * 2 + 1 with the mul and
    add replaced by one sub node (and the add dropped) runs as the hand-written program,
    verifies, and loses the constants nothing reads."""
    from sampan.ir import Node, Value
    from sampan.runtime.codegen import compile_graph
    g = parse("""graph f(%0: f32[3] 'x') {
      %1: f32[3] = const(value=[2.0, 2.0, 2.0])
      %2: f32[3] = const(value=[1.0, 1.0, 1.0])
      %3: f32[3] = relu(%0)
      %4: f32[3] = mul(%3, %1)
      %5: f32[3] = add(%4, %2)
      %6: f32[3] = neg(%5)
      return (%6, %5)
    }""")
    relu, mul, add, _ = g.nodes
    assert len(g.consts) == 2
    c = g.add_const(np.full(3, 5, np.float32))
    sub = Node("sub", [relu.outputs[0], c], {}, "")
    sub.outputs.append(Value(g._new_id(), (3,), np.float32, node=sub))
    g.splice({id(mul): [sub], id(add): []}, {add.outputs[0].id: sub.outputs[0]})
    verify(g)
    assert [n.op for n in g.nodes] == ["relu", "sub", "neg"]
    assert g.outputs[1] is sub.outputs[0] and g.nodes[2].inputs[0] is sub.outputs[0]
    assert len(g.consts) == 1                        # c0 and c1 are read no more
    x = np.array([-1, 0, 2], np.float32)
    got = compile_graph(g)(x)
    np.testing.assert_array_equal(got[0], -(np.maximum(x, 0) - 5))
    np.testing.assert_array_equal(got[1], np.maximum(x, 0) - 5)
