"""D1 all-reduce bandwidth: `sampan.distributed.all_reduce` against raw mpi4py `Allreduce`
(MPI_IN_PLACE, float32 numpy buffers) on the same ranks, 1–64 MB, JSON lines.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/allreduce.py [--quick]

starts itself on 2 ranks through the environment's mpiexec; `benchmarks/data_parallel.py`
calls `sampan_allreduce_bandwidth(sizes_mb)` (which does the same outside an MPI job).
Each size alternates raw and sampan repetitions (ABAB…) so that the machine's noise falls
on both; bandwidth is bytes / median time; the ratio (raw time / sampan time, target
>= 0.95 from 4 MB up) is the median over repetitions of adjacent pairs' ratios, with the
ratio of the medians and of the fastest repetitions (what each costs when a shared host
leaves both ranks alone) alongside. "sampan" is the default (the cross-rank signature
check on all_reduce's first 16 calls and every 16th); "sampan_checked" checks every call
(SAMPAN_DIST_CHECK=1), to show what that check costs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from common import blas_info, emit

SIZES_MB = (1, 4, 16, 64)


def _reps(mb, quick):
    n = 40 if mb <= 4 else (16 if mb <= 16 else 8)
    return max(5, n // 3) if quick else n


def _under_mpi():
    return "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def sampan_allreduce_bandwidth(sizes_mb=SIZES_MB, quick=False, emit_lines=True, nprocs=2):
    """All-reduce bandwidth, sampan vs raw mpi4py. Inside an MPI job: collective, call it
    on every rank; returns (on every rank) one dict per size with the median seconds and
    GB/s of each system and the ratio; rank 0 prints the JSON lines when `emit_lines`.
    Outside one: runs this file on `nprocs` ranks through mpiexec, prints its lines (when
    `emit_lines`) and returns the records it printed."""
    if not _under_mpi():
        return _self_launch(sizes_mb, quick, emit_lines, nprocs)
    import numpy as np
    from mpi4py import MPI

    import sampan.distributed as dist
    g = dist.init("mpi")
    comm = MPI.COMM_WORLD.Dup()
    info = blas_info() if emit_lines else {}
    out = []
    for mb in sizes_mb:
        n = int(mb * 2**20) // 4
        a = np.zeros(n, np.float32)
        b = np.zeros(n, np.float32)
        c = np.zeros(n, np.float32)

        def raw():
            comm.Allreduce(MPI.IN_PLACE, [a, MPI.FLOAT], op=MPI.SUM)

        def ours():
            dist.all_reduce(b)

        def ours_checked():
            every, g.check_every = g.check_every, 1
            try:
                dist.all_reduce(c)
            finally:
                g.check_every = every

        fns = {"mpi4py": raw, "sampan": ours, "sampan_checked": ours_checked}
        times = {k: [] for k in fns}
        for f in fns.values():              # warm-up
            f()
            f()
        for i in range(_reps(mb, quick)):
            order = list(fns.items())
            for k, f in (order if i % 2 == 0 else order[::-1]):   # who goes first alternates
                comm.Barrier()
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        # every rank's time is the step's: take the slower rank per repetition
        for k in times:
            mine = np.array(times[k])
            comm.Allreduce(MPI.IN_PLACE, mine, op=MPI.MAX)
            times[k] = mine.tolist()
        med = {k: statistics.median(v) for k, v in times.items()}
        rec = {"size_mb": mb, "ranks": g.size}
        for k, v in times.items():
            rec[f"{k}_s"] = med[k]
            rec[f"{k}_gbps"] = mb * 2**20 / med[k] / 1e9
        # the ratio of each repetition's adjacent raw and sampan runs: the machine's drift
        # (other jobs on a shared host) falls on both halves of a pair
        pairs = [x / y for x, y in zip(times["mpi4py"], times["sampan"])]
        pairs_nc = [x / y for x, y in zip(times["mpi4py"], times["sampan_checked"])]
        rec["ratio"] = statistics.median(pairs)
        rec["ratio_of_medians"] = med["mpi4py"] / med["sampan"]
        rec["ratio_checked"] = statistics.median(pairs_nc)
        # fastest against fastest: what each costs when the host leaves both ranks alone
        rec["ratio_best"] = min(times["mpi4py"]) / min(times["sampan"])
        out.append(rec)
        if emit_lines and g.rank == 0:
            for k, v in times.items():
                gbps = [mb * 2**20 / t / 1e9 for t in v]
                emit("D1", k, f"allreduce_{mb}MB", "GB_per_s", gbps, ranks=g.size,
                     ms_median=round(med[k] * 1e3, 4), **info)
            emit("D1", "sampan/mpi4py", f"allreduce_{mb}MB", "bandwidth_ratio", pairs,
                 target=0.95 if mb >= 4 else None,
                 ratio_of_medians=round(rec["ratio_of_medians"], 4),
                 ratio_best=round(rec["ratio_best"], 4),
                 checked_ratio=round(rec["ratio_checked"], 4))
    comm.Free()
    return out


def _self_launch(sizes_mb, quick, emit_lines, nprocs):
    import json

    from sampan.distributed.cli import find_mpiexec
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(HERE),
                                                      os.environ.get("PYTHONPATH")) if p))
    cmd = [find_mpiexec(), "-n", str(nprocs), sys.executable, os.path.abspath(__file__),
           "--sizes", ",".join(str(s) for s in sizes_mb)] + (["--quick"] if quick else [])
    p = subprocess.run(cmd, env=env, timeout=300, capture_output=True, text=True)
    recs = []
    for line in p.stdout.splitlines():
        if emit_lines:
            print(line, flush=True)
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    if p.returncode:
        sys.stderr.write(p.stderr[-4000:])
    return recs


HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=None, help="comma-separated MB, default 1,4,16,64")
    ap.add_argument("-n", type=int, default=2, help="ranks (when not under mpiexec)")
    a = ap.parse_args(argv)
    sizes = tuple(float(s) for s in a.sizes.split(",")) if a.sizes else SIZES_MB
    sizes = tuple(int(s) if float(s).is_integer() else s for s in sizes)
    if not _under_mpi():
        recs = sampan_allreduce_bandwidth(sizes, quick=a.quick, nprocs=a.n)
        return 0 if recs else 1
    sampan_allreduce_bandwidth(sizes, quick=a.quick)
    import sampan.distributed as dist
    dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
