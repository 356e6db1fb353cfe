"""The embedding snapshot file format: a prelude (magic, version, header length), a JSON
header, the arrays, and a trailing sha256 over every byte before it. `_write_atomic`
writes one (temporary name, fsync, rename); `read_snapshot` checks the prelude, the
header's claims against the file size and the digest while reading each array into its
own buffer. What goes into a file (exports, deltas, shards, lineage) is `snapshot`'s,
which re-exports these names."""
from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np

from sampan.errors import SampanError
from sampan import _atomic


MAGIC = b"SMPNEMB\0"
# Version 2 added lineage: every table file names the table it came from (``lineage``),
# and a shard file its place in a sharded export (``shard``). Version 1 full files still
# read (they restore into a table of a new lineage); version 1 deltas are refused, since
# nothing in them ties them to a table.
FORMAT_VERSION = 2
_READS = (1, 2)
_PRE = struct.Struct("<8sIQ")
_CHUNK = 1 << 20
_ARRAY_KINDS = "biuf"  # plain numbers only: an object dtype would read pointers from disk


class SnapshotError(SampanError, ValueError):
    """A snapshot file is damaged, of an unknown version, foreign, or out of sequence."""


def _write_atomic(path: str, header: dict, arrays: dict[str, np.ndarray]) -> None:
    specs, offset = [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        arrays[name] = a
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                      "offset": offset, "nbytes": a.nbytes})
        offset += a.nbytes
    head = json.dumps({**header, "arrays": specs}, sort_keys=True).encode()
    digest = hashlib.sha256()

    def write(f):
        for chunk in [_PRE.pack(MAGIC, FORMAT_VERSION, len(head)), head,
                      *(memoryview(a).cast("B") for a in arrays.values() if a.nbytes)]:
            f.write(chunk)
            digest.update(chunk)
        f.write(digest.digest())

    # sweep: a killed write of another file of the chain (its name is never written
    # again) leaves a temporary as large as a snapshot; the next write removes it
    _atomic.write_file(path, write, sweep=True)


def _array_specs(path: str, header, body: int) -> list[tuple[str, np.dtype, tuple, int]]:
    """Check what the header claims about its arrays against the file; returns the specs.

    Run before anything is allocated, so a damaged or hostile header can make the reader
    allocate at most the file's own size, and only plain numeric arrays.
    """
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        raise SnapshotError(f"{path}: header has no array list")
    out, offset, names = [], 0, set()
    for spec in header["arrays"]:
        try:
            name, dt = str(spec["name"]), np.dtype(str(spec["dtype"]))
            shape = tuple(int(d) for d in spec["shape"])
            off, nbytes = int(spec["offset"]), int(spec["nbytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{path}: unreadable array entry {spec!r} ({exc})") from None
        if dt.kind not in _ARRAY_KINDS or dt.hasobject or dt.fields is not None:
            raise SnapshotError(f"{path}: array {name!r} has dtype {dt.str}; snapshots "
                                f"hold only bool, integer and float arrays")
        if any(d < 0 for d in shape) or nbytes != int(np.prod(shape)) * dt.itemsize:
            raise SnapshotError(f"{path}: array {name!r} claims {nbytes} bytes for shape "
                                f"{list(shape)} of {dt.str}")
        if off != offset or name in names:
            raise SnapshotError(f"{path}: array {name!r} at offset {off}, expected {offset}")
        names.add(name)
        offset += nbytes
        out.append((name, dt, shape, nbytes))
    if offset != body:
        raise SnapshotError(f"{path}: header describes {offset} bytes of arrays, the file "
                            f"holds {body} (truncated or damaged)")
    return out


def read_snapshot(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read and verify one snapshot file: ``(header, arrays)``; raises SnapshotError.

    The fixed prelude (magic, version, header length) is checked before anything else is
    read, and each array is read straight into its own buffer while the checksum runs,
    so a foreign file costs a few bytes and a snapshot about its own size in memory.
    ``header["format_version"]`` says which version the file was written in.

    >>> # header, arrays = read_snapshot("emb.full"); arrays["weights"].shape
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pre = f.read(_PRE.size)
        if len(pre) < _PRE.size or size < _PRE.size + 32:
            raise SnapshotError(f"{path}: truncated ({size} bytes), not a sampan snapshot")
        magic, version, head_len = _PRE.unpack(pre)
        if magic != MAGIC:
            raise SnapshotError(f"{path}: bad magic {magic!r}, expected {MAGIC!r}")
        if version not in _READS:
            raise SnapshotError(f"{path}: format version {version}, this sampan reads "
                                f"versions {', '.join(map(str, _READS))}")
        body = size - _PRE.size - 32 - head_len
        if body < 0:
            raise SnapshotError(f"{path}: truncated (header of {head_len} bytes in a file "
                                f"of {size})")
        digest = hashlib.sha256(pre)
        head = f.read(head_len)
        digest.update(head)
        try:
            header = json.loads(head)
            specs = _array_specs(path, header, body)
        except (ValueError, RecursionError) as exc:  # SnapshotError is a ValueError
            problem = exc
        else:
            problem = None
        if problem is not None:
            # A damaged file is the likelier cause: check the checksum (streaming the rest
            # through it, nothing kept) before blaming the header itself.
            left = size - 32 - f.tell()
            while left > 0 and (chunk := f.read(min(_CHUNK, left))):
                digest.update(chunk)
                left -= len(chunk)
            _check_digest(path, digest, f, size)
            raise SnapshotError(f"{path}: bad header: {problem}") from None
        arrays = {}
        for name, dt, shape, nbytes in specs:
            a = np.empty(shape, dt)
            buf = a.reshape(-1).view(np.uint8)
            if nbytes and f.readinto(buf) != nbytes:
                raise SnapshotError(f"{path}: truncated inside array {name!r}")
            digest.update(buf)
            arrays[name] = a
        _check_digest(path, digest, f, size)
    header.pop("arrays")
    header["format_version"] = version
    return header, arrays


def _check_digest(path: str, digest, f, size: int) -> None:
    f.seek(size - 32)
    if digest.digest() != f.read(32):
        raise SnapshotError(f"{path}: checksum mismatch (file damaged or truncated)")
