"""Kernel choice by measurement: the on-disk cache (stored, re-read, keyed by machine,
corrupt -> warning and rebuilt), prefer(), eager == jit with oneDNN chosen, and a
machine without oneDNN (the loader made to fail) running on the numpy kernels."""
import json

import numpy as np
import pytest

import sampan
from sampan.backends import cache as kcache, choice, onednn
from sampan.backends.onednn import _lib
from sampan.ops.registry import OPS

needs_onednn = pytest.mark.skipif(not onednn.available(),
                                  reason=f"oneDNN unavailable: {onednn.why_unavailable()}")


@pytest.fixture
def cache(cache, monkeypatch):
    # conftest's cache, under the pool whose float32 classes race numpy against oneDNN
    # (test_pool.py tests both pools)
    monkeypatch.setenv("SAMPAN_GEMM_POOL", "onednn")
    return cache


def _mm(m=64, k=96, n=48):
    r = np.random.default_rng(1)
    return r.standard_normal((m, k)).astype(np.float32), r.standard_normal((k, n)).astype(
        np.float32)


@needs_onednn
def test_winner_stored_and_reread(cache):
    a, b = _mm()
    y = OPS["matmul"].kernel(a, b)
    np.testing.assert_allclose(y, a @ b, rtol=1e-5, atol=1e-5)
    got = choice.entries()
    key = next(k for k in got if "[64,96]" in k)
    assert got[key]["winner"] in ("numpy", "onednn") and "numpy" in got[key]["times_us"]
    doc = json.loads(cache.read_text())
    assert choice.machine_key() in doc["machines"]
    assert choice.cpu_model() in choice.machine_key()      # keyed by the CPU model
    # a fresh process state reads the winner back instead of measuring again
    doc["machines"][choice.machine_key()][key]["winner"] = "onednn"
    doc["sha256"] = kcache._digest(doc["machines"])
    cache.write_text(json.dumps(doc))
    choice.reset()
    OPS["matmul"].kernel(a, b)
    assert OPS["matmul"].kernel.pick((a, b)) is OPS["matmul"].kernels["onednn"]


@needs_onednn
def test_a_choice_measured_while_busy_is_measured_again_when_quiet(cache, monkeypatch):
    a, b = _mm(40, 72, 24)
    calls = []
    real = choice._measure
    monkeypatch.setattr(choice, "_measure", lambda *x: calls.append(1) or real(*x))
    monkeypatch.setattr(kcache, "busy", lambda: True)
    OPS["matmul"].kernel(a, b)
    key = next(k for k in choice.entries() if "[40,72]" in k)
    assert choice.entries()[key]["busy"] is True and len(calls) == 1
    choice.reset()                       # a new process, still busy: the stored choice
    OPS["matmul"].kernel(a, b)
    assert len(calls) == 1
    choice.reset()                       # a new process on a quiet machine: measured again
    monkeypatch.setattr(kcache, "busy", lambda: False)
    OPS["matmul"].kernel(a, b)
    assert len(calls) == 2 and choice.entries()[key]["busy"] is False
    choice.reset()
    OPS["matmul"].kernel(a, b)           # and that choice is final
    assert len(calls) == 2


@needs_onednn
def test_a_busy_choice_is_raced_again_when_the_machine_is_clearly_quieter(cache, monkeypatch):
    # a shared machine that is never quiet: the record keeps its load, and a process
    # that meets the class under a clearly lower load measures it again
    a, b = _mm(36, 68, 28)
    calls, load = [], {"now": 3.0}
    real = choice._measure
    monkeypatch.setattr(choice, "_measure", lambda *x: calls.append(1) or real(*x))
    monkeypatch.setattr(kcache, "busy", lambda: True)
    monkeypatch.setattr(kcache, "load_per_core", lambda: load["now"])
    OPS["matmul"].kernel(a, b)
    key = next(k for k in choice.entries() if "[36,68]" in k)
    assert choice.entries()[key]["load"] == 3.0 and len(calls) == 1
    for now, measured in ((2.5, 1), (1.5, 2), (1.2, 2), (0.8, 3)):
        load["now"] = now                # 2.5 >= 0.6 * 3: kept; 1.5 < 1.8: raced again
        choice.reset()
        OPS["matmul"].kernel(a, b)
        assert len(calls) == measured, now
    assert choice.entries()[key]["load"] == 0.8     # each new record keeps its own load
    # an older busy record with no load is measured once more
    choice.flush()
    doc = json.loads(cache.read_text())
    del doc["machines"][choice.machine_key()][key]["load"]
    doc["sha256"] = kcache._digest(doc["machines"])
    cache.write_text(json.dumps(doc))
    choice.reset()
    np.testing.assert_allclose(OPS["matmul"].kernel(a, b), a @ b, rtol=1e-5, atol=1e-5)
    assert len(calls) == 4 and choice.entries()[key]["load"] == 0.8


@needs_onednn
def test_corrupt_cache_warns_and_is_rebuilt(cache):
    cache.write_text('{"format": 1, "machines": {}, "sha256": "0000"}')
    a, b = _mm(33, 40, 50)
    with pytest.warns(choice.KernelCacheWarning, match="unreadable"):
        OPS["matmul"].kernel(a, b)
    choice.flush()
    doc = json.loads(cache.read_text())
    assert doc["sha256"] == kcache._digest(doc["machines"])
    assert any("[33,40]" in k for k in doc["machines"][choice.machine_key()])


@needs_onednn
def test_other_machine_key_is_not_used(cache, monkeypatch):
    a, b = _mm(20, 30, 40)
    OPS["matmul"].kernel(a, b)
    choice.flush()
    monkeypatch.setattr(kcache, "cpu_model", lambda: "Some Other CPU")
    choice.reset()
    assert choice.entries() == {}


@needs_onednn
def test_prefer_overrides(cache, monkeypatch):
    calls = []
    real = OPS["matmul"].kernels["onednn"]
    monkeypatch.setitem(OPS["matmul"].kernels, "onednn",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    a, b = _mm(8, 8, 8)
    with choice.prefer("onednn"):
        OPS["matmul"].kernel(a, b)
    assert calls == [1]
    with choice.prefer("numpy", op="matmul"):
        OPS["matmul"].kernel(a, b)
    assert calls == [1]
    h = sampan.backends.prefer("onednn", op="matmul")     # global until undone
    OPS["matmul"].kernel(a, b)
    sampan.backends.prefer(None, op="matmul")
    assert calls == [1, 1] and h is not None
    with pytest.raises(sampan.SampanError, match="unknown backend"):
        choice.prefer("cuda-magic")


@needs_onednn
def test_eager_equals_jit_with_onednn_chosen(cache, monkeypatch):
    used = {"eager": set(), "jit": set()}
    mode = ["eager"]
    for op in ("matmul", "conv2d", "conv_transpose2d", "conv2d_grad_weight"):
        real = OPS[op].kernels["onednn"]

        def spy(*a, _op=op, _real=real, **k):
            used[mode[0]].add(_op)
            return _real(*a, **k)
        monkeypatch.setitem(OPS[op].kernels, "onednn", spy)
    sampan.manual_seed(0)
    lin1, lin2 = sampan.nn.Linear(64, 32), sampan.nn.Linear(32, 10)
    conv = sampan.nn.Conv2d(3, 4, 3, padding=1)

    def f(x, img):
        h = sampan.relu(lin1(x))
        c = sampan.max_pool2d(sampan.relu(conv(img)), 2)
        return lin2(h).sum() + c.sum()

    x, img = sampan.randn(16, 64), sampan.randn(2, 3, 8, 8)
    with choice.prefer("onednn"):
        eager = f(x, img)
        eager.backward()
        ge = [p.grad.numpy().copy() for p in (lin1.weight, conv.weight)]
        for p in (lin1.weight, conv.weight):
            p.grad = None
        step = sampan.jit(f)
        mode[0] = "jit"
        jitted = step(x, img)
        jitted.backward()
        gj = [p.grad.numpy() for p in (lin1.weight, conv.weight)]
    # both ways ran oneDNN for the GEMMs and convolutions, backward included
    assert used["eager"] >= {"matmul", "conv2d", "conv2d_grad_weight"}
    assert used["jit"] >= {"matmul", "conv2d", "conv2d_grad_weight"}
    np.testing.assert_allclose(jitted.numpy(), eager.numpy(), rtol=1e-5)
    for a, b in zip(ge, gj):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_without_onednn_runs_as_today(cache, monkeypatch):
    monkeypatch.delenv("SAMPAN_ONEDNN", raising=False)
    monkeypatch.delenv("SAMPAN_ONEDNN_LIB", raising=False)
    monkeypatch.setattr(_lib, "_state", dict(_lib._state, lib=False))
    monkeypatch.setattr(_lib, "_candidates", lambda: [])
    choice.reset()
    assert not onednn.available() and "not installed" in onednn.why_unavailable()
    assert choice.backends() == []
    a, b = _mm(5, 6, 7)
    assert np.array_equal(OPS["matmul"].kernel(a, b), OPS["matmul"].kernels["numpy"](a, b))
    x = sampan.randn(2, 3, 6, 6, requires_grad=True)
    w = sampan.randn(4, 3, 3, 3, requires_grad=True)
    sampan.conv2d(x, w).sum().backward()
    assert x.grad is not None and not cache.exists()
    choice.reset()
    monkeypatch.undo()
    choice.reset()


def test_cli_show_and_clear(cache, capsys):
    from sampan.cli import main
    assert main(["kernels", "--show"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cache"] == str(cache) and "machine" in out
    cache.write_text("{}")
    assert main(["kernels", "--clear"]) == 0
    assert not cache.exists()
