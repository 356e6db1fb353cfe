"""D1 all-reduce bandwidth: `sampan.distributed.all_reduce` against raw mpi4py `Allreduce`
(MPI_IN_PLACE, float32 numpy buffers) on the same ranks, 1–64 MB, JSON lines.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/allreduce.py [--quick]

starts itself on 2 ranks through the environment's mpiexec; under mpiexec (or from
`benchmarks/data_parallel.py`) call `sampan_allreduce_bandwidth(sizes_mb)` on every rank.
Each size alternates raw and sampan repetitions (ABAB…) so that the machine's noise falls
on both; bandwidth is bytes / median time; the ratio (raw time / sampan time, target
>= 0.95 from 4 MB up) is the median over repetitions of adjacent pairs' ratios, with the
ratio of the medians alongside. "sampan_nocheck" is sampan without the cross-rank signature check
(SAMPAN_DIST_CHECK=0), to show what that check costs.
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


def sampan_allreduce_bandwidth(sizes_mb=SIZES_MB, quick=False, emit_lines=True):
    """Collective: call on every rank of an MPI job. Returns (on every rank) one dict per
    size with the median seconds and GB/s of raw mpi4py and of sampan, and the ratio; rank 0
    prints them as JSON lines when `emit_lines`."""
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

        def ours_nocheck():
            g.check = False
            try:
                dist.all_reduce(c)
            finally:
                g.check = True

        fns = {"mpi4py": raw, "sampan": ours, "sampan_nocheck": ours_nocheck}
        times = {k: [] for k in fns}
        for f in fns.values():              # warm-up
            f()
            f()
        for _ in range(_reps(mb, quick)):
            for k, f in fns.items():
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
        pairs_nc = [x / y for x, y in zip(times["mpi4py"], times["sampan_nocheck"])]
        rec["ratio"] = statistics.median(pairs)
        rec["ratio_of_medians"] = med["mpi4py"] / med["sampan"]
        rec["ratio_nocheck"] = statistics.median(pairs_nc)
        out.append(rec)
        if emit_lines and g.rank == 0:
            for k, v in times.items():
                gbps = [mb * 2**20 / t / 1e9 for t in v]
                emit("D1", k, f"allreduce_{mb}MB", "GB_per_s", gbps, ranks=g.size,
                     ms_median=round(med[k] * 1e3, 4), **info)
            emit("D1", "sampan/mpi4py", f"allreduce_{mb}MB", "bandwidth_ratio", pairs,
                 target=0.95 if mb >= 4 else None,
                 ratio_of_medians=round(rec["ratio_of_medians"], 4),
                 nocheck_ratio=round(rec["ratio_nocheck"], 4))
    comm.Free()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=None, help="comma-separated MB, default 1,4,16,64")
    ap.add_argument("-n", type=int, default=2, help="ranks (when not under mpiexec)")
    a = ap.parse_args(argv)
    sizes = tuple(float(s) for s in a.sizes.split(",")) if a.sizes else SIZES_MB
    sizes = tuple(int(s) if float(s).is_integer() else s for s in sizes)
    if "PMI_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        from sampan.distributed.cli import find_mpiexec
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        cmd = [find_mpiexec(), "-n", str(a.n), sys.executable, os.path.abspath(__file__)]
        cmd += sys.argv[1:] if argv is None else list(argv)
        return subprocess.run(cmd, env=env, timeout=300).returncode
    sampan_allreduce_bandwidth(sizes, quick=a.quick)
    import sampan.distributed as dist
    dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
