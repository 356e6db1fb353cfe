"""A saved program can be trusted: every file is checksummed, every malformed field is a
LoadError at load (never a KeyError at the first call, never wrong numbers), replacing a
program survives a crash between its renames, and 0-d arrays stay 0-d."""
import fcntl
import hashlib
import json
import os
import pathlib
import random
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.io import _atomic
from sampan.jit import LoadError
from sampan.jit import serialize as S

FILES = ("graph.ir", "meta.json", "weights.safetensors", "checksums.sha256")


def _model(seed=0):
    sampan.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    m.eval()
    return m


class _Two(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, a, b):
        return {"y": (self.fc(a) - b).relu(), "z": a * 2.0}


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A saved two-input program whose inputs have one shape, so swapping them in
    meta.json would still run: only the checksum can tell."""
    d = tmp_path_factory.mktemp("prog")
    sampan.manual_seed(0)
    f = _Two()
    a, b = sampan.randn(3, 4), sampan.randn(3, 4)
    path = str(d / "p.sampan")
    S.save(f, path, (a, b), passes=[])   # no passes: the weights stay state inputs
    ref = f(a, b)
    return path, {n: pathlib.Path(path, n).read_bytes() for n in FILES}, (a, b), ref


def _restore(path, files):
    for n, data in files.items():
        with open(os.path.join(path, n), "wb") as f:
            f.write(data)


def _rewrite_meta(path, meta):
    """meta.json replaced and its checksum recomputed: a writer bug, not a flipped bit."""
    data = json.dumps(meta).encode()
    p = pathlib.Path(path)
    (p / "meta.json").write_bytes(data)
    lines = (p / "checksums.sha256").read_text().splitlines()
    lines = [f"{hashlib.sha256(data).hexdigest()}  meta.json" if ln.endswith(" meta.json")
             else ln for ln in lines]
    (p / "checksums.sha256").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------- corruption
@pytest.mark.parametrize("name", FILES)
def test_flipped_bits_in_any_file_give_load_error(program, name):
    path, files, _, _ = program
    rng = random.Random(name)
    data = files[name]
    # a bounded sample of positions (over half of meta.json and checksums.sha256), one
    # random bit each
    n = 400 if name == "meta.json" else 150
    positions = rng.sample(range(len(data)), min(n, len(data)))
    try:
        for pos in positions:
            bad = bytearray(data)
            bad[pos] ^= 1 << rng.randrange(8)
            with open(os.path.join(path, name), "wb") as f:
                f.write(bad)
            with pytest.raises(LoadError):
                S.read(path)
    finally:
        _restore(path, files)


def test_truncated_or_missing_files_give_load_error(program):
    path, files, _, _ = program
    try:
        for name in FILES:
            for cut in (0, 1, len(files[name]) // 2, len(files[name]) - 1):
                with open(os.path.join(path, name), "wb") as f:
                    f.write(files[name][:cut])
                with pytest.raises(LoadError):
                    S.read(path)
            _restore(path, files)
            os.remove(os.path.join(path, name))
            with pytest.raises(LoadError, match="missing"):
                S.read(path)
            _restore(path, files)
    finally:
        _restore(path, files)


def _swap_inputs(meta):
    meta["inputs"][0]["index"], meta["inputs"][1]["index"] = 1, 0


@pytest.mark.parametrize("edit", [
    lambda m: m["inputs"][0].update(index=7),
    lambda m: m["inputs"][0].update(index="0"),
    lambda m: m["inputs"][0].update(kind="args"),
    lambda m: m["inputs"].pop(),
    lambda m: m["inputs"][2].update(key="input.9"),
    lambda m: m["inputs"][2].update(kind="arg", index=0),
    lambda m: m.update(n_args=3),
    lambda m: m.update(n_args=-1),
    lambda m: m.update(outputs=["out"]),
    lambda m: m.update(outputs=["out", "bogus"]),
    lambda m: m.update(out_tree={"dict": [["y", {"t": 5}]]}),
    lambda m: m.update(out_tree={"dict": [["y", {"const": 0}]]}),
    lambda m: m.update(out_tree={"dict": "y"}),
    lambda m: m.update(out_tree={"weird": 1}),
    lambda m: m["dtypes"].update({"example.0": "float64"}),
    lambda m: m["dtypes"].update({"example.0": "no-such-dtype"}),
    lambda m: m["dtypes"].pop("example.1"),
    lambda m: m.update(version=1),
    lambda m: m.update(version="2"),
    lambda m: m.update(version=True),
    lambda m: m.pop("format"),
    lambda m: m.update(inputs=None),
])
def test_every_malformed_meta_field_is_a_load_error(program, edit):
    path, files, _, _ = program
    meta = json.loads(files["meta.json"])
    edit(meta)
    try:
        _rewrite_meta(path, meta)
        with pytest.raises(LoadError):
            S.load(path)
    finally:
        _restore(path, files)


def test_swapped_inputs_are_caught_by_the_checksum(program):
    path, files, _, _ = program
    meta = json.loads(files["meta.json"])
    _swap_inputs(meta)
    pathlib.Path(path, "meta.json").write_bytes(json.dumps(meta, indent=1).encode())
    try:
        with pytest.raises(LoadError, match="meta.json is damaged"):
            S.load(path)
    finally:
        _restore(path, files)


def test_newer_version_names_the_version(program):
    path, files, _, _ = program
    meta = json.loads(files["meta.json"])
    meta["version"] = S.VERSION + 1
    try:
        _rewrite_meta(path, meta)
        with pytest.raises(LoadError, match=f"format version {S.VERSION + 1}.*upgrade sampan"):
            S.load(path)
    finally:
        _restore(path, files)


def test_version_1_program_still_loads(program, tmp_path):
    _, files, args, ref = program
    v1 = tmp_path / "v1.sampan"
    v1.mkdir()
    meta = json.loads(files["meta.json"])
    meta["version"] = 1
    meta["sha256"] = {n: hashlib.sha256(files[n]).hexdigest()
                      for n in ("graph.ir", "weights.safetensors")}
    for n in ("graph.ir", "weights.safetensors"):
        (v1 / n).write_bytes(files[n])
    (v1 / "meta.json").write_text(json.dumps(meta))
    out = S.load(str(v1))(*args)
    assert out["y"].numpy().tobytes() == ref["y"].numpy().tobytes()
    # and version 1's meta.json is checked field by field too
    meta["inputs"][0]["index"] = 9
    (v1 / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(LoadError, match="index"):
        S.load(str(v1))


# ---------------------------------------------------------------------------- replacing
def _outputs(path, x):
    return S.load(path)(x).numpy()


@pytest.fixture
def two_renames(monkeypatch):
    """Publish with two renames, as where renameat2(RENAME_EXCHANGE) is missing."""
    monkeypatch.setattr(_atomic, "exchange", lambda a, b: False)


def test_replacing_a_program_is_one_atomic_exchange_on_linux(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").touch()
    if not _atomic.exchange(str(a), str(b)):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    assert os.listdir(b) == ["x"] and os.listdir(a) == []
    path = str(tmp_path / "m.sampan")
    x = sampan.randn(4, 5)
    S.save(_model(0), path, (x,))
    new_m = _model(1)

    def never(src, dst):   # no rename at all: the exchange alone publishes
        raise AssertionError("os.replace called")
    monkeypatch.setattr(os, "replace", never)
    S.save(new_m, path, (x,))
    monkeypatch.undo()
    np.testing.assert_allclose(_outputs(path, x), new_m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "m.sampan"]


@pytest.mark.usefixtures("two_renames")
def test_crash_between_the_two_renames_is_recovered_on_load(tmp_path, monkeypatch):
    path = str(tmp_path / "m.sampan")
    x = sampan.randn(4, 5)
    old_m, new_m = _model(0), _model(1)
    S.save(old_m, path, (x,))
    real, calls = os.replace, []

    def crash_after_first(src, dst):   # the process "dies" after the old one is moved
        calls.append((src, dst))
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(src, dst)
    monkeypatch.setattr(os, "replace", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        S.save(new_m, path, (x,))
    monkeypatch.undo()
    assert not os.path.exists(path)   # nothing under the final name ...
    got = _outputs(path, x)            # ... but load puts the new program in place
    np.testing.assert_array_equal(got, S.load(path)(x).numpy())
    np.testing.assert_allclose(got, new_m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["m.sampan"]


@pytest.mark.usefixtures("two_renames")
def test_failed_first_rename_keeps_the_old_program(tmp_path, monkeypatch):
    path = str(tmp_path / "m.sampan")
    x = sampan.randn(4, 5)
    old_m = _model(0)
    S.save(old_m, path, (x,))

    def fail(src, dst):
        raise OSError("simulated")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        S.save(_model(1), path, (x,))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["m.sampan"]
    np.testing.assert_allclose(_outputs(path, x), old_m(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("two_renames")
def test_failed_second_rename_puts_the_old_program_back(tmp_path, monkeypatch):
    path = str(tmp_path / "m.sampan")
    x = sampan.randn(4, 5)
    old_m = _model(0)
    S.save(old_m, path, (x,))
    real, calls = os.replace, []

    def fail_second(src, dst):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("simulated")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", fail_second)
    with pytest.raises(OSError):
        S.save(_model(1), path, (x,))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["m.sampan"]
    np.testing.assert_allclose(_outputs(path, x), old_m(x).numpy(), rtol=1e-5, atol=1e-6)


def test_next_save_removes_temporaries_of_killed_saves_only(tmp_path):
    path = str(tmp_path / "m.sampan")
    x = sampan.randn(4, 5)
    dead = tmp_path / "m.sampan.tmp-0123456789abcdef"
    (dead / "sub").mkdir(parents=True)
    (dead / "graph.ir").write_text("half")
    dead_old = tmp_path / "m.sampan.old-deadbeef"   # left by an older sampan
    dead_old.mkdir()
    live = tmp_path / "m.sampan.tmp-fedcba9876543210"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)   # another process is writing it
    try:
        S.save(_model(), path, (x,))
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["m.sampan", live.name]


def test_saved_files_honour_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        path = S.save(_model(), str(tmp_path / "m.sampan"), (sampan.randn(2, 5),))
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o750
    for n in FILES:
        assert os.stat(os.path.join(path, n)).st_mode & 0o777 == 0o640, n


# ---------------------------------------------------------------------------- 0-d, memory
def test_zero_d_state_and_inputs_stay_zero_d(tmp_path):
    m = _model()
    m.train()
    for _ in range(2):
        m(sampan.randn(6, 5))
    m.eval()
    x, s = sampan.randn(4, 5), sampan.tensor(np.float32(0.5))
    path = S.save(m, str(tmp_path / "bn.sampan"), (x,))
    loaded = S.load(path)
    for spec, v in zip(loaded.meta["inputs"], loaded.graph.inputs):
        if spec["kind"] != "arg":
            assert loaded.arrays[spec["key"]].shape == v.shape, spec
    np.testing.assert_allclose(loaded(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    # the counter is stored where the program reads it: in training mode, which counts
    m.train()
    loaded = S.load(S.save(m, str(tmp_path / "bn-train.sampan"), (x,)))
    m.eval()
    nbt = [k for k in loaded.arrays if k.endswith("num_batches_tracked")]
    assert nbt and loaded.arrays[nbt[0]].shape == () and int(loaded.arrays[nbt[0]]) == 2
    # a 0-d example input comes back 0-d
    w = sampan.randn(5, 3)
    p2 = S.save(lambda x, s: (x @ w) * s, str(tmp_path / "s.sampan"), (x, s))
    ex = S.load(p2).example_inputs
    assert ex[1].shape == () and ex[0].shape == (4, 5)
    # the reference: torch keeps a BatchNorm's counter 0-d in its state dict
    assert torch.nn.BatchNorm1d(8).state_dict()["num_batches_tracked"].shape == ()


_RSS_PROBE = """
import sys
from sampan.jit import serialize as S


def status(key):
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key + ":"))
S.read(sys.argv[1])                       # the imports a read needs, on a small program
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")                          # reset the peak (VmHWM) to the current size
base = status("VmRSS")
S.read(sys.argv[2])
print(status("VmHWM") - base)
"""


def test_load_reads_weights_without_extra_copies(tmp_path):
    # peak resident memory of a fresh process, so that memory-mapped copies count too
    # (safetensors' load_file maps the file and copies every array out of it: 2x)
    sampan.manual_seed(0)
    x = sampan.randn(2, 1024)
    small = S.save(nn.Linear(1024, 4), str(tmp_path / "small.sampan"), (x,), passes=[])
    big = S.save(nn.Sequential(nn.Linear(1024, 2048), nn.Linear(2048, 1024)),
                 str(tmp_path / "big.sampan"), (x,), passes=[])
    size = os.path.getsize(os.path.join(big, "weights.safetensors"))
    assert size > 16 << 20
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak")
    r = subprocess.run([sys.executable, "-c", _RSS_PROBE, small, big], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    growth = int(r.stdout.split()[-1])
    assert 0.9 * size <= growth <= 1.3 * size, (growth, size)
    tracemalloc.start()   # and within this process, what Python allocates
    try:
        S.read(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 1.3 * size, (peak, size)


def test_a_program_written_by_the_version_1_writer_still_loads(tmp_path):
    # written by sampan.jit.save of main on 2026-12-01 (format 1: checksums in meta.json,
    # a bfloat16 buffer stored as uint16)
    import shutil

    data = pathlib.Path(__file__).parent / "data"
    path = tmp_path / "v1_program"
    shutil.copytree(data / "v1_program", path)
    m = S.load(str(path))
    assert m.meta["version"] == 1 and m.arrays["input.3.scale"].dtype == sampan.dtypes.bfloat16
    x = sampan.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    want = np.load(data / "v1_program.expected.npy")
    assert m(x)["y"].numpy().tobytes() == want.tobytes()
    # its graph and weights stay covered by the checksums version 1 kept
    p = path / "weights.safetensors"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(LoadError, match="damaged"):
        S.load(str(path))


@pytest.mark.parametrize("exchange", [True, False])
def test_replacing_works_in_any_folder_and_with_a_trailing_slash(tmp_path, monkeypatch,
                                                                  exchange):
    if not exchange:
        monkeypatch.setattr(_atomic, "exchange", lambda a, b: False)
    folder = tmp_path / "runs.tmp-0123456789abcdef"   # looks like a temporary itself
    folder.mkdir()
    x = sampan.randn(4, 5)
    path = str(folder / "m.sampan") + os.sep
    S.save(_model(0), path, (x,))
    new_m = _model(1)
    S.save(new_m, path, (x,))
    np.testing.assert_allclose(_outputs(path, x), new_m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert os.listdir(folder) == ["m.sampan"] and os.path.isdir(folder)


_KILLED_SAVE = """
import os, signal, sys
import sampan
from sampan import nn
from sampan.io import _atomic
from sampan.io import _tensorfile
from sampan.jit import serialize as S

path, where = sys.argv[1], sys.argv[2]
_atomic.exchange = lambda a, b: False      # the two-rename path
real_replace, real_write, calls = os.replace, _tensorfile.write, []


def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)   # no handler, no finally: a real crash


def replace(src, dst):
    calls.append(src)
    if where == "between-renames" and len(calls) == 2:
        die()
    return real_replace(src, dst)


os.replace = replace
if where == "writing-weights":
    _tensorfile.write = die
sampan.manual_seed(1)
m = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
m.eval()
S.save(m, path, (sampan.randn(4, 5),))
"""


@pytest.mark.parametrize("where", ["between-renames", "writing-weights"])
def test_a_killed_save_leaves_a_loadable_program(tmp_path, where):
    path = str(tmp_path / "m.sampan")
    x = sampan.randn(4, 5)
    old_m, new_m = _model(0), _model(1)
    S.save(old_m, path, (x,))
    r = subprocess.run([sys.executable, "-c", _KILLED_SAVE, path, where], timeout=120,
                       capture_output=True, text=True, check=False)
    assert r.returncode == -9, r.stderr
    assert len(os.listdir(tmp_path)) == 2   # the program (or its set-aside copy) + the new
    want = new_m if where == "between-renames" else old_m
    np.testing.assert_allclose(_outputs(path, x), want(x).numpy(), rtol=1e-5, atol=1e-6)
    S.save(new_m, path, (x,))   # and the next save cleans up whatever the killed one left
    assert os.listdir(tmp_path) == ["m.sampan"]
