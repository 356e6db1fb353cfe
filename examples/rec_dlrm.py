"""Train DLRM on the planted click stream (WORKLOADS.md W4) and watch held-out AUC rise.

    .venv/bin/python examples/rec_dlrm.py               # 200 steps of 2048, as in W4
    .venv/bin/python examples/rec_dlrm.py --quick       # ~30 s version for `make demo`

Raw 64-bit feature ids go straight into a collisionless hash embedding (no vocabulary);
batch t+1's ids are deduplicated and given rows on a background thread while step t runs,
and counted in an id sketch there. Then the sketch's top ids move into a hot-row cache on
the trainer for a few more steps (its hit rate is printed), and at the end the table is
exported as a snapshot and served read-only.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sampan
from sampan.rec.data import ClickStream
from sampan.rec.hotcache import HotCache
from sampan.rec.metrics import LogLoss, StreamingAUC
from sampan.rec.models import DLRM, predict, train_step
from sampan.rec.sharded import Prefetcher
from sampan.rec.sketch import IdStats
from sampan.rec.snapshot import ServingTable, export_full


def evaluate(model, batches):
    """Held-out AUC and log loss."""
    m, ll = StreamingAUC(), LogLoss()
    for b in batches:
        p = predict(model, b.ids_matrix(), b.dense)
        m.update(p, b.labels)
        ll.update(p, b.labels)
    return m.value(), ll.value()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--cache-mb", type=float, default=8.0, help="hot-row cache budget")
    ap.add_argument("--cache-steps", type=int, default=20,
                    help="steps trained through the hot-row cache after the others")
    ap.add_argument("--quick", action="store_true", help="30 steps of 1024 (for make demo)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.eval_every, args.cache_steps = 30, 1024, 10, 10
    sampan.manual_seed(0)
    stream = ClickStream(seed=0)
    held_out = [stream.batch(10**6 + i, 4096) for i in range(2)]
    planted = np.concatenate([stream.planted_logit(b.ids_matrix(), b.dense) for b in held_out])
    m0 = StreamingAUC()
    m0.update(1 / (1 + np.exp(-planted)), np.concatenate([b.labels for b in held_out]))
    print(f"planted model's own AUC on the held-out batches: {m0.value():.3f}")

    model = DLRM()  # 26 fields, 13 dense, dim 16, bottom 13-64-16, top 367-256-1
    opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)
    batches = (stream.batch(i, args.batch) for i in range(args.steps))
    emb = model.embedding.emb
    emb.stats = IdStats(width=1 << 18, capacity=1 << 16)  # counted on the prefetch thread
    pf = Prefetcher(model.embedding.emb, batches, ids_of=lambda b: b.ids_matrix())
    t0 = time.perf_counter()
    for step, pb in enumerate(pf, 1):
        b = pb.batch
        loss = train_step(model, opt, b.ids_matrix(), b.dense, b.labels, pulled=pb)
        pf.done()
        if step % args.eval_every == 0 or step == args.steps:
            a, ll = evaluate(model, held_out)
            rate = step * args.batch / (time.perf_counter() - t0)
            print(f"step {step:4d}  train loss {loss:.4f}  held-out AUC {a:.4f}  "
                  f"logloss {ll:.4f}  rows {len(model.embedding.emb):,}  "
                  f"{rate:,.0f} samples/s", flush=True)
    print(f"prefetch overlap: {pf.overlap():.0%} of the id work hidden behind training")
    pf.close()

    # the sketch's top ids (as many as the budget holds) in a cache on the trainer
    cache = HotCache(emb, budget_mb=args.cache_mb, stats=emb.stats)
    cache.refresh()
    model.embedding.emb = cache
    for i in range(args.steps, args.steps + args.cache_steps):
        b = stream.batch(i, args.batch)
        train_step(model, opt, b.ids_matrix(), b.dense, b.labels)
    cache.close()  # every cached row written back to the table
    model.embedding.emb = emb
    c = cache.counters()
    a, _ = evaluate(model, held_out)
    print(f"hot-row cache: {c['rows']:,} rows ({args.cache_mb:g} MB, "
          f"{c['rows'] / len(emb):.1%} of the table) served {c['hit_rate']:.1%} of "
          f"{c['hits'] + c['misses']:,} lookups over {args.cache_steps} steps; "
          f"{c['written_back']:,} rows written back; held-out AUC {a:.4f}")

    table = model.embedding.emb.shards[0].table
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "emb.full")
        export_full(table, path)
        serving = ServingTable(path)
        ids = held_out[0].ids_matrix()
        same = np.array_equal(serving.lookup(ids), table.read(ids.ravel()).reshape(
            ids.shape + (table.dim,)))
        print(f"snapshot: {os.path.getsize(path) / 2**20:.1f} MiB, {len(serving):,} ids; "
              f"serving lookups equal training table: {same}")
    model.embedding.emb.close()


if __name__ == "__main__":
    main()
