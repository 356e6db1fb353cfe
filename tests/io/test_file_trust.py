"""Files sampan writes and reads back can be trusted: checkpoints keep 0-d arrays 0-d,
are read header first and without extra copies, honour the umask and clean up after
killed saves; the fused-kernel cache runs only the source a module's name promises."""
import fcntl
import os
import tracemalloc

import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.io import CheckpointError, load, save
from sampan.io import checkpoint as ckpt
from sampan.tensor import Tensor


# ---------------------------------------------------------------------------- 0-d arrays
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool", "bfloat16"])
def test_zero_d_arrays_and_tensors_stay_zero_d(tmp_path, dtype):
    a = np.ones((), sampan.dtypes.as_dtype(dtype))
    obj = {"arr": a, "tensor": Tensor(a.copy()), "scalar": a[()], "one": a.reshape(1)}
    save(obj, tmp_path / "z.ck")
    back = load(tmp_path / "z.ck")
    assert isinstance(back["arr"], np.ndarray) and back["arr"].shape == ()
    assert isinstance(back["tensor"], Tensor) and back["tensor"].shape == ()
    assert back["scalar"].shape == () and type(back["scalar"]) is type(a[()])
    assert back["one"].shape == (1,)             # a real (1,) array stays (1,)
    assert back["arr"].dtype == a.dtype and back["arr"].tobytes() == a.tobytes()


def _bn_model():
    sampan.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def test_batchnorm_state_dict_round_trips_like_torch(tmp_path):
    m = _bn_model()
    for _ in range(3):   # move the running statistics and num_batches_tracked
        m(sampan.randn(8, 4))
    sd = m.state_dict()
    save(sd, tmp_path / "bn.ck")
    m2 = _bn_model()
    m2.load_state_dict(load(tmp_path / "bn.ck"))
    # the reference: torch.save/load keeps num_batches_tracked 0-d too
    tb = torch.nn.BatchNorm1d(6)
    torch.save(tb.state_dict(), tmp_path / "bn.pt")
    assert torch.load(tmp_path / "bn.pt")["num_batches_tracked"].shape == ()
    for k, v in m2.state_dict().items():
        assert v.shape == sd[k].shape and np.array_equal(v.numpy(), sd[k].numpy()), k
    assert int(m2.state_dict()["1.num_batches_tracked"].numpy()) == 3
    m.eval(), m2.eval()
    x = sampan.randn(5, 4)
    assert m(x).numpy().tobytes() == m2(x).numpy().tobytes()


def test_trainer_with_batchnorm_resumes_exactly(tmp_path):
    from sampan.data import DataLoader, TensorDataset
    from sampan.optim import Adam
    from sampan.train import Trainer

    rng = np.random.default_rng(0)
    x = sampan.tensor(rng.standard_normal((64, 4)).astype(np.float32))
    y = sampan.tensor(rng.integers(0, 3, 64).astype(np.int64))

    def setup():
        m = _bn_model()
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, seed=3)
        return Trainer(m, Adam(m.parameters(), lr=0.01), sampan.cross_entropy, loader)
    ref = setup()
    ref.fit(2)
    t1 = setup()
    t1.fit(1)
    save(t1.state_dict(), tmp_path / "run.ck")
    t2 = setup()
    sampan.manual_seed(99)
    t2.load_state_dict(load(tmp_path / "run.ck"))
    t2.fit(2)
    for a, b in zip(t2.model.state_dict().values(), ref.model.state_dict().values()):
        assert a.shape == b.shape and np.array_equal(a.numpy(), b.numpy())


# ---------------------------------------------------------------------------- reading
def _traced_peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_load_peaks_at_the_file_size_not_three_times_it(tmp_path):
    rng = np.random.default_rng(0)
    state = {f"w{i}": rng.standard_normal(1 << 20).astype(np.float32) for i in range(6)}
    state["step"] = np.int64(3)
    _, saved = _traced_peak(lambda: save(state, tmp_path / "big.ck"))
    size = os.path.getsize(tmp_path / "big.ck")
    assert saved <= 0.1 * size, (saved, size)   # written from the arrays' own buffers
    back, peak = _traced_peak(lambda: load(tmp_path / "big.ck"))
    assert peak <= 1.3 * size, (peak, size)
    for k, v in state.items():
        assert np.array_equal(back[k], v)
    back["w0"][0] = 1.0   # loaded arrays are writable


def test_wrong_magic_is_refused_before_the_file_is_read(tmp_path):
    p = tmp_path / "model.bin"
    p.write_bytes(b"PK\x03\x04" + bytes(16 << 20))
    err, peak = _traced_peak(lambda: pytest.raises(CheckpointError, load, p))
    assert "not a sampan checkpoint" in str(err.value)
    assert peak < 1 << 16   # today's loader read all 16 MiB first


def test_corrupt_payload_header_never_allocates_what_it_claims(tmp_path):
    # the payload's own header is read before its checksum can be checked: a flipped
    # shape must be refused by the tiling check, not allocated
    path = tmp_path / "c.ck"
    save({"w": np.arange(64, dtype=np.float32)}, path)
    data = bytearray(path.read_bytes())
    i = data.index(b'"shape":[64]')
    for bad in (b'"shape":[99]', b'"shape":[6]4', b'"shape":[-1]'):
        data[i:i + 12] = bad
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match="corrupt"):
            load(path)


# ---------------------------------------------------------------------------- writing
@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_checkpoint_honours_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        save({"w": np.ones(3)}, tmp_path / "c.ck")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "c.ck").st_mode & 0o777 == 0o666 & ~mask


def test_next_save_removes_temporaries_of_killed_saves_only(tmp_path):
    path = tmp_path / "c.ck"
    dead = tmp_path / ".c.ck.0123456789abcdef.tmp"     # what a killed save leaves
    dead.write_bytes(b"half a checkpoint")
    live = tmp_path / ".c.ck.fedcba9876543210.tmp"     # another process writing now
    live.write_bytes(b"being written")
    other = tmp_path / ".d.ck.0123456789abcdef.tmp"    # another checkpoint's
    other.write_bytes(b"not ours")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        save({"w": np.ones(3)}, path)
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["c.ck", live.name, other.name])
    np.testing.assert_array_equal(load(path)["w"], np.ones(3))


def test_save_replaces_atomically_after_a_failed_rename(tmp_path, monkeypatch):
    path = tmp_path / "c.ck"
    save({"v": np.ones(2)}, path)

    def broken(src, dst):
        raise OSError("simulated")
    monkeypatch.setattr(ckpt.os, "replace", broken)
    with pytest.raises(OSError):
        save({"v": np.zeros(2)}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["c.ck"]
    np.testing.assert_array_equal(load(path)["v"], np.ones(2))


# ---------------------------------------------------------------------------- kernel cache
@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A fresh, empty kernel cache in this process (as a new process would see it)."""
    pytest.importorskip("numba")
    from sampan.backends.numba import kernelgen as KG

    d = tmp_path / "kernels"
    monkeypatch.setenv("SAMPAN_CACHE_DIR", str(d))
    monkeypatch.setattr(KG, "_LOADED", {})
    monkeypatch.setattr(KG, "_DIR_STATE", {})
    f32 = np.dtype(np.float32)
    # t2 = x0 * x1 + x0, a one-entry-per-op body written from the op table
    src = KG.kernel_source([("mul", (0, 1)), ("add", (2, 0))], [3], [f32, f32], [f32],
                           ["full", "full"], "flat", False)
    return KG, d, src


def _run(k):
    x = np.arange(6, dtype=np.float32)
    y = np.full(6, 2.0, np.float32)
    out = np.empty(6, np.float32)
    k(x, y, out)
    return out, x * y + x


def _forget(KG, name):
    KG._LOADED.clear()
    os.sys.modules.pop(name, None)


def test_tampered_kernel_module_is_rebuilt_and_never_run(kernel_cache, tmp_path):
    KG, _, src = kernel_cache
    k, name, path = KG.load_kernel(src)
    got, want = _run(k)
    np.testing.assert_array_equal(got, want)
    marker = tmp_path / "tampered-code-ran"
    with open(path, "w") as f:   # same name, other code: it must never execute
        f.write(f"open({str(marker)!r}, 'w').write('ran')\n"
                "from numba import njit\n\n"
                "@njit(cache=True)\ndef kernel(x0, x1, o0):\n"
                "    for i in range(o0.shape[0]):\n        o0[i] = 42.0\n")
    _forget(KG, name)
    rebuilt = KG.STATS["rebuilt"]
    k2, name2, path2 = KG.load_kernel(src)
    assert not marker.exists()
    assert (name2, path2) == (name, path) and KG.STATS["rebuilt"] == rebuilt + 1
    with open(path) as f:
        assert f.read() == src
    got, want = _run(k2)
    np.testing.assert_array_equal(got, want)


def test_truncated_kernel_module_is_rebuilt(kernel_cache):
    KG, _, src = kernel_cache
    _, name, path = KG.load_kernel(src)
    with open(path, "r+") as f:   # a full disk or a killed writer
        f.truncate(len(src) // 2)
    _forget(KG, name)
    k, _, _ = KG.load_kernel(src)
    with open(path) as f:
        assert f.read() == src
    got, want = _run(k)
    np.testing.assert_array_equal(got, want)


class _Evil:
    """A pickle that, once loaded, writes a file: the machine code numba would load."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _compiled(KG, src):
    f32 = np.dtype(np.float32)
    k, name, _ = KG.load_kernel(src)
    KG.compile_kernel(k, name, KG._nb_sig([f32, f32], ["full", "full"], "flat", [f32]))
    return k, name


def test_damaged_numba_cache_files_are_recompiled_never_unpickled(kernel_cache, tmp_path):
    import pickle

    KG, d, src = kernel_cache
    _, name = _compiled(KG, src)
    pyc = d / "__pycache__"
    index = [p for p in pyc.iterdir() if p.name.endswith(".nbi")]
    code = [p for p in pyc.iterdir() if p.name.endswith(".nbc")]
    assert index and code
    # numba's machine code swapped for a pickle that runs code when loaded
    marker = tmp_path / "pickle-ran"
    for p in code:
        p.write_bytes(pickle.dumps(_Evil(str(marker))))
    _forget(KG, name)
    k, name = _compiled(KG, src)
    assert not marker.exists()
    got, want = _run(k)
    np.testing.assert_array_equal(got, want)
    # a truncated index (it raised UnpicklingError in every later process)
    index[0].write_bytes(index[0].read_bytes()[:10])
    _forget(KG, name)
    k, name = _compiled(KG, src)
    got, want = _run(k)
    np.testing.assert_array_equal(got, want)
    # and what was rewritten is trusted again: the next process loads it
    _forget(KG, name)
    hits = KG.STATS["cache_hits"]
    _compiled(KG, src)
    assert KG.STATS["cache_hits"] == hits + 1


def test_a_checkpoint_written_before_these_changes_still_loads():
    # written by sampan.save of main on 2026-12-01 (safetensors' own serializer)
    import pathlib

    back = load(pathlib.Path(__file__).parent / "data" / "v1_main_2026-12-01.ck")
    np.testing.assert_array_equal(back["w"], np.arange(4, dtype=np.float32))
    assert back["b"].dtype == sampan.dtypes.bfloat16 and back["b"].tolist() == [1, 1]
    assert back["n"] == 3 and isinstance(back["n"], np.int64)
    assert isinstance(back["t"], Tensor) and back["t"].numpy().dtype == np.float16
