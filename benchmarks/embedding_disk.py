"""Disk tier of HashEmbeddingTable: RSS and samples/s with a RAM budget, against all-RAM.

Two parts (``--parts``):

- ``store``: batched gather + scatter of 4096 random ids over ``--store-rows`` 16-wide
  float32 rows, in a memory-mapped chunk file (id = row: the best case, no id index) and
  in LMDB (one write transaction a batch), rows/s and RSS (anonymous and file-backed);
  and the file costs that shaped ``sampan/rec/logstore.py``: us per random 4 kB pread,
  per 4 kB pwrite of a clean page in place, and per 192-byte record appended in batches.
- ``train``: a table of ``--ids`` distinct ids (filled first), then ``--steps`` steps of
  ``--batch`` samples x ``--fields`` ids drawn Zipf(1.1) over them (lookup + SparseAdagrad
  push), each system in its own process so that RSS is its own; timed twice, every system
  alike: the first ``--steps`` after the fill (``phase=cold``, the ``embedding-disk-cold``
  line: the fill leaves the coldest ranks in RAM, so this is mostly the tier's warm-up),
  then ``--steps`` more after ``--warmup`` untimed steps (``phase=steady``, the
  ``embedding-disk`` line: what a trainer that runs for hours sees): ``sampan-ram`` (all
  rows in RAM), ``sampan-disk`` (``memory_budget_mb=--budget-mb``, spill to a temp dir,
  the log store of ``sampan.rec.logstore``) and ``sampan-lmdb`` (the same over the LMDB
  store). Lines: samples/s, peak RSS, RssAnon, the table's resident bytes, the store's
  index, merges, rebuilds and bytes on disk.

    python benchmarks/embedding_disk.py --ids 10000000 --budget-mb 256
    python benchmarks/embedding_disk.py --quick        # 10^6 ids, 64 MB, a few seconds

Targets (issue 33): RSS <= budget + 300 MB at >= 0.5x the all-RAM samples/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)

import numpy as np  # noqa: E402
from common import blas_info, emit  # noqa: E402


def _rss() -> dict:
    want = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    with open("/proc/self/status") as f:
        got = {ln.split(":")[0]: int(ln.split()[1]) for ln in f if ln.startswith(want)}
    return {k: round(v / 1024, 1) for k, v in got.items()}


def store_lines(n_rows: int, batches: int, info: dict) -> None:
    import lmdb
    rng = np.random.default_rng(0)
    d = tempfile.mkdtemp(prefix="sampan-store-")
    try:
        mm = np.lib.format.open_memmap(os.path.join(d, "rows.npy"), "w+", np.float32,
                                       (n_rows, 16))
        t = time.perf_counter()
        for _ in range(batches):
            ids = np.sort(rng.integers(0, n_rows, 4096))
            mm[ids] = mm[ids] + 1.0
        rate = batches * 4096 / (time.perf_counter() - t)
        emit("embedding-disk-store", "memmap-chunks", "cpu", "rows_per_s", [rate],
             rows=n_rows, rss_mb=_rss(), **info)
        del mm
        env = lmdb.open(os.path.join(d, "lmdb"), map_size=1 << 40, sync=False,
                        readahead=False, max_dbs=2)
        db = env.open_db(b"rows")
        val = bytes(64)
        for s in range(0, n_rows, 1 << 16):
            ks = np.arange(s, min(n_rows, s + (1 << 16)), dtype=np.int64).astype(">u8").tobytes()
            with env.begin(write=True, db=db) as txn:
                txn.cursor().putmulti([(ks[i:i + 8], val) for i in range(0, len(ks), 8)],
                                      append=True)
        t = time.perf_counter()
        for _ in range(batches):
            ks = np.unique(rng.integers(0, n_rows, 4096)).astype(">u8").tobytes()
            keys = [ks[i:i + 8] for i in range(0, len(ks), 8)]
            with env.begin(write=True, db=db) as txn:
                a = np.frombuffer(b"".join(txn.get(k) for k in keys), np.float32) + 1.0
                out = a.tobytes()
                txn.cursor().putmulti([(k, out[64 * i:64 * (i + 1)])
                                       for i, k in enumerate(keys)])
        rate = batches * 4096 / (time.perf_counter() - t)
        emit("embedding-disk-store", "lmdb", "cpu", "rows_per_s", [rate], rows=n_rows,
             rss_mb=_rss(), **info)
        env.close()
        page_lines(d, n_rows, batches, info)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def page_lines(d: str, n_rows: int, batches: int, info: dict) -> None:
    """Why the log store appends (sampan.rec.logstore): us per 4 kB page written in place
    at random (pwrite of a clean page of a synced file) against us per 192-byte record
    appended 4096 at a time, and us per random 4 kB pread."""
    rng = np.random.default_rng(1)
    path = os.path.join(d, "pages")
    n_pages = max(n_rows * 192 // 4096, 4096)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        blk = bytes(4096 * 256)
        for s in range(0, n_pages, 256):
            os.pwrite(fd, blk, s * 4096)
        os.fsync(fd)
        page = bytes(4096)
        pages = rng.integers(0, n_pages, 4096 * batches)
        t = time.perf_counter()
        for p in pages[:4096 * batches // 2]:
            os.pread(fd, 4096, int(p) * 4096)
        read_us = (time.perf_counter() - t) / (pages.size // 2) * 1e6
        t = time.perf_counter()
        for p in pages[pages.size // 2:]:
            os.pwrite(fd, page, int(p) * 4096)
        write_us = (time.perf_counter() - t) / (pages.size - pages.size // 2) * 1e6
        log = os.open(os.path.join(d, "log"), os.O_RDWR | os.O_CREAT | os.O_APPEND)
        rec = bytes(192 * 4096)
        t = time.perf_counter()
        for _ in range(batches):
            os.write(log, rec)
        append_us = (time.perf_counter() - t) / (4096 * batches) * 1e6
        os.close(log)
        emit("embedding-disk-store", "file-pages", "cpu", "us_per_op", [write_us],
             pread_4k_us=round(read_us, 2), pwrite_clean_4k_us=round(write_us, 2),
             append_192b_us=round(append_us, 3), pages=n_pages, **info)
    finally:
        os.close(fd)


def _zipf_ids(rng, n_ids: int, size: int) -> np.ndarray:
    ranks = (rng.zipf(1.1, size) - 1) % n_ids
    return (ranks * 0x9E3779B1 + 12345) % (1 << 62)  # ranks spread over the id space


def child(args) -> dict:
    """One system in this process: fill, train, report (JSON on stdout)."""
    from threadpoolctl import threadpool_limits
    from sampan.rec.optim import SparseAdagrad
    from sampan.rec.table import HashEmbeddingTable
    threadpool_limits(1)
    if args.remap_keys:
        from sampan.rec.disktier import SpillStore
        SpillStore.REMAP_KEYS = args.remap_keys
    if args.system in ("disk", "lmdb"):
        from sampan.rec import disktier
        disktier.STORE = "log" if args.system == "disk" else "lmdb"
    spill = tempfile.mkdtemp(prefix="sampan-spill-", dir=args.spill_root) \
        if args.system in ("disk", "lmdb") else None
    try:
        kw = dict(memory_budget_mb=args.budget_mb, spill_dir=spill) if spill else {}
        t = HashEmbeddingTable(16, **kw)
        opt = SparseAdagrad(0.05)
        t.attach_slots(opt.slot_width(16))
        t0 = time.perf_counter()
        step = 1 << 16
        with t.bulk_fill() if args.bulk_fill else contextlib.nullcontext():
            for s in range(0, args.ids, step):
                ranks = np.arange(s, min(args.ids, s + step), dtype=np.int64)
                t.lookup((ranks * 0x9E3779B1 + 12345) % (1 << 62), step=0)
                if s // step % 16 == 0:
                    print(f"# {args.system}: filled {s + ranks.size} of {args.ids} ids "
                          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        fill_s = time.perf_counter() - t0
        print(f"# {args.system}: fill {fill_s:.0f} s, rss {_rss()}", file=sys.stderr,
              flush=True)
        last = (ranks[-1:] * 0x9E3779B1 + 12345) % (1 << 62)  # resident in every system
        opt.apply(t, last, np.zeros((1, 16), np.float32), step=0)  # compile the push first
        rng = np.random.default_rng(0)

        def phase(first: int, n: int) -> float:
            """Seconds of lookup + push over ``n`` steps (drawing the ids not timed)."""
            took = 0.0
            for s in range(first, first + n, 64):
                batches = [_zipf_ids(rng, args.ids, args.batch * args.fields)
                           for _ in range(min(64, first + n - s))]
                t0 = time.perf_counter()
                for i, ids in enumerate(batches, start=s):
                    v = t.lookup(ids, step=i + 1)
                    opt.apply(t, ids, v * 0.01, step=i + 1)
                took += time.perf_counter() - t0
            return took

        def tier_counts() -> tuple:
            return (t.tier.promoted, t.tier.demoted) if t.tier is not None else (0, 0)

        c0 = tier_counts()
        cold_s = phase(0, args.steps)
        c1 = tier_counts()
        phase(args.steps, args.warmup)
        c2 = tier_counts()
        train_s = phase(args.steps + args.warmup, args.steps) if args.warmup else cold_s
        c3 = tier_counts() if args.warmup else c1
        per = lambda a, b: [round((b[k] - a[k]) / args.steps, 1) for k in (0, 1)]  # noqa
        pc, ps = per(c0, c1), per(c2, c3)
        out = {"samples_per_s": args.steps * args.batch / train_s, "fill_s": fill_s,
               "bulk_fill": args.bulk_fill,
               "cold_samples_per_s": args.steps * args.batch / cold_s,
               "promoted_per_step": ps[0], "demoted_per_step": ps[1],
               "cold_promoted_per_step": pc[0], "cold_demoted_per_step": pc[1],
               "rss_mb": _rss(), "ids": len(t), "table_mb": t.nbytes / 2**20}
        if t.tier is not None:
            st = t.tier.store
            out.update(resident_mb=t.tier.resident_bytes / 2**20,
                       resident_rows=len(t.map), demoted=t.tier.demoted,
                       promoted=t.tier.promoted, store=type(st).__name__,
                       store_index_mb=st.nbytes / 2**20,
                       merges=getattr(st, "merges", None),
                       rebuilds=getattr(st, "rebuilds", None),
                       bulk_builds=getattr(st, "bulk_builds", None),
                       disk_mb=sum(os.path.getsize(os.path.join(spill, f))
                                   for f in os.listdir(spill)) / 2**20)
        return out
    finally:
        if spill:
            shutil.rmtree(spill, ignore_errors=True)


def train_lines(args, info: dict) -> None:
    got = {}
    for system in args.systems.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", system,
               "--ids", str(args.ids), "--budget-mb", str(args.budget_mb),
               "--steps", str(args.steps), "--batch", str(args.batch),
               "--fields", str(args.fields), "--remap-keys", str(args.remap_keys),
               "--warmup", str(args.warmup)] + ([] if args.bulk_fill else ["--no-bulk-fill"])
        if args.spill_root:
            cmd += ["--spill-root", args.spill_root]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        sys.stderr.write(r.stderr[-2000:])
        if r.returncode:
            print(f"# {system} failed (rc {r.returncode})", file=sys.stderr)
            continue
        got[system] = json.loads(r.stdout.strip().splitlines()[-1])
    base = {s: {k: v for k, v in r.items() if not k.startswith("cold_")}
            for s, r in got.items()}
    cold = {s: dict({k: v for k, v in r.items() if not k.startswith("cold_")
                     and k not in ("promoted_per_step", "demoted_per_step")},
                    samples_per_s=r["cold_samples_per_s"],
                    promoted_per_step=r["cold_promoted_per_step"],
                    demoted_per_step=r["cold_demoted_per_step"])
            for s, r in got.items()}
    # steady state: --steps timed after --warmup untimed steps (every system alike);
    # cold: the first --steps after the fill (the fill leaves the coldest ranks in RAM)
    phases = [("cold", cold)] + ([("steady", base)] if args.warmup else [])
    for name, res_of in phases:
        for system, res in res_of.items():
            extra = {k: v for k, v in res.items() if k != "samples_per_s"}
            ratio = (res["samples_per_s"] / res_of["ram"]["samples_per_s"]
                     if "ram" in res_of else None)
            emit("embedding-disk" if name == "steady" or not args.warmup
                 else "embedding-disk-cold", f"sampan-{system}", "cpu", "samples_per_s",
                 [res["samples_per_s"]], phase=name,
                 warmup_steps=args.warmup if name == "steady" else 0,
                 budget_mb=args.budget_mb if system in ("disk", "lmdb") else None,
                 vs_ram=None if ratio is None else round(ratio, 3),
                 rss_over_budget_mb=(round(res["rss_mb"]["VmHWM"] - args.budget_mb, 1)
                                     if system in ("disk", "lmdb") else None),
                 batch=args.batch, fields=args.fields, steps=args.steps, **extra, **info)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="store,train")
    ap.add_argument("--ids", type=int, default=10**7)
    ap.add_argument("--budget-mb", type=float, default=256.0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=2000,
                    help="steps run untimed between the cold and the steady-state timing "
                         "(0: time only the first --steps after the fill)")
    ap.add_argument("--batch", type=int, default=512, help="samples a step")
    ap.add_argument("--fields", type=int, default=8, help="ids a sample")
    ap.add_argument("--systems", default="ram,disk",
                    help="comma list of ram (all rows in RAM), disk (the log store), "
                         "lmdb (the LMDB store)")
    ap.add_argument("--spill-root", default=None, help="folder for the spill dirs")
    ap.add_argument("--remap-keys", type=int, default=0,
                    help="SpillStore.REMAP_KEYS for this run (0: the default)")
    ap.add_argument("--store-rows", type=int, default=10**7)
    ap.add_argument("--store-batches", type=int, default=50)
    ap.add_argument("--no-bulk-fill", dest="bulk_fill", action="store_false",
                    help="fill without HashEmbeddingTable.bulk_fill (new ids through the "
                         "log and its merges, as a trainer's first pass would)")
    ap.add_argument("--quick", action="store_true", help="10^6 ids, 64 MB, 50 steps")
    ap.add_argument("--child", choices=("ram", "disk", "lmdb"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.ids, args.budget_mb, args.steps, args.store_rows = 10**6, 64.0, 50, 10**6
        args.warmup = min(args.warmup, 200)
    if args.child:
        args.system = args.child
        print(json.dumps(child(args)), flush=True)
        return
    info = {**blas_info()}
    parts = args.parts.split(",")
    if "store" in parts:
        store_lines(args.store_rows, args.store_batches, info)
    if "train" in parts:
        train_lines(args, info)


if __name__ == "__main__":
    main()
