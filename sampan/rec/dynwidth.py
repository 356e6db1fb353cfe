"""Dynamic embedding dimension: each id's row grows wider as the id is seen more often.

``HashEmbeddingTable(dim=16, dynamic_dims=(4, 8, 16), dim_thresholds=(c1, c2))`` keeps
an id's row 4 wide until the table has counted ``c1`` sightings of it (``meta["freq"]``,
the table's exact per-row sighting count, bumped by every lookup that resolves the id),
8 wide from ``c1`` and 16 wide from ``c2`` -- the idea of DeepRec's dynamic-dimension
variables and Paddle's dymf accessor. A width only grows; a row freed by eviction and
reused starts again at the narrowest width.

Rules (the contract :class:`DynamicWidthRows` keeps):

- **Zero padding.** Lookups return full-width float32 rows; the columns beyond a row's
  stored width read 0 (they are not projected). A new row stores the first ``width``
  lanes of its usual ``hashed_normal`` start.
- **The stored part only is trained.** The sparse optimisers go through gather ->
  kernel -> scatter (the store is not ``addressable``) and zero the gradient of columns
  beyond each row's width first (:meth:`DynamicWidthRows.stored_mask`), so neither the
  weights nor the optimiser slots of unstored columns move. Slots stay one full-width
  float32 store (only the stored part is used): one layout for every optimiser kernel,
  and the weights are what dynamic widths are meant to shrink.
- **Growth trains the new part from zero.** When a row widens, its stored lanes are
  copied and the new lanes start at 0, with their slots still at the optimiser's initial
  value (never touched while unstored), exactly as if those lanes had just been created.
- **Snapshots keep widths.** :meth:`raw` is ``{"values": zero-padded float32 rows,
  "width": uint8}``; snapshot files carry ``weights.width`` and the table's
  ``dynamic_dims``/``dim_thresholds`` in their header (files without them read as
  fixed-width, as before).

``set_vectors`` (and any scatter) stores the lanes of the row's current width and drops
the rest. A :class:`~sampan.rec.hotcache.HotCache` in front of such a table is not
supported yet: it trains cached rows at full width on the trainer.

Rows of each width live in their own :class:`~sampan.rec.hashtable.ChunkedRows` pool;
a table row maps to (width, slot in that pool), so a 4-wide row takes 16 bytes of
values plus 5 of index.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampan.errors import SampanValueError, op_error
from sampan.rec.hashtable import ChunkedRows, _f32_ptr
from sampan.rec.snapshot_file import SnapshotError

__all__ = ["DynamicWidthRows", "check_dynamic", "check_width_array", "dynamic_kwargs"]

_INDEX_BYTES = 5  # uint8 width + int32 slot per row


def check_dynamic(dim: int, dims, thresholds) -> tuple[tuple, tuple]:
    """Validated ``(dynamic_dims, dim_thresholds)`` for a table of width ``dim``."""
    name = "HashEmbeddingTable"
    try:
        dims = tuple(int(d) for d in dims)
        thresholds = tuple(int(c) for c in thresholds)
    except (TypeError, ValueError):
        raise op_error(SampanValueError, name, f"dynamic_dims={dims!r}, "
                       f"dim_thresholds={thresholds!r}", "sequences of ints") from None
    if not dims or dims[-1] != dim or any(b <= a for a, b in zip(dims, dims[1:])) \
            or dims[0] < 1 or dims[-1] > 255:
        raise op_error(SampanValueError, name, f"dynamic_dims={dims}",
                       f"strictly increasing widths in 1..255 ending at dim={dim}")
    if len(thresholds) != len(dims) - 1 or any(c < 1 for c in thresholds) \
            or any(b <= a for a, b in zip(thresholds, thresholds[1:])):
        raise op_error(SampanValueError, name, f"dim_thresholds={thresholds}",
                       f"{len(dims) - 1} strictly increasing counts >= 1 (one per widening)")
    return dims, thresholds


@njit(cache=True, nogil=True)
def _gather_rows(bases, lane, shift, row_width, row_slot, rows, out):
    """``out[j]`` = row ``rows[j]`` zero-padded (rows < 0 untouched); ``bases[k]`` are
    the chunk addresses of the pool whose width ``w`` has ``lane[w] == k``."""
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        r = rows[j]
        if r < 0:
            continue
        w = np.int64(row_width[r])
        if w == 0:
            out[j, :] = 0.0
            continue
        s = np.int64(row_slot[r])
        p = _f32_ptr(bases[lane[w], s >> shift])
        o = (s & m) * w
        for d in range(w):
            out[j, d] = p[o + d]
        for d in range(w, out.shape[1]):
            out[j, d] = 0.0


@njit(cache=True, nogil=True)
def _scatter_rows(bases, lane, shift, row_width, row_slot, rows, vals):
    """Store the first ``width`` lanes of ``vals[j]`` at row ``rows[j]`` (rows < 0 and
    rows holding nothing skipped)."""
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        r = rows[j]
        if r < 0:
            continue
        w = np.int64(row_width[r])
        if w == 0:
            continue
        s = np.int64(row_slot[r])
        p = _f32_ptr(bases[lane[w], s >> shift])
        o = (s & m) * w
        for d in range(w):
            p[o + d] = vals[j, d]


def dynamic_kwargs(source) -> dict:
    """``dynamic_dims``/``dim_thresholds`` of a store or a snapshot header's table config
    (``{}`` for a fixed-width one), as table keyword arguments."""
    if isinstance(source, DynamicWidthRows):
        return {"dynamic_dims": list(source.dims), "dim_thresholds": list(source.thresholds)}
    if isinstance(source, dict) and "dynamic_dims" in source:
        return {"dynamic_dims": source["dynamic_dims"],
                "dim_thresholds": source.get("dim_thresholds")}
    return {}


def check_width_array(path: str, cfg: dict, arrays: dict, n: int) -> None:
    """A snapshot file of a dynamic-width table names valid widths and holds one per row
    (``weights.width``, uint8, each one of ``dynamic_dims``); others hold none."""
    if "dynamic_dims" not in cfg:
        if "weights.width" in arrays:
            raise SnapshotError(f"{path}: a 'weights.width' array but no dynamic_dims in "
                                f"the header")
        return
    try:
        dims, _ = check_dynamic(cfg.get("dim"), cfg["dynamic_dims"],
                                cfg.get("dim_thresholds") or ())
    except SampanValueError as e:
        raise SnapshotError(f"{path}: {e}") from None
    w = arrays.get("weights.width")
    if w is None or w.dtype != np.uint8 or w.shape != (n,):
        got = "none" if w is None else f"{w.dtype}{list(w.shape)}"
        raise SnapshotError(f"{path}: 'weights.width' is {got}, expected uint8[{n}]")
    bad = ~np.isin(w, np.asarray(dims, np.uint8))
    if bad.any():
        raise SnapshotError(f"{path}: row width {int(w[bad][0])} in 'weights.width', "
                            f"expected one of {dims}")


class DynamicWidthRows:
    """float32 rows of per-row width, read zero-padded to ``width`` (see module doc).

    >>> s = DynamicWidthRows(4, 4, (2, 4), (3,)); s.ensure(2)
    >>> s.scatter([0], np.ones((1, 4), np.float32)); s.gather([0]).tolist()
    [[1.0, 1.0, 0.0, 0.0]]
    >>> n = s.grow([0], [3]); s.scatter([0], np.ones((1, 4), np.float32)); s.gather([0]).tolist()
    [[1.0, 1.0, 1.0, 1.0]]
    """

    row_dtype = "float32"
    addressable = False  # rows of several widths: optimisers gather/scatter

    def __init__(self, width: int, shift: int, dims, thresholds):
        self.dims, self.thresholds = check_dynamic(width, dims, thresholds)
        self.width, self.shift = int(width), int(shift)
        self._cuts = np.asarray(self.thresholds, np.int64)
        self._dims = np.asarray(self.dims, np.uint8)
        self.pools = {w: ChunkedRows(w, shift) for w in self.dims}
        self._next = {w: 0 for w in self.dims}
        self._free: dict[int, list[np.ndarray]] = {w: [] for w in self.dims}
        self.row_width = np.zeros(0, np.uint8)  # 0: row holds nothing yet
        self.row_slot = np.zeros(0, np.int32)
        self._lane = np.zeros(256, np.int64)  # width -> its pool's row in _bases()
        for k, w in enumerate(self.dims):
            self._lane[w] = k

    def _bases(self) -> np.ndarray:
        """Chunk addresses of every pool, one row per width (for the kernels)."""
        n = max(len(p.chunks) for p in self.pools.values())
        out = np.zeros((len(self.dims), max(n, 1)), np.int64)
        for k, w in enumerate(self.dims):
            b = self.pools[w].bases
            out[k, : b.size] = b
        return out

    # -- sizes ---------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Rows addressable without growing."""
        return self.row_width.size

    def width_counts(self) -> dict:
        """``{width: rows stored at that width}``."""
        return {w: int((self.row_width == w).sum()) for w in self.dims}

    @property
    def bytes_per_row(self) -> float:
        """Mean bytes of one stored row: its values at its width, plus its index."""
        counts = self.width_counts()
        n = sum(counts.values())
        if n == 0:
            return float(4 * self.dims[0] + _INDEX_BYTES)
        return round(sum(4 * w * c for w, c in counts.items()) / n + _INDEX_BYTES, 3)

    @property
    def nbytes(self) -> int:
        """Bytes held by the pools and the per-row index."""
        return sum(p.nbytes for p in self.pools.values()) + self.row_width.nbytes \
            + self.row_slot.nbytes

    def ensure(self, n_rows: int) -> None:
        """Make rows ``0 .. n_rows-1`` addressable (new rows hold nothing, read zeros)."""
        if n_rows <= self.capacity:
            return
        step = 1 << self.shift
        size = max(-(-n_rows // step) * step, 2 * self.capacity)
        for name, dt in (("row_width", np.uint8), ("row_slot", np.int32)):
            grown = np.zeros(size, dt)
            old = getattr(self, name)
            grown[: old.size] = old
            setattr(self, name, grown)

    def width_for(self, counts) -> np.ndarray:
        """The width an id of ``counts`` sightings is stored at."""
        return self._dims[np.searchsorted(self._cuts, np.asarray(counts, np.int64),
                                          side="right")]

    # -- placement -------------------------------------------------------------------------
    def _rows(self, rows) -> tuple[np.ndarray, np.ndarray]:
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        pos = np.flatnonzero(rows >= 0)
        r = rows[pos]
        if r.size and r.max() >= self.capacity:
            raise IndexError(f"row {r.max()} out of range for {self.capacity} rows")
        return pos, r

    def _take(self, w: int, n: int) -> np.ndarray:
        free = np.concatenate(self._free[w]) if self._free[w] else np.empty(0, np.int32)
        got = free[:n]
        self._free[w] = [free[n:]] if free.size > n else []
        fresh = np.arange(self._next[w], self._next[w] + n - got.size, dtype=np.int32)
        self._next[w] += fresh.size
        self.pools[w].ensure(self._next[w])
        return np.concatenate([got, fresh]).astype(np.int32)

    def _place(self, rows: np.ndarray, widths: np.ndarray, keep_values: bool = True) -> None:
        """Store unique ``rows`` at ``widths``, keeping their values (new lanes zero), or
        zeroed (``keep_values=False``)."""
        keep = self.row_width[rows] != widths
        rows, widths = rows[keep], widths[keep]
        if not rows.size:
            return
        vals = self.gather(rows) if keep_values else np.zeros((rows.size, self.width),
                                                              np.float32)
        old_w = self.row_width[rows]
        for w in self.dims:
            sel = old_w == w
            if sel.any():
                self._free[w].append(self.row_slot[rows[sel]].copy())
        for w in self.dims:
            sel = np.flatnonzero(widths == w)
            if sel.size:
                slots = self._take(w, sel.size)
                self.row_slot[rows[sel]] = slots
                self.row_width[rows[sel]] = w
                self.pools[w].scatter(slots.astype(np.int64), vals[sel, :w])

    def reset(self, rows) -> None:
        """Unique rows (re)created for new ids: narrowest width, zeros."""
        _, r = self._rows(rows)
        narrow = self.row_width[r] == self.dims[0]  # a reused row's old narrow values
        self._place(r, np.full(r.size, self.dims[0], np.uint8), keep_values=False)
        if narrow.any():
            self.pools[self.dims[0]].scatter(
                self.row_slot[r[narrow]].astype(np.int64),
                np.zeros((int(narrow.sum()), self.dims[0]), np.float32))

    def grow(self, rows, counts) -> int:
        """Widen rows whose sighting ``counts`` passed a threshold; returns rows widened."""
        pos, r = self._rows(rows)
        want = self.width_for(np.asarray(counts, np.int64).ravel()[pos])
        sel = want > self.row_width[r]
        if not sel.any():
            return 0
        r, inv = np.unique(r[sel], return_index=True)
        self._place(r, want[sel][inv])
        return int(r.size)

    # -- the store contract ----------------------------------------------------------------
    def gather(self, rows, out: np.ndarray | None = None) -> np.ndarray:
        """Rows as float32 ``(n, width)``, zero beyond each row's width; rows < 0 untouched."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        self._rows(rows)
        if out is None:
            out = np.zeros((rows.size, self.width), np.float32)
        _gather_rows(self._bases(), self._lane, self.shift, self.row_width, self.row_slot,
                     rows, out)
        return out

    def stored_mask(self, rows) -> np.ndarray:
        """float32 ``(n, width)``: 1 on each row's stored columns, 0 beyond."""
        _, r = self._rows(rows)
        return (np.arange(self.width) < self.row_width[r][:, None]).astype(np.float32)

    def scatter(self, rows, values, round_keys=None) -> None:
        """Store the first ``width(row)`` lanes of ``values[j]`` at ``rows[j]`` (rows < 0
        skipped; a row holding nothing takes the narrowest width; float32 needs no
        rounding, so ``round_keys`` is ignored)."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        vals = np.ascontiguousarray(values, np.float32).reshape(rows.size, self.width)
        _, r = self._rows(rows)
        empty = self.row_width[r] == 0
        if empty.any():
            u = np.unique(r[empty])
            self._place(u, np.full(u.size, self.dims[0], np.uint8))
        _scatter_rows(self._bases(), self._lane, self.shift, self.row_width, self.row_slot,
                      rows, vals)

    def raw(self, rows) -> dict:
        """``{"values": zero-padded float32 rows, "width": uint8 widths}``."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        pos, r = self._rows(rows)
        width = np.zeros(rows.size, np.uint8)
        width[pos] = self.row_width[r]
        return {"values": self.gather(rows), "width": width}

    def set_raw(self, rows, raw: dict) -> None:
        """Put rows back at the widths and values :meth:`raw` gave (a raw form without
        ``width``, from a fixed-width file, stores every row full width)."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        pos, r = self._rows(rows)
        vals = np.asarray(raw["values"], np.float32).reshape(rows.size, self.width)
        width = raw.get("width")
        width = np.full(rows.size, self.width, np.uint8) if width is None else \
            np.asarray(width, np.uint8).ravel()
        bad = ~np.isin(width[pos], self._dims)
        if bad.any():
            raise op_error(SampanValueError, "DynamicWidthRows.set_raw",
                           f"row width {int(width[pos][bad][0])}", f"one of {self.dims}")
        u, first = np.unique(r, return_index=True)
        self._place(u, width[pos][first])
        self.scatter(rows, vals)
