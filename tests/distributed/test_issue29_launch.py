"""Issue 29, items 9 and 20: `sampan launch` stops its whole job on SIGTERM/SIGHUP (no
rank, child of a rank, proxy or mpiexec is left), and a job without a host file listens
on loopback only and runs in a network namespace that has nothing but loopback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.distributed.netcheck import alive, descendants, in_loopback_namespace, \
    is_loopback, listening

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = "import sys; from sampan.cli import main; sys.exit(main(sys.argv[1:]))"

# standard library only: each rank and a child it started leave their pids, then wait
SLEEPER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    d, r = sys.argv[1], os.environ["SAMPAN_RANK"]
    if sys.argv[2:] == ["stubborn"]:  # ignore SIGTERM: only the kill after the grace ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # (the child inherits it)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.path.join(d, "tmp-" + r), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(os.path.join(d, "tmp-" + r), os.path.join(d, "pids-" + r))
    time.sleep(120)
""")

ALL_REDUCE = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from mpi4py import MPI
    d, c = sys.argv[1], MPI.COMM_WORLD
    x = np.arange(4.0) * (c.rank + 1)
    y = np.empty_like(x)
    c.Allreduce(x, y)
    sys.stdout.write(f"sum {c.rank} {y.tolist()}\\n")   # one write: lines stay whole
    sys.stdout.flush()
    end = time.monotonic() + 60
    if d != "-":                      # "-": no one looks at the job while it runs
        with open(os.path.join(d, f"ready-{c.rank}"), "w") as f:
            f.write(str(os.getpid()))
    while d != "-" and not os.path.exists(os.path.join(d, "go")) and time.monotonic() < end:
        time.sleep(0.05)
    c.Barrier()
""")


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    for k in ("SAMPAN_LAUNCH_DIR", "SAMPAN_TIMEOUT", "PMI_RANK", "PMI_SIZE",
              "UCX_NET_DEVICES", "FI_TCP_IFACE", "FI_SOCKETS_IFACE"):
        env.pop(k, None)
    return env


def _start(tmp_path, source, *extra, args=()):
    script = tmp_path / "job.py"
    script.write_text(source)
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, "launch", "-n", "2", *extra,
                             str(script), str(tmp_path), *args], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(paths, proc, seconds=60):
    end = time.monotonic() + seconds
    while not all(os.path.exists(p) for p in paths):
        if proc.poll() is not None or time.monotonic() > end:
            out, err = proc.communicate(timeout=10) if proc.poll() is not None else ("", "")
            pytest.fail(f"the job did not start: {out[-2000:]} {err[-3000:]}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signalled_launcher_leaves_no_process_of_its_job(tmp_path, sig):
    _signal_and_check(tmp_path, sig, _start(tmp_path, SLEEPER))


def test_ranks_that_ignore_the_signal_are_killed_after_the_grace(tmp_path):
    t0 = time.monotonic()
    _signal_and_check(tmp_path, signal.SIGTERM,
                      _start(tmp_path, SLEEPER, "--grace", "1", args=["stubborn"]))
    assert time.monotonic() - t0 < 30


def _signal_and_check(tmp_path, sig, launcher):
    job = set()
    try:
        _wait_for([tmp_path / f"pids-{r}" for r in (0, 1)], launcher)
        for r in (0, 1):
            job |= {int(p) for p in (tmp_path / f"pids-{r}").read_text().split()}
        job |= descendants(launcher.pid)              # mpiexec, its proxy, the ranks
        assert len(job) >= 6, job                     # 2 ranks, 2 children, hydra
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=30)
        end = time.monotonic() + 15     # generous on a loaded machine; ends when all are gone
        while any(alive(p) for p in job) and time.monotonic() < end:
            time.sleep(0.05)
        left = sorted(p for p in job if alive(p))
        assert not left, f"left running after {signal.Signals(sig).name}: {left}"
        assert launcher.returncode == -sig, err[-3000:]   # ended as the signal ends it
        assert f"{signal.Signals(sig).name}: stopped the job" in err
    finally:
        for p in [launcher.pid, *job]:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        launcher.wait(10)


def test_a_job_on_one_machine_listens_on_loopback_only(tmp_path):
    launcher = _start(tmp_path, ALL_REDUCE)
    try:
        _wait_for([tmp_path / f"ready-{r}" for r in (0, 1)], launcher)
        ranks = {int((tmp_path / f"ready-{r}").read_text()) for r in (0, 1)}
        hydra = descendants(launcher.pid) - ranks
        # Hydra binds its own control port to every interface whatever it is told (the
        # ranks inherit that socket): not sampan's to choose, so left out here
        theirs = {(a, port) for a, port, _ in listening(hydra)}
        socks = [s for s in listening(ranks) if (s[0], s[1]) not in theirs]
        outside = [s for s in socks if not is_loopback(s[0])]
        assert not outside, f"ranks listen beyond loopback: {outside}"
        (tmp_path / "go").write_text("")
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err[-3000:]
        assert "sum 0 [0.0, 3.0, 6.0, 9.0]" in out and "sum 1 [0.0, 3.0, 6.0, 9.0]" in out
    finally:
        if launcher.poll() is None:
            (tmp_path / "go").write_text("")
            try:
                launcher.wait(30)
            except subprocess.TimeoutExpired:
                launcher.kill()


def test_a_two_rank_all_reduce_runs_in_a_loopback_only_namespace(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(ALL_REDUCE)
    p = in_loopback_namespace(
        f"exec {sys.executable} -c '{LAUNCHER}' launch -n 2 --timeout 20 {script} -",
        env=_env(), timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "sum 0 [0.0, 3.0, 6.0, 9.0]" in p.stdout and "sum 1 [0.0, 3.0, 6.0, 9.0]" in p.stdout
