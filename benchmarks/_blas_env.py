"""OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE when it loads (and either may be
set on this machine, slowing numpy): a benchmark run as a script calls
`rerun_without_overrides()` before it imports numpy, which starts the same command again
without them. Benchmarks only: tests and CI leave the variables alone."""
import os
import sys

OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def rerun_without_overrides() -> None:
    if set(OVERRIDES) & set(os.environ):
        env = {k: v for k, v in os.environ.items() if k not in OVERRIDES}
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
