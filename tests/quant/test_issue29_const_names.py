"""Issue 29 item 14: constants that a pass adds to a loaded program get names no other
constant of the graph has, so a weight-only int8 CNN is written and loads again."""
from __future__ import annotations

import numpy as np

import sampan
import sampan.nn as nn
from sampan.ir.graph import Graph
from sampan.ir.text import parse


def _cnn(depth):
    sampan.manual_seed(0)
    layers, c = [], 3
    for _ in range(depth):
        layers += [nn.Conv2d(c, 32, 3, padding=1), nn.ReLU()]
        c = 32
    m = nn.Sequential(*layers, nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    m.eval()
    return m


def test_weight_only_int8_cnn_saves_and_loads(tmp_path):
    x = sampan.randn(2, 3, 4, 4)
    xs = np.random.default_rng(1).standard_normal((5, 3, 4, 4)).astype(np.float32)
    for depth in (1, 2):   # the clash fell on a different constant at each depth
        m = _cnn(depth)
        d = sampan.jit.save(m, str(tmp_path / f"cnn{depth}.sampan"), (x,), dynamic="batch")
        wo = sampan.quant.quantize_program(d, None, str(tmp_path / f"wo{depth}.sampan"),
                                           weight_only=True)
        q = sampan.jit.load(wo)
        g, _, _ = sampan.jit.serialize.read(wo)
        assert "dequantize" in [n.op for n in g.nodes]
        names = [c.name for c in g.consts if c.name is not None]
        assert len(names) == len(set(names)), names
        ref = m(sampan.Tensor(xs)).numpy()
        got = q(sampan.Tensor(xs)).numpy()
        # int8 weights with per-channel scales: within a few percent of the float outputs
        assert np.abs(got - ref).max() <= 0.03 * np.abs(ref).max() + 1e-3


def test_printer_names_are_unique_in_a_parsed_graph():
    g = Graph()
    x = g.add_input((4,), np.float32)
    big = np.arange(32, dtype=np.float32)
    a = g.add_const(big, name="c2")          # a name an earlier print gave (a parsed graph)
    b = g.add_const(big * 2)                 # id 2: the printer used to call it 'c2' too
    y = g.add_node("add", [x, g.add_node("sum", [a], {}).outputs[0]], {}).outputs[0]
    g.outputs = [y, b]
    text = str(g)
    names = [v.name for v in g.consts]
    assert len(set(names)) == len(names), names
    back = parse(text, {v.name: v.const for v in g.consts})
    for v, w in zip(g.consts, back.consts):
        np.testing.assert_array_equal(v.const, w.const)


def test_add_const_never_reuses_a_name():
    g = Graph()
    a = g.add_const(np.zeros(32, np.float32), name="w.int8")
    b = g.add_const(np.ones(32, np.float32), name="w.int8")
    assert a.name == "w.int8" and b.name != a.name
