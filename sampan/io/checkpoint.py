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
It reads the file once, in order, each array straight into its own buffer (see
`_tensorfile`): a load peaks at about the file's size.

A 0-d array (a BatchNorm's ``num_batches_tracked``) is stored with shape ``[]``. Writers
before 2026-12 stored it as ``[1]``, which the format cannot tell from a real (1,)
array: such files load as they always did. The layout did not change, so the version
stays 1 (older readers read the new files).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct

import numpy as np

from sampan.errors import SampanError

from .. import _atomic
from .. import _tensorfile as _tf

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "CheckpointError", "load", "save"]

FORMAT_NAME = "sampan.checkpoint"
FORMAT_VERSION = 1
MAGIC = b"SAMPANCK"
_PREFIX = struct.Struct("<8sIQ32s")  # magic, version, header length, header sha256


class CheckpointError(SampanError, RuntimeError):
    """A checkpoint cannot be written or read back faithfully."""


_ST_CODES = _tf.CODES   # numpy dtype name -> safetensors dtype code


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
        arr = _tf.contiguous(arr)   # keeps a 0-d array 0-d
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


# ---------------------------------------------------------------------------- public API
def save(obj, path) -> None:
    """Write `obj` (nested dicts/lists/tuples of Tensors, arrays, scalars) to `path` atomically.

    The bytes go to a temporary file in the same folder (mode 0o666 less the umask), are
    fsynced, then renamed over `path`; a failure at any point leaves an existing file at
    `path` untouched, and temporaries that killed saves left are removed.

    Example::

        >>> sampan.save({"model": model.state_dict(), "step": 10}, "ckpt.sampan")
    """
    enc = _Encoder()
    tree = enc.encode(obj)
    meta = {"format": FORMAT_NAME}
    head = _tf.header_bytes(enc.arrays, meta)
    digest = hashlib.sha256(head)
    for a in enc.arrays.values():   # hashed from the arrays' own buffers: no payload copy
        if a.nbytes:
            digest.update(a.reshape(-1).view(np.uint8))
    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "payload_nbytes": len(head) + sum(a.nbytes for a in enc.arrays.values()),
        "payload_sha256": digest.hexdigest(),
        "tree": tree,
    }
    hbytes = json.dumps(header, allow_nan=False, separators=(",", ":")).encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes), hashlib.sha256(hbytes).digest())

    def write(f):
        f.write(prefix)
        f.write(hbytes)
        _tf.write(f, enc.arrays, meta)
    _atomic.write_file(os.fspath(path), write)


def load(path):
    """Read a checkpoint written by `save`, verifying its version and checksums.

    Tensors come back as sampan Tensors, numpy arrays as numpy arrays. The file is read
    once, in order: the fixed prefix first (a file of another kind is refused before
    more of it is read), then each array straight into its own buffer.

    Example::

        >>> state = sampan.load("ckpt.sampan"); model.load_state_dict(state["model"])
    """
    path = os.fspath(path)
    where = f"load('{path}')"
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(_PREFIX.size)
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
            raise CheckpointError(f"{where}: invalid format version {version}; the file is "
                                  "corrupt")
        if len(data) < _PREFIX.size:
            raise CheckpointError(f"{where}: the file is truncated ({len(data)} bytes)")
        _, _, hlen, hsum = _PREFIX.unpack_from(data, 0)
        start = _PREFIX.size
        if start + hlen > size:
            raise CheckpointError(
                f"{where}: the file is truncated: the header needs {start + hlen} bytes, "
                f"the file has {size}")
        hbytes = f.read(hlen)
        if hashlib.sha256(hbytes).digest() != hsum:
            raise CheckpointError(f"{where}: header checksum mismatch; the file is corrupt")
        header = _header(hbytes, version, where)
        have, want = size - start - hlen, header["payload_nbytes"]
        if have != want:
            what = "truncated" if have < want else "corrupt"
            raise CheckpointError(
                f"{where}: the file is {what}: the tensor payload has {have} bytes, "
                f"the header says {want}")
        digest = hashlib.sha256()
        try:
            arrays, _ = _tf.read(f, want, CheckpointError, f"{where}: tensor payload", digest)
        except CheckpointError:
            if digest.hexdigest() != header["payload_sha256"]:
                raise CheckpointError(f"{where}: tensor payload checksum mismatch; the file "
                                      "is corrupt") from None
            raise
    if digest.hexdigest() != header["payload_sha256"]:
        raise CheckpointError(f"{where}: tensor payload checksum mismatch; the file is corrupt")
    try:
        return _decode(header["tree"], arrays)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise CheckpointError(f"{where}: the header's tree is malformed ({type(e).__name__}: "
                              f"{e}); the file was not written by sampan.save") from None


def _header(hbytes: bytes, version: int, where: str) -> dict:
    try:
        header = json.loads(hbytes.decode("utf-8"))
    except ValueError as e:  # cannot happen with a matching checksum unless written badly
        raise CheckpointError(f"{where}: the header is not valid JSON ({e})") from None
    if (not isinstance(header, dict) or header.get("format") != FORMAT_NAME
            or header.get("format_version") != version):
        raise CheckpointError(f"{where}: the header does not describe a {FORMAT_NAME} "
                              f"version {version}; the file is corrupt")
    n, h = header.get("payload_nbytes"), header.get("payload_sha256")
    if type(n) is not int or n < 0 or not isinstance(h, str) or "tree" not in header:
        raise CheckpointError(f"{where}: the header lacks a valid payload_nbytes, "
                              "payload_sha256 or tree; the file is corrupt")
    return header
