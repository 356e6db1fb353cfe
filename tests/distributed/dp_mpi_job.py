"""One `mpiexec -n 2` job for test_data_parallel.py: eager DataParallel for 5 steps on
each rank's half of the global batch; rank r writes its parameters to <out>/rank<r>.npz.
Run: mpiexec -n 2 python dp_mpi_job.py OUT_DIR"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sampan.distributed as dist  # noqa: E402
from sampan.distributed.data_parallel import DataParallel  # noqa: E402
from test_data_parallel import _data, _model, _train  # noqa: E402


def main(out):
    dist.init("mpi", timeout=30)
    r, n = dist.rank(), dist.world_size()
    x, y = _data()
    dp = DataParallel(_model(seed=r), bucket_mb=0.002)
    _train(dp, x, y, r, n)
    np.savez(os.path.join(out, f"rank{r}.npz"),
             *[p.numpy() for p in dp.module.parameters()], size=n)
    dist.destroy()


if __name__ == "__main__":
    main(sys.argv[1])
