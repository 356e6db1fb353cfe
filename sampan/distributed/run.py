"""What each rank runs under `sampan launch`: ``python .../sampan/distributed/run.py
script.py args…`` (started by mpiexec; standard library only, so that it costs nothing
when the script itself does not import sampan).

It exports the rank and world size (SAMPAN_RANK, SAMPAN_WORLD_SIZE, from the MPI
launcher's PMI_RANK/PMI_SIZE), leaves its pid where the launcher watches
(SAMPAN_LAUNCH_DIR/rank-<r>.pid), runs the script as `__main__`, and on an uncaught
exception writes the traceback there (rank-<r>.traceback), prints it, and aborts the MPI
job so that the other ranks stop at once instead of waiting for their timeout.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback


def rank_and_size():
    env = os.environ
    for r, n in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMIX_RANK", "PMIX_SIZE"), ("SAMPAN_RANK", "SAMPAN_WORLD_SIZE")):
        if r in env:
            return int(env[r]), int(env.get(n, "1"))
    return 0, 1


def _write(directory, name, text):
    if not directory:
        return
    path = os.path.join(directory, name)
    try:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _user_traceback(e):
    """The traceback from the script's own frames on (not this runner's nor runpy's)."""
    tb = e.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _abort(code):
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python run.py script.py [args...]", file=sys.stderr)
        return 2
    rank, size = rank_and_size()
    os.environ["SAMPAN_RANK"], os.environ["SAMPAN_WORLD_SIZE"] = str(rank), str(size)
    d = os.environ.get("SAMPAN_LAUNCH_DIR")
    _write(d, f"rank-{rank}.pid", str(os.getpid()))
    script = argv[0]
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            _write(d, f"rank-{rank}.traceback", f"exited with status {code}\n")
            _abort(code)
    except BaseException as e:             # noqa: BLE001 - reported, then the job aborts
        text = _user_traceback(e)
        _write(d, f"rank-{rank}.traceback", text)
        print(f"[rank {rank}] {text}", file=sys.stderr, end="")
        _abort(1)
    _write(d, f"rank-{rank}.done", "0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
