"""T1 embedding tiers on the W4 stream: the id sketch, the hot-row cache, compressed rows.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/embedding_tiers.py
    ... --quick                       (fewer batches and steps: a minute or two)
    ... --parts sketch,hits           (only some parts: sketch, hits, train, rows, ray)

One JSON line per measurement (WORKLOADS.md format):

- ``sketch``: ids/s of ``IdStats.update`` (numba count-min + heavy hitters) against Apache
  DataSketches' ``count_min_sketch`` and ``frequent_items_sketch`` (one Python call per id),
  on the same W4 batches, and how many estimates stay within the stated error bound.
- ``hits``: hit rate (per looked-up id) of the sketch-sized ``HotCache`` (refreshed every
  ``--refresh`` batches from its sketch) at budgets of 1/5/20% of the distinct ids, against
  an LRU cache of as many rows (exact LRU, by stack distance) and a static top-K of the
  first pass (exact counts); measured over a second pass of fresh batches of the stream.
- ``train``: W4 samples/s with the cache (5% budget) against without, local shards,
  side by side block by block; ``ray``: the same with 2 Ray shards.
- ``rows``: AUC after ``--steps`` steps and embedding bytes per row for float16, bfloat16
  and int8 rows against float32.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from common import blas_info, emit
from numba import njit

import sampan
from sampan.rec.data import ClickStream
from sampan.rec.hashtable import HashMap
from sampan.rec.hotcache import HotCache
from sampan.rec.metrics import auc
from sampan.rec.models import DLRM, HashEmbedding, predict, train_step
from sampan.rec.sharded import Prefetcher, ShardedEmbedding
from sampan.rec.sketch import IdStats

F, D, DIM = 26, 13, 16
BUDGETS = (0.01, 0.05, 0.20)


# ------------------------------------------------------------------------------ sketch
def sketch_lines(batches, info):
    try:
        import datasketches as ds
    except ImportError:  # the 'bench' extra: the other parts' lines still come
        ds = None
        print("# datasketches is not installed (pip install '.[bench]'): IdStats alone",
              file=sys.stderr)

    ids = [b.indices for b in batches]
    n = sum(x.size for x in ids)
    stats = IdStats(width=1 << 16, depth=4, capacity=1 << 14)
    stats.update(ids[0][:100])  # compile
    stats.clear()
    t = time.perf_counter()
    for x in ids:
        stats.update(x)
    ours = n / (time.perf_counter() - t)
    uniq, true = np.unique(np.concatenate(ids), return_counts=True)
    err = stats.estimate(uniq) - true
    within = float((err <= stats.error_bound).mean())
    emit("T1", "sampan", "IdStats", "ids_per_s", [ours], ids=n, within_bound=round(within, 5),
         delta=round(stats.delta, 4), error_bound=stats.error_bound,
         mean_abs_error=round(float(err.mean()), 2), never_below=bool((err >= 0).all()),
         sketch_mb=round(stats.nbytes / 2**20, 2), **info)
    if ds is None:
        return
    # DataSketches takes one id per Python call: time a slice of the stream
    part = np.concatenate(ids)[: min(n, 200_000)].tolist()
    cms = ds.count_min_sketch(4, 1 << 16)
    t = time.perf_counter()
    for v in part:
        cms.update(v)
    cms_rate = len(part) / (time.perf_counter() - t)
    fi = ds.frequent_items_sketch(14)
    t = time.perf_counter()
    for v in part:
        fi.update(v)
    fi_rate = len(part) / (time.perf_counter() - t)
    emit("T1", "datasketches", "count_min_sketch", "ids_per_s", [cms_rate], ids=len(part),
         **info)
    emit("T1", "datasketches", "frequent_items_sketch", "ids_per_s", [fi_rate],
         ids=len(part), **info)
    emit("T1", "sampan/datasketches", "IdStats/count_min_sketch", "speed_ratio",
         [ours / cms_rate], winner="numba" if ours > cms_rate else "datasketches")
    # IdStats is a count-min *and* its heavy hitters: DataSketches needs both sketches fed
    both = 1 / (1 / cms_rate + 1 / fi_rate)
    emit("T1", "sampan/datasketches", "IdStats/count_min+frequent_items", "speed_ratio",
         [ours / both], datasketches_ids_per_s=round(both, 1),
         winner="numba" if ours > both else "datasketches")


# ------------------------------------------------------------------------------ hit rates
@njit(cache=True)
def _stack_distances(dense, n_ids, out):
    """For each access, how many distinct ids were accessed since this id's previous
    access (-1: first access): LRU of K rows hits exactly when that is < K. A Fenwick
    tree over time marks each id's latest access."""
    t_n = dense.size
    tree = np.zeros(t_n + 1, np.int64)
    last = np.full(n_ids, -1, np.int64)
    for t in range(t_n):
        x = dense[t]
        p = last[x]
        if p < 0:
            out[t] = -1
        else:
            # marks in (p, t): prefix(t) - prefix(p + 1)
            s = 0
            i = t
            while i > 0:
                s += tree[i]
                i -= i & -i
            i = p + 1
            while i > 0:
                s -= tree[i]
                i -= i & -i
            out[t] = s
            i = p + 1
            while i <= t_n:
                tree[i] -= 1
                i += i & -i
        i = t + 1
        while i <= t_n:
            tree[i] += 1
            i += i & -i
        last[x] = t


def hit_lines(pass1, pass2, refresh, info, sketch_every=1):
    first = np.concatenate([b.indices for b in pass1])
    second = np.concatenate([b.indices for b in pass2])
    rows = int(np.unique(first).size)
    stream = np.concatenate([first, second])
    _, dense = np.unique(stream, return_inverse=True)
    dist = np.empty(stream.size, np.int64)
    _stack_distances(dense.astype(np.int64), int(dense.max()) + 1, dist)
    dist2 = dist[first.size:]
    u1, c1 = np.unique(first, return_counts=True)
    order1 = np.argsort(-c1, kind="stable")
    c2 = np.unique(second, return_counts=True)[1]
    out = {}
    for frac in BUDGETS:
        k = max(1, int(frac * rows))
        lru = float(((dist2 >= 0) & (dist2 < k)).mean())
        top = HashMap(k)
        top.put(u1[order1[:k]], np.zeros(k, np.int64))
        static = float((top.get(second) >= 0).mean())
        # the ceiling of any K-row cache on pass 2: its own top K, known in hindsight
        oracle = float(c2[np.argsort(-c2, kind="stable")[:k]].sum() / second.size)
        emb = ShardedEmbedding(DIM, n_shards=1)
        probe = HotCache(emb, budget_mb=1)
        cache = HotCache(emb, budget_mb=k * probe.row_bytes / 2**20 + 1e-9,
                         sketch_every=sketch_every)
        for i, b in enumerate(pass1 + pass2):
            if i == len(pass1):
                before = cache.counters()
            cache.pull(b.indices, i)
            if (i + 1) % refresh == 0:
                cache.refresh(i)
        c = cache.counters()
        hits, misses = c["hits"] - before["hits"], c["misses"] - before["misses"]
        rate = hits / (hits + misses)
        dh = c["distinct_hits"] - before["distinct_hits"]
        dm = c["distinct_misses"] - before["distinct_misses"]
        emb.close()
        out[frac] = rate
        emit("T1", "sampan", f"hot-cache-{int(frac * 100)}pct", "hit_rate", [rate],
             rows=rows, cache_rows=cache.capacity, budget_mb=round(cache.budget_mb, 2),
             lru_hit_rate=round(lru, 4), static_topk_hit_rate=round(static, 4),
             oracle_hit_rate=round(oracle, 4),
             distinct_hit_rate=round(dh / max(dh + dm, 1), 4),  # the pull/push work saved
             beats_lru=bool(rate > lru), refresh_every=refresh, lookups=int(second.size),
             sketch_every=sketch_every,
             **({"target": 0.8, "met": bool(rate >= 0.8)} if frac == 0.05 else {}), **info)
    return rows, out


# ------------------------------------------------------------------------------ training
def _model(weights, emb=None, **table_kwargs):
    from w4_ctr import sampan_model
    m, _ = sampan_model(weights)
    if emb is not None or table_kwargs:
        sd = dict(m.state_dict())
        e = HashEmbedding(DIM, emb=emb, lr=0.05, **table_kwargs) if emb is not None else \
            HashEmbedding(DIM, lr=0.05, initial_capacity=1 << 22, **table_kwargs)
        m = DLRM(n_fields=F, n_dense=D, dim=DIM, embedding=e)
        m.load_state_dict(sd)
    return m, sampan.optim.Adagrad(m.parameters(), lr=0.05)


def _train(m, opt, batches, blocks, on_step=None, prefetch=False):
    """Generator: each block's seconds (with ``prefetch``, a Prefetcher pulls ahead;
    ``on_step(i)`` runs between steps, where a cache may refresh)."""
    pf = Prefetcher(m.embedding.emb, batches, ids_of=lambda b: b.ids_matrix()) \
        if prefetch else None
    it = iter(pf) if pf is not None else None
    for blk in blocks:
        t0 = time.perf_counter()
        for i in blk:
            b = batches[i]
            if pf is not None:
                train_step(m, opt, b.ids_matrix(), b.dense, b.labels, pulled=next(it))
                pf.done()
            else:
                train_step(m, opt, b.ids_matrix(), b.dense, b.labels)
            if on_step is not None:
                on_step(i)
        yield time.perf_counter() - t0
    if pf is not None:
        pf.close()


def _count_calls(emb):
    """Count the Ray calls a remote embedding sends (``emb.ray_calls``): each send of a
    shard's outbox is one call, whatever it batches."""
    emb.ray_calls = 0
    kick = emb._kick_locked

    def counted(s):
        emb.ray_calls += bool(s.outbox)
        kick(s)

    emb._kick_locked = counted


def train_lines(batches, evals, rows, args, info, backend="local"):
    from w4_ctr import shared_weights
    weights = shared_weights()
    shards = 2 if backend == "ray" else 1
    kw = {"backend": "ray", "max_staleness": args.staleness} if backend == "ray" else {}
    plain_emb = ShardedEmbedding(DIM, n_shards=shards, initial_capacity=1 << 22, **kw)
    back_emb = ShardedEmbedding(DIM, n_shards=shards, initial_capacity=1 << 22, **kw)
    probe = HotCache(back_emb, budget_mb=1)
    k = max(1, int(0.05 * rows))
    cache = HotCache(back_emb, budget_mb=k * probe.row_bytes / 2**20 + 1e-9,
                     write_back_every=args.write_back, sketch_every=args.sketch_every)
    if backend == "ray":
        for e in (plain_emb, back_emb):
            _count_calls(e)
    plain, popt = _model(weights, plain_emb)
    cached, copt = _model(weights, cache)
    blocks = np.array_split(np.arange(len(batches)), 5)
    warm = max(1, len(batches) // 10)

    def refresh(i):  # between passes: once warm, then every --train-refresh steps
        if (i + 1) % args.train_refresh == 0 or i + 1 == warm:
            cache.refresh(i)

    runs = {"plain": _train(plain, popt, batches, blocks, prefetch=True),
            "cache": _train(cached, copt, batches, blocks, refresh, prefetch=True)}
    times = {s: [] for s in runs}
    for r in range(len(blocks)):
        for s in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            print(f"# {backend} block {r + 1}/{len(blocks)}: {s}", file=sys.stderr, flush=True)
            times[s].append(next(runs[s]))
    cache.flush()
    # bytes between trainer and shards a step: without the cache every distinct id's id
    # and vector each way (pull, push); with it the cache's own count (misses both ways,
    # write-backs with their slots, refresh loads)
    row = 8 + 4 * DIM
    moved = {"plain": 2 * row * sum(int(np.unique(b.indices).size) for b in batches),
             "cache": cache.counters()["bytes_moved"]}
    res = {}
    for s, m in (("plain", plain), ("cache", cached)):
        emb = plain_emb if s == "plain" else back_emb
        calls = {"ray_calls_per_step": round(emb.ray_calls / len(batches), 2)} \
            if backend == "ray" else {}
        rates = [len(b) * args.batch / t for b, t in zip(blocks, times[s])]
        p = np.concatenate([predict(m, b.ids_matrix(), b.dense) for b in evals])
        a = auc(p, np.concatenate([b.labels for b in evals]))
        extra = cache.counters() if s == "cache" else {}
        extra = {k2: (round(v, 4) if isinstance(v, float) else v) for k2, v in extra.items()}
        res[s] = emit("T1", "sampan", f"w4-{s}", "samples_per_s", rates, backend=backend,
                      shards=shards, auc=round(a, 4), prefetch=True,
                      write_back_every=args.write_back, sketch_every=args.sketch_every,
                      bytes_per_step=int(moved[s] / len(batches)), **calls,
                      **({"max_staleness": args.staleness} if backend == "ray" else {}),
                      **extra, **info)
    target = 1.5 if backend == "ray" else 1.2
    ratio = res["cache"]["value"] / res["plain"]["value"]
    emit("T1", "sampan_cache/sampan", f"w4-{backend}", "speed_ratio", [ratio], target=target,
         met=bool(ratio >= target), auc_gap=round(abs(res["cache"]["auc"] -
                                                      res["plain"]["auc"]), 4))
    plain_emb.close()
    back_emb.close()


def rows_lines(batches, evals, args, info):
    from w4_ctr import shared_weights
    weights = shared_weights()
    blocks = np.array_split(np.arange(len(batches)), 5)
    res = {}
    for dt in ("float32", "float16", "bfloat16", "int8"):
        m, opt = _model(weights, row_dtype=dt)
        ts = list(_train(m, opt, batches, blocks))
        p = np.concatenate([predict(m, b.ids_matrix(), b.dense) for b in evals])
        a = auc(p, np.concatenate([b.labels for b in evals]))
        t = m.embedding.emb.shards[0].table
        per_row = t.bytes_per_row
        rates = [len(b) * args.batch / s for b, s in zip(blocks, ts)]
        res[dt] = emit("T1", "sampan", f"rows-{dt}", "auc", [a], row_dtype=dt,
                       weight_bytes_per_row=per_row["weights"],
                       bytes_per_row=per_row, rows=len(t),
                       weight_mb=round(len(t) * per_row["weights"] / 2**20, 1),
                       samples_per_s=round(float(np.median(rates)), 1), **info)
        m.embedding.emb.close()
    for dt in ("float16", "bfloat16", "int8"):
        cut = res["float32"]["weight_bytes_per_row"] / res[dt]["weight_bytes_per_row"]
        gap = abs(res[dt]["value"] - res["float32"]["value"])
        extra = {"target_cut": 3.5, "target_auc_gap": 0.002,
                 "met": bool(cut >= 3.5 and gap <= 0.002)} if dt == "int8" else {}
        emit("T1", f"sampan_{dt}/sampan_float32", "rows", "bytes_cut", [cut],
             auc_gap=round(gap, 4), **extra)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="sketch,hits,train,rows,ray")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--pass-batches", type=int, default=100,
                    help="batches per pass of the hit-rate measurement")
    ap.add_argument("--steps", type=int, default=200, help="training steps (train, rows)")
    ap.add_argument("--eval-batches", type=int, default=10)
    ap.add_argument("--refresh", type=int, default=10, help="batches between refreshes")
    ap.add_argument("--write-back", type=int, default=4, help="the cache's write_back_every")
    ap.add_argument("--sketch-every", type=int, default=1,
                    help="the cache's sketch_every (one batch's misses in N feed its sketch)")
    ap.add_argument("--train-refresh", type=int, default=50,
                    help="steps between the cache's refreshes while training")
    ap.add_argument("--staleness", type=int, default=1,
                    help="the Ray shards' max_staleness (as W4's sampan-ray line)")
    ap.add_argument("--quick", action="store_true", help="30-batch passes, 60 steps of 1024")
    args = ap.parse_args(argv)
    if args.quick:
        args.pass_batches, args.steps, args.batch, args.eval_batches = 30, 60, 1024, 4
    parts = args.parts.split(",")
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    stream = ClickStream(seed=0)
    info = {"batch": args.batch, **blas_info()}
    print(f"# generating {2 * args.pass_batches} + {args.eval_batches} batches",
          file=sys.stderr, flush=True)
    pass1 = [stream.batch(i, args.batch) for i in range(args.pass_batches)]
    pass2 = [stream.batch(10**5 + i, args.batch) for i in range(args.pass_batches)]
    evals = [stream.batch(10**6 + i, args.batch) for i in range(args.eval_batches)]
    train = (pass1 + pass2)[: args.steps]
    rows = int(np.unique(np.concatenate([b.indices for b in train])).size)
    if "sketch" in parts:
        sketch_lines(pass1[:20], info)
    if "hits" in parts:
        hit_lines(pass1, pass2, args.refresh, info, args.sketch_every)
    if "train" in parts:
        train_lines(train, evals, rows, args, dict(info, steps=len(train)))
    if "ray" in parts:
        import importlib.util
        if importlib.util.find_spec("ray") is None:
            print("# ray is not installed: no Ray lines", file=sys.stderr)
        else:
            from sampan.rec.remote import init_ray, require_ray
            ray = require_ray()
            init_ray(ray, num_cpus=2, object_store_memory=512 * 2**20)
            train_lines(train, evals, rows, args, dict(info, steps=len(train)), "ray")
            ray.shutdown()
    if "rows" in parts:
        rows_lines(train, evals, args, dict(info, steps=len(train)))


if __name__ == "__main__":
    main()
