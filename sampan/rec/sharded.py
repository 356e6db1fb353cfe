"""Sharded embeddings behind a pull/push interface, and a pipelined batch prefetcher.

A shard answers four calls, all on *unique* int64 ids:

- ``assign(ids, step) -> rows``: resolve ids, run admission, create rows (no copy);
- ``gather(ids, rows) -> vectors``: copy vectors out, re-resolving any row whose owner
  changed since ``assign`` (eviction between the two), default vector for missing ids;
- ``push(ids, grads, step)``: apply the optimiser to those ids' rows;
- ``pull(ids, step) -> vectors``: assign then gather, for one-shot callers.

:class:`LocalShard` serves them from an in-process :class:`HashEmbeddingTable`; a remote
shard (a later Ray actor) implements the same four calls and drops in unchanged.
:class:`ShardedEmbedding` dedupes a batch, routes ids to shards by hash, and runs the
per-shard calls on a thread pool (the table kernels release the GIL).
"""

from __future__ import annotations

import copy
import inspect
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from sampan import _recorder as _rec
from sampan.rec.hashtable import HashMap, hash_ids
from sampan.rec.kernels import unique_inverse
from sampan.rec.optim import SparseAdagrad
from sampan.rec.table import HashEmbeddingTable

__all__ = ["LocalShard", "Prefetcher", "PulledBatch", "ShardedEmbedding"]


class LocalShard:
    """An in-process shard: a table plus the sparse optimiser that updates it.

    >>> s = LocalShard(HashEmbeddingTable(2)); s.pull(np.array([4])).shape
    (1, 2)
    """

    def __init__(self, table: HashEmbeddingTable, optimizer=None):
        self.table = table
        self.optimizer = optimizer if optimizer is not None else SparseAdagrad(0.05)

    def assign(self, ids: np.ndarray, step: int | None = None) -> np.ndarray:
        """Rows for unique ids, creating admitted ones (-1: not admitted)."""
        return self.table.rows_for(ids, step)

    def gather(self, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Vectors of ids at ``rows``; rows whose owner changed are looked up again."""
        t = self.table
        with t.lock:
            live = rows >= 0
            stale = live & (t.meta["key"][np.where(live, rows, 0)] != ids)
            stale |= live & ~t.live[np.where(live, rows, 0)]
            if stale.any():
                rows = rows.copy()
                rows[stale] = t.map.get(ids[stale])
            out = t.weights.gather(rows)
        out[rows < 0] = t.default
        return out

    def pull(self, ids: np.ndarray, step: int | None = None) -> np.ndarray:
        """assign + gather in one call."""
        return self.gather(ids, self.assign(ids, step))

    def push(self, ids: np.ndarray, grads: np.ndarray, step: int | None = None) -> None:
        """Apply summed gradients of unique ids."""
        self.optimizer.apply(self.table, ids, grads, step, summed=True)

    def read_rows(self, ids: np.ndarray):
        """``(found, weights, slots)`` of unique ids as stored (``slots`` None before the
        optimiser attached any); creates nothing, counts no sighting."""
        t = self.table
        with t.lock:
            rows = t.map.get(ids)
            w = t.weights.gather(rows)
            s = t.slots.gather(rows) if t.slots is not None else None
        return rows >= 0, w, s

    def top_ids(self, k: int):
        """``(ids, counts)``: up to ``k`` ids of rows in RAM with the most sightings
        (``meta["freq"]``: one per pull that named the id, plus what a cache wrote back),
        in no order; creates and counts nothing."""
        t = self.table
        with t.lock:
            n = t.alloc.next_row
            rows = np.flatnonzero(t.live[:n])
            freq = t.meta["freq"][rows]
            if int(k) < rows.size:
                part = np.argpartition(-freq, int(k) - 1)[: int(k)] if k > 0 else rows[:0]
                rows, freq = rows[part], freq[part]
            return t.meta["key"][rows].copy(), freq.copy()

    def write_rows(self, ids: np.ndarray, weights: np.ndarray, slots, seen,
                   step: int | None = None) -> None:
        """Overwrite the weights (and slots) of unique ids, creating missing rows, and add
        ``seen`` sightings to their frequency (a cache in front writes back this way)."""
        t, opt = self.table, self.optimizer
        t.attach_slots(opt.slot_width(t.dim), opt.slot_init)
        with t.lock:
            step = t.step if step is None else int(step)
            t.step = max(t.step, step)
            rows, created = t.map.get_or_insert(ids, t.alloc)
            t._create(ids, rows, created, step)
            t.weights.scatter(rows, weights)
            if slots is not None:
                t.slots.scatter(rows, slots)
            t.meta["updated"][rows] = step
            t.dirty[rows] = True
            seen = np.asarray(seen, np.int64)
            t.meta["freq"][rows] += seen
            t.meta["last_seen"][rows[seen > 0]] = step


@dataclass
class PulledBatch:
    """A batch with its embedding ids deduplicated and their vectors pulled."""

    batch: object
    uniq: np.ndarray
    inverse: np.ndarray
    vectors: np.ndarray
    timings: dict = field(default_factory=dict)


# backend name -> the ShardedEmbedding subclass that `ShardedEmbedding(..., backend=name)`
# makes: "ray" is registered by `sampan.rec.remote` (imported by `sampan.rec`), whose
# subclass is defined on this class, so this module does not import it
BACKENDS: dict = {}


def register_backend(name: str, cls) -> None:
    """Make ``ShardedEmbedding(..., backend=name)`` return a ``cls`` (a subclass)."""
    BACKENDS[name] = cls


class ShardedEmbedding:
    """Ids partitioned over ``n_shards`` shards by hash; calls fan out on a thread pool.

    ``backend="ray"`` puts every shard in a Ray actor instead (``sampan.rec.remote``;
    ``num_shards`` is an alias of ``n_shards``).

    Set ``stats`` to an :class:`sampan.rec.sketch.IdStats` to have every pull (and every
    prefetch's plan) count its ids there.

    >>> e = ShardedEmbedding(4, n_shards=2); u, inv, v = e.pull([7, 8, 7]); v[inv].shape
    (3, 4)
    """

    stats = None  # an IdStats fed by plan(), when set

    def __new__(cls, *args, backend: str = "local", **kwargs):
        if backend != "local" and backend not in BACKENDS:
            names = " or ".join(repr(n) for n in ["local", *BACKENDS])
            raise ValueError(f"ShardedEmbedding backend must be {names}, got {backend!r}")
        if backend != "local" and cls is ShardedEmbedding:
            return object.__new__(BACKENDS[backend])
        return object.__new__(cls)

    def __init__(self, dim: int, n_shards: int = 4, optimizer_factory=None, shards=None,
                 threads: int | None = None, *, backend: str = "local",
                 num_shards: int | None = None, **table_kwargs):
        self.dim = int(dim)
        if num_shards is not None:
            n_shards = num_shards
        self.max_staleness = 0
        if shards is None:
            if n_shards < 1:
                raise ValueError(f"n_shards must be >= 1, got {n_shards}")
            make_opt = optimizer_factory or (lambda: SparseAdagrad(0.05))
            ev = table_kwargs.pop("eviction", None)
            # an eviction policy's sweep cursor and growth count describe one table
            shards = [LocalShard(HashEmbeddingTable(dim, eviction=copy.deepcopy(ev),
                                                    **table_kwargs), make_opt())
                      for _ in range(n_shards)]
        self.shards = list(shards)
        n = len(self.shards)
        self.pool = ThreadPoolExecutor(threads or min(n, 4)) if n > 1 else None
        self.push_log: list[np.ndarray] | None = None  # ids pushed, while a Prefetcher asks

    def close(self) -> None:
        """Stop the thread pool."""
        if self.pool is not None:
            self.pool.shutdown()

    def __len__(self) -> int:
        return sum(len(s.table) for s in self.shards)

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """Shard index of each id (high hash bits; the tables use the low ones)."""
        return ((hash_ids(ids) >> np.uint64(40)) % np.uint64(len(self.shards))).astype(np.int64)

    def _split(self, uniq: np.ndarray) -> list[np.ndarray]:
        if _rec.ACTIVE:
            with _rec.span("split", "rec", ids=int(uniq.size), shards=len(self.shards)):
                return self._split_ids(uniq)
        return self._split_ids(uniq)

    def _split_ids(self, uniq: np.ndarray) -> list[np.ndarray]:
        if len(self.shards) == 1:
            return [np.arange(uniq.size)]
        sid = self.shard_of(uniq)
        order = np.argsort(sid, kind="stable")
        bounds = np.searchsorted(sid[order], np.arange(len(self.shards) + 1))
        return [order[bounds[i]:bounds[i + 1]] for i in range(len(self.shards))]

    def _map(self, fn, parts):
        if self.pool is None:
            return [fn(0, parts[0])]
        return list(self.pool.map(fn, range(len(parts)), parts))

    def plan(self, ids, step: int | None = None):
        """Dedupe ``ids`` and assign rows on every shard: ``(uniq, inverse, parts, rows)``."""
        uniq, inverse = unique_inverse(ids)
        self._count(uniq, inverse)
        parts, rows = self.plan_unique(uniq, step)
        return uniq, inverse, parts, rows

    def plan_unique(self, uniq: np.ndarray, step: int | None = None):
        """:meth:`plan` of ids already distinct (int64; no dedupe, no ``stats``):
        ``(parts, rows)``, what :meth:`fetch` takes with ``uniq``."""
        parts = self._split(uniq)
        before = self._sizes() if _rec.ACTIVE else None
        rows = self._map(lambda i, p: self.shards[i].assign(uniq[p], step), parts)
        if _rec.ACTIVE and before is not None:
            # the tables are the cache: an id with a row already is a hit; one that made a
            # row (or was refused admission) a miss
            made = sum(self._sizes()) - sum(before)
            refused = sum(int((r < 0).sum()) for r in rows)
            _rec.instant("cache", "rec", hits=int(uniq.size) - made - refused,
                         misses=made + refused, ids=int(uniq.size))
        return parts, rows

    def _count(self, uniq: np.ndarray, inverse: np.ndarray) -> None:
        if self.stats is not None:
            self.stats.update(uniq, np.bincount(inverse, minlength=uniq.size), unique=True)

    def _sizes(self):
        try:
            return [len(s.table) for s in self.shards]
        except (AttributeError, TypeError):   # a remote shard: it counts for itself
            return None

    def fetch(self, uniq, parts, rows) -> np.ndarray:
        """Gather the vectors of a plan, shape ``(len(uniq), dim)``."""
        out = np.empty((uniq.size, self.dim), np.float32)

        def one(i, p):
            out[p] = self.shards[i].gather(uniq[p], rows[i])

        self._map(one, parts)
        return out

    def pull(self, ids, step: int | None = None):
        """``(uniq, inverse, vectors)`` with ``vectors[inverse]`` the rows of ``ids``."""
        with _rec.span("pull", "rec", ids=int(np.size(ids))):
            uniq, inverse, parts, rows = self.plan(ids, step)
            return uniq, inverse, self.fetch(uniq, parts, rows)

    def push(self, uniq, grads, step: int | None = None) -> None:
        """Apply summed gradients of unique ids on their shards."""
        if _rec.ACTIVE:
            with _rec.span("push", "rec", ids=int(np.size(uniq))):
                return self._push(uniq, grads, step)
        return self._push(uniq, grads, step)

    def _push(self, uniq, grads, step) -> None:
        uniq = np.ascontiguousarray(uniq, np.int64)
        grads = np.ascontiguousarray(grads, np.float32)
        parts = self._split(uniq)
        self._map(lambda i, p: self.shards[i].push(uniq[p], grads[p], step), parts)
        if self.push_log is not None:
            self.push_log.append(uniq.copy())

    def _refetch(self, uniq, parts, rows, mask, out) -> None:
        """Gather again, into ``out``, the vectors of the plan's ids selected by ``mask``."""
        def one(i, p):
            sel = mask[p]
            if sel.any():
                out[p[sel]] = self.shards[i].gather(uniq[p[sel]], rows[i][sel])

        self._map(one, parts)

    def read_rows(self, uniq):
        """``(found, weights, slots)`` of unique ids as their shards store them (slots
        None while no shard has optimiser slots yet); creates nothing."""
        uniq = np.ascontiguousarray(uniq, np.int64)
        parts = self._split(uniq)
        got = self._map(lambda i, p: self.shards[i].read_rows(uniq[p]), parts)
        return _join_rows(uniq.size, self.dim, parts, got)

    def top_ids(self, k: int):
        """``(ids, counts)``: the ``k`` ids the shards counted most (their rows'
        sightings, ``LocalShard.top_ids``), most first (ties by id)."""
        return top_of(self._map(lambda i, _: self.shards[i].top_ids(k),
                                [None] * len(self.shards)), k)

    def write_rows(self, uniq, weights, slots, seen, step: int | None = None) -> None:
        """Overwrite unique ids' weights and slots on their shards (a cache's write-back)."""
        uniq = np.ascontiguousarray(uniq, np.int64)
        parts = self._split(uniq)
        self._map(lambda i, p: self.shards[i].write_rows(
            uniq[p], weights[p], None if slots is None else slots[p], seen[p], step), parts)

    def read(self, ids) -> np.ndarray:
        """Vectors of ids without creating rows (serving-style)."""
        uniq, inverse = unique_inverse(ids)
        parts = self._split(uniq)
        out = np.empty((uniq.size, self.dim), np.float32)

        def one(i, p):
            out[p] = self.shards[i].table.read(uniq[p])

        self._map(one, parts)
        return out[inverse]


def top_of(got, k: int):
    """The ``k`` highest counts of several shards' ``(ids, counts)``, most first."""
    ids = np.concatenate([np.asarray(g[0], np.int64) for g in got])
    cnt = np.concatenate([np.asarray(g[1], np.int64) for g in got])
    order = np.lexsort((ids, -cnt))[: max(int(k), 0)]
    return ids[order], cnt[order]


def _join_rows(n: int, dim: int, parts, got):
    """One ``(found, weights, slots)`` from the shards' answers for ``parts`` of n ids."""
    found = np.zeros(n, np.bool_)
    w = np.zeros((n, dim), np.float32)
    widths = {g[2].shape[1] for g in got if g[2] is not None}
    s = np.zeros((n, widths.pop()), np.float32) if len(widths) == 1 else None
    for p, (f, wp, sp) in zip(parts, got):
        found[p], w[p] = f, wp
        if s is not None and sp is not None:
            s[p] = sp
    return found, w, s


def _init_signature(cls) -> inspect.Signature:
    """``cls(...)``'s signature as ``__init__`` spells it (``__new__`` only dispatches)."""
    sig = inspect.signature(cls.__init__)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


ShardedEmbedding.__signature__ = _init_signature(ShardedEmbedding)


class Prefetcher:
    """Iterate ``PulledBatch`` es, preparing batch t+1 on a background thread during step t.

    The background thread dedupes batch t+1's ids, assigns their rows (the hashing,
    admission and row creation) and gathers their vectors while the caller trains on batch
    t. When the caller reports ``done()`` (its push of step t), the thread gathers again
    just the ids that push touched, so training sees exactly what a synchronous loop would
    (as long as pushes go through ``emb.push`` and nothing else evicts meanwhile).
    ``ids_of(batch)`` extracts the id array of a batch.

    ``max_staleness`` (default: the embedding's, 0 for the local backend) above 0 trades
    that exactness for overlap: batch t+1 is pulled without waiting for step t's push, so
    the vectors a step trains on miss at most the last ``max_staleness`` steps' updates
    (batch t is pulled only after step t - max_staleness - 1 reported ``done()``).
    ``overlap()`` reports the fraction of background work hidden behind the caller.
    """

    def __init__(self, emb: ShardedEmbedding, batches, ids_of, start_step: int = 0,
                 max_staleness: int | None = None):
        self.emb, self.ids_of = emb, ids_of
        s = getattr(emb, "max_staleness", 0) if max_staleness is None else int(max_staleness)
        if s < 0:
            raise ValueError(f"max_staleness must be >= 0, got {s}")
        self.max_staleness = s
        self._it = iter(batches)
        self._out: queue.Queue = queue.Queue(maxsize=max(1, s))
        # batch 0 needs no push before its gather; with staleness s, batches 0..s none
        self._pushed = threading.Semaphore(1 if s == 0 else s + 1)
        self._step = start_step
        self.bg_seconds = 0.0
        self.wait_seconds = 0.0
        self._stop = threading.Event()
        emb.push_log = [] if s == 0 else None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        step, stale = self._step, self.max_staleness > 0
        try:
            for batch in self._it:
                if stale:
                    self._pushed.acquire()
                    if self._stop.is_set():
                        return
                t0 = time.perf_counter()
                with _rec.span("pull", "rec", step=step, prefetch=True):
                    uniq, inv, parts, rows = self.emb.plan(self.ids_of(batch), step)
                    vecs = self.emb.fetch(uniq, parts, rows)
                t1 = time.perf_counter()
                if not stale:
                    self._pushed.acquire()
                    if self._stop.is_set():
                        return
                t2 = time.perf_counter()
                pushed, self.emb.push_log = self.emb.push_log, ([] if not stale else None)
                if pushed:
                    seen = HashMap(sum(p.size for p in pushed))
                    for p in pushed:
                        seen.put(p, np.zeros(p.size, np.int64))
                    with _rec.span("pull", "rec", step=step, refetch=True):
                        self.emb._refetch(uniq, parts, rows, seen.get(uniq) >= 0, vecs)
                t3 = time.perf_counter()
                self.bg_seconds += (t1 - t0) + (t3 - t2)
                self._out.put(PulledBatch(batch, uniq, inv, vecs,
                                          {"plan_fetch": t1 - t0, "refetch": t3 - t2}))
                step += 1
        except BaseException as exc:  # noqa: BLE001  (surfaced in the caller)
            self._out.put(exc)
            return
        self._out.put(None)

    def __iter__(self):
        return self

    def __next__(self) -> PulledBatch:
        t0 = time.perf_counter()
        if _rec.ACTIVE:
            with _rec.span("prefetch_wait", "rec"):
                item = self._out.get()
        else:
            item = self._out.get()
        self.wait_seconds += time.perf_counter() - t0
        if item is None:
            raise StopIteration
        if isinstance(item, BaseException):
            raise RuntimeError("prefetch thread failed") from item  # noqa: TRY004
        return item

    def done(self) -> None:
        """Tell the prefetcher the current batch's gradients are pushed."""
        self._pushed.release()

    def overlap(self) -> float:
        """Fraction of background time not waited for by the caller (1.0 = fully hidden)."""
        if self.bg_seconds == 0:
            return 0.0
        return max(0.0, 1.0 - self.wait_seconds / self.bg_seconds)

    def close(self) -> None:
        """Stop the background thread."""
        self._stop.set()
        self._pushed.release()
        self._thread.join(timeout=5)
        self.emb.push_log = None
