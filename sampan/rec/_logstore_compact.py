"""Compaction of the log store (:mod:`sampan.rec.logstore`): merging the log into the
base a range of pages at a time, and rebuilding the base larger or with another record
layout. A mixin of :class:`~sampan.rec.logstore.LogStore`, which holds the files."""

from __future__ import annotations

import os

import numpy as np

from sampan.rec._logstore_kernels import (BATCH, FINE, LIVE, LOAD, PAGE_WORDS, TAIL,
                                          _WINDOW, _apply, _err)


class _Compaction:
    def _compact(self) -> None:
        """The log into the base: a merge, or a rebuild if the rows would fill the base
        past LOAD (merging first would walk long chains of full pages)."""
        grow = self.count > LOAD * self.P * self.m["pages"]
        if not grow:
            try:
                self._merge()
            except _Overflow:  # the base is full up to its last page
                grow = True
        if grow:  # the fewest pages (a power of two) under LOAD: (LOAD/2, LOAD] full
            pages = self.m["pages"]
            while self.count > LOAD * self.P * pages:
                pages *= 2
            self._rebuild(max(pages, 2 * self.m["pages"]), self.slot_width)

    def _merge(self) -> None:
        """Apply the log's latest records to the base, a range of pages at a time: each
        entry's share of the range (its records are in page order) is one read."""
        sizes = sum((b[1:] - b[:-1] for _, _, b in self.runs), np.zeros(FINE, np.int64))
        r = 0
        while r < FINE:
            r2, tot = r, 0
            while r2 < FINE and (tot == 0 or tot + sizes[r2] <= 2 * BATCH):
                tot += int(sizes[r2])
                r2 += 1
            if tot:
                parts, offs = [], []
                for start, _, b in self.runs:
                    lo, hi = int(b[r]), int(b[r2])
                    if hi > lo:
                        buf = np.empty((hi - lo, self.R), np.uint64)
                        at = (start + lo * self.R) * 8
                        if os.preadv(self.log_fd, [memoryview(buf)], at) != buf.nbytes:
                            raise _err(f"spill store {self.path}: log.{self.m['log']} is "
                                       f"shorter than its entries")
                        parts.append(buf)
                        offs.append(start + (lo + np.arange(hi - lo)) * self.R)
                w = np.concatenate(parts)
                keys = w[:, 0].view(np.int64)
                latest = (self.index.get(keys) >> 2) == np.concatenate(offs)
                w, keys = w[latest], keys[latest]
                self._check(w, "merge")
                homes = self._homes(keys, self.m["pages"])
                order = np.argsort(homes, kind="stable")
                self._apply_sorted(self.base_fd, self.n_pages, w[order], homes[order])
            r = r2
        self.merges += 1
        self._switch(self.m["gen"], self.m["pages"], self.slot_width)

    def _apply_sorted(self, fd: int, n_pages: int, w: np.ndarray, homes: np.ndarray):
        """Apply records (sorted by home page) to a base file, a window at a time."""
        j, counts = 0, np.zeros(2, np.int64)
        while j < w.shape[0]:
            a = int(homes[j])
            # the window ends a few pages past the last home it serves (sparse records
            # read a few pages each, dense ones _WINDOW pages at a time)
            last = int(homes[np.searchsorted(homes, a + _WINDOW) - 1])
            extra = 8
            while True:
                end = min(last + 1 + extra, n_pages)
                buf = np.empty((end - a, PAGE_WORDS), np.uint64)
                if os.preadv(fd, [memoryview(buf)], a * PAGE_WORDS * 8) != buf.nbytes:
                    raise _err(f"spill store {self.path}: a base file is short")
                dirty = np.zeros(end - a, np.bool_)
                nxt = _apply(buf, a, w, homes, j, a + _WINDOW, dirty, counts)
                if nxt >= 0:
                    break
                if end == n_pages:
                    raise _Overflow()
                extra *= 4
            d = np.flatnonzero(dirty)
            if d.size:  # write back the dirty runs (gaps of a few clean pages too)
                cut = np.flatnonzero(np.diff(d) > 4)
                for s, e in zip(np.r_[d[0], d[cut + 1]], np.r_[d[cut], d[-1]] + 1):
                    mv = memoryview(buf[s:e]).cast("B")
                    done = 0
                    while done < len(mv):
                        done += os.pwrite(fd, mv[done:], (a + s) * PAGE_WORDS * 8 + done)
            j = nxt
        return counts

    def _rebuild(self, pages: int, slot_width: int) -> None:
        """A new base of ``pages`` home pages (and records of ``slot_width``) holding
        every row, then a manifest naming it and a new log."""
        gen = self.m["gen"] + 1
        while True:
            self._new_base(gen, pages)
            new = _Layout(self, slot_width)
            fd = os.open(self._file("base", gen), os.O_RDWR)
            try:
                parts = (self._scan_base(BATCH), self._scan_log(BATCH, pages))
                for ids, rec in (g for part in parts for g in part):
                    w = new.encode(rec)
                    homes = self._homes(ids, pages)
                    order = np.argsort(homes, kind="stable")
                    self._apply_sorted(fd, pages + TAIL, w[order], homes[order])
                break
            except _Overflow:
                pages *= 2
            finally:
                os.close(fd)
        self.rebuilds += 1
        old_w = self.slot_width
        self._layout(slot_width)
        try:
            self._switch(gen, pages, slot_width)
        except BaseException:
            self._layout(old_w)
            raise


class _Overflow(Exception):
    """A chain of the base ran past its last page: the base needs more pages."""


class _Layout:
    """The record layout of another slot width, to re-encode rows during a rebuild."""

    def __init__(self, store: LogStore, slot_width: int):
        self.store, self.slot_width = store, int(slot_width)

    def encode(self, rec: dict) -> np.ndarray:
        s = self.store
        old = (s.slot_width, s.sw, s.R, s.P)
        try:
            s._layout(self.slot_width)
            n = rec["meta"].shape[0]
            return s._encode(rec, LIVE, np.ones(n, np.uint8))
        finally:
            s.slot_width, s.sw, s.R, s.P = old
