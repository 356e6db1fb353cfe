"""`sampan launch`: a rank killed mid-step ends the job non-zero within the timeout with
the rank named; a rank's exception is printed with its rank and traceback; a stopped rank
(no heartbeat) is named by its peer's timed-out collective."""
from __future__ import annotations

import io
import os
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEP = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import sampan.distributed as dist
    dist.init()
    assert os.environ["SAMPAN_RANK"] == str(dist.rank())
    assert os.environ["SAMPAN_WORLD_SIZE"] == "2"
    x = np.ones(1000, np.float32)
    for step in range(5):
        dist.all_reduce(x, op="mean")
        if step == 2 and dist.rank() == 1:            # mid-step: between two collectives
            os.kill(os.getpid(), getattr(signal, "SIG" + sys.argv[1]))
        dist.all_reduce(x)
    print("finished", dist.rank())
""")

# needs only mpi4py (no sampan import: a fast job)
RAISE = textwrap.dedent("""
    import os
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()
    if os.environ["SAMPAN_RANK"] == "1":
        raise ValueError("bad batch on rank " + os.environ["SAMPAN_RANK"])
    MPI.COMM_WORLD.Barrier()
""")


class _Result:
    def __init__(self, rc, out, err):
        self.returncode, self.stdout, self.stderr = rc, out, err


def _launch(tmp_path, monkeypatch, source, *args, timeout=5):
    """`sampan launch -n 2 --timeout T script args` (the launcher in this process: the
    ranks are mpiexec's processes)."""
    from sampan.cli import main
    script = tmp_path / "script.py"
    script.write_text(source)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    for k in ("SAMPAN_LAUNCH_DIR", "SAMPAN_TIMEOUT", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(k, raising=False)
    out, err = io.StringIO(), io.StringIO()
    import sampan.distributed.cli as cli
    real = cli.launch
    monkeypatch.setattr(cli, "launch", lambda *a, **k: real(*a, stdout=out, stderr=err, **k))
    t0 = time.monotonic()
    rc = main(["launch", "-n", "2", "--timeout", str(timeout), str(script), *args])
    return _Result(rc, out.getvalue(), err.getvalue()), time.monotonic() - t0


def test_killed_rank_ends_the_job_with_its_rank_named(tmp_path, monkeypatch):
    p, wall = _launch(tmp_path, monkeypatch, STEP, "KILL", timeout=5)
    assert p.returncode != 0
    assert "rank 1 of 2 failed first" in p.stderr, p.stderr[-3000:]
    assert "killed by signal 9" in p.stderr
    assert "finished" not in p.stdout
    assert wall < 5 + 30          # the timeout plus two interpreter starts on a busy machine


def test_exception_prints_rank_and_traceback(tmp_path, monkeypatch):
    p, _ = _launch(tmp_path, monkeypatch, RAISE)
    assert p.returncode != 0
    assert "rank 1 of 2 failed first" in p.stderr, p.stderr[-3000:]
    tail = p.stderr[p.stderr.index("--- rank 1 ---"):]
    assert "Traceback" in tail and "ValueError: bad batch on rank 1" in tail
    assert "script.py" in tail and "runpy" not in tail


def test_launch_errors(tmp_path, capsys):
    from sampan.cli import main
    from sampan.distributed.cli import find_mpiexec
    assert os.access(find_mpiexec(), os.X_OK)
    assert main(["launch", "-n", "2", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_stopped_rank_is_named_by_the_heartbeat(tmp_path, monkeypatch):
    p, wall = _launch(tmp_path, monkeypatch, STEP, "STOP", timeout=3)
    assert p.returncode != 0
    assert "rank 1 (pid" in p.stderr and "no heartbeat" in p.stderr, p.stderr[-3000:]
    assert "timed out after 3 s" in p.stderr
    assert wall < 3 + 30


def test_hostfile_timeout_and_env_reach_mpiexec(tmp_path, monkeypatch):
    """The command line and environment `sampan launch` hands to mpiexec (a stand-in that
    records them): -n, -f HOSTFILE, the rank runner, SAMPAN_TIMEOUT/SAMPAN_LAUNCH_DIR."""
    from sampan.cli import main
    record = tmp_path / "argv.txt"
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" > {record}\n"
                    f"printf '%s\\n' \"$SAMPAN_TIMEOUT $SAMPAN_LAUNCH_DIR\" >> {record}\n")
    fake.chmod(0o755)
    hosts = tmp_path / "hosts"
    hosts.write_text("node1:2\nnode2:2\n")
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    monkeypatch.setenv("SAMPAN_MPIEXEC", str(fake))
    assert main(["launch", "-n", "4", "--hostfile", str(hosts), "--timeout", "7",
                 str(script), "--lr", "0.1"]) == 0
    argv, env = record.read_text().splitlines()
    assert argv.startswith(f"-n 4 -f {hosts} ")
    assert argv.endswith(f"sampan/distributed/run.py {script} --lr 0.1")
    assert env.startswith("7.0 ") and "sampan-launch-" in env
