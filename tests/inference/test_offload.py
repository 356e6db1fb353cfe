"""The onnxruntime_offload pass, the engine op, and the Predictor's onnxruntime runtime."""
import threading

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, InferenceError, create_predictor
from sampan.ir import Graph, parse, verify
from sampan.backends import onnxruntime as E
from sampan.passes import PassManager
from sampan.passes.offload import offload, offload_report
from sampan.runtime import compile_graph

from ._models import rand


class Gap(nn.Layer):
    """Linear -> relu -> lgamma (no ONNX lowering) -> Linear -> tanh."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x).relu()
        return self.b(sampan.lgamma(h.abs() + 1.0)).tanh()


@pytest.fixture(scope="module")
def gap(tmp_path_factory):
    sampan.manual_seed(3)
    m = Gap()
    m.eval()
    return sampan.jit.save(m, str(tmp_path_factory.mktemp("offload") / "gap.sampan"),
                           (sampan.randn(3, 4),), dynamic="batch")


def _pred(path, runtime="numba", offload_min=None):
    c = Config(path)
    c.set_runtime(runtime)
    if offload_min is not None:
        c.enable_onnxruntime_offload(offload_min)
    return create_predictor(c)


def _engines(p):
    return [n for n in p.graph.nodes if n.op == "engine"]


def test_unsupported_op_in_the_middle_gives_two_engines(gap):
    ref = _pred(gap)
    p = _pred(gap, offload_min=3)
    eng = _engines(p)
    assert len(eng) == 2
    ops = [n.op for n in p.graph.nodes]
    # lgamma between the engines, fused by fuse_elementwise with nothing else
    assert ops.index("engine") < next(i for i, n in enumerate(p.graph.nodes)
                                      if n.op != "engine") < len(ops) - 1
    assert "lgamma" not in {o for n in eng for o in n.meta["offloaded"]}
    assert "matmul" in eng[0].meta["offloaded"] and "matmul" in eng[1].meta["offloaded"]
    for b in (1, 5, 17):                      # symbolic batch: one session per size
        x = rand(b, 4, seed=b)
        np.testing.assert_allclose(p.run([x])[0], ref.run([x])[0], rtol=1e-5, atol=1e-5)
    assert [s["batch"] for s in p.compiled_sizes()] == [1, 5, 17]
    rep = offload_report(p.graph)
    fell = [(line, why) for line, why in rep if not why.startswith("engine")]
    assert len(fell) == 1 and "lgamma" in fell[0][0] and "no ONNX lowering" in fell[0][1]
    assert sum(why.startswith("engine") for _, why in rep) >= 5
    assert "onnxruntime_offload" in p.passes_run and "unfuse" in p.passes_run


def test_min_subgraph_size_is_respected(gap):
    # the groups: matmul, add, relu, abs, add (5 nodes) and matmul, add, tanh (3 nodes)
    p = _pred(gap, offload_min=4)
    assert len(_engines(p)) == 1
    small = [why for _, why in offload_report(p.graph) if "min_subgraph_size=4" in why]
    assert len(small) == 3 and "group of 3 supported node(s)" in small[0]
    assert len(_engines(_pred(gap, offload_min=6))) == 0
    x = rand(2, 4)
    np.testing.assert_allclose(p.run([x])[0], _pred(gap).run([x])[0], rtol=1e-5, atol=1e-5)


def test_onnxruntime_runtime_falls_back_per_node(gap):
    p = _pred(gap, runtime="onnxruntime")
    ops = [n.op for n in p.graph.nodes]
    assert ops == ["engine", "lgamma", "engine"]
    x = rand(6, 4)
    np.testing.assert_allclose(p.run([x])[0], _pred(gap).run([x])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,shape", [("mlp", (1, 8)), ("mlp", (7, 8)),
                                        ("cnn", (1, 1, 8, 8)), ("cnn", (3, 1, 8, 8))])
def test_mlp_and_cnn_match_numba(saved, name, shape):
    _, paths = saved
    x = rand(*shape, seed=len(shape))
    ref = _pred(paths[name]).run([x])[0]
    for p in (_pred(paths[name], offload_min=3), _pred(paths[name], runtime="onnxruntime")):
        assert _engines(p)
        np.testing.assert_allclose(p.run([x])[0], ref, rtol=1e-5, atol=1e-5)
    whole = _pred(paths[name], runtime="onnxruntime")
    assert [n.op for n in whole.graph.nodes] == ["engine"]      # everything is supported


def test_clone_shares_sessions_and_runs_in_threads(saved):
    _, paths = saved
    p = _pred(paths["cnn"], offload_min=3)
    x = rand(4, 1, 8, 8)
    want = p.run([x])[0]
    n_sessions = len(E._CACHE)
    clones = [p.clone() for _ in range(3)]
    assert len(E._CACHE) == n_sessions            # the clones reuse the sessions
    got = [None] * len(clones)

    def work(k):
        for _ in range(5):
            got[k] = clones[k].run([x])[0]
    ts = [threading.Thread(target=work, args=(k,)) for k in range(len(clones))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for g in got:
        np.testing.assert_array_equal(g, want)


def _diamond():
    """x -> relu -> (lgamma, and straight on) -> add: one group {relu, add} would need the
    lgamma both after and before it."""
    g = Graph()
    x = g.add_input(("batch", 5), "float32", name="x")
    (r,) = g.add_node("relu", [x], {}).outputs
    (u,) = g.add_node("lgamma", [r], {}).outputs
    (s,) = g.add_node("add", [r, u], {}).outputs
    (t,) = g.add_node("tanh", [s], {}).outputs
    g.outputs = [t]
    return g


def test_partition_stays_acyclic_and_the_ir_round_trips():
    g = offload(_diamond(), min_subgraph_size=1)
    verify(g)
    assert [n.op for n in g.nodes] == ["engine", "lgamma", "engine"]
    assert parse(str(g)) == g
    from sampan.jit import dynamic as _dyn
    c = _dyn.concrete(g, {"batch": 3})
    x = np.abs(rand(3, 5)) + 0.5
    want = np.tanh(x + sampan.lgamma(sampan.tensor(x)).numpy())
    np.testing.assert_allclose(compile_graph(c)(x)[0], want, rtol=1e-5, atol=1e-6)
    # the pass registered in the manager reads its options from the graph's meta
    d = _diamond()
    d.meta["onnxruntime_offload"] = {"min_subgraph_size": 3}
    out = PassManager(["onnxruntime_offload"], debug=True).run(d)
    assert [n.op for n in out.nodes] == ["relu", "lgamma", "add", "tanh"]
    assert all("min_subgraph_size=3" in w or "lgamma" in w for _, w in offload_report(out))


def test_engine_op_eager_kernel():
    (s,) = E.OPS["engine"].samples()
    y, r = sampan.ops.registry.OPS["engine"].kernel(*s.args, **s.attrs)
    x, w = s.args
    np.testing.assert_allclose(r, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, np.maximum(x @ w, 0) + x @ w, rtol=1e-5, atol=1e-6)
    with pytest.raises(E.EngineError, match="input 0"):
        E.OPS["engine"].shape_rule(sampan.ops.registry.Spec((3, 9), np.float32),
                                   sampan.ops.registry.Spec((4, 5), np.float32), **s.attrs)


def test_bad_options(gap):
    c = Config(gap)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InferenceError, match="min_subgraph_size"):
            c.enable_onnxruntime_offload(bad)
    c.set_runtime("onnxruntime")
    c.set_precision("bf16")
    with pytest.raises(InferenceError, match="bf16"):
        create_predictor(c)
    with pytest.raises(Exception, match="unknown engine"):
        offload(_diamond(), engine="nope")


def test_engine_that_cannot_be_built_falls_back_with_a_warning(monkeypatch):
    g = offload(_diamond(), min_subgraph_size=1)
    from sampan.jit import dynamic as _dyn
    c = _dyn.concrete(g, {"batch": 2})

    class Refuses:
        def __init__(self, *a):
            raise RuntimeError("no kernel for this model")
    monkeypatch.setitem(E.ENGINES, "onnxruntime", Refuses)
    E.clear_cache()
    with pytest.warns(RuntimeWarning, match="no kernel for this model"):
        fn = compile_graph(c)
    x = np.abs(rand(2, 5)) + 0.5
    want = np.tanh(x + sampan.lgamma(sampan.tensor(x)).numpy())
    np.testing.assert_allclose(fn(x)[0], want, rtol=1e-5, atol=1e-6)


def test_support_names_what_the_engine_refuses(monkeypatch):
    from sampan.passes import offload as O

    class Picky(E.OrtRunner):
        def __init__(self, model_bytes, n, threads=None):
            if b"Tanh" in model_bytes:
                raise RuntimeError("Tanh is not implemented here")
            super().__init__(model_bytes, n, threads)
    monkeypatch.setitem(E.ENGINES, "picky", Picky)
    g = offload(_diamond(), min_subgraph_size=1, engine="picky")
    assert [n.op for n in g.nodes] == ["engine", "lgamma", "engine", "tanh"]
    why = dict((line.split(" = ")[1].split("(")[0], w) for line, w in offload_report(g))
    assert "picky cannot run 'tanh'" in why["tanh"] and "not implemented" in why["tanh"]
    assert O.support(_diamond(), engine="picky")[0] is None


def test_ir_debug_dump_with_engine_nodes(gap, tmp_path):
    c = Config(gap)
    c.enable_onnxruntime_offload()
    c.switch_ir_debug(str(tmp_path / "ir"))
    p = create_predictor(c)
    names = sorted(f.name for f in (tmp_path / "ir").iterdir())
    ir = next(f for f in names if f.endswith("_onnxruntime_offload.ir"))
    assert "engine(" in (tmp_path / "ir" / ir).read_text()
    assert any(f.endswith("_onnxruntime_offload.dot") for f in names)
    assert "ort_offload   3" in c.summary()
    x = rand(3, 4)
    assert p.run([x])[0].shape == (3, 3)


def test_two_inputs_two_symbols_and_two_outputs(saved):
    _, paths = saved
    a, b = rand(2, 3, 4), rand(2, 6, seed=1)
    ref = _pred(paths["two"]).run([a, b])
    for p in (_pred(paths["two"], runtime="onnxruntime"), _pred(paths["two"], offload_min=1)):
        assert any(len(n.outputs) > 1 for n in _engines(p)) or len(_engines(p)) > 1
        for got, want in zip(p.run([a, b]), ref):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        a2, b2 = rand(5, 7, 4, seed=2), rand(5, 6, seed=3)
        for got, want in zip(p.run([a2, b2]), _pred(paths["two"]).run([a2, b2])):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
