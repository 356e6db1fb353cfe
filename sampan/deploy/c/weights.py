"""`weights.bin` of the C target: a 64-byte header, then the tensors, each 64-byte
aligned, little-endian.

Header (little-endian): magic ``SAMPANCW`` (8 bytes), format version (u32), tensor count
(u32), payload bytes (u64), payload checksum (u64), lineage (32 bytes: the sha256 of the
saved program's checksums file, so a weights file of another program is refused even
when its sizes match). The checksum is the sum, mod 2**64, of splitmix64(w ^ (i *
0x9E3779B97F4A7C15)) over the payload's little-endian u64 words w_i (a bijection per
word: any changed word changes the sum; cheap in C and vectorised in numpy).
"""
from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

from ...io import _atomic

MAGIC = b"SAMPANCW"
VERSION = 1
HEADER = 64
ALIGN = 64
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def checksum(payload: bytes) -> int:
    """The payload checksum (see the module doc); len(payload) % 8 == 0."""
    w = np.frombuffer(payload, dtype="<u8")
    i = np.arange(w.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = w ^ (i * _GOLD)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return int(z.sum(dtype=np.uint64))


def lineage(program_dir) -> bytes:
    """sha256 of the program's checksums file (or of its graph text)."""
    for name in ("checksums.sha256", "graph.ir"):
        p = os.path.join(os.fspath(program_dir), name)
        if os.path.exists(p):
            with open(p, "rb") as f:
                return hashlib.sha256(f.read()).digest()
    return hashlib.sha256(b"").digest()


def layout(tensors):
    """Offsets (into the payload) of each array of `tensors`, and the payload size."""
    offs, at = [], 0
    for a in tensors:
        offs.append(at)
        at += -(-max(a.nbytes, 1) // ALIGN) * ALIGN
    return offs, at


def write(path, tensors, lin: bytes):
    """Write `tensors` (numpy arrays, in order) as weights.bin; returns (offsets,
    payload bytes, checksum)."""
    offs, size = layout(tensors)
    payload = bytearray(size)
    for a, o in zip(tensors, offs):
        b = np.ascontiguousarray(a)
        b = b.astype(b.dtype.newbyteorder("<"), copy=False)
        payload[o:o + b.nbytes] = b.tobytes()
    payload = bytes(payload)
    h = checksum(payload)
    head = MAGIC + struct.pack("<IIQQ", VERSION, len(tensors), size, h) + lin
    assert len(head) == HEADER
    _atomic.write_file(path, lambda f: (f.write(head), f.write(payload)))
    return offs, size, h


def pack_panels(b: np.ndarray, nr: int) -> np.ndarray:
    """B (K x N float32) packed for the GEMM micro-kernel: panels of `nr` columns, each
    K rows of nr, zero past N."""
    k, n = b.shape
    p = -(-n // nr)
    out = np.zeros((p, k, nr), np.float32)
    for j in range(p):
        blk = b[:, j * nr:(j + 1) * nr]
        out[j, :, :blk.shape[1]] = blk
    return out
