"""Issue 29, items 11, 12, 16, 17: symbolic sizes under ``dynamic=``. Each case runs at
sizes other than the traced ones, through `sampan.jit(..., dynamic=)` and through
save/load, against eager sampan and numpy / PyTorch; a branch on a size is a guard that a
call outside it fails (saved program, naming the line) or retraces (live function)."""
import json
import os

import numpy as np
import pytest

import sampan
import sampan.nn.functional as F
from sampan import nn
from sampan.jit.dynamic import DynamicShapeError

torch = pytest.importorskip("torch")

BATCH = {0: {0: "batch"}}
SEQ = {0: {1: "seq"}}


def _both(fn, dyn, example, tmp_path):
    """The jitted function and the program saved from it (traced at `example`)."""
    path = str(tmp_path / "p.sampan")
    sampan.jit.save(fn, path, (example,), dynamic=dyn)
    return sampan.jit(fn, dynamic=dyn), sampan.jit.load(path)


def _check(fn, dyn, make, sizes, tmp_path, ref=None, rtol=1e-5, atol=1e-6):
    jf, loaded = _both(fn, dyn, make(sizes[0]), tmp_path)
    for n in sizes:
        x = make(n)
        with sampan.no_grad():
            want = fn(x)
            outs = [jf(x), loaded(x)]
        want = want if isinstance(want, tuple) else (want,)
        for got in outs:
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=rtol, atol=atol,
                                           err_msg=f"size {n}")
        if ref is not None:
            for g, r in zip(want, ref(torch.from_numpy(x.numpy()))):
                np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-4, atol=1e-5)
    return jf


def _x(n):
    return sampan.from_numpy(np.random.default_rng(n).standard_normal((n, 3))
                             .astype(np.float32))


# ---------------------------------------------------------------------- item 11
def _branch(x):
    if x.shape[0] > 4:
        return x * 2.0
    return x + 1.0


def test_branch_on_a_size_is_a_guard_of_the_saved_program(tmp_path):
    path = str(tmp_path / "b.sampan")
    sampan.jit.save(_branch, path, (_x(2),), dynamic=BATCH)
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert [(g["lhs"], g["op"], g["rhs"], g["holds"]) for g in meta["guards"]] == \
        [("batch", ">", "4", False)]
    loaded = sampan.jit.load(path)
    for n in (2, 3, 4, 1):
        np.testing.assert_allclose(loaded(_x(n)).numpy(), _x(n).numpy() + 1.0)
    with pytest.raises(DynamicShapeError, match=r"batch>4.*test_issue29_dynamic\.py:\d+: "
                                                r"if x\.shape\[0\] > 4:.*batch=6"):
        loaded(_x(6))


def test_branch_on_a_size_retraces_a_live_function():
    f = sampan.jit(_branch, dynamic=BATCH)
    for n in (2, 6, 3, 9, 4, 5):
        np.testing.assert_allclose(f(_x(n)).numpy(), _branch(_x(n)).numpy())
    assert f.n_traces == 2       # one program for batch <= 4, one for batch > 4


def test_branch_decided_differently_at_the_probe_size(tmp_path):
    def h(x):       # traced at 2 and 3: the two traces disagree
        return x * 2.0 if x.shape[0] > 2 else x + 1.0
    f = sampan.jit(h, dynamic=BATCH)
    for n in (2, 3, 7, 2, 1):
        np.testing.assert_allclose(f(_x(n)).numpy(), h(_x(n)).numpy())
    with pytest.raises(DynamicShapeError, match=r"batch>2.*test_issue29_dynamic\.py:\d+"):
        sampan.jit.save(h, str(tmp_path / "h.sampan"), (_x(2),), dynamic=BATCH)
    assert not os.path.exists(tmp_path / "h.sampan")


def test_programs_saved_without_guards_still_load(tmp_path):
    path = str(tmp_path / "old.sampan")
    sampan.jit.save(lambda x: x * 3.0, path, (_x(2),), dynamic=BATCH)
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert "guards" not in meta                # nothing decided: as older programs
    np.testing.assert_allclose(sampan.jit.load(path)(_x(5)).numpy(), _x(5).numpy() * 3)


def test_a_damaged_guard_is_a_load_error(tmp_path):
    import hashlib
    path = str(tmp_path / "b.sampan")
    sampan.jit.save(_branch, path, (_x(2),), dynamic=BATCH)
    mp = os.path.join(path, "meta.json")
    meta = json.load(open(mp))
    meta["guards"][0]["lhs"] = "__import__('os')"
    data = json.dumps(meta).encode()
    open(mp, "wb").write(data)
    sums = open(os.path.join(path, "checksums.sha256")).read().splitlines()
    sums = [f"{hashlib.sha256(data).hexdigest()}  meta.json" if s.endswith("meta.json") else s
            for s in sums]
    open(os.path.join(path, "checksums.sha256"), "w").write("\n".join(sums) + "\n")
    with pytest.raises(sampan.jit.LoadError, match="guards"):
        sampan.jit.load(path)


# ---------------------------------------------------------------------- item 16
def test_median_over_a_dynamic_dim(tmp_path):
    _check(lambda x: x.median(dim=0).values, BATCH, _x, [3, 5, 4, 8, 1], tmp_path,
           ref=lambda t: (t.median(dim=0).values,))


def test_integer_median_and_index_from_the_size(tmp_path):
    def f(x):
        return x[(x.shape[0] - 1) // 2] + x.median(dim=0).values
    _check(f, BATCH, _x, [3, 6, 9], tmp_path,
           ref=lambda t: (t[(t.shape[0] - 1) // 2] + t.median(dim=0).values,))


# ---------------------------------------------------------------------- item 12
def _ids(n):
    return sampan.from_numpy(np.random.default_rng(n).integers(0, 10, (2, n)))


def test_learned_positions_over_a_dynamic_sequence(tmp_path):
    sampan.manual_seed(0)
    tok, pos = nn.Embedding(10, 4), nn.Embedding(16, 4)

    def by_arange(ids):
        return tok(ids) + pos(sampan.arange(ids.shape[1]))

    def by_slice(ids):
        return tok(ids) + pos.weight[:ids.shape[1]]

    def by_cumsum(ids):
        return tok(ids) + pos(sampan.ones_like(ids).cumsum(1) - 1)
    for fn in (by_arange, by_slice, by_cumsum):
        _check(fn, SEQ, _ids, [3, 5, 16, 1], tmp_path)
    # beyond the table: eager raises or clamps; the saved program names the slice
    _, loaded = _both(by_slice, SEQ, _ids(3), tmp_path)
    with pytest.raises(DynamicShapeError, match=r"seq>16.*ids\.shape\[1\]"):
        loaded(_ids(20))


def test_arange_and_slices_keep_symbolic_extents(tmp_path):
    def f(x):
        return (x[1:] - x[:-1]).sum(1) + sampan.arange(x.shape[0] + 1)[2:]
    _check(f, BATCH, _x, [3, 5, 8], tmp_path,
           ref=lambda t: ((t[1:] - t[:-1]).sum(1) + torch.arange(t.shape[0] + 1)[2:],))


def test_bidirectional_gru_with_a_small_dynamic_batch(tmp_path):
    sampan.manual_seed(0)
    gru = nn.GRU(5, 12, batch_first=True, bidirectional=True)
    gru.eval()

    def make(n):
        return sampan.from_numpy(np.random.default_rng(n).standard_normal((n, 4, 5))
                                 .astype(np.float32))
    path = str(tmp_path / "gru.sampan")
    with sampan.no_grad():
        sampan.jit.save(gru, path, (make(3),), dynamic=BATCH)
    loaded = sampan.jit.load(path)
    for n in (3, 5, 1):
        with sampan.no_grad():
            got, want = loaded(make(n)), gru(make(n))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- item 17
@pytest.mark.parametrize("name,fn,ref", [
    ("var0", lambda x: x.var(0), lambda t: (t.var(0),)),
    ("std", lambda x: x.std(), lambda t: (t.std(),)),
    ("var_mean", lambda x: sampan.var_mean(x, 0), lambda t: torch.var_mean(t, 0)),
    ("quantile", lambda x: sampan.quantile(x, 0.3, dim=0),
     lambda t: (torch.quantile(t, 0.3, dim=0),)),
])
def test_statistics_over_a_dynamic_dim(tmp_path, name, fn, ref):
    _check(fn, BATCH, _x, [3, 5, 8, 2], tmp_path, ref=ref)


def test_var_at_a_size_with_no_degrees_of_freedom_is_guarded(tmp_path):
    f, loaded = _both(lambda x: x.var(0), BATCH, _x(3), tmp_path)
    with pytest.raises(DynamicShapeError, match=r"batch<=1|batch-1<=0"):
        loaded(_x(1))
    got = f(_x(1)).numpy()           # the live function traces that size on its own
    assert np.isnan(got).all() and np.isnan(torch.from_numpy(_x(1).numpy()).var(0)).all()


def test_batch_norm_training_updates_running_stats():
    rm, rv = sampan.zeros(3), sampan.ones(3)
    trm, trv = torch.zeros(3), torch.ones(3)
    f = sampan.jit(lambda x: F.batch_norm(x, rm, rv, training=True, momentum=0.1),
                   dynamic=BATCH)
    for n in (4, 7, 2, 9):
        x = _x(n)
        y = f(x)
        t = torch.nn.functional.batch_norm(torch.from_numpy(x.numpy()), trm, trv,
                                           training=True, momentum=0.1)
        np.testing.assert_allclose(y.numpy(), t.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rm.numpy(), trm.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.numpy(), trv.numpy(), rtol=1e-5, atol=1e-6)
    assert f.n_traces == 1


def test_gradient_with_a_batch_dim(tmp_path):
    w = sampan.from_numpy(np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32))

    def g(x):
        x = x.detach().requires_grad_()
        return sampan.grad((x @ w).sum(), [x])[0]
    f = sampan.jit(g, dynamic=BATCH)
    tw = torch.from_numpy(w.numpy())
    for n in (4, 7, 1):
        tx = torch.from_numpy(_x(n).numpy()).requires_grad_()
        (want,) = torch.autograd.grad((tx @ tw).sum(), [tx])
        np.testing.assert_allclose(f(_x(n)).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert f.n_traces == 1


def test_the_predictor_checks_the_guards_too(tmp_path):
    from sampan.inference import Config, create_predictor
    path = str(tmp_path / "b.sampan")
    sampan.jit.save(_branch, path, (_x(2),), dynamic=BATCH)
    pred = create_predictor(Config(path))
    np.testing.assert_allclose(pred.run([_x(3).numpy()])[0], _x(3).numpy() + 1.0)
    with pytest.raises(DynamicShapeError, match=r"batch>4.*if x\.shape\[0\] > 4:"):
        pred.run([_x(6).numpy()])


def _gru_input(n):
    return sampan.from_numpy(np.random.default_rng(n).standard_normal((n, 4, 5))
                             .astype(np.float32))


def test_bidirectional_gru_exports_to_onnx_with_a_small_dynamic_batch(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    sampan.manual_seed(0)
    gru = nn.GRU(5, 12, batch_first=True, bidirectional=True)
    gru.eval()
    path = str(tmp_path / "gru.onnx")
    sampan.onnx.export(gru, (_gru_input(3),), path, dynamic_axes={"x": {0: "batch"}})
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in (3, 6, 1):
        with sampan.no_grad():
            want = gru(_gru_input(n))[0].numpy()
        got = sess.run(None, {sess.get_inputs()[0].name: _gru_input(n).numpy()})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onnx_export_refuses_a_branch_on_a_dynamic_size(tmp_path):
    # an ONNX model cannot check a guard per call: exporting one branch silently is refused
    with pytest.raises(DynamicShapeError, match=r"batch>4.*if x\.shape\[0\] > 4:"):
        sampan.onnx.export(_branch, (_x(2),), str(tmp_path / "b.onnx"),
                           dynamic_axes={"x": {0: "batch"}})


@pytest.mark.parametrize("fn", [lambda x: x.median(dim=0).values, lambda x: x.var(0),
                                lambda x: (x[1:] - x[:-1]).sum(1)
                                + sampan.arange(x.shape[0] + 1)[2:]],
                         ids=["median", "var", "slice_arange"])
def test_symbolic_sizes_reach_onnx(tmp_path, fn):
    ort = pytest.importorskip("onnxruntime")
    path = str(tmp_path / "m.onnx")
    sampan.onnx.export(fn, (_x(3),), path, dynamic_axes={"x": {0: "batch"}})
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in (3, 5, 8):
        got = sess.run(None, {sess.get_inputs()[0].name: _x(n).numpy()})[0]
        np.testing.assert_allclose(got, fn(_x(n)).numpy(), rtol=1e-5, atol=1e-6)


def test_deploy_computes_any_symbolic_size_and_refuses_a_branch(tmp_path):
    import importlib.util
    path = str(tmp_path / "v.sampan")
    sampan.jit.save(lambda x: x.var(0) + (x[1:] - x[:-1]).sum(0), path, (_x(3),),
                    dynamic=BATCH)
    sampan.deploy.generate(path, str(tmp_path / "out"))
    spec = importlib.util.spec_from_file_location("issue29_model",
                                                  str(tmp_path / "out" / "model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.load()
    for n in (3, 6):
        t = torch.from_numpy(_x(n).numpy())
        np.testing.assert_allclose(m(_x(n).numpy()), (t.var(0) + (t[1:] - t[:-1]).sum(0)).numpy(),
                                   rtol=1e-5, atol=1e-6)
    path = str(tmp_path / "b.sampan")
    sampan.jit.save(_branch, path, (_x(2),), dynamic=BATCH)
    with pytest.raises(sampan.SampanError, match=r"batch>4.*if x\.shape\[0\] > 4:"):
        sampan.deploy.generate(path, str(tmp_path / "out2"))
