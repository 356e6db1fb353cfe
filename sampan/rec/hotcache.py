"""A hot-row cache in front of any embedding shard set (local or Ray).

:class:`HotCache` keeps the top K ids of the id stream (K from a memory budget, the ids
from the shards' own sighting counts, or an :class:`~sampan.rec.sketch.IdStats`) in a
dense array on the trainer, found
through a small open-addressing index (a :class:`HashEmbeddingTable` sized for K rows:
one chunk of weights, one of optimiser slots, a linear-probing map). While an id is
cached the cache's copy is the one that trains: its gradients go through a copy of the
shards' sparse optimiser, locally, with the same kernel, so the arithmetic is the one the
shard would do. Misses go to the shards in one batched pull (and their gradients in one
push), as without a cache.

Write-back. Every ``write_back_every`` steps (and before a refresh drops rows) the
weights and slots of the cached rows written since the last write-back, with the
sightings counted meanwhile, are written to their shards (``write_rows``: numbered and
logged like a push, so a restarted Ray shard gets it again). So the shards, and every
snapshot or recovery built from them, hold each cached row as of at most
``shard_staleness = write_back_every - 1`` steps ago (a bound in the sense of
``Prefetcher(max_staleness=)``, which bounds what reads miss); a trainer that dies
loses at most those steps of its cached rows, and nothing of the rest.
``write_back_every=1`` makes the shards equal, after every step, to a table trained
without the cache. The trainer itself always reads the cached copy, so its training
equals the one-tier table's whatever ``write_back_every``; a
:class:`~sampan.rec.sharded.Prefetcher` runs over the cache as over the shards (the cache
has their ``plan`` / ``fetch``), its misses pulled ahead on the prefetch thread.

Cost (``benchmarks/embedding_tiers.py --quick``, W4 at a 5% budget, thread CPU per step
by call, 1 local shard): a hit spares the shards its lookup, gather, optimiser update and
transfer, but only a quarter of a batch's distinct ids are hits (the per-lookup hit rate,
about 0.5, counts repeats, which a pull and a push dedupe anyway) and the misses, mostly
new ids, cost the shards what they cost without a cache. So the shards save about 1.7 ms
of a 24-29 ms step (plan 2.6 -> 2.0, gather 1.7 -> 1.5, push 3.4 -> 2.5): even a cache
that cost nothing would make the step at most about 1.07x faster on this stream. What the
cache spends: one numba pass that looks a batch up in its index, counts it and orders it
hits first (so fetch and push move two blocks, no row copies, and the hits' update runs
the optimiser's kernel on the plan's rows, ``apply_rows``), the sketch's update of the
misses with ``choose="sketch"`` (about 1.2 ms, on its own thread: the default now ranks
by the shards' own counts instead, which the step pays nothing for), and
each write-back's rows (weights and slots of every row trained since the last one:
about 1.1 ms a step at ``write_back_every=4``), which leave with the next pull (one Ray
call per shard per step). On a 2-core machine whose cores the trainer's threads and the
shards share, that is about as much as the hits save.

One trainer per cache: a second trainer pushing the same ids to the shards would not see
the cached copy (as with any write-back cache). Counters (hits and misses per lookup,
bytes moved, rows written back) are in :meth:`HotCache.counters` and on the profiler
timeline (``hot_cache`` instants and ``write_back`` spans, category ``rec``).
"""

from __future__ import annotations

import collections
import copy
import queue
import threading

import numpy as np
from numba import njit

from sampan import _recorder as _rec
from sampan.errors import SampanValueError, op_error
from sampan.rec.hashtable import HashMap, _get
from sampan.rec.kernels import unique_inverse
from sampan.rec.sketch import IdStats
from sampan.rec.table import HashEmbeddingTable

__all__ = ["HotCache"]

# index slots (2 x int64, load <= 0.5) and row metadata (6 int64 + 3 flags) per cached row
ROW_OVERHEAD = 4 * 16 + 6 * 8 + 3 + 8
# batches of misses whose counts go to the sketch's thread in one hand-over
FEED_EVERY = 8


@njit(cache=True, nogil=True)
def _split_plan(tab, uniq, inverse, seen, unfed, feed):
    """One pass over a batch's plan: looks the distinct ids up in the cache's index
    (``tab``, a :class:`HashMap`'s slots), counts one sighting of each cached id into
    its row's ``seen`` (as a shard counts a pull) and, when ``feed``, its occurrences
    (``inverse``) into ``unfed`` (the sketch's unit), and orders the distinct
    ids hits first, misses after (``inverse`` rewritten in place to match), so that a
    fetch and a push take the hits and the misses as two contiguous blocks, copying no
    rows. Returns ``(uniq, rows, n_hits, miss_counts, hit_occurrences,
    miss_occurrences, bad)``, ids and rows in the new order; ``bad`` is -1, or the first
    row past ``seen`` (nothing counted then). The caller checks ``inverse < uniq.size``."""
    n = uniq.size
    rows = np.empty(n, np.int64)
    _get(tab, uniq, rows)
    nh = 0
    for j in range(n):
        r = rows[j]
        if r >= seen.size or r >= unfed.size:
            return uniq, rows, 0, np.empty(0, np.int64), 0, 0, r
        nh += r >= 0
    cnt = np.zeros(n, np.int64)
    for i in range(inverse.size):
        cnt[inverse[i]] += 1
    pos = np.empty(n, np.int64)
    new_uniq = np.empty(n, np.int64)
    new_rows = np.empty(n, np.int64)
    miss_cnt = np.empty(n - nh, np.int64)
    a, b = 0, nh
    h = m = 0
    for j in range(n):
        r, c = rows[j], cnt[j]
        if r >= 0:
            seen[r] += 1  # one sighting a pull, as a shard counts its rows
            if feed:
                unfed[r] += c
            pos[j] = a
            a += 1
            h += c
        else:
            pos[j] = b
            miss_cnt[b - nh] = c
            b += 1
            m += c
        new_uniq[pos[j]] = uniq[j]
        new_rows[pos[j]] = r
    for i in range(inverse.size):
        inverse[i] = pos[inverse[i]]
    return new_uniq, new_rows, nh, miss_cnt, h, m, -1


def _shard_optimizer(emb):
    make = getattr(emb, "make_optimizer", None)
    if make is not None:
        return make()
    shards = getattr(emb, "shards", None)
    if shards and hasattr(shards[0], "optimizer"):
        return copy.deepcopy(shards[0].optimizer)
    raise op_error(SampanValueError, "HotCache", f"an embedding {type(emb).__name__} "
                   "without a known optimiser", "a ShardedEmbedding, or optimizer=")


class HotCache:
    """The top-K ids of ``emb`` (a :class:`ShardedEmbedding`, local or Ray) on the trainer.

    ``budget_mb`` sizes K (weights, optimiser slots, index and metadata per row);
    ``stats`` chooses the ids (an :class:`IdStats` the caller feeds, e.g. through
    ``ParquetCTRReader(stats=)``). Without one, ``choose="shards"`` (the default, where
    ``emb`` has ``top_ids``) takes the ids the shards counted most: a shard counts a
    sighting of each row a pull names, and the cache writes its rows' sightings back with
    them, so the counts are exact, cost the step nothing, and equal a one-tier table's;
    W4 quick hit rates 0.501 / 0.604 / 0.667 at 1 / 5 / 20%. ``choose="sketch"`` makes an
    :class:`IdStats` and feeds it from the cache's pulls on a thread of its own (the
    misses' counts each step, the cached ids' counts summed in the cache at each refresh
    and flush; about 1.2 ms of CPU a W4 step; 0.502 / 0.602 / 0.661), with
    ``sketch_every=N`` the misses of one batch in N, counts times N (N=2: 0.501 / 0.595 /
    0.643). :meth:`refresh` (between passes) loads the current top K. The cache
    has ``emb``'s ``pull``, ``push`` and ``read``, so ``HashEmbedding(dim, emb=cache)``
    trains through it.

    >>> from sampan.rec import ShardedEmbedding
    >>> c = HotCache(ShardedEmbedding(4, n_shards=1), budget_mb=1)
    >>> u, inv, v = c.pull([3, 3, 5], 0); c.push(u, np.ones_like(v), 0); c.refresh()
    {'kept': 0, 'dropped': 0, 'loaded': 2}
    >>> c.counters()["misses"], len(c)
    (3, 2)
    """

    def __init__(self, emb, budget_mb: float, *, stats: IdStats | None = None,
                 write_back_every: int = 1, optimizer=None, sketch_every: int = 1,
                 choose: str = "shards"):
        if not isinstance(budget_mb, (int, float)) or isinstance(budget_mb, bool) \
                or budget_mb <= 0:
            raise op_error(SampanValueError, "HotCache", f"budget_mb={budget_mb!r}",
                           "a positive number of MB")
        if not isinstance(write_back_every, int) or write_back_every < 1:
            raise op_error(SampanValueError, "HotCache",
                           f"write_back_every={write_back_every!r}", "an int >= 1")
        for s in getattr(emb, "shards", ()) or ():
            t = getattr(s, "table", None)
            if t is not None and getattr(t, "dynamic", False):
                # the cache trains full-width rows and writes full-width slots back
                raise op_error(SampanValueError, "HotCache", "a table with dynamic_dims "
                               "(per-row widths)", "a fixed-width table (a cache in front "
                               "of dynamic widths is not supported yet)")
        self.emb, self.dim = emb, int(emb.dim)
        self.optimizer = optimizer if optimizer is not None else _shard_optimizer(emb)
        width = self.optimizer.slot_width(self.dim)
        self.row_bytes = 4 * (self.dim + width) + ROW_OVERHEAD
        self.capacity = int(budget_mb * 2**20) // self.row_bytes
        if self.capacity < 1:
            raise op_error(SampanValueError, "HotCache", f"budget_mb={budget_mb} "
                           f"(one row takes {self.row_bytes} bytes)", "room for a row")
        if not isinstance(sketch_every, int) or isinstance(sketch_every, bool) \
                or sketch_every < 1:
            raise op_error(SampanValueError, "HotCache", f"sketch_every={sketch_every!r}",
                           "an int >= 1")
        self.sketch_every = sketch_every
        self._plans = 0  # plans so far: every sketch_every-th feeds the misses to the sketch
        self.budget_mb = float(budget_mb)
        self.write_back_every = write_back_every
        if choose not in ("shards", "sketch"):
            raise op_error(SampanValueError, "HotCache", f"choose={choose!r}",
                           "'shards' (the shards' own counts) or 'sketch'")
        # without a caller's sketch: the shards' own counts where they can rank them
        # (exact, and counted on the shards' side of a pull anyway: nothing on the step),
        # else a sketch of the cache's own, fed from the plans
        self.choose = "stats" if stats is not None else (
            "shards" if choose == "shards" and hasattr(emb, "top_ids") else "sketch")
        self.feeds_stats = self.choose == "sketch"
        self._feed: queue.Queue | None = None  # lists of (ids, counts) for the sketch
        self._backlog: list = []  # (ids, counts) not handed to the sketch's thread yet
        self._backlog_lock = threading.Lock()
        self._feed_error: BaseException | None = None
        # a sketch some times wider than K: the K-th id's count must stand out of the
        # count-min error (e / width of the total), or the tail of the top K is noise
        self.stats = stats if not self.feeds_stats else IdStats(
            width=max(1 << 16, 4 * self.capacity), capacity=max(self.capacity, 1024))
        shift = max(4, (self.capacity - 1).bit_length())
        self.table = HashEmbeddingTable(self.dim, chunk_shift=shift,
                                        initial_capacity=self.capacity)
        self.table.attach_slots(width, self.optimizer.slot_init)
        self._seen = np.zeros(0, np.int64)   # pulls naming a cached row since write-back
        self._unfed = np.zeros(0, np.int64)  # sightings per cached row not yet in stats
        self._dirty = np.zeros(0, np.bool_)  # cached rows trained since write-back
        self.steps = 0
        # the id -> row layout's generation: a refresh moves rows, so rows resolved by a
        # plan are used as they are (no second lookup) only while it is unchanged
        self._gen = 0
        # (uniq, rows, gen, n_hits) of recent plans, their ids in hits-first order
        self._planned: collections.deque = collections.deque(maxlen=8)
        self.last_write_back = 0  # step count at the last write-back
        self.push_log: list | None = None  # ids pushed, while a Prefetcher asks
        self._n = {"hits": 0, "misses": 0, "distinct_hits": 0, "distinct_misses": 0,
                   "bytes_moved": 0, "written_back": 0, "write_backs": 0, "refreshes": 0}

    @property
    def shard_staleness(self) -> int:
        """Steps of updates to cached rows the shards (and their snapshots) may lack:
        ``write_back_every - 1``, a bound in the sense of ``Prefetcher(max_staleness=)``."""
        return self.write_back_every - 1

    @property
    def max_staleness(self) -> int:
        """What a :class:`Prefetcher` over the cache may let reads miss: the shards'
        own (the trainer reads cached rows as they are, whatever the write-back)."""
        return getattr(self.emb, "max_staleness", 0)

    def __len__(self) -> int:
        return len(self.table)

    def counters(self) -> dict:
        """Hits and misses (per looked-up id occurrence), ``hit_rate``; the same per
        distinct id of a batch (``distinct_hit_rate``: the share of the shards' per-id
        work a pull and a push skip, since both dedupe first), ``bytes_moved`` between
        trainer and shards, rows ``written_back`` in ``write_backs`` calls."""
        n = dict(self._n)
        total = n["hits"] + n["misses"]
        n["hit_rate"] = n["hits"] / total if total else 0.0
        dt = n["distinct_hits"] + n["distinct_misses"]
        n["distinct_hit_rate"] = n["distinct_hits"] / dt if dt else 0.0
        n["rows"], n["capacity"] = len(self), self.capacity
        return n

    def _count(self, uniq: np.ndarray, cnt: np.ndarray, now: bool = False) -> None:
        """Feed the sketch on a thread of its own (its kernels release the GIL), off the
        training step's path, ``FEED_EVERY`` batches' counts at a time (waking a thread
        costs a GIL hand-over or two: on a busy 2-core machine about 1.5 ms a step when
        it woke for every batch; summing the 8 batches per id first saved nothing, W4's
        misses being mostly one-off ids); ``now`` hands over what waits at once.
        :meth:`refresh` and :meth:`flush` hand over the rest and wait for it."""
        with self._backlog_lock:
            if uniq.size:
                self._backlog.append((uniq, cnt))
            if not self._backlog or (len(self._backlog) < FEED_EVERY and not now):
                return
            items, self._backlog = self._backlog, []
            if self._feed is None:
                self._feed = queue.Queue(maxsize=8)
                threading.Thread(target=self._feed_loop, args=(self._feed,), daemon=True,
                                 name="sampan-hotcache-sketch").start()
            self._feed.put(items)

    def _feed_cached(self) -> None:
        """Give the sketch the cached ids' sightings counted since the last time (the
        queue keeps them in order with the misses' counts)."""
        if not self.feeds_stats:
            return
        t = self.table
        with t.lock:
            n = min(t.alloc.next_row, self._unfed.size)
            rows = np.flatnonzero((self._unfed[:n] > 0) & t.live[:n])
            ids, cnt = t.meta["key"][rows], self._unfed[rows].copy()
            self._unfed[:n] = 0
        self._count(ids, cnt, now=True)  # with what the misses left waiting

    def _feed_loop(self, q: queue.Queue) -> None:
        while (items := q.get()) is not None:
            try:
                for ids, cnt in items:  # one update a batch: its ids are distinct
                    self.stats.update(ids, cnt, unique=True)
            except Exception as exc:  # noqa: BLE001  (raised again by refresh)
                self._feed_error = exc
            finally:
                q.task_done()
        q.task_done()

    def _rows(self, uniq: np.ndarray) -> np.ndarray:
        rows = self.table.map.get(uniq)
        self._grow_counters()
        return rows

    def _grow_counters(self) -> None:
        """Per-row counters for every row the table has handed out."""
        n = self.table.alloc.next_row
        if self._seen.size < n:
            self._seen = np.concatenate([self._seen, np.zeros(n - self._seen.size, np.int64)])
            self._unfed = np.concatenate([self._unfed, np.zeros(n - self._unfed.size,
                                                                np.int64)])
            self._dirty = np.concatenate([self._dirty, np.zeros(n - self._dirty.size,
                                                                np.bool_)])

    # -- the embedding interface ------------------------------------------------------
    def pull(self, ids, step: int | None = None):
        """``(uniq, inverse, vectors)`` as ``ShardedEmbedding.pull``: cached ids from the
        dense array, the rest from the shards in one batched pull."""
        uniq, inverse, parts, rows = self.plan(ids, step)
        return uniq, inverse, self.fetch(uniq, parts, rows)

    def plan(self, ids, step: int | None = None):
        """Dedupe, count, split into cached ids and misses, and plan the misses' pull on
        the shards (``ShardedEmbedding.plan``'s contract, so a :class:`Prefetcher` can
        run it ahead on its thread)."""
        uniq, inverse = unique_inverse(ids)
        inverse = np.ascontiguousarray(inverse, np.int64).ravel()
        if inverse.size and inverse.max() >= uniq.size:  # _split_plan's assumption
            raise RuntimeError(f"HotCache.plan: inverse index {inverse.max()} past its "
                               f"{uniq.size} distinct ids")
        uniq = np.ascontiguousarray(uniq, np.int64)
        with self.table.lock:
            self._grow_counters()
            uniq, rows, nh, miss_cnt, h, m, bad = _split_plan(
                self.table.map.tab, uniq, inverse, self._seen, self._unfed, self.feeds_stats)
            if bad >= 0:  # the index named a row the counters do not cover
                raise RuntimeError(f"HotCache.plan: row {bad} past its {self._seen.size} "
                                   "counters")
            gen = self._gen
            # push() of these ids (hits first) skips the lookup and the split
            self._planned.append((uniq, rows, gen, nh))
        hit_at, miss = np.arange(nh), np.arange(nh, uniq.size)
        self._plans += 1
        if self.feeds_stats and miss.size and self._plans % self.sketch_every == 0:
            # the misses now (one batch in sketch_every, its counts scaled to stay an
            # unbiased estimate); the cached ids' sightings add up in _unfed and reach the
            # sketch at the next refresh or flush: one update per cached row, not per step
            k = self.sketch_every
            self._count(uniq[nh:], miss_cnt if k == 1 else miss_cnt * k)
        # the misses are distinct: the shards plan them as they are
        sub = self._plan_misses(uniq[nh:], step) if miss.size else None
        h, m = int(h), int(m)
        self._n["hits"] += h
        self._n["misses"] += m
        self._n["distinct_hits"] += int(hit_at.size)  # a batch's distinct ids: the work
        self._n["distinct_misses"] += int(miss.size)  # a pull and a push do per id
        self._n["bytes_moved"] += miss.size * (8 + 4 * self.dim)
        if _rec.ACTIVE:
            _rec.instant("hot_cache", "rec", hits=h, misses=m, ids=int(uniq.size),
                         cached=len(self), bytes=int(miss.size * (8 + 4 * self.dim)))
        return uniq, inverse, (hit_at, miss, sub), (rows, gen)

    def _plan_misses(self, miss_ids, step):
        """The shards' plan of distinct ids (no second dedupe where the shards offer
        ``plan_unique`` and count no ``stats`` of their own)."""
        fn = getattr(self.emb, "plan_unique", None)
        if fn is None or getattr(self.emb, "stats", None) is not None:
            return self.emb.plan(miss_ids, step)
        parts, rows = fn(miss_ids, step)
        return miss_ids, None, parts, rows

    def fetch(self, uniq, parts, rows=None) -> np.ndarray:
        """The vectors of a plan: cached rows as they are now, the misses' pull answers."""
        hit_at, miss, sub = parts
        out = np.empty((uniq.size, self.dim), np.float32)
        moved = self._gather_planned(uniq, hit_at, rows, out, whole=True)
        if sub is not None:
            out[hit_at.size:] = self.emb.fetch(sub[0], sub[2], sub[3])  # the misses' block
            if moved:
                self._cached_since(uniq, miss, out)
        return out

    def _gather_planned(self, uniq, at, rows, out, whole: bool = False) -> bool:
        """Gather the plan's cached rows; with the plan's rows (``(rows, gen)``) and no
        refresh since, straight from the dense array by row (no second index lookup;
        ``whole``: ``at`` is every hit of the plan, the block it starts with).
        Returns whether the layout may have moved since the plan."""
        if rows is not None:
            with self.table.lock:
                if rows[1] == self._gen:
                    if whole:  # the hits' block, first: gathered in place
                        self.table.weights.gather(rows[0][:at.size], out=out[:at.size])
                    else:
                        out[at] = self.table.weights.gather(rows[0][at])
                    return False
        self._gather_cached(uniq, at, out)
        return True

    def _cached_since(self, uniq, at, out) -> None:
        """Ids planned as misses that a refresh cached meanwhile: the cache's copy is the
        one that trains now (it may be ahead of the shards')."""
        now = np.flatnonzero(self.table.map.get(uniq[at]) >= 0)
        if now.size:
            self._gather_cached(uniq, at[now], out)

    def _gather_cached(self, uniq, at, out) -> None:
        with self.table.lock:
            rows = self.table.map.get(uniq[at])
            ok = rows >= 0
            out[at[ok]] = self.table.weights.gather(rows[ok])
        if not ok.all():  # left the cache since the plan (a refresh wrote it back first)
            out[at[~ok]] = self.emb.read(uniq[at[~ok]])

    def _refetch(self, uniq, parts, rows, mask, out) -> None:
        """Gather again the ids of a plan that ``mask`` selects (the Prefetcher's, for
        ids pushed since the plan)."""
        hit_at, miss, sub = parts
        # every hit again, in place (a plain copy of the small dense rows; a hit that was
        # not pushed reads as it did)
        moved = self._gather_planned(uniq, hit_at, rows, out, whole=True)
        if sub is not None and mask[miss].any():
            part = out[hit_at.size:]  # the misses' block: the shards write into it
            self.emb._refetch(sub[0], sub[2], sub[3], mask[miss], part)
            if moved:
                self._cached_since(uniq, miss[mask[miss]], out)

    def push(self, uniq, grads, step: int | None = None) -> None:
        """Apply summed gradients of unique ids: cached rows here, the rest on the shards;
        writes back every ``write_back_every`` pushes."""
        given = uniq
        uniq = np.ascontiguousarray(uniq, np.int64)
        grads = np.ascontiguousarray(grads, np.float32).reshape(uniq.size, self.dim)
        with self.table.lock:
            planned = next((p for p in self._planned if p[0] is given), None)
            if planned is not None and planned[2] == self._gen:
                # resolved by the plan, hits first: two blocks, no copies
                rows, nh = planned[1], planned[3]
                hit, miss = slice(0, nh), slice(nh, uniq.size)
                n_hit, n_miss = nh, uniq.size - nh
            else:
                rows = self._rows(uniq)
                hit, miss = np.flatnonzero(rows >= 0), np.flatnonzero(rows < 0)
                n_hit, n_miss = hit.size, miss.size
            if n_hit:
                # the plan resolved these rows: the optimiser's kernel alone, no lookup
                self.optimizer.apply_rows(self.table, rows[hit], grads[hit])
                self._dirty[rows[hit]] = True
        if n_miss:
            self.emb.push(uniq[miss], grads[miss], step)
            self._n["bytes_moved"] += int(n_miss) * (8 + 4 * self.dim)
        if self.push_log is not None:  # a Prefetcher gathers these again
            self.push_log.append(uniq.copy())
        self.steps += 1
        if self.steps - self.last_write_back >= self.write_back_every:
            self.write_back(step)

    def read(self, ids) -> np.ndarray:
        """Vectors of ids without creating rows or counting (serving-style)."""
        uniq, inverse = unique_inverse(ids)
        with self.table.lock:
            rows = self.table.map.get(uniq)
            out = self.table.weights.gather(rows)
        miss = rows < 0
        if miss.any():
            out[miss] = self.emb.read(uniq[miss])
        return out[inverse]

    # -- write-back and refresh -------------------------------------------------------------
    def write_back(self, step: int | None = None) -> int:
        """Write the cached rows trained or seen since the last write-back to the shards;
        returns how many rows went."""
        self.last_write_back = self.steps
        t = self.table
        with _rec.span("write_back", "rec", cached=len(self)) as sp:
            with t.lock:
                n = t.alloc.next_row
                rows = np.flatnonzero((self._dirty[:n] | (self._seen[:n] > 0)) & t.live[:n])
                if rows.size == 0:
                    return 0
                ids = t.meta["key"][rows]
                w, s = t.weights.gather(rows), t.slots.gather(rows)
                seen = self._seen[rows].copy()
                self._dirty[rows] = False
                self._seen[rows] = 0
            self.emb.write_rows(ids, w, s, seen, step)
            nbytes = rows.size * (16 + 4 * (self.dim + s.shape[1]))
            if _rec.ACTIVE:  # (NULL_SPAN's args are shared: only a real span's)
                sp.args["rows"], sp.args["bytes"] = int(rows.size), int(nbytes)
        self._n["written_back"] += rows.size
        self._n["write_backs"] += 1
        self._n["bytes_moved"] += nbytes
        return int(rows.size)

    def refresh(self, step: int | None = None) -> dict:
        """Cache the current top K of ``stats``: write everything back, drop the rows that
        left the top K, load the new ones from the shards (ids the shards have no row for
        yet are loaded by a later refresh). Returns ``{"kept", "dropped", "loaded"}``."""
        self.write_back(step)
        if self.choose == "shards":  # every sighting is on the shards after the write-back
            want, _ = self.emb.top_ids(self.capacity)
        else:
            self._feed_cached()
            if self._feed is not None:
                self._feed.join()  # every pull so far counted
            if self._feed_error is not None:
                err, self._feed_error = self._feed_error, None
                raise RuntimeError("HotCache: counting ids in the sketch failed") from err
            want, _ = self.stats.top(self.capacity)
        t = self.table
        wanted = HashMap(max(want.size, 16))  # np.isin sorts or hashes in Python's pace
        wanted.put(want, np.zeros(want.size, np.int64))
        with t.lock:
            have = t.ids()
            keep = wanted.get(have) >= 0
            self._gen += 1
            self._planned.clear()
            gone = have[~keep]
            gone_rows = t.map.get(gone)
            late = self._unfed[gone_rows]  # counted by a plan since _feed_cached
            self._unfed[gone_rows] = 0
            t.remove(gone)
            new = want[t.map.get(want) < 0]
        if self.feeds_stats and late.any():
            self._count(gone[late > 0], late[late > 0])
        found, w, s = self.emb.read_rows(new) if new.size else (np.zeros(0, bool), None, None)
        new = new[found]
        if new.size:
            with t.lock:
                self._gen += 1
                t.set_vectors(new, w[found])
                rows = self._rows(new)
                t.slots.scatter(rows, s[found] if s is not None else np.full(
                    (new.size, t.slots.width), t.slot_init, np.float32))
                self._dirty[rows] = False
                self._seen[rows] = 0
                self._unfed[rows] = 0
            self._n["bytes_moved"] += new.size * (8 + 4 * (self.dim + t.slots.width))
        self._n["refreshes"] += 1
        if _rec.ACTIVE:
            _rec.instant("hot_cache_refresh", "rec", kept=int(keep.sum()),
                         dropped=int((~keep).sum()), loaded=int(new.size))
        return {"kept": int(keep.sum()), "dropped": int((~keep).sum()), "loaded": int(new.size)}

    def flush(self) -> None:
        """Write everything back (and wait for the shards' pending pushes); the cached
        ids' sightings go to the sketch."""
        self.write_back()
        self._feed_cached()
        if hasattr(self.emb, "flush"):
            self.emb.flush()

    def close(self) -> None:
        """Write everything back and stop the sketch's thread (the shards stay up)."""
        self.flush()
        if self._feed is not None:
            self._feed.put(None)
            self._feed.join()
            self._feed = None
