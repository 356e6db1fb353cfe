"""Inference rewrites: batch-norm folded into conv2d / linear weights, constant weight
transposes folded, no dropout left in eval-mode traces; IR before/after and numbers."""
import numpy as np

import sampan
from sampan import nn
from sampan.ir import verify
from sampan.ir.graph import Graph
from sampan.jit.api import trace
from sampan.passes import PassManager, pipeline
from sampan.runtime import compile_graph

NO_FUSE = [p for p in pipeline("inference") if p != "fuse_elementwise"]


def _net():
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Dropout(0.3), nn.Conv2d(8, 4, 3, bias=False), nn.BatchNorm2d(4),
                      nn.Flatten(), nn.Linear(4 * 4 * 4, 10), nn.BatchNorm1d(10))
    r = np.random.default_rng(0)
    for bn in (m[1], m[5], m[8]):   # non-trivial statistics, as after training
        c = bn.num_features
        bn.running_mean._data[...] = r.standard_normal(c)
        bn.running_var._data[...] = r.uniform(0.3, 3.0, c)
        bn.weight._data[...] = r.uniform(0.5, 2.0, c)
        bn.bias._data[...] = r.standard_normal(c)
    return m.eval()


def _traced(m, x):
    state = list(m.named_parameters()) + [(n, b) for n, b in m.named_buffers()]
    g, slots, *_ = trace(m.__call__, (x,), {}, state)
    g.meta["frozen"] = {i: ref._data for i, (k, ref) in enumerate(slots) if k == "state"}
    return g, slots


def _ops(g):
    return [n.op for n in g.nodes]


def test_conv_bn_net_folds_and_matches_unfolded():
    m = _net()
    x = sampan.randn(4, 3, 6, 6)
    g, _ = _traced(m, x)
    before = _ops(PassManager([p for p in NO_FUSE if p != "fold_batch_norm"]).run(g))
    after = PassManager(NO_FUSE, debug=True).run(g)
    ops = _ops(after)
    assert before.count("sub") == 3 and before.count("mul") >= 6
    assert ops == ["conv2d", "add", "relu", "conv2d", "add", "reshape", "matmul", "add"], ops
    text = str(after)
    assert "sqrt(" not in text and "reciprocal(" not in text and "sub(" not in text
    # the frozen inputs stay in the signature, unread
    used = {v.id for n in after.nodes for v in n.inputs}
    assert not any(v.id in used for v in after.inputs[1:])
    got = compile_graph(after)(x.numpy(), *[None] * (len(after.inputs) - 1))[0]
    np.testing.assert_allclose(got, m(x).numpy(), rtol=1e-4, atol=2e-5)


def test_saved_inference_program_is_folded_and_equal(tmp_path):
    m = _net()
    x = sampan.randn(2, 3, 6, 6)
    p = sampan.jit.save(m, str(tmp_path / "net"), (x,))
    loaded = sampan.jit.load(p)
    assert "sub(" not in str(loaded.graph) and str(loaded.graph).count("conv2d(") == 2
    np.testing.assert_allclose(loaded(x).numpy(), m(x).numpy(), rtol=1e-4, atol=2e-5)
    plain = sampan.jit.save(m, str(tmp_path / "plain"), (x,), passes=["dce"])
    assert "sub(" in str(sampan.jit.load(plain).graph)


def test_fold_batch_norm_ir_before_after():
    g = Graph()
    x = g.add_input((2, 3), "float32")
    r = np.random.default_rng(1)
    w = g.add_const(r.standard_normal((3, 4)).astype(np.float32))
    mean, scale = (g.add_const(r.standard_normal(4).astype(np.float32)) for _ in range(2))
    y = g.add_node("matmul", [x, w], {}).output
    y = g.add_node("sub", [y, mean], {}).output
    y = g.add_node("mul", [y, scale], {}).output
    g.outputs = [y]
    text = str(g)
    assert "sub(" in text and "mul(" in text
    g2 = PassManager(["fold_batch_norm"], debug=True).run(g)
    assert _ops(g2) == ["matmul", "add"] and "sub(" not in str(g2)
    a = r.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(compile_graph(g2)(a)[0], compile_graph(g)(a)[0], rtol=1e-5,
                               atol=1e-6)


def test_chains_that_are_not_per_channel_affine_stay():
    g = Graph()
    x = g.add_input((2, 3), "float32")
    w = g.add_const(np.ones((3, 4), np.float32))
    full = g.add_const(np.arange(8, dtype=np.float32).reshape(2, 4))   # varies per row
    y = g.add_node("matmul", [x, w], {}).output
    z = g.add_node("mul", [y, full], {}).output
    u = g.add_node("matmul", [x, w], {}).output
    v = g.add_node("mul", [u, g.add_const(np.float32(2.0))], {}).output
    g.outputs = [z, v, u]          # u is read outside the chain: cannot fold
    g2 = PassManager(["fold_batch_norm"], debug=True).run(g)
    assert _ops(g2) == ["matmul", "mul", "matmul", "mul"]


def test_constant_weight_transpose_folds():
    g = Graph()
    x = g.add_input((5, 6), "float32")
    wi = g.add_input((4, 6), "float32", name="fc.weight")
    wt = g.add_node("permute", [wi], {"dims": (1, 0)}).output
    g.outputs = [g.add_node("matmul", [x, wt], {}).output]
    w = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    assert "permute(" in str(g)
    g.meta["frozen"] = {1: w}
    g2 = PassManager(NO_FUSE, debug=True).run(g)
    verify(g2)
    assert _ops(g2) == ["matmul"], str(g2)
    wt2 = g2.nodes[0].inputs[1]
    assert wt2.is_const and wt2.const.flags.c_contiguous
    a = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_array_equal(compile_graph(g2)(a, w)[0], a @ w.T)


def test_eval_mode_traces_contain_no_dropout():
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU())
    x = sampan.randn(4, 8)
    m.train()
    train_ops = _ops(_traced(m, x)[0])
    assert "uniform" in train_ops and "where" in train_ops
    m.eval()
    eval_ops = _ops(_traced(m, x)[0])
    assert not {"uniform", "where", "gt"} & set(eval_ops), eval_ops
