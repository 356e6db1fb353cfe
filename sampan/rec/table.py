"""Dynamic embedding table: raw int64 ids -> float32 rows, with metadata and eviction.

One :class:`HashEmbeddingTable` owns a collisionless :class:`HashMap` (id -> row), row
storage for weights and optimiser slots (:class:`ChunkedRows`), and per-row metadata
(owning id, frequency, last-seen step, show/click counts, step of last write). Every read
and write of the id -> row mapping happens under one lock, and a lookup resolves ids and
copies vectors inside that lock, so an eviction running on another thread can free and
reuse a row only between lookups, never during one. Gradients are pushed by *id* and
resolved again under the lock, so a row that changed owner since the forward pass is
never written with the old owner's gradient.
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
from numba import njit

from sampan.rec.hashtable import (META_FIELDS, ChunkedRows, HashMap, RowAllocator,  # noqa: F401
                                  _as_keys, _mix)
from sampan.rec.policies import AdmitAll
from sampan.rec.rowstore import make_rows

__all__ = ["HashEmbeddingTable", "hashed_normal"]


@njit(cache=True, nogil=True)
def _pair_hashes(keys, seed, out):
    salt = np.uint64(seed) * np.uint64(0x2545F4914F6CDD1D) + np.uint64(1)
    for j in range(keys.size):
        base = _mix(np.uint64(keys[j]) ^ salt)
        for d in range(out.shape[1]):
            out[j, d] = _mix(base + np.uint64(2 * d))


def hashed_normal(ids, dim: int, seed: int = 0, std: float = 0.01) -> np.ndarray:
    """Deterministic N(0, std) float32 vectors keyed by id: an id always starts the same.

    Shards and reruns therefore agree without sharing a random stream. Each 64-bit hash
    of (seed, id, lane pair) gives two 24-bit uniforms and two normals (Box-Muller); the
    transcendental part runs as vectorised float32 numpy.

    >>> hashed_normal([7], 4).shape
    (1, 4)
    """
    ids = _as_keys(ids, "hashed_normal")
    half = (dim + 1) // 2
    h = np.empty((ids.size, half), np.uint64)
    _pair_hashes(ids, np.uint64(seed & (2**64 - 1)), h)
    u1 = ((h >> np.uint64(40)).astype(np.float32) + np.float32(1.0)) * np.float32(2.0**-24)
    angle = (h & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(2 * np.pi * 2.0**-24)
    r = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.float32(std)
    out = np.empty((ids.size, half, 2), np.float32)
    np.multiply(r, np.cos(angle), out=out[:, :, 0])
    np.multiply(r, np.sin(angle), out=out[:, :, 1])
    return out.reshape(ids.size, 2 * half)[:, :dim]


@njit(cache=True, nogil=True)
def _touch(rows, freq, last_seen, dirty, step):
    for j in range(rows.size):
        r = rows[j]
        if r >= 0:
            freq[r] += 1
            last_seen[r] = step
            dirty[r] = True


@njit(cache=True, nogil=True)
def _record(rows, labels, show, click, dirty):
    for j in range(rows.size):
        r = rows[j]
        if r >= 0:
            dirty[r] = True
            show[r] += 1
            click[r] += labels[j]


def _dynamic_rows(dim, shift, row_dtype, dims, thresholds):
    from sampan.rec.dynwidth import DynamicWidthRows
    if row_dtype != "float32":
        raise ValueError(f"HashEmbeddingTable: dynamic_dims store float32 rows, got "
                         f"row_dtype={row_dtype!r}")
    if thresholds is None:
        raise ValueError("HashEmbeddingTable: dynamic_dims needs dim_thresholds (the "
                         "sighting counts at which a row widens)")
    return DynamicWidthRows(dim, shift, dims, thresholds)


class HashEmbeddingTable:
    """A growable, collisionless embedding table keyed by raw int64 ids.

    ``admission`` decides when a new id gets a row (default: always), ``eviction``
    frees rows (default: never). Ids without a row read ``default`` (zeros).
    ``row_dtype`` stores the weights as ``"float32"`` (default), ``"float16"``,
    ``"bfloat16"`` or ``"int8"`` with a per-row scale (``sampan.rec.rowstore``); lookups
    return float32 either way and optimiser slots stay float32. ``dynamic_dims`` (widths
    ending at ``dim``) with ``dim_thresholds`` (sighting counts) store each id's row at a
    width that grows with its count, read zero-padded (``sampan.rec.dynwidth``).
    ``memory_budget_mb`` with ``spill_dir`` keeps at most that many MB of rows (slots,
    metadata, id map) in RAM and the least recently seen rest on disk
    (``sampan.rec.disktier``); ``tier`` is then the
    :class:`~sampan.rec.disktier.DiskTier`, else None.

    >>> t = HashEmbeddingTable(4); v = t.lookup([10, -3, 10]); v.shape, len(t)
    ((3, 4), 2)
    """

    def __init__(self, dim: int, *, init_std: float = 0.01, seed: int = 0, admission=None,
                 eviction=None, default=None, chunk_shift: int = 14,
                 initial_capacity: int = 1024, pending_limit: int = 1 << 22,
                 row_dtype: str = "float32", dynamic_dims=None, dim_thresholds=None,
                 memory_budget_mb: float | None = None, spill_dir: str | None = None):
        if dim < 1:
            raise ValueError(f"embedding dim must be >= 1, got {dim}")
        if dynamic_dims is not None and (memory_budget_mb is not None or spill_dir is not None):
            raise ValueError("HashEmbeddingTable: dynamic_dims with a disk tier "
                             "(memory_budget_mb / spill_dir) is not supported yet: use one")
        self.dim = int(dim)
        self.init_std = float(init_std)
        self.seed = int(seed)
        self.admission = admission if admission is not None else AdmitAll()
        self.eviction = eviction
        self.default = np.zeros(dim, np.float32) if default is None else \
            np.asarray(default, np.float32).reshape(dim)
        # pre-sizing avoids rehash / metadata copies while a known-size table fills up;
        # untouched metadata pages cost no resident memory
        self.initial_capacity = int(initial_capacity)
        self.map = HashMap(initial_capacity)
        self.alloc = RowAllocator()
        # the weights' store (sampan.rec.rowstore): float32 chunks, or compressed rows
        self.weights = make_rows(dim, chunk_shift, row_dtype) if dynamic_dims is None else \
            _dynamic_rows(dim, chunk_shift, row_dtype, dynamic_dims, dim_thresholds)
        self.row_dtype = row_dtype
        self.dynamic = dynamic_dims is not None  # per-row widths (DynamicWidthRows)
        self.slots: ChunkedRows | None = None
        self.slot_init = 0.0
        self.meta = {f: np.zeros(0, np.int64) for f in META_FIELDS}
        self.live = np.zeros(0, np.bool_)
        self.dirty = np.zeros(0, np.bool_)  # rows written since the last snapshot export
        self.exported = np.zeros(0, np.bool_)  # rows a snapshot chain holds (as of its end)
        self.pending = HashMap(1024)  # sightings of ids not admitted yet
        self.pending_limit = int(pending_limit)
        # ids evicted since the last snapshot export whose rows that export held: at most
        # one entry per row then exported, so the log is bounded by the table's size
        self.evicted: list[np.ndarray] = []
        # names this table in its snapshot files, so a delta of another table is refused
        self.lineage = os.urandom(16).hex()
        self.lock = threading.RLock()
        self.step = 0
        self.export_seq: int | None = None  # sequence number of the last snapshot export
        # id -> pin count: rows a caller still means to push to, which eviction must keep
        self.pins = HashMap(64)
        self.on_evict = None  # optional callback(ids) after eviction removes rows
        self.tier = None
        if (memory_budget_mb is None) != (spill_dir is None):
            raise ValueError("HashEmbeddingTable: memory_budget_mb and spill_dir go together "
                             f"(got memory_budget_mb={memory_budget_mb!r}, "
                             f"spill_dir={spill_dir!r})")
        if spill_dir is not None:
            self._spill(float(memory_budget_mb), os.fspath(spill_dir))

    def _spill(self, budget_mb: float, spill_dir: str) -> None:
        """Pre-size the map and metadata for the rows the budget can hold, then the tier."""
        from sampan.rec.disktier import DiskTier
        # per row: weights, one float32 slot a lane (Adagrad's), metadata, map at <= 1/2
        per = self.weights.bytes_per_row + 4 * self.dim + 8 * len(META_FIELDS) + 3 + 64
        n = max(int(budget_mb * (1 << 20)) // per, 16)
        self.map = HashMap(n + min(65536, max(n // 4, 1024)))  # + a batch's new ids
        self.initial_capacity = n
        self._grow_meta(n)
        self.tier = DiskTier(self, budget_mb, spill_dir)

    @contextlib.contextmanager
    def bulk_fill(self):
        """Fill a table with a disk tier in bulk: while open, the rows of ids new to the
        table that the tier demotes are spooled, and written into its store in one
        sequential pass on exit (``sampan.rec._logstore_bulk``), not merged in a million at
        a time. Inside, an id must not be looked up again once demoted (spooled rows are
        not readable until the exit; one spooled twice is refused there, and the store is
        left as before). Without a tier, or over an LMDB store: a plain context.

        >>> t = HashEmbeddingTable(4)
        >>> with t.bulk_fill():
        ...     _ = t.lookup([1, 2, 3])
        >>> len(t)
        3
        """
        store = self.tier.store if self.tier is not None else None
        if not hasattr(store, "bulk_begin"):
            yield self
            return
        with self.lock:
            store.bulk_begin()
        try:
            yield self
        finally:
            with self.lock:
                store.bulk_end()

    # -- sizes -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.map) + (len(self.tier) if self.tier is not None else 0)

    @property
    def bytes_per_row(self) -> dict:
        """Bytes per row: ``weights`` (as stored), ``slots``, ``meta`` (and ``total``)."""
        w = self.weights.bytes_per_row
        s = 4 * self.slots.width if self.slots is not None else 0
        m = 8 * len(META_FIELDS) + 3
        return {"weights": w, "slots": s, "meta": m, "total": w + s + m}

    @property
    def nbytes(self) -> int:
        """Bytes held by the map, rows, slots and metadata."""
        n = self.map.nbytes + self.pending.nbytes + self.weights.nbytes + self.live.nbytes
        n += sum(a.nbytes for a in self.meta.values())
        return n + (self.slots.nbytes if self.slots is not None else 0)

    def attach_slots(self, width: int, init: float = 0.0) -> None:
        """Give every row ``width`` float32 optimiser slots initialised to ``init``."""
        with self.lock:
            if self.slots is not None and self.slots.width == width and self.slot_init == init:
                return
            if self.tier is not None:
                self.tier.flush()  # the budget holds fewer rows with slots: re-fill it
            self.slots = ChunkedRows(width, self.weights.shift)
            self.slot_init = float(init)
            self.slots.ensure(self.weights.capacity)
            if init != 0.0:
                for c in self.slots.chunks:
                    c.fill(init)
            if self.tier is not None:
                self.tier.refit()

    # -- id -> row -----------------------------------------------------------------------
    def _grow(self) -> None:
        n = self.alloc.next_row
        self.weights.ensure(n)
        if self.slots is not None:
            old = self.slots.capacity
            self.slots.ensure(n)
            if self.slot_init != 0.0:
                for c in self.slots.chunks[old >> self.slots.shift:]:
                    c.fill(self.slot_init)
        if n > self.live.size:
            self._grow_meta(max(n, 2 * self.live.size, self.initial_capacity))

    def _grow_meta(self, size: int) -> None:
        if size > self.live.size:
            for f, a in self.meta.items():
                grown = np.zeros(size, np.int64)
                grown[: a.size] = a
                self.meta[f] = grown
            live = np.zeros(size, np.bool_)
            live[: self.live.size] = self.live
            self.live = live
            for name in ("dirty", "exported"):
                flags = np.zeros(size, np.bool_)
                old = getattr(self, name)
                flags[: old.size] = old
                setattr(self, name, flags)

    def _create(self, keys: np.ndarray, rows: np.ndarray, created: np.ndarray, step: int):
        if not created.any():
            return
        self._grow()
        new_rows, new_keys = rows[created], keys[created]
        if self.dynamic:  # a reused row starts again at the narrowest width
            self.weights.reset(new_rows)
        self.weights.scatter(new_rows, hashed_normal(new_keys, self.dim, self.seed,
                                                     self.init_std))
        if self.slots is not None:
            self.slots.scatter(new_rows, np.full((new_rows.size, self.slots.width),
                                                 self.slot_init, np.float32))
        m = self.meta
        m["key"][new_rows] = new_keys
        m["freq"][new_rows] = 0
        m["last_seen"][new_rows] = step
        m["show"][new_rows] = 0
        m["click"][new_rows] = 0
        m["updated"][new_rows] = step
        self.live[new_rows] = True
        self.dirty[new_rows] = True
        self.exported[new_rows] = False

    def _admit_missing(self, keys: np.ndarray, rows: np.ndarray, step: int) -> None:
        miss = rows < 0
        if not miss.any():
            return
        uniq, inv, cnt = np.unique(keys[miss], return_inverse=True, return_counts=True)
        seen = self.pending.get(uniq)
        total = np.where(seen < 0, 0, seen) + cnt
        ok = self.admission.admit(uniq, total)
        if ok.any():
            self.pending.remove(uniq[ok])
            new_rows, created = self.map.get_or_insert(uniq[ok], self.alloc)
            self._create(uniq[ok], new_rows, created, step)
            got = np.full(uniq.size, -1, np.int64)
            got[ok] = new_rows
            rows[miss] = got[inv]
        if (~ok).any():
            if len(self.pending) + int((~ok).sum()) > self.pending_limit:
                self.pending.clear()  # bounded memory: forget old sightings, keep serving
            self.pending.put(uniq[~ok], total[~ok])

    def rows_for(self, ids, step: int | None = None, create: bool = True) -> np.ndarray:
        """Rows of ``ids`` (-1 for ids without a row), creating admitted ones.

        Counts the sighting (frequency, last-seen step) of every id that has a row.
        """
        keys = _as_keys(ids, "HashEmbeddingTable.rows_for")
        with self.lock:
            step = self.step if step is None else int(step)
            self.step = max(self.step, step)
            if self.tier is not None and create:
                self.tier.prepare(keys)  # promote this batch's disk rows, demote cold ones
            if not create:
                return self.map.get(keys)
            if self.eviction is not None:
                self.evict(step)  # before resolving, so this batch's rows stay valid
            if isinstance(self.admission, AdmitAll):
                rows, created = self.map.get_or_insert(keys, self.alloc)
                self._create(keys, rows, created, step)
            else:
                rows = self.map.get(keys)
                self._admit_missing(keys, rows, step)
            _touch(rows, self.meta["freq"], self.meta["last_seen"], self.dirty, step)
            if self.dynamic:
                self.weights.grow(rows, self.meta["freq"][np.maximum(rows, 0)])
            return rows

    def lookup(self, ids, step: int | None = None, create: bool = True) -> np.ndarray:
        """Vectors for ``ids`` (shape ``ids.shape + (dim,)``), resolved atomically."""
        shape = np.shape(ids)
        keys = _as_keys(ids, "HashEmbeddingTable.lookup")
        with self.lock:
            rows = self.rows_for(keys, step, create)
            out = self.weights.gather(rows) if rows.size else np.zeros((0, self.dim),
                                                                      np.float32)
            if self.tier is not None and not create:  # read disk rows where they lie
                rows = self.tier.read_into(keys, rows, out)
        if (rows < 0).any():
            out[rows < 0] = self.default
        return out.reshape(shape + (self.dim,))

    def read(self, ids) -> np.ndarray:
        """Vectors for ``ids`` without creating rows or counting sightings."""
        return self.lookup(ids, create=False)

    def record(self, ids, labels) -> None:
        """Add one show and ``labels`` clicks to each id's row (ids without a row skip)."""
        keys = _as_keys(ids, "HashEmbeddingTable.record")
        lab = np.ascontiguousarray(labels, np.int64).ravel()
        if lab.shape != keys.shape:
            raise ValueError(f"record: got {keys.size} ids and {lab.size} labels")
        with self.lock:
            if self.tier is not None:
                self.tier.prepare(keys)  # ids on disk count too
            _record(self.map.get(keys), lab, self.meta["show"], self.meta["click"], self.dirty)

    def set_vectors(self, ids, values) -> None:
        """Overwrite the vectors of ids (creating rows regardless of admission)."""
        keys = _as_keys(ids, "HashEmbeddingTable.set_vectors")
        with self.lock:
            if self.tier is not None:
                self.tier.prepare(keys)
            rows, created = self.map.get_or_insert(keys, self.alloc)
            self._create(keys, rows, created, self.step)
            self.weights.scatter(rows, np.asarray(values, np.float32).reshape(-1, self.dim))
            self.meta["updated"][rows] = self.step
            self.dirty[rows] = True

    # -- eviction ------------------------------------------------------------------------
    def pin(self, ids) -> None:
        """Keep the rows of ``ids`` through eviction until as many :meth:`unpin` calls.

        A worker pins the ids it pulled until its push of their gradients lands, so an
        eviction in between cannot drop (or recycle) a row a pending push targets. Pins
        count per id; pinning an id without a row is allowed (it stays unevictable if
        it gets one). Explicit :meth:`remove` ignores pins.
        """
        keys, cnt = np.unique(_as_keys(ids, "HashEmbeddingTable.pin"), return_counts=True)
        with self.lock:
            have = self.pins.get(keys)
            self.pins.put(keys, np.where(have < 0, 0, have) + cnt)

    def unpin(self, ids) -> None:
        """Release one pin of each id (one per occurrence); unpinning an unpinned id raises."""
        keys, cnt = np.unique(_as_keys(ids, "HashEmbeddingTable.unpin"), return_counts=True)
        with self.lock:
            have = self.pins.get(keys)
            bad = have < cnt
            if bad.any():
                raise ValueError(f"HashEmbeddingTable.unpin: id {int(keys[bad][0])} is pinned "
                                 f"{max(int(have[bad][0]), 0)} times, asked to unpin "
                                 f"{int(cnt[bad][0])}")
            left = have - cnt
            self.pins.remove(keys[left == 0])
            self.pins.put(keys[left > 0], left[left > 0])

    def remove(self, ids) -> int:
        """Delete ids and free their rows; returns how many existed."""
        keys = _as_keys(ids, "HashEmbeddingTable.remove")
        with self.lock:
            old = self.map.remove(keys)
            gone = old[old >= 0]
            self.live[gone] = False
            self.dirty[gone] = False
            # A delta must list an id only if the chain so far holds it: ids created and
            # evicted between two exports never reached a reader.
            logged = self.exported[gone]
            if logged.any() and self.export_seq is not None:
                self.evicted.append(keys[old >= 0][logged])
            self.exported[gone] = False
            self.alloc.release(gone)
            if self.tier is not None:  # ids held on disk
                n_disk, logged_disk = self.tier.remove(keys, old)
                if logged_disk.size and self.export_seq is not None:
                    self.evicted.append(logged_disk)
                return int(gone.size) + n_disk
            return int(gone.size)

    def evict(self, step: int | None = None, max_rounds: int = 64) -> int:
        """Run the eviction policy incrementally; returns rows evicted.

        Window policies (TTL, user) look at one window of rows per call; a capacity
        policy keeps sweeping windows (at most ``max_rounds``) until under capacity.
        Pinned ids (:meth:`pin`) are never chosen.
        """
        if self.eviction is None:
            return 0
        total = 0
        cap = getattr(self.eviction, "capacity", None)
        with self.lock:
            step = self.step if step is None else int(step)
            for _ in range(max_rounds if cap is not None else 1):
                if cap is not None and len(self) <= cap:
                    break
                n_rows = self.alloc.next_row
                victims = self.eviction.select(self.meta, self.live[:n_rows], len(self), step)
                if victims.size and len(self.pins):
                    victims = victims[self.pins.get(self.meta["key"][victims]) < 0]
                if victims.size:
                    keys = self.meta["key"][victims]
                    total += self.remove(keys)
                    if self.on_evict is not None:
                        self.on_evict(keys)
        return total

    # -- listing -------------------------------------------------------------------------
    def ids(self) -> np.ndarray:
        """All ids that currently own a row."""
        with self.lock:
            ids = self.map.items()[0]
            return ids if self.tier is None else np.concatenate([ids, self.tier.ids()])
