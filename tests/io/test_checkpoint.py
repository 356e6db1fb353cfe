"""Checkpoint round trips, corruption detection and atomic writes."""
import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest

from sampan.io import CheckpointError, load, save
from sampan.io import checkpoint as ckpt
from sampan.tensor import Tensor

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8,
          np.int16, np.int32, np.int64, np.uint32, np.bool_]


def _random(dtype, shape, rng):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    # random bit patterns cover subnormals, infinities and NaN payloads of every float type
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_bit_exact_every_dtype(tmp_path, dtype):
    rng = np.random.default_rng(0)
    arr = _random(dtype, (3, 5), rng)
    t = Tensor(_random(dtype, (4,), rng)) if np.dtype(dtype) != np.uint32 else None
    obj = {"arr": arr, "scalar_arr": arr[0, 0].copy().reshape(()), "empty": arr[:0]}
    if t is not None:
        obj["tensor"] = t
    save(obj, tmp_path / "c.ck")
    back = load(tmp_path / "c.ck")
    for key, value in obj.items():
        src = value.numpy() if isinstance(value, Tensor) else value
        got = back[key]
        assert type(got) is type(value)
        got = got.numpy() if isinstance(got, Tensor) else got
        assert got.dtype == src.dtype and got.shape == src.shape
        assert _bits(got) == _bits(src)


def test_nested_model_and_optimiser_state(tmp_path):
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    state = {
        "model": {"fc.weight": w, "fc.bias": Tensor(np.zeros(2, np.float32)),
                  "bn.running_mean": np.ones(2), "bn.num_batches": np.int64(7)},
        "optim": {
            "state": {0: {"step": 3, "exp_avg": np.full(3, 0.5, ml_dtypes.bfloat16)}, 1: {}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                              "params": [0, 1], "nesterov": False, "name": None}],
        },
        "epoch": 4, "best": float("inf"), "nan": float("nan"), "neg_zero": -0.0,
        "tags": ["a", ("b", 2)], "big": 2**70,
    }
    save(state, tmp_path / "s.ck")
    back = load(tmp_path / "s.ck")
    assert isinstance(back["model"]["fc.weight"], Tensor)
    assert back["model"]["fc.weight"].requires_grad
    assert not back["model"]["fc.bias"].requires_grad
    np.testing.assert_array_equal(back["model"]["fc.weight"].numpy(), w.numpy())
    assert isinstance(back["model"]["bn.running_mean"], np.ndarray)
    assert back["model"]["bn.num_batches"] == 7
    assert isinstance(back["model"]["bn.num_batches"], np.int64)
    assert set(back["optim"]["state"]) == {0, 1}  # int keys survive
    assert back["optim"]["state"][0]["exp_avg"].dtype == ml_dtypes.bfloat16
    assert back["optim"]["param_groups"][0] == state["optim"]["param_groups"][0]
    assert back["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert back["epoch"] == 4 and back["best"] == float("inf") and np.isnan(back["nan"])
    assert str(back["neg_zero"]) == "-0.0"
    assert back["tags"] == ["a", ("b", 2)] and back["big"] == 2**70
    back["model"]["bn.running_mean"][0] = 5  # loaded arrays are writable


def test_non_contiguous_and_big_endian_arrays(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T
    b = np.arange(4, dtype=">i4")
    save([a, b], tmp_path / "x.ck")
    a2, b2 = load(tmp_path / "x.ck")
    np.testing.assert_array_equal(a2, a)
    np.testing.assert_array_equal(b2, b)


def test_unsupported_object_is_rejected_with_its_path(tmp_path):
    with pytest.raises(CheckpointError, match=r"type set at 'opt\.groups\.0'"):
        save({"opt": {"groups": [{1, 2}]}}, tmp_path / "bad.ck")
    assert not os.path.exists(tmp_path / "bad.ck")


@pytest.fixture
def written(tmp_path):
    path = tmp_path / "c.ck"
    save({"w": np.arange(100, dtype=np.float32), "lr": 0.5}, path)
    return path


def test_truncated_file_raises(written):
    data = written.read_bytes()
    for cut in (0, 5, 30, 60, len(data) - 1):
        written.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="truncated|not a sampan checkpoint"):
            load(written)
    written.write_bytes(data[:len(data) - 7])
    with pytest.raises(CheckpointError, match="the file is truncated"):
        load(written)


def test_any_flipped_byte_raises(written):
    data = written.read_bytes()
    # every byte of the file (a stride keeps it quick): none may load wrong numbers
    for pos in range(0, len(data), 3):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        written.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError):
            load(written)


def test_flipped_payload_byte_message(written):
    data = bytearray(written.read_bytes())
    data[-10] ^= 0xFF
    written.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="payload checksum mismatch; the file is corrupt"):
        load(written)


def test_flipped_header_byte_message(written):
    data = bytearray(written.read_bytes())
    data[ckpt._PREFIX.size + 3] ^= 0x01
    written.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="header checksum mismatch"):
        load(written)


def test_newer_format_version_raises(written, tmp_path):
    data = written.read_bytes()
    _, _, hlen, _ = ckpt._PREFIX.unpack_from(data, 0)
    header = json.loads(data[ckpt._PREFIX.size:ckpt._PREFIX.size + hlen])
    header["format_version"] = 2
    hbytes = json.dumps(header).encode()
    import hashlib

    prefix = ckpt._PREFIX.pack(ckpt.MAGIC, 2, len(hbytes), hashlib.sha256(hbytes).digest())
    written.write_bytes(prefix + hbytes + data[ckpt._PREFIX.size + hlen:])
    with pytest.raises(CheckpointError, match="format version 2, newer than the version 1"):
        load(written)


def test_not_a_checkpoint(tmp_path):
    p = tmp_path / "junk.ck"
    p.write_bytes(b"PK\x03\x04 definitely a zip file")
    with pytest.raises(CheckpointError, match="not a sampan checkpoint"):
        load(p)


def test_header_payload_mismatch_is_caught(tmp_path, monkeypatch):
    # a header that names a dtype the payload does not have (a writer bug) never loads
    real = ckpt._Encoder._array

    def lying(self, arr, path, kind, extra):
        node = real(self, arr, path, kind, extra)
        node["dtype"] = "float64"
        return node

    monkeypatch.setattr(ckpt._Encoder, "_array", lying)
    save({"w": np.ones(2, np.float32)}, tmp_path / "m.ck")
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="in the payload but float64"):
        load(tmp_path / "m.ck")


def test_failed_write_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "c.ck"
    save({"v": np.ones(3)}, path)
    before = path.read_bytes()

    def broken_fsync(fd):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ckpt.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        save({"v": np.zeros(3)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.ck"]  # the temporary file was removed
    np.testing.assert_array_equal(load(path)["v"], np.ones(3))


def test_failed_rename_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "c.ck"
    save({"v": np.ones(3)}, path)

    def broken_replace(src, dst):
        raise KeyboardInterrupt  # even an interrupt between write and rename

    monkeypatch.setattr(ckpt.os, "replace", broken_replace)
    with pytest.raises(KeyboardInterrupt):
        save({"v": np.zeros(3)}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["c.ck"]
    np.testing.assert_array_equal(load(path)["v"], np.ones(3))


def test_format_is_documented_prefix(written):
    data = written.read_bytes()
    magic, version, hlen = struct.unpack_from("<8sIQ", data, 0)
    assert magic == b"SAMPANCK" and version == ckpt.FORMAT_VERSION
    header = json.loads(data[52:52 + hlen])
    assert header["format"] == "sampan.checkpoint"
    assert len(data) == 52 + hlen + header["payload_nbytes"]
    from safetensors.numpy import load as st_load

    assert st_load(data[52 + hlen:])["w"].shape == (100,)  # the payload is plain safetensors
