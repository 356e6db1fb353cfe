"""Issue 31, "bf16 that pays": bfloat16 GEMMs, convolutions and their gradients on
oneDNN's bf16 kernels whatever the float32 pool is (the calibration decides per
precision, cached per machine), weights cast once per step, and the numbers against
PyTorch's CPU autocast within bfloat16 tolerance."""
import numpy as np
import pytest
import torch

import sampan
import sampan.nn.functional as F
from sampan import dtypes as dt
from sampan.amp import mode as amp_mode
from sampan.backends import cache as kcache, choice, onednn, pool
from sampan.ops.registry import OPS

needs_onednn = pytest.mark.skipif(not onednn.available(),
                                  reason=f"oneDNN unavailable: {onednn.why_unavailable()}")


@pytest.fixture
def kcache_file(tmp_path, monkeypatch):
    """A fresh kernel choice cache, a quiet machine and no pool forced (by the environment
    or by sampan's spinning OpenMP policy)."""
    monkeypatch.setenv("SAMPAN_KERNEL_CACHE", str(tmp_path / "kernels.json"))
    monkeypatch.delenv("SAMPAN_GEMM_POOL", raising=False)
    monkeypatch.delenv("SAMPAN_GEMM_POOL_BF16", raising=False)
    monkeypatch.setattr(kcache, "busy", lambda: False)
    # measured here even where sampan's spinning OpenMP policy holds the "onednn" pool
    monkeypatch.setattr(pool, "spin_owns_cores", lambda: False)
    choice.reset()
    yield
    choice.reset()


def _f32(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _close_bf16(got, want, what, ulps=2):
    """Within bfloat16 tolerance: `ulps` ulps of bf16 (2**-8 each) of the largest magnitude."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    tol = ulps * 2 ** -8 * max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= tol, f"{what}: max abs error {err} > {tol}"


def _sampan_vs_torch(fn_s, fn_t, arrays, grads_of):
    """Run fn under each framework's bf16 autocast; loss = sum(out.float() * probe).
    Returns (sampan out, torch out, [(sampan grad, torch grad) for grads_of])."""
    ts = [sampan.tensor(a, requires_grad=i in grads_of) for i, a in enumerate(arrays)]
    tt = [torch.tensor(a, requires_grad=i in grads_of) for i, a in enumerate(arrays)]
    with sampan.amp.autocast(sampan.bfloat16):
        ys = fn_s(*ts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt = fn_t(*tt)
    assert ys.dtype == dt.bfloat16 and yt.dtype == torch.bfloat16
    probe = _f32(*ys.shape, seed=9)
    (sampan.cast(ys, "float32") * sampan.tensor(probe)).sum().backward()
    (yt.float() * torch.tensor(probe)).sum().backward()
    out_t = yt.float().detach().numpy()
    grads = [(ts[i].grad.numpy(), tt[i].grad.numpy()) for i in grads_of]
    return ys.numpy().astype(np.float32), out_t, grads


@needs_onednn
@pytest.mark.parametrize("fp32_pool", ["openblas", "onednn"])
def test_matmul_linear_conv_fwd_bwd_match_torch_bf16_on_onednn(kcache_file, fp32_pool):
    pool.set_pool(fp32_pool)
    pool.set_pool("onednn", "bfloat16")
    x, w, b = _f32(32, 64), _f32(64, 48, seed=1, scale=0.2), _f32(48, seed=2)
    ys, yt, grads = _sampan_vs_torch(lambda x, w: x @ w, lambda x, w: x @ w, [x, w], (0, 1))
    _close_bf16(ys, yt, "matmul")
    for (gs, gt), n in zip(grads, "xw"):
        assert gs.dtype == np.float32
        _close_bf16(gs, gt, f"matmul grad {n}")
    # batched (attention-shaped) products
    q, k = _f32(2, 4, 16, 8, seed=3), _f32(2, 4, 8, 16, seed=4)
    ys, yt, grads = _sampan_vs_torch(lambda q, k: q @ k, lambda q, k: q @ k, [q, k], (0, 1))
    _close_bf16(ys, yt, "batched matmul")
    for gs, gt in grads:
        _close_bf16(gs, gt, "batched matmul grad")
    ys, yt, grads = _sampan_vs_torch(
        lambda x, w, b: F.linear(x, w, b),
        lambda x, w, b: torch.nn.functional.linear(x, w.t(), b), [x, w, b], (0, 1, 2))
    _close_bf16(ys, yt, "linear")
    for (gs, gt), n in zip(grads, "xwb"):
        _close_bf16(gs, gt, f"linear grad {n}")
    xi, wc, bc = _f32(4, 3, 12, 12, seed=5), _f32(6, 3, 3, 3, seed=6, scale=0.3), _f32(6, seed=7)
    ys, yt, grads = _sampan_vs_torch(
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        lambda x, w, b: torch.nn.functional.conv2d(x, w, b, padding=1), [xi, wc, bc], (0, 1, 2))
    _close_bf16(ys, yt, "conv2d")
    for (gs, gt), n in zip(grads, "xwb"):
        _close_bf16(gs, gt, f"conv2d grad {n}")
    # every bf16 GEMM/conv of forward and backward ran on oneDNN, whatever the f32 pool
    for op in ("matmul", "conv2d", "conv_transpose2d", "conv2d_grad_weight"):
        used = {n for n, f in OPS[op].kernels.items()
                for fn in OPS[op].kernel.table.values() if fn is f}
        assert used == {"onednn"}, (op, used)
    assert pool.current() == fp32_pool


def _fixed(ratio):
    n = len(pool._shapes())
    return lambda: {"openblas": [1e-3] * n, "onednn": [ratio * 1e-3] * n}


@needs_onednn
def test_calibration_decides_per_precision_and_is_cached(kcache_file, monkeypatch):
    runs = []
    monkeypatch.setattr(pool, "calibrate", lambda: runs.append("f32") or _fixed(0.95)())
    monkeypatch.setattr(pool, "calibrate_bf16", lambda: runs.append("bf16") or _fixed(0.2)())
    a, b = _f32(64, 96), _f32(96, 32, seed=1)
    ab, bb = a.astype(dt.bfloat16), b.astype(dt.bfloat16)
    OPS["matmul"].kernel(a, b)
    assert pool.current() == "openblas" and pool.current("bfloat16") is None
    assert runs == ["f32"]                           # bf16 is decided at its first call
    y = OPS["matmul"].kernel(ab, bb)
    assert runs == ["f32", "bf16"] and pool.current("bfloat16") == "onednn"
    _close_bf16(y.astype(np.float32), a @ b, "bf16 matmul")
    assert OPS["matmul"].kernel.provider((a, b), {}) == "numpy"
    assert OPS["matmul"].kernel.provider((ab, bb), {}) == "onednn"
    f32_rec, bf_rec = choice.stored(pool.POOL_KEY), choice.stored(pool.POOL_KEY_BF16)
    assert f32_rec["winner"] == "openblas" and f32_rec["ratio"] == pytest.approx(0.95)
    assert bf_rec["winner"] == "onednn" and bf_rec["ratio"] == pytest.approx(0.2)
    # a new process (state forgotten, file kept) reads both back without calibrating
    kcache.flush()
    choice.reset()
    OPS["matmul"].kernel(a, b)
    OPS["matmul"].kernel(ab, bb)
    assert runs == ["f32", "bf16"]
    assert (pool.current(), pool.current("bfloat16")) == ("openblas", "onednn")


@needs_onednn
def test_bf16_calibration_can_keep_numpy_and_forcing_wins(kcache_file, monkeypatch):
    monkeypatch.setattr(pool, "calibrate_bf16", _fixed(0.95))   # misses the 10% margin
    ab, bb = (_f32(32, 32, seed=s).astype(dt.bfloat16) for s in (1, 2))
    assert OPS["matmul"].kernel.provider((ab, bb), {}) == "numpy"
    assert pool.current("bfloat16") == "openblas"
    monkeypatch.setenv("SAMPAN_GEMM_POOL_BF16", "onednn")
    pool.set_pool(None, "bfloat16")
    assert OPS["matmul"].kernel.provider((ab, bb), {}) == "onednn"
    with pytest.raises(sampan.SampanError, match="unknown precision"):
        pool.decide("float8")


@pytest.mark.slow
@needs_onednn
def test_real_bf16_calibration_measures_both_sides(kcache_file):
    times = pool.calibrate_bf16()
    n = len(pool._shapes())
    assert len(times["onednn"]) == len(times["openblas"]) == n
    assert all(t > 0 for v in times.values() for t in v)


def test_weights_cast_once_per_step_not_per_use():
    r = np.random.default_rng(0)
    w1 = sampan.tensor(r.standard_normal((8, 16)).astype(np.float32) * 0.3, requires_grad=True)
    w2 = sampan.tensor(r.standard_normal((16, 4)).astype(np.float32) * 0.3, requires_grad=True)
    x = sampan.tensor(r.standard_normal((5, 8)).astype(np.float32))
    opt = sampan.optim.SGD([w1, w2], lr=0.1)
    base = dict(amp_mode.STATS)
    for step in range(3):
        opt.zero_grad()
        with sampan.amp.autocast():
            h = sampan.relu(x @ w1)
            h2 = sampan.relu(x @ w1)              # w1 used twice, w2 three times
            y = (h @ w2).sum() + (h2 @ w2).sum() + (h @ w2).sum()
        y.backward()
        # the reused casts carry gradients to the float32 weights like fresh ones
        want = _manual_grads(x.numpy(), w1.numpy(), w2.numpy())
        for got, ref in zip((w1.grad.numpy(), w2.grad.numpy()), want):
            _close_bf16(got, ref, f"grad at step {step}")
        made = amp_mode.STATS["made"] - base["made"]
        reused = amp_mode.STATS["reused"] - base["reused"]
        assert (made, reused) == (2 * (step + 1), 3 * (step + 1))
        opt.step()                                # new versions: cast again next step
    # an inference loop on unchanged weights casts nothing more
    with sampan.no_grad(), sampan.amp.autocast():
        for _ in range(3):
            x @ w1
    assert amp_mode.STATS["made"] - base["made"] == 7   # w1 and w2 after the last step
    # an in-place write outside the optimiser invalidates the cast as well
    with sampan.no_grad():
        w1.mul_(0.0)
    with sampan.amp.autocast():
        assert not np.any((x @ w1).numpy().astype(np.float32))


def _manual_grads(x, w1, w2):
    xt = torch.tensor(x)
    a, b = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.relu(xt @ a)
        h2 = torch.relu(xt @ a)
        y = (h @ b).float().sum() + (h2 @ b).float().sum() + (h @ b).float().sum()
    y.backward()
    return a.grad.numpy(), b.grad.numpy()


def _w1_like(amp, steps=30):
    """A small W1-like MLP (64 -> 128 -> 128 -> 10, ReLU, cross-entropy, SGD momentum)
    on a fixed planted task; the loss after `steps`."""
    r = np.random.default_rng(0)
    sizes = (64, 128, 128, 10)
    ws = [sampan.tensor(r.uniform(-1, 1, (i, o)).astype(np.float32) / np.sqrt(i),
                        requires_grad=True) for i, o in zip(sizes, sizes[1:])]
    bs = [sampan.tensor(np.zeros(o, np.float32), requires_grad=True) for o in sizes[1:]]
    x = r.standard_normal((128, 64)).astype(np.float32)
    y = np.argmax(x @ r.standard_normal((64, 10)), 1)
    x, y = sampan.tensor(x), sampan.tensor(y)
    opt = sampan.optim.SGD(ws + bs, lr=0.05, momentum=0.9)
    loss = None
    for _ in range(steps):
        opt.zero_grad()
        with sampan.amp.autocast(enabled=amp):
            h = x
            for i, (w, b) in enumerate(zip(ws, bs)):
                h = F.linear(h, w, b)
                h = sampan.relu(h) if i < 2 else h
            loss = sampan.cross_entropy(h, y)
        loss.backward()
        opt.step()
    return float(loss.item())


def test_w1_like_bf16_loss_within_1pct_of_fp32():
    l32, l16 = _w1_like(False), _w1_like(True)
    assert l32 < 0.6 * np.log(10)                    # it trained (from ~ln 10)
    assert abs(l16 - l32) <= 0.01 * abs(l32), (l16, l32)


@needs_onednn
def test_measured_bf16_races_per_class_forced_does_not(kcache_file, monkeypatch):
    """Measured, each bf16 class picks its kernel by its own race (the calibration per
    precision): a convolution may keep the numba loops while a GEMM goes to oneDNN;
    forcing the bf16 pool sends every bf16 call to that library unraced."""
    raced = []

    def fake_measure(cands, arrays, attrs):
        raced.append(arrays[0].dtype)
        fast = "onednn" if arrays[0].ndim == 2 else "numpy"   # GEMMs oneDNN, convs numba
        return {n: (1e-4 if n == fast else 1e-3) for n in cands}
    monkeypatch.setattr(choice, "_measure", fake_measure)
    monkeypatch.setattr(pool, "calibrate_bf16", _fixed(0.2))
    pool.set_pool("onednn")
    x, w = _f32(2, 3, 10, 10), _f32(4, 3, 3, 3, seed=1, scale=0.3)
    xb, wb = x.astype(dt.bfloat16), w.astype(dt.bfloat16)
    a, b = _f32(48, 64, seed=2).astype(dt.bfloat16), _f32(64, 32, seed=3).astype(dt.bfloat16)
    conv = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    y = OPS["conv2d"].kernel(xb, wb, **conv)
    ref = torch.nn.functional.conv2d(torch.tensor(xb.astype(np.float32), dtype=torch.float64),
                                     torch.tensor(wb.astype(np.float32), dtype=torch.float64),
                                     padding=1).numpy()
    _close_bf16(y.astype(np.float32), ref, "bf16 conv2d (numba side)")
    m = OPS["matmul"].kernel(a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    _close_bf16(m.astype(np.float32), ref, "bf16 matmul (oneDNN side)")
    assert OPS["conv2d"].kernel.provider((xb, wb), conv) in ("numba", "numpy")
    assert OPS["matmul"].kernel.provider((a, b), {}) == "onednn"
    assert raced == [dt.bfloat16, dt.bfloat16]
    # each bf16 class is stored under its own key (the dtype is in it), apart from f32's
    assert any(k.startswith("onednn:conv2d;<V2") for k in choice.entries())
    # forced: every bf16 call on the forced library, no race
    pool.set_pool("onednn", "bfloat16")
    raced.clear()
    OPS["conv2d"].kernel(xb, wb, **conv)
    assert OPS["conv2d"].kernel.provider((xb, wb), conv) == "onednn" and raced == []


@needs_onednn
def test_large_bf16_gemm_goes_to_the_calibrated_library_unraced(kcache_file, monkeypatch):
    """Under the "onednn" float32 pool, a bf16 matmul of BF16_DIRECT_FLOPS or more runs
    the library the bf16 calibration chose without a race of its own (a busy race once
    sent W3's (8,128,256) @ (256,1024) to the float32-sgemm side at 4x the time); smaller
    ones still race; a calibration that kept numpy keeps racing them all."""
    raced = []

    def fake_measure(cands, arrays, attrs):       # a race that would pick numpy
        raced.append(tuple(arrays[0].shape))
        return {n: (1e-4 if n == "numpy" else 1e-3) for n in cands}
    monkeypatch.setattr(choice, "_measure", fake_measure)
    monkeypatch.setattr(pool, "calibrate_bf16", _fixed(0.2))
    pool.set_pool("onednn")
    big = [_f32(8, 64, 128, seed=4).astype(dt.bfloat16), _f32(128, 256, seed=5).astype(dt.bfloat16)]
    small = [_f32(16, 32, seed=6).astype(dt.bfloat16), _f32(32, 8, seed=7).astype(dt.bfloat16)]
    assert choice._gemm_flops(big) >= choice.BF16_DIRECT_FLOPS > choice._gemm_flops(small)
    for a, b in (big, small):
        m = OPS["matmul"].kernel(a, b)
        _close_bf16(m.astype(np.float32), a.astype(np.float64) @ b.astype(np.float64),
                    f"bf16 matmul {a.shape}")
    assert OPS["matmul"].kernel.provider(tuple(big), {}) == "onednn"
    assert OPS["matmul"].kernel.provider(tuple(small), {}) == "numpy"
    assert raced == [(16, 32)]
    choice.clear()                                               # file and memory
    monkeypatch.setattr(pool, "calibrate_bf16", _fixed(0.95))    # bf16 calibration: numpy
    pool.set_pool("onednn")
    raced.clear()
    OPS["matmul"].kernel(*big)
    assert raced == [(8, 64, 128)]


def test_bf16_activation_times_f32_weight_lowers_without_a_float32_round_trip():
    """A bf16 activation @ a float32 weight under autocast: both cast to bf16 before
    promotion (no bf16 -> f32 -> bf16 pair of casts, eager or traced), same numbers."""
    from sampan.jit.api import trace
    a = _f32(6, 16, seed=1).astype(dt.bfloat16)
    w = _f32(16, 8, seed=2, scale=0.3)

    def f(a, w):
        with sampan.amp.autocast(sampan.bfloat16):
            return a @ w
    g = trace(f, (sampan.tensor(a), sampan.tensor(w)))[0]
    casts = [n for n in g.nodes if n.op == "cast"]
    assert [n.attrs["dtype"] for n in casts] == ["bfloat16"], str(g)
    ta, tw = sampan.tensor(a), sampan.tensor(w, requires_grad=True)
    y = f(ta, tw)
    assert y.dtype == dt.bfloat16
    want = a.astype(np.float64) @ w.astype(dt.bfloat16).astype(np.float64)
    _close_bf16(y.numpy().astype(np.float32), want, "bf16 @ f32 weight")
    y.sum().backward()
    assert tw.grad.dtype == np.float32
    _close_bf16(tw.grad.numpy(), a.astype(np.float64).sum(0)[:, None].repeat(8, 1),
                "weight grad")


def test_attention_softmax_stays_bf16_and_matches_torch_autocast():
    """softmax of bf16 scores follows its input under autocast (PyTorch's CPU policy):
    the scores -> softmax -> @ v chain runs in bf16 with no float32 copy, forward and
    backward, within bf16 tolerance of PyTorch's autocast and of float64."""
    q, k, v = _f32(2, 3, 16, 8, seed=1), _f32(2, 3, 16, 8, seed=2), _f32(2, 3, 16, 8, seed=3)

    def att_s(q, k, v):
        return sampan.softmax((q @ k.permute(0, 1, 3, 2)) * 0.35, -1) @ v

    def att_t(q, k, v):
        return torch.softmax((q @ k.transpose(-1, -2)) * 0.35, -1) @ v
    with sampan.amp.autocast(sampan.bfloat16):
        s = sampan.tensor(q) @ sampan.tensor(k).permute(0, 1, 3, 2)
        assert sampan.softmax(s, -1).dtype == dt.bfloat16
    ys, yt, grads = _sampan_vs_torch(att_s, att_t, [q, k, v], (0, 1, 2))
    # three roundings to bf16 in the chain (scores, probabilities, output), each side
    _close_bf16(ys, yt, "attention", ulps=6)
    q64, k64, v64 = (torch.tensor(a, dtype=torch.float64) for a in (q, k, v))
    _close_bf16(ys, att_t(q64, k64, v64).numpy(), "attention vs float64", ulps=6)
    for (gs, gt), n in zip(grads, "qkv"):
        assert gs.dtype == np.float32
        _close_bf16(gs, gt, f"attention grad {n}", ulps=6)


_POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SAMPAN_OMP_SPIN", "SAMPAN_GEMM_POOL")


def _policy_in(code, env_extra=None):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in _POLICY_VARS}
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", code + "\nfrom sampan import _threads\n"
                          "import os\nprint(_threads.openmp_wait_policy(), '|', "
                          "os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_import_sampan_sets_its_wait_policy_before_torch_loads_libgomp():
    """PyTorch ships libgomp.so.1, which oneDNN then shares: sampan's policy is set at
    `import sampan` (PASSIVE; with SAMPAN_OMP_SPIN=auto a bounded spin where the "onednn"
    GEMM pool owns the cores, here forced), and the user's own policy wins."""
    passive = {"SAMPAN_OMP_SPIN": "0"}
    assert _policy_in("import sampan\nimport torch", passive) == \
        "OMP_WAIT_POLICY=PASSIVE | PASSIVE None"
    assert _policy_in("import sampan", {"SAMPAN_GEMM_POOL": "onednn",
                                        "SAMPAN_OMP_SPIN": "auto"}) == \
        "GOMP_SPINCOUNT=10000 | None 10000"
    assert _policy_in("import sampan", {"SAMPAN_GEMM_POOL": "onednn"}) == \
        "OMP_WAIT_POLICY=PASSIVE | PASSIVE None"                 # the spin is off by default
    assert _policy_in("import sampan", {"SAMPAN_GEMM_POOL": "openblas"}) == \
        "OMP_WAIT_POLICY=PASSIVE | PASSIVE None"
    assert _policy_in("import sampan", {"OMP_WAIT_POLICY": "ACTIVE"}) == \
        "OMP_WAIT_POLICY=ACTIVE | ACTIVE None"


def test_a_libgomp_loaded_after_torchs_reads_sampans_policy():
    """`import torch` first loads PyTorch's libgomp, which keeps libgomp's default spin;
    numba's omp layer then loads the system's libgomp beside it (two copies in
    /proc/self/maps), and that one reads the policy sampan set (libgomp's own display of
    its settings says so): before, it spun for libgomp's default 300000 rounds."""
    pytest.importorskip("numba")
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in _POLICY_VARS}
    env["SAMPAN_OMP_SPIN"] = "0"
    code = ("import ctypes, sys\nimport torch\nimport sampan\n"
            "from sampan import _threads\n"
            "import numba.np.ufunc.omppool\n"
            "libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l})\n"
            "late = [ctypes.CDLL(p) for p in libs if 'torch' not in p]\n"
            "late = [g for g in late if hasattr(g, 'omp_display_env')]\n"
            "print(len(libs), len(late), _threads.openmp_wait_policy()); sys.stdout.flush()\n"
            "[g.omp_display_env(1) for g in late[:1]]\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    n_libs, n_late, policy = out.stdout.strip().split(" ", 2)
    assert policy == "OMP_WAIT_POLICY=PASSIVE (a libgomp loaded before sampan keeps its " \
        "default)"
    if int(n_libs) < 2 or int(n_late) == 0:   # e.g. a torch built on the system's libgomp
        pytest.skip(f"one libgomp here ({n_libs} loaded): nothing loads after torch's")
    assert "GOMP_SPINCOUNT = '0'" in out.stderr, out.stderr


def test_float64_times_float32_under_autocast_is_promoted_first_as_before():
    a = _f32(4, 8, seed=1).astype(np.float64)
    w = _f32(8, 3, seed=2)
    with sampan.amp.autocast(sampan.bfloat16):
        y = sampan.tensor(a) @ sampan.tensor(w)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y.numpy(), a @ w.astype(np.float64), rtol=1e-12)
