"""`sampan launch -n N [--hostfile F] [--timeout S] script.py args…`: N ranks through the
MPI installation's `mpiexec` (the one installed next to this Python, e.g. by
``pip install mpich mpi4py``; never a system MPI by accident).

Every rank runs `python -m sampan.distributed.run script.py args…`, which exports
SAMPAN_RANK/SAMPAN_WORLD_SIZE and reports an uncaught exception (traceback to a file in the
launch directory, then MPI_Abort). The launcher watches the ranks (their pid files,
tracebacks and mpiexec's own report of a bad termination); when one fails it prints which
rank failed and its traceback and returns non-zero. Ranks themselves bound every collective
by the timeout (SAMPAN_TIMEOUT), so a dead or stuck rank never hangs the job; if mpiexec
is still running `timeout` + 5 seconds after a failure, the launcher kills it.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from .group import DistributedError


def find_mpiexec() -> str:
    """mpiexec of the MPI that mpi4py uses: $SAMPAN_MPIEXEC, next to the Python
    executable (a virtual environment's bin/), or listed in the mpich package's files."""
    env = os.environ.get("SAMPAN_MPIEXEC")
    if env:
        return env
    for d in {os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(
            sys.executable)), os.path.join(sys.prefix, "bin")}:
        p = os.path.join(d, "mpiexec")
        if os.access(p, os.X_OK):
            return p
    try:
        from importlib.metadata import files
        for f in files("mpich") or ():
            if f.name == "mpiexec":
                p = str(f.locate())
                if os.access(p, os.X_OK):
                    return os.path.realpath(p)
    except Exception:  # noqa: BLE001 - the package is not installed
        pass
    raise DistributedError("sampan launch: no mpiexec next to "
                           f"{sys.executable} nor in the mpich package; expected an MPI "
                           "installed into this environment: pip install mpich mpi4py")


_HYDRA_PID = re.compile(rb"PID (\d+) RUNNING AT")
_HYDRA_CODE = re.compile(rb"EXIT CODE: (\d+)")


class _Watch:
    """The launch directory and mpiexec's stderr: which ranks failed, first one first."""

    def __init__(self, directory, n):
        self.dir, self.n = directory, n
        self.failed = {}          # rank -> (time, text)
        self.hydra_bad = []       # (pid, exit code) that mpiexec reported
        self._pid = None

    def pids(self):
        out = {}
        for r in range(self.n):
            try:
                with open(os.path.join(self.dir, f"rank-{r}.pid")) as f:
                    out[r] = int(f.read())
            except (OSError, ValueError):
                pass
        return out

    def scan(self):
        now = time.time()
        for r, pid in self.pids().items():
            if r in self.failed:
                continue
            tb = os.path.join(self.dir, f"rank-{r}.traceback")
            if os.path.exists(tb):
                with open(tb) as f:
                    self.failed[r] = (os.path.getmtime(tb), f.read())
            elif not _alive(pid) and not os.path.exists(
                    os.path.join(self.dir, f"rank-{r}.done")):
                self.failed[r] = (now, f"died without a traceback (pid {pid}; killed by a "
                                       "signal or os._exit?)\n")

    def stderr_line(self, line):
        m = _HYDRA_PID.search(line)
        if m:
            self._pid = int(m.group(1))
        m = _HYDRA_CODE.search(line)
        if m and self._pid is not None:
            self.hydra_bad.append((self._pid, int(m.group(1))))
            self._pid = None

    def report(self):
        """[(rank, text)], the first failure first; ranks stopped by the abort that the
        first failure caused are said to be so."""
        pid_rank = {p: r for r, p in self.pids().items()}
        for pid, code in self.hydra_bad:       # mpiexec names the first bad termination
            r = pid_rank.get(pid)
            if r is not None:
                t, text = self.failed.get(r, (0.0, ""))
                how = (f"killed by signal {code - 128 if code > 128 else code}"
                       if code in (9, 15) or code > 128 else f"exit code {code}")
                keep = text if "without a traceback" not in text else ""
                self.failed[r] = (-1.0, f"{how} (reported by mpiexec, pid {pid})\n{keep}")
                break
        order = sorted(self.failed.items(), key=lambda kv: kv[1][0])
        out = []
        for i, (r, (_, text)) in enumerate(order):
            if i and "without a traceback" in text:
                text = (f"stopped when the job aborted after rank {order[0][0]} failed "
                        "(no traceback of its own)\n")
            out.append((r, text))
        return out


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                          # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def launch(nprocs, script, args=(), hostfile=None, timeout=60.0, python=None,
           stdout=None, stderr=None) -> int:
    """Run `script` on `nprocs` ranks; return the job's status (0: every rank succeeded).
    The ranks' output goes to `stdout`/`stderr` (default: this process's); on a failure,
    the launcher prints to `stderr` which rank failed first and each failed rank's
    traceback."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    out = stderr
    n = int(nprocs)
    if n < 1:
        raise DistributedError(f"sampan launch: got -n {nprocs}; expected at least 1")
    if not os.path.exists(script):
        raise DistributedError(f"sampan launch: script {script!r} does not exist")
    exe = find_mpiexec()
    d = tempfile.mkdtemp(prefix="sampan-launch-")
    env = dict(os.environ, SAMPAN_LAUNCH_DIR=d, SAMPAN_TIMEOUT=str(float(timeout)),
               SAMPAN_WORLD_SIZE=str(n))
    cmd = [exe, "-n", str(n)] + (["-f", hostfile] if hostfile else [])
    # the runner by path: it needs only the standard library, so a rank imports sampan
    # (seconds) only if the script does
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")
    cmd += [python or sys.executable, runner, script, *args]
    watch = _Watch(d, n)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)

    def pump(src, dst):      # mpiexec reports a bad termination on stdout
        for line in iter(src.readline, b""):
            watch.stderr_line(line)
            if hasattr(dst, "buffer"):
                dst.buffer.write(line)
            else:
                dst.write(line.decode(errors="replace"))
            dst.flush()
    readers = [threading.Thread(target=pump, args=(p.stdout, stdout), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, stderr), daemon=True)]
    for t in readers:
        t.start()
    failed_at = None
    try:
        while p.poll() is None:
            watch.scan()
            if watch.failed and failed_at is None:
                failed_at = time.monotonic()
            # a backstop: the ranks' own timeouts end the job first, with their reports
            if failed_at is not None and time.monotonic() - failed_at > timeout + 5:
                _kill(p)
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        _kill(p)
        raise
    finally:
        rc = p.wait()
        for t in readers:
            t.join(5)
        watch.scan()
        failures = watch.report()
        shutil.rmtree(d, ignore_errors=True)
    if not failures and rc == 0:
        return 0
    if failures:
        first = failures[0][0]
        print(f"sampan launch: rank {first} of {n} failed first ({script})", file=out)
        for r, text in failures:
            print(f"--- rank {r} ---\n{text.rstrip()}", file=out)
    else:
        print(f"sampan launch: mpiexec exited with status {rc}", file=out)
    return rc if rc else 1


def _kill(p):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(2)
            return
        except subprocess.TimeoutExpired:
            pass


def _launch_cmd(a) -> int:
    try:
        return launch(a.nprocs, a.script, a.args, hostfile=a.hostfile, timeout=a.timeout)
    except DistributedError as e:
        print(e, file=sys.stderr)
        return 2


def register(sub):
    """Add `sampan launch` to the sampan command line."""
    import argparse
    p = sub.add_parser("launch", help="run a script on N ranks through mpiexec (MPI)")
    p.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    p.add_argument("--hostfile", default=None, help="MPI host file (one host per line, "
                   "optionally host:slots) for a multi-host job")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a collective waits for a peer before failing (default 60)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_launch_cmd)
