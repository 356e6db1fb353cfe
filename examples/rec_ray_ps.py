"""DLRM with its embedding table on two Ray parameter-server shards; one is killed mid-run.

    .venv/bin/python examples/rec_ray_ps.py            # 30 steps of 512, kill after 15

Each shard is a Ray actor (``ShardedEmbedding(..., backend="ray")``) that writes a delta
snapshot every few pushes. Killing one makes Ray restart it; the new actor restores its
latest full snapshot plus deltas, and the trainer re-sends just the logged calls since the
last delta, so training carries on as if nothing happened. The same script runs on many
hosts with ``ray.init(address=...)`` before it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sampan  # noqa: E402
from sampan.rec.data import ClickStream  # noqa: E402
from sampan.rec.metrics import auc  # noqa: E402
from sampan.rec.models import DLRM, predict, train_step  # noqa: E402
from sampan.rec.sharded import Prefetcher  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--kill-after", type=int, default=15)
    args = ap.parse_args(argv)
    try:
        from sampan.rec.remote import init_ray, require_ray
        ray = require_ray()
    except sampan.SampanError as exc:
        print(f"skipped: {exc}")
        return
    t0 = time.perf_counter()
    init_ray(ray, num_cpus=2, object_store_memory=200 * 2**20)
    sampan.manual_seed(0)
    model = DLRM(n_shards=2, backend="ray", delta_every=5, initial_capacity=1 << 16)
    emb = model.embedding.emb
    pids = [i["pid"] for i in emb.info()]
    print(f"2 shard actors up (pids {pids}) in {time.perf_counter() - t0:.1f} s; a delta "
          f"snapshot every 5 pushes under {emb.snapshot_dir}")
    opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)
    stream = ClickStream(seed=0)
    held_out = [stream.batch(10**6, 2048)]
    batches = (stream.batch(i, args.batch) for i in range(args.steps))
    pf = Prefetcher(emb, batches, ids_of=lambda b: b.ids_matrix())
    seen = 0
    for step, pb in enumerate(pf, 1):
        b = pb.batch
        loss = train_step(model, opt, b.ids_matrix(), b.dense, b.labels, pulled=pb)
        pf.done()
        if step == args.kill_after:
            emb.kill_shard(0)
            print(f"step {step:3d}  loss {loss:.4f}  -> killed shard 0's actor (pid {pids[0]})")
        elif step % 5 == 0 or step == args.steps:
            print(f"step {step:3d}  loss {loss:.4f}  rows {len(emb):,}", flush=True)
        for r in emb.restores()[0][seen:]:
            seen += 1
            print(f"step {step:3d}  loss {loss:.4f}  <- shard 0 is back as pid {r['pid']}: "
                  f"restored to step {r['step']} from {r['files']} snapshot files in "
                  f"{r['seconds']:.2f} s; the trainer re-sent {r.get('resent', 0)} logged "
                  f"calls (nothing lost, nothing applied twice)")
    pf.close()
    emb.flush()
    b = held_out[0]
    a = auc(predict(model, b.ids_matrix(), b.dense), b.labels)
    print(f"training carried on through the restart: held-out AUC {a:.4f} after "
          f"{args.steps} steps; {time.perf_counter() - t0:.1f} s in all")
    emb.close()
    ray.shutdown()


if __name__ == "__main__":
    main()
