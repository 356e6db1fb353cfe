"""The provider contract (issue 30): a toy provider, a folder of three kernels in a
temporary package, registered by name and put first in the provider list, gets exactly the
nodes it supports from the partition, in eager dispatch, in the jit and in the Predictor;
its numbers match numpy's."""
import importlib
import sys
import textwrap

import numpy as np
import pytest

import sampan
from sampan import backends
from sampan.backends import get_provider, providers, register_provider, set_providers

TOY = '''
"""A toy provider: matmul, add and relu in float32 only, counting what it ran."""
import numpy as np

from sampan.backends import Provider

CALLS = []


def matmul(a, b):
    CALLS.append("matmul")
    return np.matmul(a, b)


def add(a, b):
    CALLS.append("add")
    return np.add(a, b)


def relu(x):
    CALLS.append("relu")
    return np.maximum(x, 0).astype(x.dtype)


class Toy(Provider):
    name = "toy"
    kernels = {"matmul": matmul, "add": add, "relu": relu}

    def supports(self, node):
        return node.op in self.kernels and all(
            np.dtype(v.dtype) == np.float32 for v in node.inputs)


PROVIDER = Toy()
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    pkg = tmp_path / "toyprov_pkg" / "toy"
    pkg.mkdir(parents=True)
    (tmp_path / "toyprov_pkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("toyprov_pkg.toy")
    register_provider(mod.PROVIDER)
    yield mod
    set_providers(None)
    backends.unregister_provider("toy")
    for m in ("toyprov_pkg.toy", "toyprov_pkg"):
        sys.modules.pop(m, None)


def _data():
    r = np.random.default_rng(0)
    return (r.standard_normal((4, 6)).astype(np.float32),
            r.standard_normal((6, 3)).astype(np.float32),
            r.standard_normal((3,)).astype(np.float32))


def _ref(x, w, b):
    return np.exp(np.maximum(x @ w + b, 0)) * 2.0


def _model(x, w, b):
    return sampan.exp(sampan.relu(x @ w + b)) * 2.0


def test_registry_finds_builtin_and_registered_providers(toy):
    assert {"numpy", "numba", "onednn", "onnxruntime", "toy"} <= set(providers())
    assert get_provider("toy") is toy.PROVIDER
    assert "add" in get_provider("numpy").kernels
    assert set(get_provider("onednn").kernels) >= {"matmul", "conv2d"}
    with pytest.raises(backends.ProviderError, match="unknown kernel provider 'nope'"):
        get_provider("nope")
    with pytest.raises(backends.ProviderError, match="registered already"):
        register_provider(toy.PROVIDER)


def test_eager_gives_the_toy_exactly_the_calls_it_supports(toy):
    x, w, b = _data()
    add_kernel = sampan.ops.registry.OPS["add"].kernel
    with set_providers(["toy", "numpy"]):
        assert backends.get_providers() == ["toy", "numpy"]
        y = _model(sampan.tensor(x), sampan.tensor(w), sampan.tensor(b))
        assert toy.CALLS == ["matmul", "add", "relu"]         # exp, mul: numpy's
        del toy.CALLS[:]
        sampan.add(sampan.tensor(x.astype(np.float64)), sampan.tensor(x.astype(np.float64)))
        assert toy.CALLS == []                                # float64: not supported
    np.testing.assert_allclose(y.numpy(), _ref(x, w, b), rtol=1e-5, atol=1e-6)
    # the default list back: every op's own kernel again
    assert backends.get_providers() == ["onednn", "numba", "numpy"]
    assert sampan.ops.registry.OPS["add"].kernel is add_kernel
    del toy.CALLS[:]
    sampan.add(sampan.tensor(x), sampan.tensor(x))
    assert toy.CALLS == []


def _assigned(g, name):
    return [n.op for n in g.nodes if n.meta.get("provider") == name]


def _supported(g, prov):
    return [n.op for n in g.nodes if prov.supports(n)]


def test_jit_partition_gives_the_toy_the_nodes_it_supports(toy):
    x, w, b = _data()
    with set_providers(["toy", "numba", "numpy"]):
        f = sampan.jit(_model)
        y = f(sampan.tensor(x), sampan.tensor(w), sampan.tensor(b))
        g = f.graph
        # add/relu/exp/mul are fused: the toy gets the matmul, the fused node is numba's
        assert _assigned(g, "toy") == _supported(g, toy.PROVIDER) == ["matmul"]
        assert _assigned(g, "numba") == ["fused"]
        assert "matmul" in toy.CALLS
    np.testing.assert_allclose(y.numpy(), _ref(x, w, b), rtol=1e-5, atol=1e-6)


def test_predictor_partition_gives_the_toy_the_nodes_it_supports(toy, tmp_path):
    from sampan.inference import Config, create_predictor
    x, w, b = _data()
    path = sampan.jit.save(lambda a: _model(a, sampan.tensor(w), sampan.tensor(b)),
                           str(tmp_path / "m.sampan"), (sampan.tensor(x),))
    cfg = Config(path)
    cfg.set_providers(["toy", "numpy"])
    assert cfg.get_providers() == ["toy", "numpy"] and cfg.runtime() == "numpy"
    p = create_predictor(cfg)
    assert p.get_providers() == ["toy", "numpy"]
    g = p.graph
    got = _assigned(g, "toy")
    assert got == _supported(g, toy.PROVIDER) and {"matmul", "add", "relu"} <= set(got)
    assert all(n.meta["provider"] == "numpy" for n in g.nodes if n.op not in toy.Toy.kernels)
    del toy.CALLS[:]
    out = p.run([x])[0]
    assert sorted(toy.CALLS) == sorted(got)
    np.testing.assert_allclose(out, _ref(x, w, b), rtol=1e-5, atol=1e-6)


def test_old_runtime_knobs_spell_provider_lists(tmp_path):
    from sampan.inference import Config
    c = Config(str(tmp_path / "nothing.sampan"))
    assert c.get_providers() == ["onednn", "numba", "numpy"] and c.runtime() == "numba"
    c.set_runtime("numpy")
    assert c.get_providers() == ["onednn", "numpy"]
    c.set_runtime("onnxruntime")
    assert c.get_providers()[0] == "onnxruntime" and c.runtime() == "onnxruntime"
    c.set_runtime("numba")
    c.enable_onnxruntime_offload(2)
    assert c.get_providers() == ["onnxruntime", "onednn", "numba", "numpy"]
    assert c.runtime() == "numba" and c.offload_min_subgraph_size() == 2
    assert "onnxruntime_offload" in c.pass_builder().enabled_passes()
    c.set_providers(["numba"])
    assert c.get_providers() == ["numba", "numpy"] and c.offload_min_subgraph_size() is None
    assert c.pass_builder().is_turned_off("onnxruntime_offload")
    with pytest.raises(sampan.SampanError, match="unknown kernel provider 'tvm'"):
        c.set_providers(["tvm"])


def test_partition_pass_is_registered_and_reads_the_graph_list(toy):
    from sampan.passes import PASSES, PassManager
    assert "partition" in PASSES
    x, w, b = _data()
    f = sampan.jit(_model)
    f(sampan.tensor(x), sampan.tensor(w), sampan.tensor(b))
    g = f.raw_graph.copy()
    g.meta["providers"] = ["toy"]
    g = PassManager(["partition"]).run(g)
    assert _assigned(g, "toy") == _supported(g, toy.PROVIDER)
    assert g.meta["partition"]["toy"] == len(_assigned(g, "toy")) >= 3


def test_a_list_without_onednn_keeps_gemms_on_numpy(tmp_path):
    """The measured choice (oneDNN where it won) is the onednn provider's: a list without
    it binds the numpy kernel, in eager and in compiled code (out= buffers included)."""
    from sampan.ops.registry import OPS
    x, w, _ = _data()
    with set_providers(["numba", "numpy"]):
        assert OPS["matmul"].kernel is OPS["matmul"].kernels["numpy"]
        f = sampan.jit(lambda a: sampan.relu(a @ sampan.tensor(w)) @ sampan.tensor(w.T))
        y = f(sampan.tensor(x))
        assert "onednn" not in {n.meta["provider"] for n in f.graph.nodes}
    np.testing.assert_allclose(y.numpy(), np.maximum(x @ w, 0) @ w.T, rtol=1e-5, atol=1e-5)
    # a Predictor's list, under the default eager list: its matmuls bind numpy's kernel
    from sampan.inference import Config, create_predictor
    path = sampan.jit.save(lambda a: sampan.relu(a @ sampan.tensor(w)) @ sampan.tensor(w.T),
                           str(tmp_path / "m.sampan"), (sampan.tensor(x),))
    cfg = Config(path)
    cfg.set_providers(["numba", "numpy"])
    p = create_predictor(cfg)
    out = p.run([x])[0]
    assert "k_matmul_numpy" in p.code and "out_matmul" not in p.code
    np.testing.assert_allclose(out, np.maximum(x @ w, 0) @ w.T, rtol=1e-5, atol=1e-5)
    assert OPS["matmul"].kernel is not OPS["matmul"].kernels["numpy"] or not \
        get_provider("onednn").available()


def test_onnxruntime_first_is_the_offload(tmp_path):
    """"onnxruntime" first in the list is what set_runtime("onnxruntime") was: every node
    it supports in engine nodes, which the partition gives to the onnxruntime provider."""
    pytest.importorskip("onnxruntime")
    from sampan.inference import Config, create_predictor
    from sampan.passes import PassManager
    x, w, b = _data()
    fn = lambda a: _model(a, sampan.tensor(w), sampan.tensor(b))  # noqa: E731
    path = sampan.jit.save(fn, str(tmp_path / "m.sampan"), (sampan.tensor(x),))
    new, old = Config(path), Config(path)
    new.set_providers(["onnxruntime", "onednn", "numpy"])
    old.set_runtime("onnxruntime")
    assert new.get_providers() == old.get_providers() and new.runtime() == "onnxruntime"
    p, q = create_predictor(new), create_predictor(old)
    assert str(p.graph) == str(q.graph) and p.passes_run == q.passes_run
    engines = [n for n in p.graph.nodes if n.op == "engine"]
    assert engines and all(n.meta["provider"] == "onnxruntime" for n in engines)
    np.testing.assert_allclose(p.run([x])[0], _ref(x, w, b), rtol=1e-5, atol=1e-6)
    # the partition pass on its own offloads too when the list starts with onnxruntime
    f = sampan.jit(fn)
    f(sampan.tensor(x))
    g = f.raw_graph.copy()
    g.meta["providers"] = ["onnxruntime"]
    g.meta["onnxruntime_offload"] = {"min_subgraph_size": 1}
    g = PassManager(["partition"]).run(g)
    assert [n.op for n in g.nodes] == ["engine"] and g.meta["partition"] == {"onnxruntime": 1}
