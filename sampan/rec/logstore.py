"""Disk store of a table's spilled rows: a hashed page file and an append-only log.

The disk tier (:mod:`sampan.rec.disktier`) keeps the rows that do not fit its RAM budget
here. Two levels:

- the **base**: a file of 4 kB pages, each holding ``P`` fixed-size records; an id's
  record lives in its home page (a hash of the id) or, when that page was full, in one
  of the pages after it (a page that ever overflowed says so in its header, so a search
  stops at the first page that does not). No index in RAM: where a record lies follows
  from its id, which is what lets 10^8 ids sit under a 256 MB budget (an index in RAM
  costs >= 5 bytes an id, 500 MB at 10^8).
- the **log**: every write (a batch of demoted rows, or of deletions) is appended to one
  log file as one entry: a header (sequence number, record count, the store's row count
  after it, a checksum over the header and the records' checksums) and the records. An
  in-RAM map ``id -> its latest log record`` (at most ``index_entries`` ids; its bytes
  count toward the table's budget) serves reads of logged ids. When it is full, the log
  is **merged** into the base: its latest records, sorted by home page, are applied to
  windows of consecutive pages (one read and one write per window), and the manifest
  then names a new, empty log. When the base gets too full it is **rebuilt** at twice
  the pages (a new file, then the manifest switches to it).

Why not write the base in place on every demotion (``benchmarks/embedding_disk.py
--parts store --store-rows 2000000 --store-batches 10``, the shared 2-core build machine,
ext4, under load, 2026-12-02): a random 4 kB ``pwrite`` over a clean page of a synced
file took 50.6 us (35-100 us in other runs, through ``mmap`` too), a random 4 kB
``pread`` 2.1 us, and appending 192-byte records 4096 at a time 0.33 us a record; so a
demotion appends, and the base takes its updates in runs of pages at a merge. Reads
use ``pread`` from numba kernels, not a memory map: mapped file pages count in the
process' RSS, and a fault maps up to 64 kB around it.

Figures (``--ids 10000000 --budget-mb 256 --parts train --steps 1000 --warmup 2000``,
2026-12-02, one run of the code before the frequency-ranked demotion and sorted uniques
of ``sampan.rec.disktier``, then one after; load 10-12 on the 2-core machine, so the
all-RAM figures swung 83k-214k samples/s and the ratios are rough): fill 416 -> 167 s;
steady state (after 2000 untimed steps) 22.1k -> 31.4k samples/s (0.266x -> 0.205x of
that run's all-RAM), 1091 -> 1033 promotions a step; cold (the first 1000 steps after
the fill, which leaves the coldest ranks in RAM) 19.7k -> 32.0k (0.092x -> 0.217x);
peak RSS budget + 311.5 -> + 290.0 MB; 4.3 GB on disk. 3x10^7 ids (after, load ~13):
fill 582 s (27 merges), steady 25.8k (0.418x of that run's all-RAM 61.9k, which slows
with 7.5 GB of rows), 1100 promotions a step, + 288.8 MB, 8.2 GB. Earlier, quiet, cold
only: all-RAM 479.6k, log store 64.7k (0.135x), + 299 MB.

What limits it: the workload's misses. ``(zipf(1.1) - 1) % n`` spreads ~20% of lookups
over all ids, so even a static cache of the 826k most popular ranks the budget holds
misses ~914 of a step's ~2360 distinct ids (the tier: 1033); a miss costs a ``pread`` of
its home page (``_base_find``, ~1.3 us quiet, ~3-7 us loaded: the largest item of a
steady-state profile) plus a demotion appended, a share of a merge (one per ~1M logged
ids, rewriting the pages they fall on) and the tier's map work, against a ~1 ms
all-RAM step (quiet); 0.5x needs ~1 us of disk work a miss, all told. Reads of runs
(``preadv``) do not help: a step's ~1000 misses fall on pages ~1000 apart. io_uring, or
a memory-mapped base with its pages unmapped after each step, are what is left.
A fill of new ids merges ~100 times at 10^8 (each rewriting most of a base that grows
to 32 GB, ~3 TB of I/O): ``HashEmbeddingTable.bulk_fill`` spools new ids instead and
writes base, log and spool into a new base in one sequential pass
(:mod:`sampan.rec._logstore_bulk`; homes are the top bits of the hash so that a spool
bucket is one run of pages at any base size). Figures: ``benchmarks/RESULTS.md``.

Crash consistency: a killed process leaves (1) a manifest written atomically (temporary
file, fsync, rename) and checked by its own sha256; (2) a base whose pages hold, for
every id, either its state as of the last completed merge or a newer state the log also
holds (a merge only overwrites, adds and clears the records of logged ids); (3) a log
whose entries each check or, for the last one only, may be torn: a torn last entry is
cut off on reopen, so a batch is there whole or not at all. A failed check anywhere else
(a record, an entry before the last, the manifest, a file of the wrong size) is a
:class:`~sampan.rec.disktier.DiskTierError`, never rows read wrong. A merge killed half
way is simply done again: reads prefer the log, and applying a record twice gives the
same page. Power loss is not covered (the log is not fsynced per batch), as with LMDB
under ``sync=False`` before.

Records are little-endian 64-bit words: ``meta (6) | flags (1: state, dirty, exported,
has slots, in base) | weights [+ int8 scale] | slots | checksum``; pages are 512 words:
a header word (bit 0: overflowed) and ``P = 511 // R`` records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import numpy as np

from sampan import _atomic
from sampan.rec._logstore_bulk import _Bulk
from sampan.rec._logstore_compact import _Compaction
from sampan.rec._logstore_kernels import (BATCH, DEAD, FINE, HEAD, INDEX_LOAD, LIVE, MAGIC,
                                          N_META, PAGE_WORDS, TAIL, DiskTierError,  # noqa: F401
                                          _base_find, _checksums, _err, _extract,
                                          READ_THREADS, _first_bad, _read_records,
                                          base_find_split, unique_ids)
from sampan.rec.hashtable import HashMap, hash_ids
from sampan.rec.rowstore import raw_specs

__all__ = ["LogStore"]  # DiskTierError: sampan.rec.disktier's

FORMAT = "sampan-logstore"
VERSION = 2  # 2: homes are the top bits of an id's hash (1: bits 24 up)



# -- the store -----------------------------------------------------------------------------
class LogStore(_Compaction, _Bulk):
    """Rows on disk: a hashed page file plus an append-only log (see the module
    docstring). The interface :class:`~sampan.rec.disktier.DiskTier` uses:
    ``put``, ``take``, ``scan``, ``len``, ``reshape``, ``nbytes`` and ``close``."""

    def __init__(self, path: str, dim: int, row_dtype: str, lineage: str,
                 index_entries: int = 1 << 20, slot_width: int = 0):
        os.makedirs(path, exist_ok=True)
        self.path, self.dim, self.row_dtype = path, int(dim), row_dtype
        specs = raw_specs(row_dtype, 0, dim)
        self.w_dtype = specs["values"][0]
        self.scaled = "scale" in specs
        self.index_entries = max(int(index_entries), 64)
        self.base_fd = self.log_fd = -1
        self.merges = self.rebuilds = 0
        man = os.path.join(path, "MANIFEST")
        if os.path.exists(man):
            self.m = self._read_manifest(man)
            self._layout(self.m["slot_width"])
            self._open_files()
            self._sweep()
            self._replay()
        else:
            self._layout(int(slot_width))
            self.m = {"format": FORMAT, "version": VERSION, "dim": self.dim,
                      "row_dtype": row_dtype, "lineage": lineage,
                      "slot_width": self.slot_width, "gen": 0, "pages": 256,
                      "base_count": 0, "log": 0}
            self._new_base(0, 256)
            self._new_log(0)
            self._write_manifest()
            self._open_files()
            self.index = HashMap(self.index_entries, INDEX_LOAD)
            self.count, self.seq, self.log_words, self.runs = 0, 0, 0, []

    # -- layout and files ------------------------------------------------------------------
    def _layout(self, slot_width: int) -> None:
        self.slot_width = int(slot_width)
        self.vbytes = self.dim * self.w_dtype.itemsize
        self.vw = (self.vbytes + 2 * self.scaled + 7) // 8
        self.sw = (4 * self.slot_width + 7) // 8
        self.R = N_META + 1 + self.vw + self.sw + 1
        self.P = (PAGE_WORDS - 1) // self.R
        if self.P < 1:
            raise _err(f"spill store {self.path}: a record of {8 * self.R} bytes does not "
                       f"fit a 4 kB page (dim={self.dim}, slot width {self.slot_width})")

    def _file(self, kind: str, n: int) -> str:
        return os.path.join(self.path, f"{kind}.{n}")

    def _new_base(self, gen: int, pages: int) -> None:
        with open(self._file("base", gen), "wb") as f:
            f.truncate((pages + TAIL) * PAGE_WORDS * 8)  # a hole reads as empty pages

    def _new_log(self, k: int) -> None:
        open(self._file("log", k), "wb").close()

    def _open_files(self) -> None:
        for fd in (self.base_fd, self.log_fd):
            if fd >= 0:
                os.close(fd)
        self.n_pages = self.m["pages"] + TAIL
        try:
            self.base_fd = os.open(self._file("base", self.m["gen"]), os.O_RDWR)
            self.log_fd = os.open(self._file("log", self.m["log"]), os.O_RDWR)
        except FileNotFoundError as exc:
            raise _err(f"spill store {self.path}: {os.path.basename(exc.filename)}, which "
                       f"its manifest names, is missing") from None
        size = os.fstat(self.base_fd).st_size
        if size != self.n_pages * PAGE_WORDS * 8:
            raise _err(f"spill store {self.path}: base.{self.m['gen']} holds {size} bytes, "
                       f"its manifest says {self.n_pages} pages of 4096")

    def _sweep(self) -> None:
        """Remove the files of a rebuild or merge that was killed before its manifest."""
        keep = {f"base.{self.m['gen']}", f"log.{self.m['log']}"}
        for name in os.listdir(self.path):
            if re.fullmatch(r"spool\.\d+", name):  # a bulk fill killed before its manifest
                shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
            if re.fullmatch(r"(base|log)\.\d+", name) and name not in keep:
                os.unlink(os.path.join(self.path, name))

    @staticmethod
    def _digest(m: dict) -> str:
        body = {k: v for k, v in m.items() if k != "sha256"}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def _write_manifest(self) -> None:
        self.m["sha256"] = self._digest(self.m)
        data = json.dumps(self.m, sort_keys=True).encode()
        _atomic.write_file(os.path.join(self.path, "MANIFEST"), lambda f: f.write(data))

    def _read_manifest(self, man: str) -> dict:
        try:
            with open(man, "rb") as f:
                m = json.loads(f.read())
        except ValueError:
            raise _err(f"spill store {self.path}: unreadable MANIFEST") from None
        if m.get("format") != FORMAT or m.get("version") != VERSION:
            raise _err(f"spill store {self.path}: format {m.get('format')!r} version "
                       f"{m.get('version')!r}, expected {FORMAT!r} version {VERSION}")
        if m.get("sha256") != self._digest(m):
            raise _err(f"spill store {self.path}: MANIFEST fails its checksum")
        p = m.get("pages")
        if not isinstance(p, int) or p < FINE or p & (p - 1):
            raise _err(f"spill store {self.path}: MANIFEST names {p!r} base pages, expected "
                       f"a power of two >= {FINE}")
        if m.get("dim") != self.dim or m.get("row_dtype") != self.row_dtype:
            raise _err(f"spill store {self.path} holds dim={m.get('dim')} "
                       f"row_dtype={m.get('row_dtype')!r} rows, the table has "
                       f"dim={self.dim} row_dtype={self.row_dtype!r}")
        return m

    def _replay(self) -> None:
        """Rebuild the log's index; cut a torn last entry off, refuse any other damage."""
        w = np.fromfile(self._file("log", self.m["log"]), "<u8")
        size = w.size
        at, last, self.count, self.seq = 0, None, self.m["base_count"], 0
        spans = []
        while at < size:
            if at + HEAD > size:  # a header cut short: the last write, torn
                os.ftruncate(self.log_fd, at * 8)
                break
            if w[at] != MAGIC or w[at + 3] != self.R or \
                    self._head_sum(w[at:at + 5], w[:0].reshape(0, 1)) != w[at + 6]:
                raise _err(f"spill store {self.path}: log.{self.m['log']} entry at word "
                           f"{at} has a damaged header")
            n = int(w[at + 2])
            end = at + HEAD + n * self.R
            torn = end > size
            if not torn:
                recs = w[at + HEAD:end].reshape(n, self.R)
                bad = _first_bad(recs)
                good = bad < 0 and self._head_sum(w[at:at + 5], recs) == w[at + 5]
                if not good:
                    if end == size:  # the last entry: a write cut short by the kill
                        torn = True
                    else:
                        raise _err(f"spill store {self.path}: log.{self.m['log']} entry at "
                                   f"word {at} fails its checksum (entries follow it: "
                                   f"damage, not a torn write)")
            if torn:
                os.ftruncate(self.log_fd, at * 8)
                break
            spans.append((at, n))
            last = (int(w[at + 1]), int(w[at + 4]))
            at = end
        self.log_words = at
        n_ids = sum(n for _, n in spans)
        self.index = HashMap(max(self.index_entries, n_ids), INDEX_LOAD)
        self.runs = []
        for s, n in spans:
            recs = w[s + HEAD:s + HEAD + n * self.R].reshape(n, self.R)
            keys = recs[:, 0].view(np.int64)
            homes = self._homes(keys, self.m["pages"])
            if homes.size > 1 and (np.diff(homes) < 0).any():
                raise _err(f"spill store {self.path}: log.{self.m['log']} entry at word {s} "
                           f"is not in page order (not written by this store)")
            self.runs.append((s + HEAD, n, self._bounds(homes)))
            self.index.put(keys, self._values(s + HEAD, recs))
        if last is not None:
            self.seq, self.count = last[0] + 1, last[1]
        del w
        if len(self.index) > self.index_entries:
            self._compact()

    def _bounds(self, homes: np.ndarray) -> np.ndarray:
        """Where each of the FINE ranges of home pages starts in a run sorted by home."""
        edges = np.arange(FINE + 1, dtype=np.int64) * (self.m["pages"] // FINE)
        return np.searchsorted(homes, edges).astype(np.int64)

    def _values(self, start: int, recs: np.ndarray) -> np.ndarray:
        """Index values: word offset * 4 + in-base bit * 2 + live bit."""
        fl = recs[:, N_META]
        offs = start + np.arange(recs.shape[0], dtype=np.int64) * self.R
        live = ((fl & 0xFF) == LIVE).astype(np.int64)
        inbase = ((fl >> 32) & 1).astype(np.int64)
        return offs * 4 + inbase * 2 + live

    @staticmethod
    def _head_sum(head: np.ndarray, recs: np.ndarray) -> np.uint64:
        words = np.concatenate([head[:5].astype(np.uint64),
                                recs[:, -1].astype(np.uint64) if recs.shape[0] else
                                np.zeros(0, np.uint64), np.zeros(1, np.uint64)])
        out = np.empty(1, np.uint64)
        _checksums(words[None, :], out)
        return out[0]

    # -- sizes -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.count) + (self.spooled if self.spool is not None else 0)

    @property
    def nbytes(self) -> int:
        """RAM the store keeps between calls (the log's index)."""
        return self.index.nbytes

    @staticmethod
    def index_bytes(entries: int) -> int:
        """RAM the index of ``entries`` logged ids takes (as :class:`HashMap` sizes it)."""
        cap = 16
        while cap * INDEX_LOAD < max(int(entries), 64):
            cap *= 2
        return 16 * cap

    # -- records ---------------------------------------------------------------------------
    def _encode(self, rec: dict, state: int, inbase: np.ndarray) -> np.ndarray:
        n = rec["meta"].shape[0]
        w = np.zeros((n, self.R), np.uint64)
        w[:, :N_META] = rec["meta"].astype("<i8").view(np.uint64)
        fl = w[:, N_META:N_META + 1].view(np.uint8)
        fl[:, 0] = state
        fl[:, 1:3] = rec["flags"][:, 0:2]
        fl[:, 4] = inbase
        o = N_META + 1
        vb = w[:, o:o + self.vw].view(np.uint8)
        vb[:, :self.vbytes] = np.ascontiguousarray(rec["values"], self.w_dtype) \
            .view(np.uint8).reshape(n, -1)
        if self.scaled:
            vb[:, self.vbytes:self.vbytes + 2] = np.asarray(rec["scale"], "<u2") \
                .view(np.uint8).reshape(n, 2)
        s = rec.get("slots")
        if s is not None and s.shape[1] == self.slot_width and self.slot_width:
            fl[:, 3] = 1
            o += self.vw
            w[:, o:o + self.sw].view(np.uint8)[:, :4 * self.slot_width] = \
                np.ascontiguousarray(s, "<f4").view(np.uint8).reshape(n, -1)
        _checksums(w, w[:, self.R - 1])
        return w

    def _check(self, w: np.ndarray, where: str) -> None:
        bad = _first_bad(w)
        if bad >= 0:
            raise _err(f"spill store {self.path}: the row of id {int(w[bad, 0].view(np.int64))}"
                       f" fails its checksum ({where}; {w.shape[0]} rows read)")

    def _decode(self, w: np.ndarray) -> dict:
        n = w.shape[0]
        fl = np.ascontiguousarray(w[:, N_META:N_META + 1]).view(np.uint8)
        flags = np.zeros((n, 8), np.uint8)
        flags[:, 0:2] = fl[:, 1:3]
        o = N_META + 1
        vb = np.ascontiguousarray(w[:, o:o + self.vw]).view(np.uint8)
        out = {"meta": np.ascontiguousarray(w[:, :N_META]).view(np.int64), "flags": flags,
               "values": np.ascontiguousarray(vb[:, :self.vbytes]).view(self.w_dtype)}
        if self.scaled:
            out["scale"] = np.ascontiguousarray(vb[:, self.vbytes:self.vbytes + 2]) \
                .view("<u2").ravel()
        out["slots"] = None
        if self.slot_width and n and fl[:, 3].all():  # _groups: all or none carry slots
            o += self.vw
            out["slots"] = np.ascontiguousarray(
                np.ascontiguousarray(w[:, o:o + self.sw]).view(np.uint8)
                [:, :4 * self.slot_width]).view("<f4")
        return out

    def _groups(self, ids: np.ndarray, w: np.ndarray) -> list:
        """Decoded records, grouped by whether they carry slots."""
        if not w.shape[0]:
            return []
        has = (w[:, N_META] >> np.uint64(24)) & np.uint64(1)
        out = []
        for val in (1, 0):
            m = has == val
            if m.any():
                out.append((ids[m], self._decode(w[m])))
        return out

    def _homes(self, keys: np.ndarray, pages: int) -> np.ndarray:
        """Home pages: the top bits of the hash, so an id's home in a base of twice the
        pages is 2 x home or 2 x home + 1 (runs of pages stay runs; _logstore_bulk)."""
        return (hash_ids(keys) >> np.uint64(65 - int(pages).bit_length())).astype(np.int64)

    # -- reading ---------------------------------------------------------------------------
    def _find_base(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found mask, records)`` of ``keys`` in the base."""
        homes = self._homes(keys, self.m["pages"])
        order = np.argsort(homes, kind="stable")
        out = np.zeros((keys.size, self.R), np.uint64)
        found = np.zeros(keys.size, np.bool_)
        k, h = keys[order], homes[order]
        if READ_THREADS > 1 and keys.size >= 64 * READ_THREADS:
            st = base_find_split(self.base_fd, self.n_pages, k, h, out, found, READ_THREADS)
        else:
            st = _base_find(self.base_fd, self.n_pages, k, h, out, found,
                            np.empty(PAGE_WORDS, np.uint64))
        if st < 0:
            raise _err(f"spill store {self.path}: base.{self.m['gen']} is shorter than its "
                       f"{self.n_pages} pages")
        f = np.empty_like(found)
        f[order] = found
        w = np.empty_like(out)
        w[order] = out
        return f, w

    def _read_log(self, offs: np.ndarray) -> np.ndarray:
        order = np.argsort(offs)
        out = np.empty((offs.size, self.R), np.uint64)
        st = _read_records(self.log_fd, offs[order], out)
        if st < 0:
            raise _err(f"spill store {self.path}: log.{self.m['log']} is shorter than its "
                       f"index says")
        w = np.empty_like(out)
        w[order] = out
        return w

    def _lookup(self, u: np.ndarray):
        """``(found mask, records, in-base mask)`` of unique ids ``u``."""
        v = self.index.get(u) if len(self.index) else np.full(u.size, -1, np.int64)
        inlog = v >= 0
        found = np.zeros(u.size, np.bool_)
        inbase = np.zeros(u.size, np.bool_)
        w = np.zeros((u.size, self.R), np.uint64)
        li = np.flatnonzero(inlog & (v & 1).astype(bool))
        if li.size:
            w[li] = self._read_log(v[li] >> 2)
            found[li] = True
        inbase[inlog] = (v[inlog] & 2).astype(bool)
        bi = np.flatnonzero(~inlog)
        if bi.size and (self.m["base_count"] or self.count):
            f, wb = self._find_base(u[bi])
            found[bi[f]] = True
            inbase[bi[f]] = True
            w[bi[f]] = wb[f]
        if found.any():
            self._check(w[found], "read")
        return found, w, inbase

    def take(self, ids: np.ndarray, delete: bool = True):
        """``(found ids, [(ids, records), ...])`` of ``ids``; ``delete`` removes them."""
        u = unique_ids(ids)
        found, w, inbase = self._lookup(u)
        fids = u[found]
        groups = self._groups(fids, w[found])
        room = max(self.index_entries // 2, 1)
        for s in range(0, fids.size if delete else 0, room):  # tombstones
            k = fids[s:s + room]
            z = {"meta": w[found][s:s + room, :N_META].view(np.int64).copy(),
                 "flags": np.zeros((k.size, 8), np.uint8),
                 "values": np.zeros((k.size, self.dim), self.w_dtype),
                 "scale": np.zeros(k.size, np.uint16)}
            self._append(k, self._encode(z, DEAD, inbase[found][s:s + room]), -k.size)
        return fids, groups

    def scan(self, batch: int = BATCH):
        """Every row: yields ``(ids, records)`` groups (the base, then the log)."""
        if self.spool is not None:
            raise _err(f"spill store {self.path}: a bulk fill is open (its rows are "
                       f"readable after bulk_end)")
        yield from self._scan_base(batch)
        yield from self._scan_log(batch)

    def _scan_base(self, batch: int):
        """The base's rows that the log does not hold newer, page order."""
        step = max(batch // self.P, 1)
        buf = np.empty((step, PAGE_WORDS), np.uint64)
        out = np.empty((step * self.P, self.R), np.uint64)
        for p0 in range(0, self.n_pages, step):
            k = min(step, self.n_pages - p0)
            got = os.preadv(self.base_fd, [memoryview(buf[:k])], p0 * PAGE_WORDS * 8)
            if got != k * PAGE_WORDS * 8:
                raise _err(f"spill store {self.path}: base.{self.m['gen']} is short")
            n = _extract(buf[:k], self.R, out)
            if not n:
                continue
            w = out[:n].copy()
            self._check(w, "scan")
            ids = w[:, 0].view(np.int64)
            if len(self.index):
                keep = self.index.get(ids) < 0  # logged: the log's record is newer
                ids, w = ids[keep], w[keep]
            yield from self._groups(ids, w)

    def _scan_log(self, batch: int, pages: int | None = None):
        """The log's live rows; with ``pages``, in the order of their home pages in a
        base of that many (so that each group falls on a run of pages)."""
        if not len(self.index):
            return
        keys, vals = self.index.items()
        live = (vals & 1).astype(bool)
        keys, vals = keys[live], vals[live]
        if pages is not None:
            order = np.argsort(self._homes(keys, pages), kind="stable")
            keys, vals = keys[order], vals[order]
        for s in range(0, keys.size, batch):
            w = self._read_log(vals[s:s + batch] >> 2)
            self._check(w, "scan")
            yield from self._groups(keys[s:s + batch], w)

    # -- writing ---------------------------------------------------------------------------
    def put(self, ids: np.ndarray, rec: dict, known: np.ndarray | None = None) -> None:
        """Write (or overwrite) the rows of ``ids``; ``known`` (optional): True where the
        caller knows the id is on disk already, False where it knows it is not."""
        ids = np.asarray(ids, np.int64)
        if not ids.size:
            return
        u, last = np.unique(ids[::-1], return_index=True)  # the last of duplicates wins
        if u.size != ids.size:
            pick = ids.size - 1 - last
            rec = {k: (None if v is None else v[pick]) for k, v in rec.items()}
            ids = u
            known = None if known is None else np.asarray(known)[pick]
        if self.spool is not None and known is not None:  # a bulk fill: new ids spooled
            new = ~np.asarray(known, np.bool_)
            if new.all():  # a fill's demotion: no copy of the batch
                return self._spool_put(self._encode(rec, LIVE, np.ones(ids.size, np.uint8)))
            if new.any():
                self._spool_put(self._encode({k: (None if v is None else v[new])
                                              for k, v in rec.items()}, LIVE,
                                             np.ones(int(new.sum()), np.uint8)))
                ids, known = ids[~new], np.asarray(known)[~new]
                rec = {k: (None if v is None else v[~new]) for k, v in rec.items()}
        room = max(self.index_entries // 2, 1)
        if ids.size > room:  # slices, so that the index never grows past its size
            for s in range(0, ids.size, room):
                self.put(ids[s:s + room], {k: (None if v is None else v[s:s + room])
                                           for k, v in rec.items()},
                         None if known is None else np.asarray(known)[s:s + room])
            return
        v = self.index.get(ids) if len(self.index) else np.full(ids.size, -1, np.int64)
        inlog = v >= 0
        inbase = (v & 2).astype(bool) & inlog
        was = (v & 1).astype(bool) & inlog
        rest = np.flatnonzero(~inlog)
        if rest.size:
            if known is not None:
                kb = np.asarray(known, np.bool_)[rest]
            elif self.m["base_count"]:
                kb = self._find_base(ids[rest])[0]
            else:
                kb = np.zeros(rest.size, np.bool_)
            inbase[rest] = was[rest] = kb
        self._append(ids, self._encode(rec, LIVE, inbase), int((~was).sum()))

    def _append(self, ids: np.ndarray, w: np.ndarray, dcount: int) -> None:
        """One log entry of records ``w``; the store then holds ``dcount`` more rows.
        The log is merged first if the index would not hold the entry's ids."""
        if len(self.index) and len(self.index) + ids.size > self.index_entries:
            self._compact()
        count = self.count + dcount
        # an entry's records in page order: a merge reads each entry's share of a range
        # of pages with one read (not a read per record)
        homes = self._homes(ids, self.m["pages"])
        order = np.argsort(homes, kind="stable")
        ids, w, homes = ids[order], w[order], homes[order]
        head = np.array([MAGIC, self.seq, w.shape[0], self.R, count, 0, 0], np.uint64)
        head[5] = self._head_sum(head, w)
        head[6] = self._head_sum(head, w[:0])  # the header alone: a torn entry's n is sane
        at = self.log_words
        hv, wv = memoryview(head).cast("B"), memoryview(np.ascontiguousarray(w)).cast("B")
        done = os.pwritev(self.log_fd, [hv, wv], at * 8)
        total = len(hv) + len(wv)
        while done < total:  # a write to a regular file may return short
            rest = wv[done - len(hv):] if done >= len(hv) else None
            done += os.pwritev(self.log_fd, [rest] if rest is not None else
                               [hv[done:], wv], at * 8 + done)
        self.runs.append((at + HEAD, w.shape[0], self._bounds(homes)))
        self.log_words += total // 8
        self.seq += 1
        self.count = count
        self.index.put(ids, self._values(at + HEAD, w))

    def _switch(self, gen: int, pages: int, slot_width: int) -> None:
        """Publish base ``gen`` with every row and a new, empty log; drop the old files."""
        old = (self._file("base", self.m["gen"]), self._file("log", self.m["log"]))
        k = self.m["log"] + 1
        self._new_log(k)
        self.m.update(gen=gen, pages=pages, base_count=self.count, log=k,
                      slot_width=slot_width)
        self._write_manifest()
        self._open_files()
        for p in old:
            if p not in (self._file("base", gen), self._file("log", k)):
                os.unlink(p)
        if self.index.capacity * 16 > self.index_bytes(self.index_entries):
            self.index = HashMap(self.index_entries, INDEX_LOAD)  # grown by a replay: back to size
        else:
            self.index.clear()
        self.log_words = 0
        self.runs = []

    def reshape(self, slot_width: int) -> None:
        """Records with ``slot_width`` slots from now on (rows keep none: the optimiser
        that wrote them is gone)."""
        if int(slot_width) != self.slot_width:
            self._rebuild(self.m["pages"], int(slot_width))

    def flush_log(self) -> None:
        """Merge the log into the base now."""
        if len(self.index):
            self._compact()

    def close(self) -> None:
        for fd in (self.base_fd, self.log_fd):
            if fd >= 0:
                os.close(fd)
        self.base_fd = self.log_fd = -1
