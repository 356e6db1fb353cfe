"""Bulk fill of the log store (:mod:`sampan.rec.logstore`): new ids spooled, then written
into a new base in one sequential pass. A mixin of :class:`~sampan.rec.logstore.LogStore`.

Between :meth:`_Bulk.bulk_begin` and :meth:`_Bulk.bulk_end`, ``put`` sends the records of
ids its caller declares new (``known`` False) to a spool instead of the log: a folder
``spool.<gen>`` of ``SPOOL_BUCKETS`` append-only files, an id's file given by the top bits
of its hash. Homes are the top bits of the hash too (``LogStore._homes``), so a bucket's
ids have their homes in one run of pages whatever the final page count. ``bulk_end``
sizes the new base for every row, then for each run of pages, in order, reads the old
base's pages of that run (less the ids the log holds newer), the log's live records of
it and the spool's bucket files of it, places them into a buffer of pages in RAM and
writes the buffer at its place in ``base.<gen + 1>``: one read of the old base and of the
spool, one sequential write of the new base. The manifest then switches to the new base
with an empty log (atomically, as after a rebuild) and the spool is removed.

Spooled rows are not readable until ``bulk_end`` (no index in RAM: that is the point), so
the caller must not look them up in between (:meth:`DiskTier.bulk_fill` documents this
for the table); an id spooled twice, or spooled while the store held it, is found at
``bulk_end`` and refused (:class:`DiskTierError`) before the manifest changes. A process
killed at any time before the manifest switch leaves the old manifest, its base and log
(the spool and the half-written base are removed on reopen): the rows as before
``bulk_begin`` plus the log entries written since; killed after, the new store whole.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from sampan.rec._logstore_kernels import (LOAD, N_META, PAGE_WORDS, TAIL, _apply, _checksums,
                                          _err, _extract)
from sampan.rec.hashtable import hash_ids

SPOOL_BUCKETS = 4096  # spool files (a power of two); a run of pages per file at the end
SPOOL_BUFFER = 8 << 20  # bytes of spooled records held before they go to their files
EXTRA = TAIL  # pages past a run's last one that its overflow chains may fill
_HOOK = None  # tests: called with each run's index after its pages are written


class _Bulk:
    spool = None  # the open spool's folder, or None

    def _spool_dir(self) -> str:
        return os.path.join(self.path, f"spool.{self.m['gen'] + 1}")

    def bulk_begin(self) -> None:
        """Spool the records of new ids (``put``'s ``known`` False) until :meth:`bulk_end`."""
        if self.spool is not None:
            raise _err(f"spill store {self.path}: a bulk fill is open already")
        d = self._spool_dir()
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        self.spool, self.spooled = d, 0
        self.spool_counts = np.zeros(SPOOL_BUCKETS, np.int64)
        self._spool_fds = {}
        self._spool_buf, self._spool_n = [], 0
        self.bulk_builds = getattr(self, "bulk_builds", 0)

    def _bucket(self, keys: np.ndarray) -> np.ndarray:
        return (hash_ids(keys) >> np.uint64(65 - SPOOL_BUCKETS.bit_length())) \
            .astype(np.int64)

    def _spool_put(self, w: np.ndarray) -> None:
        self._spool_buf.append(w)
        self._spool_n += w.shape[0]
        self.spooled += w.shape[0]
        if self._spool_n * self.R * 8 >= SPOOL_BUFFER:
            self._spool_flush()

    def _spool_flush(self) -> None:
        if not self._spool_n:
            return
        w = np.concatenate(self._spool_buf)
        self._spool_buf, self._spool_n = [], 0
        b = self._bucket(w[:, 0].view(np.int64))
        order = np.argsort(b, kind="stable")
        w, b = w[order], b[order]
        cuts = np.flatnonzero(np.diff(b)) + 1
        for s, e in zip(np.r_[0, cuts], np.r_[cuts, b.size]):
            k = int(b[s])
            fd = self._spool_fds.get(k)
            if fd is None:
                fd = self._spool_fds[k] = os.open(os.path.join(self.spool, str(k)),
                                                  os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            mv = memoryview(np.ascontiguousarray(w[s:e])).cast("B")
            done = 0
            while done < len(mv):
                done += os.write(fd, mv[done:])
            self.spool_counts[k] += e - s

    def _spool_close(self) -> None:
        for fd in self._spool_fds.values():
            os.close(fd)
        self._spool_fds = {}

    def _bucket_records(self, k: int) -> np.ndarray:
        n = int(self.spool_counts[k])
        if not n:
            return np.empty((0, self.R), np.uint64)
        w = np.fromfile(os.path.join(self.spool, str(k)), "<u8")
        if w.size != n * self.R:
            raise _err(f"spill store {self.path}: spool file {k} holds {w.size} words, "
                       f"expected {n} records of {self.R}")
        os.unlink(os.path.join(self.spool, str(k)))  # read once: the disk peak stays ~ the base
        return w.reshape(n, self.R)

    def bulk_end(self) -> None:
        """Write base, log and spool into a new base in one pass; switch the manifest."""
        if self.spool is None:
            raise _err(f"spill store {self.path}: no bulk fill is open")
        try:
            self._spool_flush()
            self._spool_close()
            total = self.count + self.spooled
            pages = self.m["pages"]
            while total > LOAD * self.P * pages:
                pages *= 2
            while True:
                try:
                    self._bulk_build(pages)
                    break
                except _Full:
                    pages *= 2
            self.count = total
            self.spooled = 0
            self.bulk_builds += 1
            self._switch(self.m["gen"] + 1, pages, self.slot_width)
        finally:
            self._spool_close()
            shutil.rmtree(self.spool, ignore_errors=True)
            self.spool = None

    def _old_run(self, lo: int, hi: int) -> np.ndarray:
        """Records of the old base's pages ``lo .. hi`` and of the overflow pages that
        follow them (a chain that leaves ``hi``), less the ids the log holds newer."""
        buf = np.empty((hi - lo, PAGE_WORDS), np.uint64)
        parts = []
        while True:
            got = os.preadv(self.base_fd, [memoryview(buf)], lo * PAGE_WORDS * 8)
            if got != buf.nbytes:
                raise _err(f"spill store {self.path}: base.{self.m['gen']} is short")
            out = np.empty((buf.shape[0] * self.P, self.R), np.uint64)
            parts.append(out[:_extract(buf, self.R, out)])
            lo += buf.shape[0]
            if not (buf[-1, 0] & np.uint64(1)) or lo >= self.n_pages:
                break
            buf = np.empty((min(8, self.n_pages - lo), PAGE_WORDS), np.uint64)
        w = np.concatenate(parts)
        if w.shape[0] and len(self.index):
            w = w[self.index.get(w[:, 0].view(np.int64)) < 0]
        return w

    def _bulk_build(self, pages: int) -> None:
        gen = self.m["gen"] + 1
        self._new_base(gen, pages)
        # runs of pages, one per spool bucket while the new base has the pages (what a run
        # holds is the transient RAM: 8 MB of pages at 10^8 ids); the old base's pages of
        # a run: those its homes map to (a page of a small old base serves several runs)
        runs = min(SPOOL_BUCKETS, pages)
        old = self.m["pages"]
        per_new, per_bucket = pages // runs, SPOOL_BUCKETS // runs
        # the log's live records, by run of the new base
        keys = vals = np.empty(0, np.int64)
        if len(self.index):
            keys, vals = self.index.items()
            live = (vals & 1).astype(bool)
            keys, vals = keys[live], vals[live]
            order = np.argsort(self._homes(keys, pages), kind="stable")
            keys, vals = keys[order], vals[order]
        log_cut = np.searchsorted(self._homes(keys, pages),
                                  np.arange(runs + 1) * per_new)
        fd = os.open(self._file("base", gen), os.O_RDWR)
        try:
            carry = np.zeros((EXTRA, PAGE_WORDS), np.uint64)
            counts = np.zeros(2, np.int64)
            for r in range(runs):
                parts = []
                if self.m["base_count"]:
                    parts.append(self._old_run(r * old // runs,
                                               -(-(r + 1) * old // runs)))
                if log_cut[r + 1] > log_cut[r]:
                    lw = self._read_log(vals[log_cut[r]:log_cut[r + 1]] >> 2)
                    self._check(lw, "bulk fill")
                    lw[:, N_META] |= np.uint64(1) << np.uint64(32)  # in the base now
                    _checksums(lw, lw[:, self.R - 1])
                    parts.append(lw)
                for k in range(r * per_bucket, (r + 1) * per_bucket):
                    parts.append(self._bucket_records(k))
                w = np.concatenate(parts)
                lo = r * per_new
                n = per_new + EXTRA
                buf = np.zeros((n, PAGE_WORDS), np.uint64)
                buf[:EXTRA] = carry
                if w.shape[0]:
                    self._check(w, "bulk fill")
                    homes = self._homes(w[:, 0].view(np.int64), pages)
                    keep = (homes >= lo) & (homes < lo + per_new)  # old chains' strays
                    w, homes = w[keep], homes[keep]
                    order = np.argsort(homes, kind="stable")
                    w, homes = np.ascontiguousarray(w[order]), homes[order]
                    before = int(counts[0])
                    if _apply(buf, lo, w, homes, 0, lo + per_new, np.zeros(n, np.bool_),
                              counts) < 0:
                        raise _Full()
                    if counts[0] - before != w.shape[0]:
                        raise _err(f"spill store {self.path}: the bulk fill holds "
                                   f"{w.shape[0] - (counts[0] - before)} ids twice "
                                   f"(spooled twice, or spooled while the store held "
                                   f"them); the store is as before the bulk fill")
                k = n if r == runs - 1 else per_new  # the last run: the tail pages too
                mv = memoryview(buf[:k]).cast("B")
                done = 0
                while done < len(mv):
                    done += os.pwrite(fd, mv[done:], lo * PAGE_WORDS * 8 + done)
                carry = buf[per_new:].copy()
                if _HOOK is not None:
                    _HOOK(r)
        except BaseException:
            os.close(fd)
            fd = -1
            os.unlink(self._file("base", gen))
            raise
        finally:
            if fd >= 0:
                os.close(fd)


class _Full(Exception):
    """Overflow chains ran past a run's spare pages: the new base needs more pages."""
