"""Disk tier of a hash embedding table: a RAM budget, and the colder rows on disk.

``HashEmbeddingTable(dim, memory_budget_mb=M, spill_dir=DIR)`` keeps at most ``M`` MB of
rows in RAM -- weights, optimiser slots, per-id metadata, the id -> row map and flags,
and the disk store's own index, as :attr:`DiskTier.resident_bytes` counts them -- and
the rest in a store under ``DIR``. Before a batch is resolved, its ids held on disk are
promoted (read only: the disk copy stays, stale, until the row is demoted again and
overwrites it, so a step's misses need no write) and, when the batch's new and promoted
ids would not fit, the resident rows seen least are demoted (:meth:`DiskTier._score`: the
lowest sighting counts, halved every ``AGE`` steps unseen, of a random sample of
``SAMPLE`` x the rows needed, never the batch's or pinned ids; LRU missed 5-9% more).
Demotion frees 1/32 of the rows more than it must, so it runs once every few batches.
A demoted row keeps everything exactly
(stored weights, float32 slots, metadata, dirty/exported bits), so a spilled table
trains to the all-RAM table's rows bit for bit. ``read`` (``create=False``) reads disk
rows where they lie, without promoting them. The map and metadata are sized once for
the rows the budget holds with one float32 slot a lane (Adagrad); attaching slots
demotes every row and re-fits the budget.

Two stores (:func:`open_store`): :class:`~sampan.rec.logstore.LogStore` (the default,
``STORE = "log"``: a hashed page file plus an append-only log, no per-id index in RAM;
see that module for its format and crash rules) and :class:`SpillStore` (LMDB,
``STORE = "lmdb"``, or any ``DIR`` that already holds an LMDB store). A killed process
loses what RAM held (as an all-RAM table does; snapshots are the recovery path) and
leaves a store that reopens with each id as of its last demotion:
``HashEmbeddingTable(..., spill_dir=DIR)`` over an existing store serves its rows.

Why the log store (``benchmarks/embedding_disk.py``): LMDB reads cost ~10 us a key in
page faults (0.050x all-RAM against the log store's 0.135x, cold, quiet machine), pages
written in place 35-100 us each, an append a write call per batch; an in-RAM id ->
offset index (>= 5 bytes an id) would not fit 10^8 ids in 256 MB. The figures, and
what keeps the issue's 0.5x and 10^8 ids out of reach: ``sampan.rec.logstore``.

SpillStore: a record per id (``meta | flags | weights [| scale] [| slots] | crc32``) and
a ``header`` (version, dim, dtype, lineage, row count) rewritten by every transaction
(<= ``SLICE`` rows); a count off its rows, a bad crc32 or another shape: DiskTierError.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

from sampan.errors import SampanValueError, op_error
from sampan.rec._logstore_kernels import DiskTierError, unique_ids  # one class: both stores
from sampan.rec.hashtable import META_FIELDS
from sampan.rec.rowstore import raw_specs

__all__ = ["DiskTier", "DiskTierError", "SpillStore", "open_store"]

FORMAT = "sampan-spill"
VERSION = 1
N_META = len(META_FIELDS)
_HEADER = b"header"


def _lmdb():
    try:
        import lmdb
    except ImportError:  # pragma: no cover - optional dependency
        raise ImportError("the LMDB spill store needs 'lmdb' (pip install lmdb)") from None
    return lmdb


def _keys(ids: np.ndarray) -> list[bytes]:
    """8-byte big-endian keys ordered like the ids (sign bit flipped)."""
    b = (ids.astype(np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8").tobytes()
    return [b[i:i + 8] for i in range(0, len(b), 8)]


def _ids(keys: list[bytes]) -> np.ndarray:
    u = np.frombuffer(b"".join(keys), ">u8").astype(np.uint64)
    return (u ^ np.uint64(1 << 63)).view(np.int64)


class SpillStore:
    """LMDB records of rows, keyed by id; each read or write of up to SLICE rows is one
    transaction."""

    REMAP_KEYS = 512
    SLICE = 1024  # rows a write transaction holds at most

    def __init__(self, path: str, dim: int, row_dtype: str, lineage: str):
        lmdb = _lmdb()
        os.makedirs(path, exist_ok=True)
        self.path, self.dim, self.row_dtype = path, int(dim), row_dtype
        specs = raw_specs(row_dtype, 0, dim)
        self.w_dtype = specs["values"][0]
        self.scaled = "scale" in specs
        self.base = 8 * N_META + 8 + self.dim * self.w_dtype.itemsize + 2 * self.scaled
        try:
            self._open()
            with self.env.begin(write=True) as txn:
                raw = txn.get(_HEADER, db=self.hdb)
                if raw is None:
                    self.header = {"format": FORMAT, "version": VERSION, "dim": self.dim,
                                   "row_dtype": row_dtype, "lineage": lineage, "count": 0}
                    txn.put(_HEADER, json.dumps(self.header).encode(), db=self.hdb)
                else:
                    self.header = self._check_header(raw)
                    n = txn.stat(self.db)["entries"]
                    if n != self.header["count"]:
                        raise DiskTierError(f"spill store {path}: header counts "
                                            f"{self.header['count']} rows, the store holds "
                                            f"{n}; it was not written by one committed "
                                            f"transaction")
        except lmdb.Error as exc:
            raise DiskTierError(f"spill store {path} cannot be opened: {exc}") from None

    def _check_header(self, raw: bytes) -> dict:
        try:
            h = json.loads(raw)
        except ValueError:
            raise DiskTierError(f"spill store {self.path}: unreadable header") from None
        if h.get("format") != FORMAT or h.get("version") != VERSION:
            raise DiskTierError(f"spill store {self.path}: format {h.get('format')!r} "
                                f"version {h.get('version')!r}, expected {FORMAT!r} "
                                f"version {VERSION}")
        if h.get("dim") != self.dim or h.get("row_dtype") != self.row_dtype:
            raise DiskTierError(f"spill store {self.path} holds dim={h.get('dim')} "
                                f"row_dtype={h.get('row_dtype')!r} rows, the table has "
                                f"dim={self.dim} row_dtype={self.row_dtype!r}")
        return h

    def __len__(self) -> int:
        return int(self.header["count"])

    # -- records -------------------------------------------------------------------------
    def _encode(self, rec: dict) -> list[bytes]:
        """Records of ``rec`` = {meta (n, 6) int64, flags (n, 8) uint8, values[, scale]
        [, slots (n, s) float32]}, each with its crc32."""
        n = rec["meta"].shape[0]
        parts = [rec["meta"].astype("<i8").view(np.uint8).reshape(n, -1),
                 rec["flags"].astype(np.uint8).reshape(n, 8),
                 np.ascontiguousarray(rec["values"], self.w_dtype).view(np.uint8)
                 .reshape(n, -1)]
        if self.scaled:
            parts.append(rec["scale"].astype("<u2").view(np.uint8).reshape(n, 2))
        if rec.get("slots") is not None:
            parts.append(rec["slots"].astype("<f4").view(np.uint8).reshape(n, -1))
        body = np.concatenate(parts, axis=1)
        crc = np.array([zlib.crc32(r) for r in body], "<u4").view(np.uint8).reshape(n, 4)
        flat = np.concatenate([body, crc], axis=1).tobytes()
        L = body.shape[1] + 4
        return [flat[i:i + L] for i in range(0, len(flat), L)]

    def _decode(self, ids: np.ndarray, vals: list[bytes]) -> dict:
        """The arrays of records (all of one slot width), checked against their crc32."""
        n = len(vals)
        lens = {len(v) for v in vals}
        if len(lens) > 1:
            raise DiskTierError(f"spill store {self.path}: rows of mixed slot widths in "
                                f"one read ({sorted(lens)} bytes)")
        L = lens.pop() if n else self.base + 4
        if (L - 4 - self.base) % 4 or L < self.base + 4:
            raise DiskTierError(f"spill store {self.path}: a record of {L} bytes, expected "
                                f"{self.base + 4} + 4 x slot width")
        a = np.frombuffer(b"".join(vals), np.uint8).reshape(n, L)
        crc = a[:, L - 4:].copy().view("<u4").ravel()
        bad = [j for j in range(n) if zlib.crc32(a[j, :L - 4]) != crc[j]]
        if bad:
            raise DiskTierError(f"spill store {self.path}: the row of id {int(ids[bad[0]])} "
                                f"fails its checksum ({len(bad)} of {n} rows read)")
        o = 8 * N_META
        out = {"meta": a[:, :o].copy().view("<i8"), "flags": a[:, o:o + 8].copy()}
        o += 8
        wb = self.dim * self.w_dtype.itemsize
        out["values"] = a[:, o:o + wb].copy().view(self.w_dtype)
        o += wb
        if self.scaled:
            out["scale"] = a[:, o:o + 2].copy().view("<u2").ravel()
            o += 2
        sw = (L - 4 - o) // 4
        out["slots"] = a[:, o:o + 4 * sw].copy().view("<f4") if sw else None
        return out

    def _commit_count(self, txn) -> None:
        """Write the header with the rows this transaction leaves (commits with them)."""
        self.header["count"] = txn.stat(self.db)["entries"]
        txn.put(_HEADER, json.dumps(self.header).encode(), db=self.hdb)

    def _open(self) -> None:
        lmdb = _lmdb()
        self.env = lmdb.open(self.path, map_size=1 << 40, max_dbs=2, sync=False,
                             readahead=False, meminit=False)
        self.db = self.env.open_db(b"rows")
        self.hdb = self.env.open_db(b"meta")
        self.moved = 0

    def _moving(self, n_keys: int) -> None:
        """Count keys read or written (about a page each); past ``REMAP_KEYS`` close and
        reopen the map, so that the store's pages the process has touched (file-backed
        RSS, which the kernel could reclaim anyway) stay bounded: a fault maps up to
        64 kB of cached file around it (Linux fault-around, measured: 7k reads mapped a
        whole 160 MB store), so 512 keys map <= 32 MB. Never inside a transaction."""
        self.moved += n_keys
        if self.moved > self.REMAP_KEYS:
            self.env.close()
            self._open()

    # -- transactions --------------------------------------------------------------------
    def put(self, ids: np.ndarray, rec: dict, known=None) -> None:
        """Write (or overwrite) the rows of ``ids``, sorted: a transaction per SLICE rows
        (``known``, the caller's word on which ids it holds, is not needed here)."""
        if not ids.size:
            return
        order = np.argsort(ids, kind="stable")
        # one transaction per SLICE rows: a write transaction holds a private copy of
        # every B-tree page it touches (a page per row, for spread-out ids), and maps
        # up to 64 kB of file around each (see _moving): 8192 rows peaked at +500 MB of
        # RSS in a 10^7-id fill, 1024 rows hold <= 4 MB + 64 MB; each slice commits whole
        for s in range(0, ids.size, self.SLICE):
            o = order[s:s + self.SLICE]
            vals = self._encode({k: (None if v is None else v[o]) for k, v in rec.items()})
            with self.env.begin(write=True, db=self.db) as txn:
                txn.cursor().putmulti(zip(_keys(ids[o]), vals))
                self._commit_count(txn)
            self._moving(o.size)

    def take(self, ids: np.ndarray, delete: bool = True):
        """``(found ids, their records)``; ``delete`` removes them in the same transaction."""
        keys = _keys(np.unique(ids))  # sorted: the B-tree walk reuses its pages
        with self.env.begin(write=delete, db=self.db) as txn:
            # one C call for the batch (Cursor.getmulti), not a Python get per key
            got = txn.cursor().getmulti(keys) if keys else []
            if delete and got:
                for k, _ in got:
                    txn.delete(k)
                self._commit_count(txn)
            fids = _ids([k for k, _ in got]) if got else np.empty(0, np.int64)
            out = fids, self._decode_mixed(fids, [v for _, v in got])
        self._moving(len(keys))
        return out

    def _decode_mixed(self, ids, vals) -> list[tuple[np.ndarray, dict]]:
        """Records grouped by length (rows demoted before and after slots attached)."""
        by_len: dict[int, list[int]] = {}
        for j, v in enumerate(vals):
            by_len.setdefault(len(v), []).append(j)
        return [(ids[js], self._decode(ids[js], [vals[j] for j in js]))
                for js in (np.array(g, np.int64) for g in by_len.values())]

    def scan(self, batch: int = 1 << 16):
        """Every row, ``batch`` at a time: yields ``(ids, records)`` groups."""
        with self.env.begin(db=self.db) as txn:
            keys, vals = [], []
            for k, v in txn.cursor():
                keys.append(bytes(k))
                vals.append(bytes(v))
                if len(keys) == batch:
                    yield from self._decode_mixed(_ids(keys), vals)
                    keys, vals = [], []
            if keys:
                yield from self._decode_mixed(_ids(keys), vals)

    nbytes = 0  # keeps nothing in RAM between calls (LMDB's index lives in its file)

    def reshape(self, slot_width: int) -> None:  # records of any slot width mix here
        pass

    def close(self) -> None:
        self.env.close()


# a larger log index merges less often (a merge rewrites the base pages it touches) but
# leaves fewer rows resident; measured (benchmarks/embedding_disk.py --quick): see below
INDEX_SHARE = 0.25
STORE = "log"  # the store a new spill_dir gets: "log" (LogStore) or "lmdb" (SpillStore)


def open_store(path: str, dim: int, row_dtype: str, lineage: str, index_bytes: float):
    """The store under ``path``: LMDB if it holds one (``data.mdb``), a :class:`LogStore`
    if it holds one (``MANIFEST``), else a new one of kind :data:`STORE`. A LogStore's
    index of logged ids takes at most ``index_bytes`` (the tier gives it INDEX_SHARE of
    the budget its map and metadata leave), and at least 1024 entries' worth."""
    from sampan.rec.logstore import LogStore  # numba kernels: compiled on first use
    lmdb_here = os.path.exists(os.path.join(path, "data.mdb"))
    log_here = os.path.exists(os.path.join(path, "MANIFEST"))
    if lmdb_here and log_here:
        raise DiskTierError(f"spill store {path} holds both an LMDB store and a log store")
    if lmdb_here or (not log_here and STORE == "lmdb"):
        return SpillStore(path, dim, row_dtype, lineage)
    if STORE not in ("log", "lmdb"):
        raise DiskTierError(f"disktier.STORE={STORE!r}, expected 'log' or 'lmdb'")
    entries = 1 << 10
    while LogStore.index_bytes(2 * entries) <= index_bytes:
        entries *= 2
    return LogStore(path, dim, row_dtype, lineage, index_entries=entries)


class DiskTier:
    """The RAM budget of one table and its spill store (see the module docstring)."""

    SLACK = 32  # demote 1/SLACK of the rows more than needed, so demotion is batched
    SAMPLE = 4  # demote the n lowest-ranked of ~SAMPLE x n random rows (not all: O(n))
    AGE = 1024  # steps unseen that halve a row's count in _score (old hot rows leave)
    PUT_SLICE = 1 << 14  # rows a demotion copies at once (a 10^7-id fill: 105k a batch)

    def __init__(self, table, budget_mb: float, spill_dir: str):
        if not budget_mb > 0:
            raise op_error(SampanValueError, "HashEmbeddingTable",
                           f"memory_budget_mb={budget_mb!r}", "a positive number of MB")
        self.table = table
        self.budget = int(budget_mb * (1 << 20))
        t = table
        fixed = t.map.nbytes + t.pending.nbytes + t.pins.nbytes + \
            sum(a.nbytes for a in t.meta.values()) + 4 * t.live.nbytes
        self.store = open_store(spill_dir, table.dim, table.row_dtype, table.lineage,
                                INDEX_SHARE * max(self.budget - fixed, 0))
        self.max_rows = self._fit()
        self.demoted = self.promoted = 0
        self.rng = np.random.default_rng(0)
        # resident rows whose (older) copy is still on disk: promotion only reads, so it
        # needs no write transaction; demotion overwrites the copy
        self.ondisk = np.zeros(table.live.size, np.bool_)
        self.n_ondisk = 0

    def __len__(self) -> int:
        """Ids held on disk only."""
        return len(self.store) - self.n_ondisk

    def _fit(self) -> int:
        """Most resident rows under the budget, given what is allocated per row already."""
        t = self.table
        fixed = t.map.nbytes + t.pending.nbytes + t.pins.nbytes + self.store.nbytes
        fixed += sum(a.nbytes for a in t.meta.values()) + 4 * t.live.nbytes
        per = t.weights.bytes_per_row + (4 * t.slots.width if t.slots is not None else 0)
        chunks = (self.budget - fixed) // (per << t.weights.shift)
        n = min(int(chunks) << t.weights.shift, t.live.size)
        if n < 1:
            raise op_error(SampanValueError, "HashEmbeddingTable",
                           f"memory_budget_mb={self.budget / (1 << 20):g}",
                           f"room for at least one chunk of {1 << t.weights.shift} rows "
                           f"beside {fixed} bytes of map and metadata")
        return n

    @property
    def resident_bytes(self) -> int:
        """Bytes the RAM tier holds (``table.nbytes`` plus the pin and flag arrays)."""
        t = self.table
        return t.nbytes + t.pins.nbytes + t.dirty.nbytes + t.exported.nbytes + \
            self.ondisk.nbytes + self.store.nbytes

    # -- moving rows ---------------------------------------------------------------------
    def _capture(self, rows: np.ndarray) -> dict:
        t = self.table
        raw = t.weights.raw(rows)
        flags = np.zeros((rows.size, 8), np.uint8)
        flags[:, 0] = t.dirty[rows]
        flags[:, 1] = t.exported[rows]
        return {"meta": np.stack([t.meta[f][rows] for f in META_FIELDS], axis=1),
                "flags": flags, "values": raw["values"], "scale": raw.get("scale"),
                "slots": t.slots.gather(rows) if t.slots is not None else None}

    def _place(self, ids: np.ndarray, rec: dict) -> np.ndarray:
        """Give ``ids`` resident rows holding ``rec`` exactly; returns the rows."""
        t = self.table
        rows, _ = t.map.get_or_insert(ids, t.alloc)
        t._grow()
        raw = {"values": rec["values"]}
        if rec.get("scale") is not None:
            raw["scale"] = rec["scale"]
        t.weights.set_raw(rows, raw)
        if t.slots is not None:
            s = rec.get("slots")
            if s is None or s.shape[1] != t.slots.width:  # demoted under another optimiser
                s = np.full((rows.size, t.slots.width), t.slot_init, np.float32)
            t.slots.scatter(rows, s)
        for i, f in enumerate(META_FIELDS):
            t.meta[f][rows] = rec["meta"][:, i]
        t.live[rows] = True
        t.dirty[rows] = rec["flags"][:, 0].astype(bool)
        t.exported[rows] = rec["flags"][:, 1].astype(bool)
        return rows

    def _drop_resident(self, rows: np.ndarray) -> None:
        t = self.table
        t.map.remove(t.meta["key"][rows])
        t.live[rows] = t.dirty[rows] = t.exported[rows] = False
        self.n_ondisk -= int(self.ondisk[rows].sum())
        self.ondisk[rows] = False
        t.alloc.release(rows)

    def demote(self, n: int, protect: np.ndarray) -> int:
        """Move the ``n`` resident rows that :meth:`_score` ranks lowest (not in
        ``protect``, not pinned) to disk; returns how many moved."""
        t, top, live = self.table, self.table.alloc.next_row, len(self.table.map)
        held = t.map.get(protect)  # the batch's resident rows (a map lookup, not an isin)
        for sampled in (True, False)[live <= self.SAMPLE * n:]:  # a sample: O(n) work
            pick = t.live[:top].copy()
            if sampled:  # ~SAMPLE x n live rows; all rows if the batch's filled it
                sample = np.zeros(top, np.bool_)
                sample[self.rng.integers(0, top, -(-self.SAMPLE * n * top // live))] = True
                pick &= sample
            pick[held[(held >= 0) & (held < top)]] = False
            cand = np.flatnonzero(pick)
            if len(t.pins):
                cand = cand[t.pins.get(t.meta["key"][cand]) < 0]
            if cand.size >= n:
                break
        if n < cand.size:
            cand = cand[np.argpartition(self._score(cand), n - 1)[:n]]
        self._demote_rows(cand)
        return int(cand.size)

    def _score(self, rows: np.ndarray) -> np.ndarray:
        """Sighting counts halved every ``AGE`` steps unseen, ties to the most recently
        seen: the lowest are demoted first."""
        m, seen = self.table.meta, self.table.meta["last_seen"][rows]
        age = np.clip((self.table.step - seen) // self.AGE, 0, 62)
        return (np.maximum(m["freq"][rows], 0) >> age).astype(np.float64) + \
            (seen - seen.min()) / (np.ptp(seen) + 1.0)

    def _demote_rows(self, rows: np.ndarray) -> None:
        """Write ``rows`` to the store and free them, PUT_SLICE rows at a time (a copy of
        the rows in stored form is the transient RAM a demotion takes)."""
        t = self.table
        for s in range(0, rows.size, self.PUT_SLICE):
            r = rows[s:s + self.PUT_SLICE]
            self.store.put(t.meta["key"][r], self._capture(r), known=self.ondisk[r])
            self._drop_resident(r)
            self.demoted += int(r.size)

    def promote(self, ids: np.ndarray) -> int:
        """Bring the rows of ``ids`` that are on disk into RAM (they must fit)."""
        n = 0
        if len(self.store) and ids.size:
            fids, groups = self.store.take(ids, delete=False)
            for gids, rec in groups:
                rows = self._place(gids, rec)
                self.ondisk[rows] = True
            n = int(fids.size)
            self.n_ondisk += n
            self.promoted += n
        return n

    def prepare(self, keys: np.ndarray) -> None:
        """Make room for a batch and promote its ids on disk; under the table lock."""
        t = self.table
        miss = unique_ids(keys[t.map.get(keys) < 0])
        if miss.size + len(t.map) > self.max_rows:
            u = unique_ids(keys)
            if u.size > self.max_rows:
                raise op_error(SampanValueError, "HashEmbeddingTable.lookup",
                               f"a batch of {u.size} distinct ids",
                               f"at most {self.max_rows} (the rows memory_budget_mb holds)")
            need = miss.size + len(t.map) - self.max_rows
            self.demote(min(need + self.max_rows // self.SLACK, len(t.map)), u)
            if miss.size + len(t.map) > self.max_rows:
                raise op_error(SampanValueError, "HashEmbeddingTable.lookup",
                               f"{len(t.map)} resident rows that are pinned or in the batch, "
                               f"and {miss.size} more ids",
                               f"at most {self.max_rows} rows in memory_budget_mb "
                               f"(unpin ids, or give a larger budget)")
        self.promote(miss)

    def read_into(self, keys: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Fill ``out`` for the ids without a resident row from disk, without promoting
        them; returns ``rows`` with the ids found on disk marked (>= 0)."""
        from sampan.rec.rowstore import make_rows
        rows = rows.copy()
        miss = np.flatnonzero(rows < 0)
        if miss.size and len(self.store):
            u, inv = np.unique(keys[miss], return_inverse=True)
            _, groups = self.store.take(u, delete=False)
            for gids, rec in groups:
                tmp = make_rows(self.table.dim, int(gids.size).bit_length(),
                                self.table.row_dtype)  # one chunk: a decoder
                tmp.ensure(gids.size)
                at = np.arange(gids.size)
                raw = {"values": rec["values"]}
                if rec.get("scale") is not None:
                    raw["scale"] = rec["scale"]
                tmp.set_raw(at, raw)
                vals = tmp.gather(at)
                j = np.searchsorted(u, gids)  # u is sorted and holds every gid
                hit = np.zeros(u.size, np.int64) - 1
                hit[j] = np.arange(gids.size)
                h = hit[inv]
                sel = h >= 0
                out[miss[sel]] = vals[h[sel]]
                rows[miss[sel]] = 0
        return rows

    def flush(self) -> None:
        """Demote every resident row and drop the row chunks (before the slot layout,
        and with it the rows the budget holds, changes); :meth:`refit` after."""
        from sampan.rec.hashtable import RowAllocator
        from sampan.rec.rowstore import make_rows
        t = self.table
        self._demote_rows(np.flatnonzero(t.live[: t.alloc.next_row]))
        t.weights = make_rows(t.dim, t.weights.shift, t.row_dtype)
        t.alloc = RowAllocator()

    def refit(self) -> None:
        """Recompute the resident row limit (after the slots were attached); the store's
        records take the new slot width (rows on disk keep none, as RAM rows would)."""
        if self.table.slots is not None:
            self.store.reshape(self.table.slots.width)
        self.max_rows = self._fit()

    # -- whole-table views ---------------------------------------------------------------
    def remove(self, ids: np.ndarray, old: np.ndarray) -> tuple[int, np.ndarray]:
        """Delete ids from disk too (``old``: their rows before the table removed the
        resident ones): ``(ids held on disk only, those a snapshot chain holds)``."""
        gone = old[old >= 0]
        self.n_ondisk -= int(self.ondisk[gone].sum())
        self.ondisk[gone] = False
        _, groups = self.store.take(ids)
        disk_only = set(ids[old < 0].tolist())
        n, logged = 0, []
        for g, rec in groups:
            only = np.array([i in disk_only for i in g.tolist()], np.bool_)
            n += int(only.sum())
            logged.append(g[only & rec["flags"][:, 1].astype(bool)])
        return n, (np.concatenate(logged) if logged else np.empty(0, np.int64))

    def ids(self) -> np.ndarray:
        """Ids held on disk only."""
        got = [g[self.table.map.get(g) < 0] for g, _ in self.store.scan()]
        return np.concatenate(got) if got else np.empty(0, np.int64)

    def with_disk(self, arrays: dict, kind: str, mark: bool = True) -> dict:
        """Snapshot ``arrays`` of the RAM rows plus the disk rows (all, or dirty ones)."""
        disk = self.export(kind, mark)
        return arrays if disk is None else {k: np.concatenate([v, disk[k]])
                                            for k, v in arrays.items()}

    def load_snapshot(self, arrays: dict, slots: bool) -> None:
        """Restore a snapshot file's rows (see :meth:`_load`), clean and exported."""
        n = arrays["ids"].size
        flags = np.zeros((n, 8), np.uint8)
        flags[:, 1] = 1
        self._load(arrays["ids"], {
            "meta": np.stack([arrays[f"meta.{f}"] for f in META_FIELDS], axis=1),
            "flags": flags, "values": arrays["weights"],
            "scale": arrays.get("weights.scale"),
            "slots": arrays.get("slots") if slots else None})

    def export(self, kind: str, mark: bool = True) -> dict | None:
        """Disk rows for a snapshot (all, or the dirty ones for a delta) in
        ``snapshot._capture``'s form; ``mark`` sets them exported (clean). None if none."""
        t = self.table
        out, marked = [], []
        for gids, rec in self.store.scan():
            pick = t.map.get(gids) < 0  # resident rows: RAM has them, newer
            if kind != "full":
                pick &= rec["flags"][:, 0] == 1
            if not pick.any():
                continue
            sub = {k: (None if v is None else v[pick]) for k, v in rec.items()}
            arr = {"ids": gids[pick], "weights": sub["values"]}
            if sub.get("scale") is not None:
                arr["weights.scale"] = sub["scale"]
            if t.slots is not None:
                s = sub["slots"]
                arr["slots"] = s if s is not None and s.shape[1] == t.slots.width else \
                    np.full((pick.sum(), t.slots.width), t.slot_init, np.float32)
            for i, f in enumerate(META_FIELDS):
                arr[f"meta.{f}"] = sub["meta"][:, i]
            out.append(arr)
            sub["flags"] = sub["flags"].copy()
            sub["flags"][:, 0], sub["flags"][:, 1] = 0, 1
            marked.append((gids[pick], sub))
        for gids, sub in marked if mark else ():  # after the scan: its read transaction is closed
            self.store.put(gids, sub, known=np.ones(gids.size, np.bool_))
        if not out:
            return None
        return {k: np.concatenate([a[k] for a in out]) for k in out[0]}

    def mark_dirty(self, ids: np.ndarray) -> None:
        """Set the dirty bit of disk rows again (an export that failed to write)."""
        fids, groups = self.store.take(ids, delete=False)
        for gids, rec in groups:
            rec["flags"] = rec["flags"].copy()
            rec["flags"][:, 0] = 1
            self.store.put(gids, rec, known=np.ones(gids.size, np.bool_))

    def _load(self, ids: np.ndarray, rec: dict) -> None:
        """Restore rows: resident ones in place, then RAM while it has room (most
        recently seen first), the rest to disk; under the table lock."""
        t = self.table
        res = t.map.get(ids) >= 0
        room = max(self.max_rows - len(t.map), 0)
        cand = np.flatnonzero(~res)
        order = cand[np.argsort(-rec["meta"][cand, 2], kind="stable")]
        to_ram = np.zeros(ids.size, bool)
        to_ram[res] = True
        to_ram[order[:room]] = True
        sub = lambda m: {k: (None if v is None else v[m]) for k, v in rec.items()}  # noqa
        new_in_ram = to_ram & ~res
        if new_in_ram.any() and len(self.store):
            self.store.take(ids[new_in_ram])  # an older file's copy on disk: RAM's now
        if to_ram.any():
            self._place(ids[to_ram], sub(to_ram))
        if (~to_ram).any():
            self.store.put(ids[~to_ram], sub(~to_ram))
