"""Every MPI collective check in one job: ``mpiexec -n 2 python mpi_checks.py OUTDIR``.

Each rank runs every check of checks.py and writes OUTDIR/rank-<r>.json ({check: "ok" or
the failure}); test_collectives.py starts the job once and asserts per check."""
from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sampan.distributed as dist  # noqa: E402
from checks import CHECKS  # noqa: E402


def main(out_dir):
    g = dist.init("auto", timeout=20)
    assert g.backend == "mpi", g
    results = {"world_size": dist.world_size(),
               "env_rank": os.environ.get("SAMPAN_RANK")}
    for name, (fn, args) in CHECKS.items():
        try:
            fn(*args)
            results[name] = "ok"
        except Exception:                                  # noqa: BLE001 - reported
            results[name] = traceback.format_exc()
        dist.barrier()
    with open(os.path.join(out_dir, f"rank-{dist.rank()}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy()


if __name__ == "__main__":
    main(sys.argv[1])
