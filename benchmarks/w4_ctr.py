"""W4 sparse CTR training: sampan DLRM on collisionless hash embeddings against PyTorch
(nn.EmbeddingBag with sparse gradients + Adagrad), ids mapped through Python dicts or hashed
into fixed 10^6-row tables. Also the hash map micro-benchmark (lookups/s, one core).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/w4_ctr.py
    ... --steps 40 --systems sampan,torch-dict      (quick look)
    ... --backends local,ray --systems sampan-prefetch,torch-hashed   (Ray shard actors)

One JSON line per (system, mode): train samples/s (median of 5 blocks of steps/5 steps,
min–max), AUC on held-out batches after exactly ``--steps`` steps, and table memory. The
systems train side by side, one block each in turn, so a shared machine's changing load
falls on all of them alike. BLAS and torch run ``--threads`` threads (default 1).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import numpy as np
from common import blas_info, emit

import sampan
from sampan.rec.data import ClickStream
from sampan.rec.hashtable import HashMap, RowAllocator
from sampan.rec.metrics import auc
from sampan.rec.models import DLRM, predict, train_step
from sampan.rec.remote import init_ray, require_ray
from sampan.rec.sharded import Prefetcher, ShardedEmbedding

F, D, DIM = 26, 13, 16
LAYERS = [(13, 64), (64, 16), (367, 256), (256, 1)]  # bottom, bottom, top, top


def shared_weights(seed=0):
    """MLP weights U(±1/sqrt(fan_in)), biases zero, (in, out) layout, from one numpy seed."""
    r = np.random.default_rng(seed)
    return [(r.uniform(-1, 1, (i, o)).astype(np.float32) / np.sqrt(i),
             np.zeros(o, np.float32)) for i, o in LAYERS]


# ------------------------------------------------------------------------------ sampan
def sampan_model(weights, n_shards=1, backend="local", staleness=0):
    # sized for the ~2.5M distinct ids that 200 W4 steps see (torch-hashed: 26M rows)
    extra = {"backend": "ray", "max_staleness": staleness} if backend == "ray" else {}
    m = DLRM(n_fields=F, n_dense=D, dim=DIM, n_shards=n_shards, lr=0.05,
             initial_capacity=(1 << 22) // n_shards, **extra)
    sd = dict(m.state_dict())  # keeps the zero-size embedding.sparse_table
    names = [k for k in sd if k.endswith(".weight")]
    for (w, b), name in zip(weights, names):
        sd[name] = w
        sd[name[: -len("weight")] + "bias"] = b
    m.load_state_dict(sd)
    return m, sampan.optim.Adagrad(m.parameters(), lr=0.05)


def sampan_run(batches, evals, weights, blocks, prefetch, n_shards=1, backend="local",
               staleness=0):
    """Generator: yields each block's seconds, then a dict of results."""
    m, opt = sampan_model(weights, n_shards, backend, staleness)
    times, pf = [], None
    if prefetch:
        pf = Prefetcher(m.embedding.emb, batches, ids_of=lambda b: b.ids_matrix())
        it = iter(pf)
    for blk in blocks:
        t0 = time.perf_counter()
        for i in blk:
            b = batches[i]
            if prefetch:
                pb = next(it)
                train_step(m, opt, b.ids_matrix(), b.dense, b.labels, pulled=pb)
                pf.done()
            else:
                train_step(m, opt, b.ids_matrix(), b.dense, b.labels)
        times.append(time.perf_counter() - t0)
        yield times[-1]
    overlap = pf.overlap() if pf else None
    if pf:
        pf.close()
    p = np.concatenate([predict(m, b.ids_matrix(), b.dense) for b in evals])
    a = auc(p, np.concatenate([b.labels for b in evals]))
    emb = m.embedding.emb
    mem = emb.nbytes if backend == "ray" else sum(s.table.nbytes for s in emb.shards)
    rows = len(emb)
    emb.close()
    yield {"auc": round(a, 4), "table_mb": round(mem / 2**20, 1), "rows": rows,
           **({"overlap": round(overlap, 3)} if overlap is not None else {})}


# ------------------------------------------------------------------------------ torch
def torch_model(torch, weights, rows_per_field):
    nn = torch.nn

    class TorchDLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embs = nn.ModuleList(nn.EmbeddingBag(n, DIM, mode="sum", sparse=True)
                                      for n in rows_per_field)
            for e in self.embs:
                nn.init.normal_(e.weight, 0.0, 0.01)
            self.lin = nn.ModuleList(nn.Linear(i, o) for i, o in LAYERS)
            with torch.no_grad():
                for lin, (w, b) in zip(self.lin, weights):
                    lin.weight.copy_(torch.from_numpy(w.T.copy()))
                    lin.bias.copy_(torch.from_numpy(b))
            iu, ju = np.triu_indices(F + 1, 1)
            self.iu, self.ju = torch.from_numpy(iu), torch.from_numpy(ju)

        def forward(self, rows, dense):
            relu = torch.relu
            x = relu(self.lin[1](relu(self.lin[0](dense))))
            es = [e(rows[:, f:f + 1]) for f, e in enumerate(self.embs)]
            t = torch.stack([x] + es, dim=1)
            z = torch.bmm(t, t.transpose(1, 2))[:, self.iu, self.ju]
            h = relu(self.lin[2](torch.cat([x, z], dim=1)))
            return self.lin[3](h).squeeze(1)

    m = TorchDLRM()
    sparse_opt = torch.optim.Adagrad(list(m.embs.parameters()), lr=0.05)
    dense_opt = torch.optim.Adagrad(list(m.lin.parameters()), lr=0.05)
    return m, sparse_opt, dense_opt


class DictMapper:
    """Raw id -> row through one Python dict per field (rows in first-seen order)."""

    def __init__(self):
        self.maps = [{} for _ in range(F)]

    def __call__(self, ids, train=True):
        out = np.empty(ids.shape, np.int64)
        for f in range(F):
            d = self.maps[f]
            if train:
                out[:, f] = [d.setdefault(x, len(d)) for x in ids[:, f].tolist()]
            else:  # unseen ids read a zero row kept at the end of the table
                out[:, f] = [d.get(x, -1) for x in ids[:, f].tolist()]
        return out


def torch_run(torch, batches, evals, weights, blocks, variant):
    """Generator: yields each block's seconds, then a dict of results."""
    hashed_rows = 10**6
    if variant == "hashed":
        rows_per_field = [hashed_rows] * F

        def mapper(ids, train=True):
            return np.mod(ids, hashed_rows)
    else:
        # tables sized to the distinct training ids of each field (+1 zero row for unseen)
        distinct = [len(np.unique(np.concatenate([b.ids_matrix()[:, f] for b in batches])))
                    for f in range(F)]
        rows_per_field = [n + 1 for n in distinct]
        mapper = DictMapper()
    m, sopt, dopt = torch_model(torch, weights, rows_per_field)
    if variant == "dict":
        with torch.no_grad():
            for f, e in enumerate(m.embs):
                e.weight[-1].zero_()
    lossf = torch.nn.BCEWithLogitsLoss()

    def step(b):
        rows = torch.from_numpy(mapper(b.ids_matrix()))
        dense, y = torch.from_numpy(b.dense), torch.from_numpy(b.labels)
        sopt.zero_grad()
        dopt.zero_grad()
        loss = lossf(m(rows, dense), y)
        loss.backward()
        sopt.step()
        dopt.step()
        return loss

    times = []
    for blk in blocks:
        t0 = time.perf_counter()
        for i in blk:
            step(batches[i])
        times.append(time.perf_counter() - t0)
        yield times[-1]
    with torch.no_grad():
        ps = []
        for b in evals:
            r = mapper(b.ids_matrix(), train=False)
            if variant == "dict":
                r = np.where(r < 0, np.array(rows_per_field)[None, :] - 1, r)
            ps.append(torch.sigmoid(m(torch.from_numpy(r), torch.from_numpy(b.dense))).numpy())
    a = auc(np.concatenate(ps), np.concatenate([b.labels for b in evals]))
    mem = sum(e.weight.numel() * 4 * 2 for e in m.embs)  # weights + Adagrad state_sum
    yield {"auc": round(a, 4), "table_mb": round(mem / 2**20, 1)}


def check_one_step(torch, batch, weights):
    """Loss before and after one step, sampan vs PyTorch (dict rows set to sampan's init)."""
    m, opt = sampan_model(weights)
    ids = batch.ids_matrix()
    l0 = train_step(m, opt, ids, batch.dense, batch.labels)
    p1 = predict(m, ids, batch.dense)
    y = batch.labels
    l1 = float(-np.mean(y * np.log(p1) + (1 - y) * np.log1p(-p1)))
    m.embedding.emb.close()

    mapper = DictMapper()
    rows = mapper(ids)
    tm, sopt, dopt = torch_model(torch, weights, [len(d) for d in mapper.maps])
    from sampan.rec.table import hashed_normal
    with torch.no_grad():
        for f, e in enumerate(tm.embs):
            keys = np.array(list(mapper.maps[f].keys()), np.int64)
            e.weight.copy_(torch.from_numpy(hashed_normal(keys, DIM, 0, 0.01)))
    lossf = torch.nn.BCEWithLogitsLoss()
    r, d, yt = torch.from_numpy(rows), torch.from_numpy(batch.dense), torch.from_numpy(y)
    loss = lossf(tm(r, d), yt)
    loss.backward()
    sopt.step()
    dopt.step()
    with torch.no_grad():
        t1 = float(lossf(tm(r, d), yt))
    t0 = float(loss.detach())
    rel = max(abs(l0 - t0) / abs(t0), abs(l1 - t1) / abs(t1))
    return {"loss0": [l0, t0], "loss1": [l1, t1], "max_rel_diff": rel}


# ------------------------------------------------------------------------------ hash map
def hashmap_bench(n=10**6, reps=5):
    rng = np.random.default_rng(0)
    keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64)
    m, alloc = HashMap(capacity=n), RowAllocator()
    t0 = time.perf_counter()
    m.get_or_insert(keys, alloc)
    insert_s = time.perf_counter() - t0
    q = rng.permutation(keys)
    m.get(q)  # warm
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        m.get(q)
        rates.append(n / (time.perf_counter() - t0))
    emit("W4", "sampan", "hashmap", "lookups_per_s", rates, keys=n,
         insert_ns=round(insert_s / n * 1e9, 1), **blas_info())


# ------------------------------------------------------------------------------ ray PS
def remote_round_trip(batch, n_shards, reps=20):
    """Median seconds of pull + push (confirmed) of one batch's ids, per backend."""
    ids = batch.ids_matrix()
    out = {}
    for backend in ("local", "ray"):
        emb = ShardedEmbedding(DIM, n_shards=n_shards, backend=backend)
        ts = []
        for r in range(reps + 2):
            t0 = time.perf_counter()
            uniq, inv, vec = emb.pull(ids, r)
            emb.push(uniq, vec * np.float32(0.01), r)
            if backend == "ray":
                emb.flush()
            if r >= 2:  # two warm-up trips
                ts.append(time.perf_counter() - t0)
        emb.close()
        out[backend] = ts
    return out


def remote_recovery(rows=10**6, chunk=1 << 17):
    """Kill a 1-shard remote table of ``rows`` rows (all in its snapshot chain), time the
    restart: restore seconds inside the actor and kill-to-answer seconds at the caller."""
    emb = ShardedEmbedding(DIM, n_shards=1, backend="ray", delta_every=10**9,
                           initial_capacity=rows, timeout=300)
    ids = np.arange(rows, dtype=np.int64) * 7919 + 11
    for i in range(0, rows, chunk):
        u, _, v = emb.pull(ids[i:i + chunk], 0)
        emb.push(u, v * np.float32(0.01), 0)
    with tempfile.TemporaryDirectory() as d:
        emb.export_sharded(d)  # also the shard's own new full snapshot
    emb.flush()
    old = emb.info()[0]["pid"]
    t0 = time.perf_counter()
    emb.kill_shard(0)  # asynchronous: wait until a new actor process answers
    while (info := emb.info()[0])["pid"] == old:
        time.sleep(0.01)
    got = emb.read(ids[:5])
    wall = time.perf_counter() - t0
    ok = info["rows"] == rows and np.isfinite(got).all()
    emb.close()
    return info["restored"], wall, ok


def ray_lines(args, batches, info):
    ray = require_ray()
    if not ray.is_initialized():
        init_ray(ray, num_cpus=2, object_store_memory=512 * 2**20)
    trip_batch = ClickStream(seed=0).batch(0, 2048)  # 2048 x 26 ids whatever --batch says
    trips = remote_round_trip(trip_batch, 2)
    emit("W4", "sampan", "ps-round-trip", "seconds", trips["ray"], backend="ray", shards=2,
         ids=int(trip_batch.ids_matrix().size),
         local_median=round(float(np.median(trips["local"])), 5), **info)
    restored, wall, ok = remote_recovery(args.recovery_rows)
    emit("W4", "sampan", "ps-recovery", "restore_seconds", [restored["seconds"]],
         backend="ray", rows=args.recovery_rows, files=restored["files"],
         kill_to_answer_s=round(wall, 2), rows_ok=bool(ok), target_s=2.0,
         met=bool(restored["seconds"] <= 2.0), **info)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--eval-batches", type=int, default=10)
    ap.add_argument("--systems", default="sampan,sampan-prefetch,torch-dict,torch-hashed")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--backends", default=None,
                    help="local and/or ray (default: both when ray is installed): 'ray' "
                         "adds 2-shard Ray actor systems (prefetch, max_staleness 1 and 0) "
                         "and their in-process 2-shard peer, the round trip and recovery")
    ap.add_argument("--recovery-rows", type=int, default=10**6)
    ap.add_argument("--quick", action="store_true", help="40 steps of 1024, 200k-row "
                    "recovery (finishes in about a minute or two)")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS / torch intra-op threads for both systems (sampan's prefetch "
                         "thread comes on top)")
    args = ap.parse_args(argv)
    if args.backends is None:
        import importlib.util
        args.backends = "local,ray" if importlib.util.find_spec("ray") else "local"
    backends = args.backends.split(",")
    if args.quick:
        args.steps, args.batch, args.recovery_rows = 40, 1024, 200_000
    systems = args.systems.split(",")
    if "ray" in backends:
        peer = "sampan-prefetch" if args.shards == 2 else "sampan-prefetch-2shards"
        systems += [s for s in (peer, "sampan-ray", "sampan-ray-sync") if s not in systems]
    from threadpoolctl import threadpool_limits
    threadpool_limits(args.threads)
    hashmap_bench()
    stream = ClickStream(seed=0)
    print(f"# generating {args.steps} + {args.eval_batches} batches", file=sys.stderr)
    batches = [stream.batch(i, args.batch) for i in range(args.steps)]
    evals = [stream.batch(10**6 + i, args.batch) for i in range(args.eval_batches)]
    weights = shared_weights()
    blocks = np.array_split(np.arange(args.steps), 5)
    info = {"batch": args.batch, "steps": args.steps, "threads": args.threads, **blas_info()}
    torch = None
    if any(s.startswith("torch") for s in systems):
        import torch
        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        chk = check_one_step(torch, batches[0], weights)
        print(json.dumps({"workload": "W4", "check": "loss before/after one step, sampan vs "
                          "torch-dict", **chk}), flush=True)
    # a throwaway run compiles numba kernels and warms caches, outside the timed runs
    for _ in sampan_run(batches[:3], evals[:1], weights, [np.arange(3)], prefetch=False):
        pass
    # Systems run block by block in turn (order rotating each round), so that load from
    # other processes on a shared machine falls on all of them alike.
    runners, ray_lines_once = {}, False
    for s in systems:
        if s.startswith("sampan-ray"):
            ray_lines_once = ray_lines_once or (ray_lines(args, batches, info) or True)
            runners[s] = sampan_run(batches, evals, weights, blocks, True, 2, "ray",
                                    0 if s == "sampan-ray-sync" else 1)
        elif s == "sampan-prefetch-2shards":
            runners[s] = sampan_run(batches, evals, weights, blocks, True, 2)
        elif s.startswith("sampan"):
            runners[s] = sampan_run(batches, evals, weights, blocks, s == "sampan-prefetch",
                                    args.shards)
        else:
            runners[s] = torch_run(torch, batches, evals, weights, blocks, s.split("-", 1)[1])
    times = {s: [] for s in systems}
    for r in range(len(blocks)):
        order = systems[r % len(systems):] + systems[: r % len(systems)]
        for s in order:
            print(f"# block {r + 1}/{len(blocks)}: {s}", file=sys.stderr, flush=True)
            times[s].append(next(runners[s]))
    recs = {}
    for s in systems:
        extra = next(runners[s])
        rates = [len(b) * args.batch / t for b, t in zip(blocks, times[s])]
        if s.startswith("sampan-ray"):
            recs[s] = emit("W4", "sampan", "prefetch", "samples_per_s", rates, shards=2,
                           backend="ray", max_staleness=0 if s.endswith("sync") else 1,
                           **extra, **info)
        elif s.startswith("sampan"):
            mode = "prefetch" if s.startswith("sampan-prefetch") else "eager"
            recs[s] = emit("W4", "sampan", mode, "samples_per_s", rates,
                           shards=2 if s.endswith("2shards") else args.shards,
                           backend="local", **extra, **info)
        else:
            recs[s] = emit("W4", "pytorch", s.split("-", 1)[1], "samples_per_s", rates,
                           **extra, **info)
    # the target of issue 6: sampan against PyTorch's hashed fixed table, same run
    for s in ("sampan", "sampan-prefetch"):
        for peer in ("torch-hashed", "torch-dict"):
            if s in recs and peer in recs:
                emit("W4", f"{s}/{peer}".replace("-", "_"), recs[s]["mode"], "speed_ratio",
                     [recs[s]["value"] / recs[peer]["value"]], auc=recs[s]["auc"],
                     peer_auc=recs[peer]["auc"])

    # the Ray targets: >= 0.8x the in-process backend, AUC within 0.005 of synchronous
    local = recs.get("sampan-prefetch-2shards") or (
        recs.get("sampan-prefetch") if args.shards == 2 else None)
    if "sampan-ray" in recs and local is not None:
        ratio = recs["sampan-ray"]["value"] / local["value"]
        emit("W4", "sampan_ray/sampan_local", "prefetch", "speed_ratio", [ratio],
             target=0.8, met=bool(ratio >= 0.8), shards=2, auc=recs["sampan-ray"]["auc"],
             peer_auc=local["auc"])
    if "sampan-ray" in recs and "sampan-ray-sync" in recs:
        gap = abs(recs["sampan-ray"]["auc"] - recs["sampan-ray-sync"]["auc"])
        emit("W4", "sampan_ray_stale1/sampan_ray_sync", "prefetch", "auc_gap", [gap],
             target=0.005, met=bool(gap <= 0.005))


if __name__ == "__main__":
    main()
