"""Checkpoints: `save(obj, path)` and `load(path)` for nested state dicts.

A checkpoint is one file, so that a single `os.replace` publishes it atomically::

    offset 0    8 bytes   magic b"SAMPANCK"
    offset 8    4 bytes   format version, uint32 little-endian (this module writes 1)
    offset 12   8 bytes   N = length of the JSON header, uint64 little-endian
    offset 20   32 bytes  sha256 of the JSON header bytes
    offset 52   N bytes   JSON header, UTF-8
    offset 52+N           safetensors payload, to the end of the file

The JSON header holds ``format`` ("sampan.checkpoint"), ``format_version``,
``payload_nbytes``, ``payload_sha256`` (sha256 of the safetensors bytes) and ``tree``,
the structure of the saved object. In ``tree`` a JSON string, number, true/false or
null stands for itself; a JSON list is a Python list; other values are tagged objects:

* ``{"$dict": [[key, value], ...]}``  a dict (keys are trees too, so int keys survive)
* ``{"$tuple": [...]}``               a tuple
* ``{"$float": "nan" | "inf" | "-inf"}``  a non-finite float
* ``{"$tensor": name, "kind": "tensor" | "ndarray" | "scalar", "dtype": ..., "shape": [...]}``
  an array stored in the payload under ``name``; ``kind`` says whether it comes back
  as a sampan Tensor (with ``requires_grad``), a numpy array or a numpy scalar.

Every array lives in the safetensors payload, whose own header names its dtype
(BF16, F16, ... so bfloat16 round-trips bit-exactly) and shape. `load` checks the
magic, the version (before reading anything else), the lengths, both checksums and
that each array's dtype and shape match the tree; any failure raises `CheckpointError`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import tempfile

import numpy as np

from sampan.errors import SampanError

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "CheckpointError", "load", "save"]

FORMAT_NAME = "sampan.checkpoint"
FORMAT_VERSION = 1
MAGIC = b"SAMPANCK"
_PREFIX = struct.Struct("<8sIQ32s")  # magic, version, header length, header sha256


class CheckpointError(SampanError, RuntimeError):
    """A checkpoint cannot be written or read back faithfully."""


# numpy dtype name -> safetensors dtype code (the payload header spells dtypes this way)
_ST_CODES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
    "uint32": "U32", "int32": "I32", "uint64": "U64", "int64": "I64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
    "complex64": "C64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def _np_dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


# ---------------------------------------------------------------------------- encoding
class _Encoder:
    """Walks the object once, turning it into a JSON tree plus a name -> array table."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def _name_for(self, path: str) -> str:
        name = path or "value"
        if name in self.arrays:
            k = 1
            while f"{name}#{k}" in self.arrays:
                k += 1
            name = f"{name}#{k}"
        return name

    def _array(self, arr: np.ndarray, path: str, kind: str, extra: dict) -> dict:
        dt = arr.dtype.name
        if dt not in _ST_CODES:
            raise CheckpointError(
                f"save: cannot store an array of dtype {arr.dtype} at '{path}'; supported "
                f"dtypes: {', '.join(_ST_CODES)}")
        arr = np.ascontiguousarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        name = self._name_for(path)
        self.arrays[name] = arr
        node = {"$tensor": name, "kind": kind, "dtype": dt, "shape": list(arr.shape)}
        node.update(extra)
        return node

    def encode(self, obj, path: str = ""):
        from sampan.tensor import Tensor

        if isinstance(obj, np.str_):
            return str(obj)
        if isinstance(obj, np.generic):  # before float: np.float64 subclasses float
            return self._array(np.asarray(obj), path, "scalar", {})
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            if math.isfinite(obj):
                return float(obj)
            return {"$float": repr(float(obj))}
        if isinstance(obj, Tensor):
            extra = {"requires_grad": bool(obj.requires_grad)}
            return self._array(np.asarray(obj.numpy()), path, "tensor", extra)
        if isinstance(obj, np.ndarray):
            return self._array(obj, path, "ndarray", {})
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                if not isinstance(k, (str, int, float, bool, type(None), tuple)):
                    raise CheckpointError(
                        f"save: dict key {k!r} at '{path}' has type {type(k).__name__}; "
                        "keys must be str, int, float, bool, None or tuples of those")
                sub = f"{path}.{k}" if path else str(k)
                items.append([self.encode(k, sub + "<key>"), self.encode(v, sub)])
            return {"$dict": items}
        if isinstance(obj, (list, tuple)):
            vals = [self.encode(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
            return vals if isinstance(obj, list) else {"$tuple": vals}
        raise CheckpointError(
            f"save: cannot store an object of type {type(obj).__name__} at '{path or '<root>'}'; "
            "a checkpoint holds dicts, lists, tuples, Tensors, numpy arrays, numbers, "
            "strings and None")


def _decode(node, arrays: dict, path: str = "<root>"):
    if node is None or isinstance(node, (bool, str, int, float)):
        return node
    if isinstance(node, list):
        return [_decode(v, arrays, f"{path}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        raise CheckpointError(f"load: malformed tree node at {path}: {node!r}")
    if "$dict" in node:
        return {_hashable(_decode(k, arrays, path)): _decode(v, arrays, f"{path}[{k!r}]")
                for k, v in node["$dict"]}
    if "$tuple" in node:
        return tuple(_decode(v, arrays, f"{path}[{i}]") for i, v in enumerate(node["$tuple"]))
    if "$float" in node:
        return float(node["$float"])
    if "$tensor" in node:
        name = node["$tensor"]
        if name not in arrays:
            raise CheckpointError(f"load: array '{name}' named in the header is missing "
                                  "from the payload; the file is corrupt")
        arr = arrays[name]
        if arr.dtype.name != node["dtype"] or list(arr.shape) != list(node["shape"]):
            raise CheckpointError(
                f"load: array '{name}' is {arr.dtype.name}{list(arr.shape)} in the payload but "
                f"{node['dtype']}{node['shape']} in the header; the file is corrupt")
        kind = node.get("kind")
        if kind == "ndarray":
            return arr
        if kind == "scalar":
            return arr.reshape(())[()]
        if kind == "tensor":
            from sampan.tensor import Tensor

            return Tensor(arr, requires_grad=bool(node.get("requires_grad", False)))
        raise CheckpointError(f"load: unknown array kind {kind!r} at {path}")
    raise CheckpointError(f"load: malformed tree node at {path}: {node!r}")


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


# ---------------------------------------------------------------------------- payload
def _serialize_arrays(arrays: dict) -> bytes:
    from safetensors import TensorSpec, serialize

    specs = {
        name: TensorSpec(dtype=arr.dtype.name, shape=list(arr.shape),
                         data_ptr=arr.ctypes.data, data_len=arr.nbytes)
        for name, arr in arrays.items()
    }
    # `arrays` keeps every buffer alive while the serializer reads the raw pointers
    return bytes(serialize(specs, metadata={"format": FORMAT_NAME}))


def _deserialize_arrays(payload: bytes) -> dict:
    from safetensors import deserialize

    codes = {v: k for k, v in _ST_CODES.items()}
    out = {}
    for name, view in deserialize(payload):
        code = view["dtype"]
        if code not in codes:
            raise CheckpointError(f"load: array '{name}' has unsupported dtype {code}")
        dt = _np_dtype(codes[code])
        out[name] = np.frombuffer(view["data"], dtype=dt).reshape(view["shape"])
    return out


# ---------------------------------------------------------------------------- public API
def save(obj, path) -> None:
    """Write `obj` (nested dicts/lists/tuples of Tensors, arrays, scalars) to `path` atomically.

    The bytes go to a temporary file in the same folder, are fsynced, then renamed over
    `path`; a failure at any point leaves an existing file at `path` untouched.

    Example::

        >>> sampan.save({"model": model.state_dict(), "step": 10}, "ckpt.sampan")
    """
    enc = _Encoder()
    tree = enc.encode(obj)
    payload = _serialize_arrays(enc.arrays)
    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "payload_nbytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "tree": tree,
    }
    hbytes = json.dumps(header, allow_nan=False, separators=(",", ":")).encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes), hashlib.sha256(hbytes).digest())
    _atomic_write(os.fspath(path), (prefix, hbytes, payload))


def _atomic_write(path: str, chunks) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    # make the rename itself durable; not every platform lets us open a folder
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def load(path):
    """Read a checkpoint written by `save`, verifying its version and checksums.

    Tensors come back as sampan Tensors, numpy arrays as numpy arrays.

    Example::

        >>> state = sampan.load("ckpt.sampan"); model.load_state_dict(state["model"])
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    where = f"load('{path}')"
    if len(data) < 12 or data[:8] != MAGIC:
        if len(data) < 12 and MAGIC.startswith(data[:8]):
            raise CheckpointError(f"{where}: the file is truncated ({len(data)} bytes)")
        raise CheckpointError(f"{where}: not a sampan checkpoint (bad magic bytes)")
    version = struct.unpack_from("<I", data, 8)[0]
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{where}: the file has format version {version}, newer than the version "
            f"{FORMAT_VERSION} this sampan reads; upgrade sampan to load it")
    if version < 1:
        raise CheckpointError(f"{where}: invalid format version {version}; the file is corrupt")
    if len(data) < _PREFIX.size:
        raise CheckpointError(f"{where}: the file is truncated ({len(data)} bytes)")
    _, _, hlen, hsum = _PREFIX.unpack_from(data, 0)
    start = _PREFIX.size
    if start + hlen > len(data):
        raise CheckpointError(
            f"{where}: the file is truncated: the header needs {start + hlen} bytes, "
            f"the file has {len(data)}")
    hbytes = data[start:start + hlen]
    if hashlib.sha256(hbytes).digest() != hsum:
        raise CheckpointError(f"{where}: header checksum mismatch; the file is corrupt")
    try:
        header = json.loads(hbytes.decode("utf-8"))
    except ValueError as e:  # cannot happen with a matching checksum unless written badly
        raise CheckpointError(f"{where}: the header is not valid JSON ({e})") from None
    if header.get("format") != FORMAT_NAME or header.get("format_version") != version:
        raise CheckpointError(f"{where}: the header does not describe a {FORMAT_NAME} "
                              f"version {version}; the file is corrupt")
    payload = data[start + hlen:]
    if len(payload) != header["payload_nbytes"]:
        what = "truncated" if len(payload) < header["payload_nbytes"] else "corrupt"
        raise CheckpointError(
            f"{where}: the file is {what}: the tensor payload has {len(payload)} bytes, "
            f"the header says {header['payload_nbytes']}")
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise CheckpointError(f"{where}: tensor payload checksum mismatch; the file is corrupt")
    try:
        arrays = _deserialize_arrays(payload)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors rejects a payload it cannot parse
        raise CheckpointError(f"{where}: the tensor payload cannot be parsed ({e})") from None
    return _decode(header["tree"], arrays)
