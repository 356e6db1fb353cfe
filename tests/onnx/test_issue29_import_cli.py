"""Issue 29, item 3, through `sampan onnx import`: the command allocates and writes what
the file paid for, not what it declares. It traces on inputs that hold one element each
(zero-strided views of the declared shapes, sampan/onnx/fold.py: probe_inputs), the
dynamic dims' probes stay zero-strided (jit/dynamic.py: resized), and `jit.save` stores an
example input that is one value broadcast as that value and its shape (meta.json's
`example_fills`), which `read` turns back into a broadcast view.

The gigabyte cases run in a subprocess under RLIMIT_AS (what it had mapped after importing
plus 1 GiB), as tests/onnx/test_issue29_fold_limits.py does."""
import hashlib
import json
import os
import textwrap

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan.cli import main  # noqa: E402
from sampan.jit.serialize import LoadError  # noqa: E402

from ._child import run_child  # noqa: E402

_CHILD = textwrap.dedent("""
    import contextlib, io, json, os, resource, sys, tempfile, tracemalloc
    import numpy as np, onnx
    from onnx import TensorProto, helper, numpy_helper
    import sampan, sampan.onnx
    from sampan.cli import main

    def model(nodes, inputs, outputs, inits=()):
        g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    def vi(name, shape, t=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, t, shape)

    N = 65536
    one = numpy_helper.from_array(np.array([1.0], np.float32))
    models = {
        # a 77-byte model declaring a 16 GiB input
        "declared_input": model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [N, N])],
                                [vi("y", [N, N])]),
        # 16 GiB of ones made from the file's few bytes
        "constant_of_shape": model(
            [helper.make_node("ConstantOfShape", ["s"], ["y"], value=one)], [],
            [vi("y", [N, N])], [numpy_helper.from_array(np.array([N, N], np.int64), "s")]),
        # a dynamic dim beside huge static ones: the probes of "b" are N x N too
        "huge_probe": model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["b", N, N])],
                            [vi("y", ["b", N, N])]),
        # a dynamic batch beside a large static dim, and a Shape-driven fill of it
        "dynamic_input": model(
            [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["c"], value=one),
             helper.make_node("Add", ["x", "c"], ["y"])],
            [vi("x", ["batch", 1024, 1024])], [vi("y", ["batch", 1024, 1024])]),
    }
    d = tempfile.mkdtemp()
    vm = [int(x.split()[1]) * 1024 for x in open("/proc/self/status")
          if x.startswith("VmSize")][0]
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
    out = {}
    for name, m in models.items():
        src, dst = os.path.join(d, name + ".onnx"), os.path.join(d, name + ".sampan")
        onnx.save(m, src)
        err = io.StringIO()
        tracemalloc.start()
        res = {"bytes": os.path.getsize(src)}
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                res["rc"] = main(["onnx", "import", src, "-o", dst, "--dim", "batch=2"])
            res["stderr"] = err.getvalue()
            if res["rc"] == 0:
                res["written"] = sum(os.path.getsize(os.path.join(dst, f))
                                     for f in os.listdir(dst))
                prog = sampan.jit.load(dst)
                res["examples"] = [[str(t.dtype), list(t.shape), max(t._data.strides,
                                                                    default=0)]
                                   for t in prog.example_inputs]
                res["outputs"] = [v.type_str() for v in prog.graph.outputs]
        except MemoryError as e:
            res["error"] = "MemoryError: " + str(e)[:200]
        except Exception as e:
            res["error"] = type(e).__name__ + ": " + str(e)[:300]
        res["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[name] = res
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def imports():
    return run_child(_CHILD)


PEAK = 96 << 20      # what one import (trace, passes, save, load back) may allocate


@pytest.mark.parametrize("name, examples, outputs", [
    ("declared_input", [["float32", [65536, 65536], 0]], ["f32[65536,65536]"]),
    ("constant_of_shape", [], ["f32[65536,65536]"]),
    ("huge_probe", [["float32", [2, 65536, 65536], 0]], ["f32[b,65536,65536]"]),
    ("dynamic_input", [["float32", [2, 1024, 1024], 0]], ["f32[batch,1024,1024]"]),
])
def test_tiny_files_import_into_tiny_programs(imports, name, examples, outputs):
    res = imports[name]
    assert "error" not in res, res["error"]
    assert res["rc"] == 0, res["stderr"]
    assert res["bytes"] < 400
    assert res["peak"] < PEAK, f"{name}: import allocated {res['peak'] >> 20} MiB"
    assert res["written"] < 64 << 10, f"{name}: wrote {res['written']} bytes"
    assert res["examples"] == examples          # declared shapes, one element each
    assert [o.replace(" ", "") for o in res["outputs"]] == outputs


def _normal_model():
    """z = Gather(Relu(x @ w.T + b), idx, axis=1): a dynamic batch, an int64 input."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((5, 6)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gather", ["r", "idx"], ["z"], axis=1)]
    g = helper.make_graph(
        nodes, "normal",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_normal_model_imports_and_runs_as_onnxruntime_does(tmp_path, capsys):
    m = _normal_model()
    src, dst = str(tmp_path / "normal.onnx"), str(tmp_path / "normal.sampan")
    onnx.save(m, src)
    assert main(["onnx", "import", src, "-o", dst, "--dim", "batch=3"]) == 0
    assert "symbolic dims batch" in capsys.readouterr().out
    prog = sampan.jit.load(dst)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    idx = np.array([4, 0, 2], np.int64)
    for n in (1, 3, 7):
        x = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
        got = prog(sampan.tensor(x), sampan.tensor(idx)).numpy()
        np.testing.assert_allclose(got, sess.run(None, {"x": x, "idx": idx})[0], rtol=1e-6,
                                   atol=1e-6)
    # the examples are the zeros the command traced on, at --dim's sizes
    ex = prog.example_inputs
    assert [(t.dtype, tuple(t.shape)) for t in ex] == [(np.float32, (3, 6)),
                                                       (np.int64, (3,))]
    for t in ex:
        np.testing.assert_array_equal(t.numpy(), np.zeros(t.shape, t.numpy().dtype))


def _fills(tmp_path):
    """A program saved with three one-value examples (float, int, bool) and a real one."""
    def f(a, b, c, d):
        return a * 2 + d, b + 1, c
    xs = (np.broadcast_to(np.float32(3.5), (1000, 1000)),
          np.broadcast_to(np.int64(-7), (2, 3)),
          np.broadcast_to(np.True_, (4,)),
          np.arange(1000, dtype=np.float32).reshape(1, 1000) / 3)
    path = str(tmp_path / "fills.sampan")
    sampan.jit.save(f, path, tuple(sampan.Tensor(x) for x in xs))
    return path, xs


def test_one_value_examples_are_stored_as_their_value_and_shape(tmp_path):
    path, xs = _fills(tmp_path)
    # 4 MB of 3.5s is not in the file; the real example (4 kB) is
    assert os.path.getsize(os.path.join(path, "weights.safetensors")) < 16 << 10
    meta = json.loads(open(os.path.join(path, "meta.json")).read())
    assert meta["example_fills"] == {"0": [1000, 1000], "1": [2, 3], "2": [4]}
    assert meta["version"] == 3         # only programs with fills: older readers say so
    prog = sampan.jit.load(path)
    ex = prog.example_inputs
    for t, x in zip(ex, xs):
        assert t.numpy().dtype == x.dtype and t.shape == x.shape
        np.testing.assert_array_equal(t.numpy(), x)
    assert all(s == 0 for s in ex[0]._data.strides)        # a view, not 4 MB
    a, b, c = prog(*ex)
    np.testing.assert_allclose(a.numpy(), xs[0] * 2 + xs[3], rtol=1e-6)
    np.testing.assert_array_equal(b.numpy(), xs[1] + 1)
    np.testing.assert_array_equal(c.numpy(), xs[2])
    # the Graph's readers that take examples see them too (bisect runs on them)
    assert main(["bisect", path, "--passes", "inference"]) == 0


def _rewrite_meta(path, change):
    meta = json.loads(open(os.path.join(path, "meta.json")).read())
    change(meta)
    data = json.dumps(meta).encode()
    open(os.path.join(path, "meta.json"), "wb").write(data)
    sums = open(os.path.join(path, "checksums.sha256")).read().splitlines()
    sums = [f"{hashlib.sha256(data).hexdigest()}  meta.json" if s.endswith("  meta.json")
            else s for s in sums]
    open(os.path.join(path, "checksums.sha256"), "w").write("\n".join(sums) + "\n")


@pytest.mark.parametrize("change, match", [
    (lambda m: m["example_fills"].update({"0": [1000, 999]}), r"graph wants"),
    (lambda m: m["example_fills"].update({"3": [1, 1000]}), r"example input 3 .* one value"),
    (lambda m: m["example_fills"].update({"9": [4]}), r"example input 9"),
    (lambda m: m["example_fills"].update({"0": [-1, 1000]}), r"example_fills"),
    (lambda m: m.update(example_fills=[[1000, 1000]]), r"example_fills"),
    (lambda m: m.update(version=2), r"which format version 2 does not have"),
])
def test_a_wrong_fill_spec_is_refused_at_load(tmp_path, change, match):
    path, _ = _fills(tmp_path)
    _rewrite_meta(path, change)
    with pytest.raises(LoadError, match=match):
        sampan.jit.load(path)


def test_programs_without_fills_load_as_before(tmp_path):
    def f(x):
        return x + 1
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = str(tmp_path / "plain.sampan")
    sampan.jit.save(f, path, (sampan.tensor(x),))
    meta = json.loads(open(os.path.join(path, "meta.json")).read())
    assert "example_fills" not in meta and meta["version"] == 2   # as older sampan writes
    ex = sampan.jit.load(path).example_inputs
    np.testing.assert_array_equal(ex[0].numpy(), x)


def test_a_sampan_that_reads_version_2_asks_for_an_upgrade(tmp_path, monkeypatch):
    path, _ = _fills(tmp_path)
    from sampan.jit import serialize
    monkeypatch.setattr(serialize, "VERSION", 2)      # as the reader before fills
    monkeypatch.setattr(serialize, "_SUMMED_VERSIONS", (2,))
    with pytest.raises(LoadError, match="format version 3.*upgrade sampan"):
        sampan.jit.load(path)
