"""The Predictor API against the models run eagerly: handles, zero copy (buffer identity),
executors compiled once per shape, and the errors for wrong feeds and damaged programs."""
import os
import time

import numpy as np
import pytest

import sampan
from sampan.inference import Config, InferenceError, create_predictor
from sampan.jit import LoadError

from ._models import eager, rand


def _pred(path, **kw):
    cfg = Config(path)
    for k, v in kw.items():
        getattr(cfg, k)(v)
    return create_predictor(cfg)


@pytest.mark.parametrize("runtime", ["numba", "numpy"])
def test_mlp_matches_eager_and_compiles_once_per_batch(saved, runtime, monkeypatch):
    import sampan.runtime
    models, paths = saved
    real, made = sampan.runtime.compile_graph, []

    def counting(g, **kw):
        made.append(tuple(g.inputs[0].shape))
        return real(g, **kw)
    monkeypatch.setattr(sampan.runtime, "compile_graph", counting)
    p = _pred(paths["mlp"], set_runtime=runtime)
    assert p.get_input_names() == ["x"] and p.get_output_names() == ["output_0"]
    h, o = p.get_input_handle("x"), p.get_output_handle("output_0")
    for seed, b in enumerate([1, 3, 1, 7, 3, 1]):
        x = rand(b, 8, seed=seed)
        h.copy_from_cpu(x)
        p.run()
        np.testing.assert_allclose(o.copy_to_cpu(), eager(models["mlp"], x), rtol=1e-5,
                                   atol=1e-6)
        assert o.shape() == [b, 4]
    assert p.compiled_sizes() == [{"batch": 1}, {"batch": 3}, {"batch": 7}]
    assert made == [(1, 8), (3, 8), (7, 8)]      # one executor per batch size, cached


def test_cnn_matches_eager(saved):
    models, paths = saved
    p = _pred(paths["cnn"])
    assert "fold_batch_norm" in p.passes_run
    h = p.get_input_handle("x")
    assert h.type() == np.float32 and h.shape() == ["batch", 1, 8, 8]
    for b in (1, 5):
        x = rand(b, 1, 8, 8, seed=b)
        got = p.run([x])[0]
        np.testing.assert_allclose(got, eager(models["cnn"], x), rtol=1e-4, atol=1e-5)
    assert len(p.compiled_sizes()) == 2


def test_two_inputs_with_batch_and_sequence(saved):
    models, paths = saved
    p = _pred(paths["two"])
    assert p.get_input_names() == ["a", "b"]
    assert sorted(p.get_output_names()) == ["s", "y"]
    for b, s in [(1, 1), (2, 5), (4, 3), (2, 5)]:
        a, bb = rand(b, s, 4, seed=b), rand(b, 6, seed=s)
        p.get_input_handle("a").copy_from_cpu(a)
        p.get_input_handle("b").copy_from_cpu(bb)
        p.run()
        want = eager(models["two"], a, bb)
        for k in ("y", "s"):
            np.testing.assert_allclose(p.get_output_handle(k).copy_to_cpu(), want[k],
                                       rtol=1e-5, atol=1e-6)
    assert p.compiled_sizes() == [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 5},
                                  {"batch": 4, "seq": 3}]


def test_share_external_input_is_zero_copy(saved):
    models, paths = saved
    p = _pred(paths["mlp"])
    h, o = p.get_input_handle("x"), p.get_output_handle("output_0")
    x = rand(2, 8)
    h.share_external_data(x)
    assert p._args[h._slot] is x                 # the program reads the caller's array
    p.run()
    first = o.copy_to_cpu()
    np.testing.assert_allclose(first, eager(models["mlp"], x), rtol=1e-5, atol=1e-6)
    x[...] = rand(2, 8, seed=9)                  # changed in place, not fed again
    p.run()
    np.testing.assert_allclose(o.copy_to_cpu(), eager(models["mlp"], x), rtol=1e-5, atol=1e-6)
    assert not np.allclose(o.copy_to_cpu(), first)


def test_copy_from_cpu_copies(saved):
    models, paths = saved
    p = _pred(paths["mlp"])
    h = p.get_input_handle("x")
    x = rand(2, 8)
    keep = x.copy()
    h.copy_from_cpu(x)
    assert not np.shares_memory(p._args[h._slot], x)
    own = p._args[h._slot]
    x[...] = 0.0
    p.run()
    np.testing.assert_allclose(p.get_output_handle("output_0").copy_to_cpu(),
                               eager(models["mlp"], keep), rtol=1e-5, atol=1e-6)
    h.copy_from_cpu(rand(2, 8, seed=3))
    assert p._args[h._slot] is own               # same shape: the handle's array is reused
    h.copy_from_cpu(sampan.tensor(keep))         # a sampan Tensor feeds too
    p.run()


def test_output_share_external_data_writes_the_callers_buffer(saved):
    models, paths = saved
    p = _pred(paths["mlp"])
    o = p.get_output_handle("output_0")
    out = np.full((3, 4), np.nan, np.float32)
    ptr = out.ctypes.data
    o.share_external_data(out)
    x = rand(3, 8)
    p.get_input_handle("x").share_external_data(x)
    p.run()
    assert out.ctypes.data == ptr
    np.testing.assert_allclose(out, eager(models["mlp"], x), rtol=1e-5, atol=1e-6)
    copy = o.copy_to_cpu()
    assert not np.shares_memory(copy, out)
    p.get_input_handle("x").copy_from_cpu(rand(2, 8))
    with pytest.raises(InferenceError, match=r"output 'output_0'.*float32\[3, 4\].*\[2, 4\]"):
        p.run()
    with pytest.raises(InferenceError, match="writable float32"):
        o.share_external_data(np.zeros((2, 4)))
    o.share_external_data(None)
    p.run()
    assert o.shape() == [2, 4]


def test_reshape_then_copy(saved):
    _, paths = saved
    p = _pred(paths["mlp"])
    h = p.get_input_handle("x")
    h.reshape([4, 8])
    with pytest.raises(InferenceError, match="no data"):
        p.run()
    h.copy_from_cpu(rand(4, 8))
    assert h.shape() == [4, 8]
    p.run()
    with pytest.raises(InferenceError, match=r"input 'x'.*got shape \[4, 9\].*float32\[batch, "
                                             r"8\] \(batch: any size"):
        h.reshape((4, 9))


def test_feed_errors_name_the_input_and_the_model_type(saved):
    _, paths = saved
    p = _pred(paths["mlp"])
    h = p.get_input_handle("x")
    with pytest.raises(InferenceError, match=r"input 'x'.*got float64\[2, 8\]; the model "
                                             r"expects float32\[batch, 8\]"):
        h.copy_from_cpu(np.zeros((2, 8)))
    with pytest.raises(InferenceError, match=r"got shape \[2, 8, 1\]"):
        h.copy_from_cpu(np.zeros((2, 8, 1), np.float32))
    with pytest.raises(InferenceError, match=r"got shape \[0, 8\]"):
        h.share_external_data(np.zeros((0, 8), np.float32))
    with pytest.raises(InferenceError, match="C-contiguous"):
        h.share_external_data(np.zeros((8, 2), np.float32).T)
    with pytest.raises(InferenceError, match="no input 'y'.*\\['x'\\]"):
        p.get_input_handle("y")
    with pytest.raises(InferenceError, match="no output"):
        p.get_output_handle("y")
    with pytest.raises(InferenceError, match=r"input\(s\) \['x'\] have no data"):
        p.run()
    ps = _pred(paths["static"])                  # saved without dynamic dims: fixed batch
    with pytest.raises(InferenceError, match=r"got shape \[3, 8\].*float32\[2, 8\]$"):
        ps.get_input_handle("x").copy_from_cpu(rand(3, 8))


def test_inputs_sharing_a_symbol_must_agree(saved):
    _, paths = saved
    p = _pred(paths["two"])
    p.get_input_handle("a").copy_from_cpu(rand(2, 3, 4))
    p.get_input_handle("b").copy_from_cpu(rand(5, 6))
    with pytest.raises(InferenceError, match=r"input 'b'.*dim 0 is 5, but 'batch' is 2 from "
                                             r"dim 0 of input 'a'.*float32\[batch, 6\]"):
        p.run()
    with pytest.raises(InferenceError, match=r"float32\[batch, seq, 4\] \(batch, seq: any"):
        p.get_input_handle("a").copy_from_cpu(rand(2, 3, 5))


def test_damaged_programs_fail_at_create_predictor(saved, tmp_path):
    import shutil
    _, paths = saved
    with pytest.raises(LoadError, match="not a saved program"):
        create_predictor(Config(str(tmp_path / "nothing")))
    for name, damage in [("weights.safetensors", "truncate"), ("graph.ir", "flip"),
                         ("checksums.sha256", "remove")]:
        d = str(tmp_path / f"{name}.{damage}")
        shutil.copytree(paths["mlp"], d)
        f = os.path.join(d, name)
        if damage == "remove":
            os.remove(f)
        else:
            data = bytearray(open(f, "rb").read())
            data = data[:len(data) // 2] if damage == "truncate" else data
            if damage == "flip":
                data[-5] ^= 1
            open(f, "wb").write(bytes(data))
        with pytest.raises(LoadError, match=name if damage != "truncate" else "damaged"):
            create_predictor(Config(d))


def _best(fs, n=1000, reps=9):
    """The fastest of `reps` runs of n calls, per function, the functions interleaved so
    that load from other processes hits them alike."""
    best = [float("inf")] * len(fs)
    for _ in range(reps):
        for i, f in enumerate(fs):
            t = time.perf_counter()
            for _ in range(n):
                f()
            best[i] = min(best[i], (time.perf_counter() - t) / n)
    return best


@pytest.mark.slow
@pytest.mark.parametrize("name,shape", [("mlp", (1, 8)), ("cnn", (1, 1, 8, 8))])
def test_run_overhead_is_small(saved, name, shape):
    """Batch 1: run() (shared and copied input) against the compiled executor called
    directly and against sampan.jit.load's callable. `pytest -s` prints the figures."""
    _, paths = saved
    p = create_predictor(Config(paths[name]))
    x = rand(*shape)
    h = p.get_input_handle("x")
    h.share_external_data(x)
    p.run()
    fn, args = p._fn, list(p._args)

    def copied():
        h.copy_from_cpu(x)
        p.run()
    loaded = sampan.jit.load(paths[name])
    t = sampan.tensor(x)
    direct, shared, copy, jit_load = _best([lambda: fn(*args), p.run, copied,
                                            lambda: loaded(t)])
    print(f"\nbatch-1 {name}: executor {direct * 1e6:.2f} us, run() {shared * 1e6:.2f} us "
          f"(+{(shared - direct) * 1e6:.2f}), copy_from_cpu+run() {copy * 1e6:.2f} us "
          f"(+{(copy - direct) * 1e6:.2f}), jit.load callable {jit_load * 1e6:.2f} us")
    # a figure, not a timed assertion (timings belong in benchmarks): only that each runs
    assert min(direct, shared, copy, jit_load) > 0


def test_planned_matmuls_follow_the_kernel_choice(saved, monkeypatch):
    """The Predictor's 2-d matmuls into planned buffers (runtime/specialize.py) run where
    the kernel choice says, as eager and the jit do, not on np.matmul regardless."""
    from sampan.backends import choice, onednn
    from sampan.ops.registry import OPS
    if not onednn.available():
        pytest.skip(f"oneDNN unavailable: {onednn.why_unavailable()}")
    models, paths = saved
    calls = []
    real = OPS["matmul"].kernels["onednn"]
    monkeypatch.setitem(OPS["matmul"].kernels, "onednn",
                        lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    x = rand(7, 8, seed=3)
    with choice.prefer("onednn", op="matmul"):
        cfg = Config(paths["mlp"])
        cfg.pass_builder().delete_pass("fuse_layers")    # the planned matmul itself
        p = create_predictor(cfg)
        got = p.run([x])[0]
    np.testing.assert_allclose(got, eager(models["mlp"], x), rtol=1e-5, atol=1e-6)
    # the first layer's product, (7, 8) @ (8, 16), is the one planned into a buffer
    assert (7, 8) in calls and all(s[0] == 7 for s in calls)


def test_profiled_runs_record_every_node_and_answer_the_same(saved):
    """Under sampan.profiler a Predictor run records a "kernel" event per executed node
    (its IR line and FLOPs, the program named by its file) inside the run's span; outside
    the profiler it records nothing, and both answer alike."""
    from sampan.profiler import profile
    models, paths = saved
    cfg = Config(paths["cnn"])
    cfg.pass_builder().delete_pass("fuse_layers")        # every node of the plain graph
    p = create_predictor(cfg)
    x = rand(3, 1, 8, 8, seed=5)
    plain = p.run([x])[0]
    with profile() as prof:
        got = p.run([x])[0]
        p.run([rand(2, 1, 8, 8, seed=6)])          # a new shape: compiled, then profiled
    np.testing.assert_array_equal(got, plain)
    kern = [e for e in prof.events if e.cat == "kernel"]
    runs = [e for e in prof.events if e.cat == "jit" and e.name == "run"]
    name = "predictor:" + os.path.basename(str(paths["cnn"]))
    assert len(runs) == 2 and {e.args["program"] for e in kern} == {name}
    per_run = len(kern) // 2
    assert per_run >= 4 and {"conv2d", "matmul"} <= {e.name for e in kern}
    assert all(r.ts <= k.ts and k.end <= r.end for r, ks in
               zip(runs, (kern[:per_run], kern[per_run:])) for k in ks)
    conv = next(e for e in kern if e.name == "conv2d")
    assert conv.args["flops"] > 0 and "conv2d" in conv.args["ir"]
    with profile() as quiet:
        pass
    p.run([x])
    assert quiet.events == []
