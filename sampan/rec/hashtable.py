"""Collisionless id -> row hash map and chunked row storage, compiled with numba.

The map is open addressing with linear probing over one ``(capacity, 2)`` int64 array of
``[key, value]`` pairs, so one probe touches one cache line. ``value < 0`` marks an empty
slot, which lets every int64 key (0, negatives, int64 min/max) be stored without a
sentinel key. Deletion uses backward shift, so there are no tombstones to clean up and
probe chains never grow with churn. The map grows (doubles and rehashes) before a batch
insert would push it past ``max_load``.

Rows live in :class:`ChunkedRows`: fixed-size float32 chunks added as the pool grows, so
growth never copies existing rows. Kernels reach a row through a table of chunk base
addresses (``bases[row >> shift]``), which costs about as much as indexing one flat array.
:class:`RowAllocator` hands out row numbers, reusing freed rows first (a free list).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from sampan.errors import SampanValueError, op_error

# the per-row metadata a table keeps beside each row (its id, sightings, steps, counts)
META_FIELDS = ("key", "freq", "last_seen", "show", "click", "updated")

__all__ = ["ChunkedRows", "HashMap", "RowAllocator", "hash_ids"]

_EMPTY = -1
# How many keys ahead a batch kernel prefetches its slot; a warm 10^6-key table does not
# fit in cache, and overlapping the misses is worth about 2x on lookup throughput.
_AHEAD = 24


@intrinsic
def _prefetch(typingctx, addr):
    """Hint the CPU to load the cache line at an integer address (numba only)."""
    sig = types.void(types.int64)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _f32_ptr(typingctx, addr):
    """Turn an integer address into a float32 pointer (numba only)."""
    sig = types.CPointer(types.float32)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _mix(k):
    # splitmix64 finaliser: raw ids are often sequential or share low bits; the mix spreads
    # them over the whole table so linear probing sees near-random homes.
    x = np.uint64(k)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@njit(cache=True, nogil=True)
def _hash_many(keys, out):
    for j in range(keys.size):
        out[j] = _mix(keys[j])


@njit(cache=True, nogil=True, inline="always")
def _prefetch_slot(tab, keys, j, mask):
    if j < keys.size:
        _prefetch(tab.ctypes.data + np.int64(_mix(keys[j]) & np.uint64(mask)) * 16)


@njit(cache=True, nogil=True)
def _get(tab, keys, out):
    mask = np.int64(tab.shape[0] - 1)
    for j in range(_AHEAD):
        _prefetch_slot(tab, keys, j, mask)
    for j in range(keys.size):
        _prefetch_slot(tab, keys, j + _AHEAD, mask)
        k = keys[j]
        i = np.int64(_mix(k) & np.uint64(mask))
        while True:
            v = tab[i, 1]
            if v < 0:
                out[j] = _EMPTY
                break
            if tab[i, 0] == k:
                out[j] = v
                break
            i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _put(tab, keys, vals, size):
    """Insert or overwrite; returns the new size."""
    mask = np.int64(tab.shape[0] - 1)
    for j in range(keys.size):
        k = keys[j]
        i = np.int64(_mix(k) & np.uint64(mask))
        while True:
            if tab[i, 1] < 0:
                tab[i, 0] = k
                tab[i, 1] = vals[j]
                size += 1
                break
            if tab[i, 0] == k:
                tab[i, 1] = vals[j]
                break
            i = (i + 1) & mask
    return size


@njit(cache=True, nogil=True)
def _get_or_insert(tab, keys, out, created, free, st):
    """Look keys up; give each missing key a row from the allocator state.

    ``st`` = [size, free_top, next_row]; returns nothing, updates ``st`` in place.
    """
    mask = np.int64(tab.shape[0] - 1)
    for j in range(_AHEAD):
        _prefetch_slot(tab, keys, j, mask)
    for j in range(keys.size):
        _prefetch_slot(tab, keys, j + _AHEAD, mask)
        k = keys[j]
        i = np.int64(_mix(k) & np.uint64(mask))
        while True:
            v = tab[i, 1]
            if v < 0:
                if st[1] > 0:
                    st[1] -= 1
                    r = free[st[1]]
                else:
                    r = st[2]
                    st[2] += 1
                tab[i, 0] = k
                tab[i, 1] = r
                st[0] += 1
                out[j] = r
                created[j] = True
                break
            if tab[i, 0] == k:
                out[j] = v
                created[j] = False
                break
            i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _remove(tab, keys, out):
    """Backward-shift deletion; returns how many keys were removed."""
    mask = np.int64(tab.shape[0] - 1)
    n = 0
    for j in range(keys.size):
        k = keys[j]
        i = np.int64(_mix(k) & np.uint64(mask))
        while True:
            v = tab[i, 1]
            if v < 0:
                out[j] = _EMPTY
                break
            if tab[i, 0] == k:
                out[j] = v
                break
            i = (i + 1) & mask
        if out[j] < 0:
            continue
        n += 1
        hole = i
        s = i
        while True:
            s = (s + 1) & mask
            if tab[s, 1] < 0:
                break
            home = np.int64(_mix(tab[s, 0]) & np.uint64(mask))
            # The entry at s may fill the hole unless its home lies cyclically in (hole, s].
            if hole <= s:
                stays = hole < home <= s
            else:
                stays = home > hole or home <= s
            if not stays:
                tab[hole, 0] = tab[s, 0]
                tab[hole, 1] = tab[s, 1]
                hole = s
        tab[hole, 1] = _EMPTY
    return n


@njit(cache=True, nogil=True)
def _rehash(old, new):
    mask = np.int64(new.shape[0] - 1)
    for s in range(old.shape[0]):
        if old[s, 1] < 0:
            continue
        k = old[s, 0]
        i = np.int64(_mix(k) & np.uint64(mask))
        while new[i, 1] >= 0:
            i = (i + 1) & mask
        new[i, 0] = k
        new[i, 1] = old[s, 1]


def hash_ids(ids) -> np.ndarray:
    """The 64-bit mix the map uses to place ids, as uint64 (for sharding and tests).

    >>> h = hash_ids([1, 2]); bool(h[0] != h[1])
    True
    """
    keys = _as_keys(ids, "hash_ids")
    out = np.empty(keys.size, np.uint64)
    _hash_many(keys, out)
    return out


def _as_keys(keys, op: str = "HashMap") -> np.ndarray:
    """Ids as a flat int64 array; refuses what would not convert exactly.

    Floats would be truncated, bools and strings are not ids, and uint64 ids at or above
    2**63 would wrap onto negative ones; an empty sequence is fine whatever its dtype.
    """
    arr = np.asarray(keys)
    if arr.size == 0 and arr.dtype.kind in "biuf":
        return np.empty(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise op_error(SampanValueError, op, f"ids of dtype {arr.dtype}",
                       "integers (int8 ... int64, uint8 ... uint64 below 2^63)",
                       "ids are not rounded or parsed: cast them to int64 yourself")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 1 << 63:
        raise op_error(SampanValueError, op, f"uint64 ids up to {int(arr.max())}",
                       "ids below 2^63 (they are stored as int64)",
                       "reinterpret them with .view(np.int64) if that is what you mean")
    return np.ascontiguousarray(arr, dtype=np.int64).ravel()


class RowAllocator:
    """Hands out row numbers 0, 1, 2, ... and reuses released rows first (free list).

    >>> a = RowAllocator(); r = a.alloc(3); a.release(r[:1]); int(a.alloc(1)[0])
    0
    """

    def __init__(self):
        self.free = np.empty(1024, np.int64)
        self.free_top = 0
        self.next_row = 0

    @property
    def live(self) -> int:
        """Number of rows currently handed out."""
        return self.next_row - self.free_top

    def alloc(self, n: int) -> np.ndarray:
        """Return ``n`` row numbers, freed rows first."""
        take = min(n, self.free_top)
        rows = np.empty(n, np.int64)
        rows[:take] = self.free[self.free_top - take : self.free_top][::-1]
        self.free_top -= take
        rows[take:] = np.arange(self.next_row, self.next_row + n - take)
        self.next_row += n - take
        return rows

    def release(self, rows) -> None:
        """Give rows back for reuse."""
        rows = np.asarray(rows, np.int64).ravel()
        need = self.free_top + rows.size
        if need > self.free.size:
            grown = np.empty(max(need, 2 * self.free.size), np.int64)
            grown[: self.free_top] = self.free[: self.free_top]
            self.free = grown
        self.free[self.free_top : need] = rows
        self.free_top = need


class HashMap:
    """Open-addressing int64 -> int64 map with numba batch operations.

    Values must be >= 0 (negative values mark empty slots). ``get`` returns -1 for
    missing keys.

    >>> m = HashMap(); m.put([5, -7], [0, 1]); m.get([-7, 5, 3]).tolist()
    [1, 0, -1]
    """

    def __init__(self, capacity: int = 1024, max_load: float = 0.5):
        if not 0.05 <= max_load <= 0.9:
            raise ValueError(f"max_load must be in [0.05, 0.9], got {max_load}")
        cap = 16
        while cap * max_load < capacity:
            cap *= 2
        self.max_load = max_load
        self.tab = np.full((cap, 2), _EMPTY, np.int64)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    @property
    def capacity(self) -> int:
        """Number of slots in the table (a power of two)."""
        return self.tab.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes held by the slot array."""
        return self.tab.nbytes

    def reserve(self, extra: int) -> None:
        """Grow (rehash) so that ``extra`` more keys fit under ``max_load``."""
        need = self.size + extra
        cap = self.capacity
        while need > cap * self.max_load:
            cap *= 2
        if cap != self.capacity:
            new = np.full((cap, 2), _EMPTY, np.int64)
            _rehash(self.tab, new)
            self.tab = new

    def get(self, keys) -> np.ndarray:
        """Values for ``keys`` (-1 where absent)."""
        k = _as_keys(keys)
        out = np.empty(k.size, np.int64)
        _get(self.tab, k, out)
        return out

    def put(self, keys, values) -> None:
        """Insert or overwrite ``keys -> values`` (values >= 0)."""
        k = _as_keys(keys)
        v = np.ascontiguousarray(values, dtype=np.int64).ravel()
        if v.shape != k.shape:
            raise ValueError(f"put: got {k.size} keys and {v.size} values")
        if v.size and v.min() < 0:
            raise ValueError(f"put: values must be >= 0, got min {v.min()}")
        self.reserve(k.size)
        self.size = _put(self.tab, k, v, self.size)

    def get_or_insert(self, keys, alloc: RowAllocator) -> tuple[np.ndarray, np.ndarray]:
        """Rows for ``keys``; missing keys get fresh rows from ``alloc``.

        Returns ``(rows, created)`` where ``created`` marks keys inserted by this call.
        """
        k = _as_keys(keys)
        self.reserve(k.size)
        out = np.empty(k.size, np.int64)
        created = np.empty(k.size, np.bool_)
        st = np.array([self.size, alloc.free_top, alloc.next_row], np.int64)
        _get_or_insert(self.tab, k, out, created, alloc.free, st)
        self.size, alloc.free_top, alloc.next_row = int(st[0]), int(st[1]), int(st[2])
        return out, created

    def remove(self, keys) -> np.ndarray:
        """Delete ``keys``; returns their old values (-1 where absent)."""
        k = _as_keys(keys)
        out = np.empty(k.size, np.int64)
        self.size -= _remove(self.tab, k, out)
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All ``(keys, values)`` in slot order."""
        live = self.tab[:, 1] >= 0
        return self.tab[live, 0].copy(), self.tab[live, 1].copy()

    def clear(self) -> None:
        """Remove every key (keeps the capacity)."""
        self.tab[:, 1] = _EMPTY
        self.size = 0


@njit(cache=True, nogil=True, inline="always")
def _prefetch_row(bases, shift, width, rows, j):
    """Prefetch the first and last cache line of row ``rows[j]`` (if any)."""
    if j < rows.size:
        r = rows[j]
        if r >= 0:
            a = bases[r >> shift] + (r & ((np.int64(1) << shift) - 1)) * width * 4
            _prefetch(a)
            _prefetch(a + width * 4 - 1)


@njit(cache=True, nogil=True)
def _gather(bases, shift, width, rows, out):
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        _prefetch_row(bases, shift, width, rows, j + _AHEAD)
        r = rows[j]
        if r < 0:
            continue
        p = _f32_ptr(bases[r >> shift])
        o = (r & m) * width
        for d in range(width):
            out[j, d] = p[o + d]


@njit(cache=True, nogil=True)
def _scatter(bases, shift, width, rows, vals):
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        r = rows[j]
        if r < 0:
            continue
        p = _f32_ptr(bases[r >> shift])
        o = (r & m) * width
        for d in range(width):
            p[o + d] = vals[j, d]


class ChunkedRows:
    """float32 rows of a fixed width held in chunks of ``2**shift`` rows.

    Adding a chunk never moves existing rows. ``bases`` (chunk addresses) lets numba
    kernels in :mod:`sampan.rec` reach row ``r`` at ``bases[r >> shift]``; the chunk
    arrays are owned here, which keeps those addresses valid.

    >>> c = ChunkedRows(2); c.ensure(3); c.scatter([2], np.ones((1, 2), np.float32))
    >>> c.gather([2]).tolist()
    [[1.0, 1.0]]
    """

    row_dtype = "float32"  # the store contract of sampan.rec.rowstore
    addressable = True  # kernels may write rows in place through `bases`

    def __init__(self, width: int, shift: int = 14):
        if width < 1:
            raise ValueError(f"row width must be >= 1, got {width}")
        self.width = int(width)
        self.shift = int(shift)
        self.chunks: list[np.ndarray] = []
        self.bases = np.empty(0, np.int64)

    @property
    def capacity(self) -> int:
        """Rows addressable without adding a chunk."""
        return len(self.chunks) << self.shift

    @property
    def nbytes(self) -> int:
        """Bytes held by all chunks."""
        return sum(c.nbytes for c in self.chunks)

    @property
    def bytes_per_row(self) -> int:
        """Bytes one row takes."""
        return 4 * self.width

    def ensure(self, n_rows: int) -> None:
        """Add zeroed chunks until rows ``0 .. n_rows-1`` exist."""
        added = False
        while self.capacity < n_rows:
            self.chunks.append(np.zeros((1 << self.shift, self.width), np.float32))
            added = True
        if added:
            self.bases = np.array([c.ctypes.data for c in self.chunks], np.int64)

    def _check(self, rows: np.ndarray) -> None:
        if rows.size and rows.max() >= self.capacity:
            raise IndexError(f"row {rows.max()} out of range for {self.capacity} rows")

    def gather(self, rows, out: np.ndarray | None = None) -> np.ndarray:
        """Copy rows into a ``(len(rows), width)`` array; rows < 0 are left untouched."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        self._check(rows)
        if out is None:
            out = np.zeros((rows.size, self.width), np.float32)
        _gather(self.bases, self.shift, self.width, rows, out)
        return out

    def scatter(self, rows, values, round_keys=None) -> None:
        """Write ``values[j]`` to row ``rows[j]`` (rows < 0 are skipped; float32 rows
        need no rounding, so ``round_keys`` is ignored)."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        vals = np.ascontiguousarray(values, np.float32).reshape(rows.size, self.width)
        self._check(rows)
        _scatter(self.bases, self.shift, self.width, rows, vals)

    def raw(self, rows) -> dict:
        """The stored form of rows, for snapshots: ``{"values": float32 rows}``."""
        return {"values": self.gather(rows)}

    def set_raw(self, rows, raw: dict) -> None:
        """Write back what :meth:`raw` gave."""
        self.scatter(rows, raw["values"])
