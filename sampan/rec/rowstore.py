"""Row storage of a hash embedding table: float32 chunks, or compressed rows.

Every store a :class:`~sampan.rec.table.HashEmbeddingTable` keeps its weights in answers
one small contract, the seam where other tiers and widths plug in:

- ``width``, ``shift`` (rows per chunk ``2**shift``), ``capacity``, ``ensure(n_rows)``;
- ``gather(rows, out=None) -> float32 (n, width)`` (rows < 0 left untouched) and
  ``scatter(rows, float32 values, round_keys=None)`` (rows < 0 skipped);
- ``raw(rows) -> {name: array}`` and ``set_raw(rows, raw)``: the stored form, exactly, as
  snapshot files carry it (``"values"``, and ``"scale"`` for int8), and
  :func:`raw_specs` to check a file's arrays against a row dtype;
- ``row_dtype``, ``bytes_per_row``, ``nbytes``, and ``addressable``: True only for a
  store whose float32 rows numba kernels may update in place through ``bases``.

:class:`~sampan.rec.hashtable.ChunkedRows` (float32, numba kernels reach rows through
``bases``) is the plain store; :class:`CompressedRows` holds float16, bfloat16 or int8 rows
with a per-row bfloat16 scale (``|w| <= 127 * scale``; the scale rounds up, so no value
clips) and converts with numpy, chunk by chunk. A sparse optimiser updates a compressed
table through ``gather`` -> its float32 kernel -> ``scatter`` (its slots stay float32),
and passes ``round_keys`` so that a store that rounds stochastically (bfloat16 by
default) can: an update smaller than a step of the stored grid still moves the row in
expectation, and the noise is a hash of (key, lane), so a replayed push rounds the same
way. Which dtype rounds which way was measured on W4 (``benchmarks/embedding_tiers.py
--parts rows``, 200 steps, AUC of float32 rows 0.8120): bfloat16 0.8129 stochastic and
0.8126 to nearest; int8 0.8094 stochastic and 0.8110 to nearest (its per-row scale is
re-chosen on every write, and stochastic rounding then re-draws every lane of the row),
so int8 rounds to nearest unless ``stochastic`` is set.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from sampan.errors import SampanValueError, op_error
from sampan.rec.hashtable import ChunkedRows, hash_ids

__all__ = ["ROW_DTYPES", "CompressedRows", "make_rows", "raw_specs"]

ROW_DTYPES = ("float32", "float16", "bfloat16", "int8")
# how each row dtype is held in memory and in snapshot files (bfloat16 as its bits)
_STORED = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
           "int8": np.int8}
_F16_MAX = float(np.finfo(np.float16).max)
STOCHASTIC = {"float16": False, "bfloat16": True, "int8": False}  # measured: see above


def make_rows(width: int, shift: int, row_dtype: str = "float32"):
    """The store for ``row_dtype`` (one of :data:`ROW_DTYPES`).

    >>> make_rows(4, 10, "int8").bytes_per_row
    6
    """
    if row_dtype not in ROW_DTYPES:
        raise op_error(SampanValueError, "HashEmbeddingTable", f"row_dtype={row_dtype!r}",
                       f"one of {ROW_DTYPES}")
    if row_dtype == "float32":
        return ChunkedRows(width, shift)
    return CompressedRows(width, shift, row_dtype)


def raw_specs(row_dtype: str, n: int, width: int) -> dict:
    """``{name: (numpy dtype, shape)}`` of the stored form of ``n`` rows."""
    specs = {"values": (np.dtype(_STORED[row_dtype]), (n, width))}
    if row_dtype == "int8":
        specs["scale"] = (np.dtype(np.uint16), (n,))
    return specs


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _uniform(round_keys: np.ndarray, width: int) -> np.ndarray:
    """Uniform [0, 1) float32 noise per (row key, lane): a hash, so it repeats exactly."""
    k = np.asarray(round_keys, np.int64)[:, None] * np.int64(width) + np.arange(width)
    h = hash_ids(k.ravel()).reshape(k.shape)
    return (h >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


class CompressedRows:
    """Rows of ``width`` values held as float16, bfloat16 or int8 (+ per-row scale).

    >>> c = CompressedRows(2, 4, "int8"); c.ensure(3)
    >>> c.scatter([1], np.array([[0.5, -1.0]], np.float32)); c.gather([1]).round(2).tolist()
    [[0.5, -1.0]]
    """

    def __init__(self, width: int, shift: int, row_dtype: str):
        if row_dtype not in ROW_DTYPES[1:]:
            raise op_error(SampanValueError, "CompressedRows", f"row_dtype={row_dtype!r}",
                           f"one of {ROW_DTYPES[1:]}")
        if width < 1:
            raise ValueError(f"row width must be >= 1, got {width}")
        self.width, self.shift, self.row_dtype = int(width), int(shift), row_dtype
        self.addressable = False  # no float32 rows in place: optimisers gather/scatter
        self._dtype = _STORED[row_dtype]
        self.stochastic = STOCHASTIC[row_dtype]  # round optimiser writes stochastically
        self.chunks: list[np.ndarray] = []
        self.scales: list[np.ndarray] = []  # int8: bfloat16 bits of each row's scale

    @property
    def capacity(self) -> int:
        """Rows addressable without adding a chunk."""
        return len(self.chunks) << self.shift

    @property
    def bytes_per_row(self) -> int:
        """Bytes one row takes (values, and the int8 scale)."""
        if self.row_dtype == "int8":
            return self.width + 2
        return self.width * np.dtype(self._dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes held by all chunks."""
        return sum(c.nbytes for c in self.chunks) + sum(s.nbytes for s in self.scales)

    def ensure(self, n_rows: int) -> None:
        """Add zeroed chunks until rows ``0 .. n_rows-1`` exist."""
        while self.capacity < n_rows:
            self.chunks.append(np.zeros((1 << self.shift, self.width), self._dtype))
            if self.row_dtype == "int8":
                self.scales.append(np.zeros(1 << self.shift, np.uint16))

    def _groups(self, rows: np.ndarray):
        """``(chunk, positions in rows, offsets in chunk)`` for the rows >= 0, by chunk."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        pos = np.flatnonzero(rows >= 0)
        if pos.size == 0:
            return
        r = rows[pos]
        if r.max() >= self.capacity:
            raise IndexError(f"row {r.max()} out of range for {self.capacity} rows")
        ch = r >> self.shift
        off = r & ((1 << self.shift) - 1)
        if ch[0] == ch.min() == ch.max():
            yield int(ch[0]), pos, off
            return
        order = np.argsort(ch, kind="stable")
        cuts = np.flatnonzero(np.diff(ch[order])) + 1
        for seg in np.split(order, cuts):
            yield int(ch[seg[0]]), pos[seg], off[seg]

    def _decode(self, c: int, off: np.ndarray) -> np.ndarray:
        v = self.chunks[c][off]
        if self.row_dtype == "float16":
            return v.astype(np.float32)
        if self.row_dtype == "bfloat16":
            return _from_bf16(v)
        return v.astype(np.float32) * _from_bf16(self.scales[c][off])[:, None]

    def _encode(self, vals: np.ndarray, noise):
        """The stored form of float32 rows (``noise``: uniform [0, 1) or None)."""
        if self.row_dtype == "float16":
            return np.clip(vals, -_F16_MAX, _F16_MAX).astype(np.float16), None
        if self.row_dtype == "bfloat16":
            if noise is None:
                return _bf16_bits(vals), None
            # add noise below the kept 16 bits, then truncate: sign-magnitude, so this
            # rounds away from zero with probability equal to the dropped fraction
            u = vals.view(np.uint32) + (noise * np.float32(65536.0)).astype(np.uint32)
            return (u >> np.uint32(16)).astype(np.uint16), None
        amax = np.abs(vals).max(axis=1) if vals.size else np.zeros(0, np.float32)
        want = amax / np.float32(127.0)
        bits = _bf16_bits(want)
        bits = np.where(_from_bf16(bits) < want, bits + np.uint16(1), bits).astype(np.uint16)
        scale = _from_bf16(bits)
        q = vals / np.where(scale > 0, scale, np.float32(1.0))[:, None]
        q = np.floor(q + noise) if noise is not None else np.rint(q)
        return np.clip(q, -127, 127).astype(np.int8), bits

    def gather(self, rows, out: np.ndarray | None = None) -> np.ndarray:
        """Rows as float32 ``(len(rows), width)``; rows < 0 are left untouched."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        if out is None:
            out = np.zeros((rows.size, self.width), np.float32)
        for c, pos, off in self._groups(rows):
            out[pos] = self._decode(c, off)
        return out

    def scatter(self, rows, values, round_keys=None) -> None:
        """Store float32 ``values[j]`` at ``rows[j]`` (rows < 0 skipped); ``round_keys``
        (one int64 per row) makes a ``stochastic`` store round stochastically (float16
        always rounds to nearest)."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        vals = np.ascontiguousarray(values, np.float32).reshape(rows.size, self.width)
        stochastic = round_keys is not None and self.stochastic \
            and self.row_dtype != "float16"
        noise = _uniform(round_keys, self.width) if stochastic else None
        for c, pos, off in self._groups(rows):
            q, scale = self._encode(vals[pos], None if noise is None else noise[pos])
            self.chunks[c][off] = q
            if scale is not None:
                self.scales[c][off] = scale

    def raw(self, rows) -> dict:
        """The stored form of rows (``values``, int8 also ``scale``), for snapshots."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        out = {"values": np.zeros((rows.size, self.width), self._dtype)}
        if self.row_dtype == "int8":
            out["scale"] = np.zeros(rows.size, np.uint16)
        for c, pos, off in self._groups(rows):
            out["values"][pos] = self.chunks[c][off]
            if self.row_dtype == "int8":
                out["scale"][pos] = self.scales[c][off]
        return out

    def set_raw(self, rows, raw: dict) -> None:
        """Write the stored form back unchanged (restore: no rounding on the way)."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        for c, pos, off in self._groups(rows):
            self.chunks[c][off] = raw["values"][pos]
            if self.row_dtype == "int8":
                self.scales[c][off] = raw["scale"][pos]
