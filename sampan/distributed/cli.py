"""`sampan launch -n N [--hostfile F] [--timeout S] script.py args…`: N ranks through the
MPI installation's `mpiexec` (the one installed next to this Python, e.g. by
``pip install mpich mpi4py``; never a system MPI by accident).

Every rank runs `python -m sampan.distributed.run script.py args…`, which exports
SAMPAN_RANK/SAMPAN_WORLD_SIZE and reports an uncaught exception (traceback to a file in the
launch directory, then MPI_Abort). The launcher watches the ranks (their pid files,
tracebacks and mpiexec's own report of a bad termination); when one fails it prints which
rank failed and its traceback and returns non-zero. Ranks themselves bound every collective
by the timeout (SAMPAN_TIMEOUT), so a dead or stuck rank never hangs the job; if mpiexec
is still running `timeout` + 5 seconds after a failure, the launcher kills the job.

Signals. SIGINT, SIGTERM and SIGHUP sent to the launcher are passed on to every rank
(and the processes they started); the job gets `--grace` seconds (default 10) to end,
then whatever is left of it (ranks, Hydra's proxies, mpiexec) is killed, and the
launcher ends as that signal would have ended it. A second signal kills at once. Hydra
puts mpiexec, each proxy and each rank in a session of its own, so the job is found by
walking /proc from mpiexec: its descendants, members of their sessions, and the ranks'
own pid files (a rank whose proxy died is no child of anyone's).

Network. A job without a host file runs on this machine and listens on loopback only:
Hydra's proxies and the ranks' PMI connect over 127.0.0.1 (`-hosts`/`-localhost`), and
the ranks' transport (UCX, or libfabric's tcp/sockets) uses the loopback interface
(UCX_NET_DEVICES, FI_TCP_IFACE, FI_SOCKETS_IFACE, unless set already). `--host ADDR`
and `--iface NAME` choose another address or interface (Hydra's `-localhost` and
`-iface`); a host file leaves the addresses to MPI. One thing stays beyond reach:
Hydra binds its own control port (mpiexec <-> proxies) to the wildcard address
whatever it is told (MPICH 5.0: HYDU_sock_listen asks MPL for no loopback bind).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
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


LOOPBACK = "127.0.0.1"
GRACE_S = 10.0     # seconds a signalled job gets to end before it is killed
_FORWARD = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                 if hasattr(signal, n))


def _loopback_iface() -> str:
    try:
        names = [n for _, n in socket.if_nameindex()]
    except (AttributeError, OSError):   # pragma: no cover - no interface list here
        names = []
    return next((n for n in names if n in ("lo", "lo0")), "lo")


def _network(hostfile, host, iface):
    """mpiexec's flags and the ranks' environment for where the job listens."""
    args = []
    if host:
        args += ["-localhost", host] + ([] if hostfile else ["-hosts", host])
    if iface:
        args += ["-iface", iface]
    if hostfile or host not in (None, LOOPBACK) or iface not in (None, _loopback_iface()):
        return args, {}
    if not host:
        args += ["-hosts", LOOPBACK, "-localhost", LOOPBACK]
    lo = _loopback_iface()
    env = {k: lo for k in ("UCX_NET_DEVICES", "FI_TCP_IFACE", "FI_SOCKETS_IFACE")
           if k not in os.environ}
    return args, env


def launch(nprocs, script, args=(), hostfile=None, timeout=60.0, python=None,
           stdout=None, stderr=None, host=None, iface=None, grace=GRACE_S) -> int:
    """Run `script` on `nprocs` ranks; return the job's status (0: every rank succeeded).
    The ranks' output goes to `stdout`/`stderr` (default: this process's); on a failure,
    the launcher prints to `stderr` which rank failed first and each failed rank's
    traceback. Without `hostfile` the job listens on loopback only (`host`/`iface`
    choose otherwise); SIGINT/SIGTERM/SIGHUP stop the whole job (`grace` seconds, then
    killed), see the module docstring."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    out = stderr
    n = int(nprocs)
    if n < 1:
        raise DistributedError(f"sampan launch: got -n {nprocs}; expected at least 1")
    if not os.path.exists(script):
        raise DistributedError(f"sampan launch: script {script!r} does not exist")
    exe = find_mpiexec()
    net, net_env = _network(hostfile, host, iface)
    d = tempfile.mkdtemp(prefix="sampan-launch-")
    env = dict(os.environ, SAMPAN_LAUNCH_DIR=d, SAMPAN_TIMEOUT=str(float(timeout)),
               SAMPAN_WORLD_SIZE=str(n), **net_env)
    cmd = [exe, "-n", str(n)] + (["-f", hostfile] if hostfile else []) + net
    # the runner by path: it needs only the standard library, so a rank imports sampan
    # (seconds) only if the script does
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")
    cmd += [python or sys.executable, runner, script, *args]
    watch = _Watch(d, n)
    signals = _Signals()
    with signals:
        if signals.got:   # before anything started: nothing to stop
            shutil.rmtree(d, ignore_errors=True)
            return signals.deliver(out, None)
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        job = _Job(p, watch)
        rc, failures = _run(p, job, watch, signals, timeout, grace, stdout, stderr)
        shutil.rmtree(d, ignore_errors=True)
        if signals.got:
            return signals.deliver(out, job)
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


def _run(p, job, watch, signals, timeout, grace, stdout, stderr):
    """Wait for the job, watching its ranks; returns (mpiexec's status, failures)."""
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
            if signals.got:
                name = signal.Signals(signals.got[0]).name
                print(f"sampan launch: {name}: passing it to the job; what is left of it in "
                      f"{grace:g} s is killed", file=stderr)
                stderr.flush()
                job.stop(signals.got[0], grace, signals)
                break
            watch.scan()
            if watch.failed and failed_at is None:
                failed_at = time.monotonic()
            # a backstop: the ranks' own timeouts end the job first, with their reports
            if failed_at is not None and time.monotonic() - failed_at > timeout + 5:
                job.kill()
                break
            time.sleep(0.1)
    except BaseException:   # KeyboardInterrupt where no handler could be installed
        job.kill()
        raise
    finally:
        rc = p.wait()
        job.kill()            # anything of the job that outlived mpiexec
        for t in readers:
            t.join(5)
        watch.scan()
        failures = watch.report()
    return rc, failures


class _Signals:
    """SIGINT/SIGTERM/SIGHUP while a job runs: recorded here (the launcher's main loop
    passes them on) instead of ending the launcher and orphaning the job. A signal this
    process ignores (nohup's SIGHUP) stays ignored, by the job too. Only the main thread
    can set handlers; elsewhere the caller's own handling stands."""

    def __init__(self):
        self.got: list[int] = []
        self.old: dict = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in _FORWARD:
            try:
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue
                self.old[sig] = signal.signal(sig, self._on)
            except (ValueError, OSError):   # pragma: no cover
                pass
        return self

    def _on(self, signum, frame):
        self.got.append(signum)

    def __exit__(self, *exc):
        self.restore()

    def restore(self):
        for sig, old in self.old.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self.old = {}

    def deliver(self, out, job) -> int:
        """Say what was stopped, then end as the first signal would have ended this
        process (its previous handler runs: SIGINT raises KeyboardInterrupt); 128 +
        the signal's number where that handler returns."""
        sig = self.got[0]
        name = signal.Signals(sig).name
        what = "before the job started" if job is None else \
            f"stopped the job ({len(job.seen)} processes)"
        print(f"sampan launch: {name}: {what}", file=out)
        out.flush()
        self.restore()
        signal.raise_signal(sig)
        return 128 + sig


class _Job:
    """Every process of one mpiexec job, found through /proc (Linux): mpiexec's
    descendants, the members of a session or process group that one of them leads, and
    the ranks named by their pid files. Each is remembered with its start time, so a pid
    reused by another process after the job's one ended is never signalled."""

    def __init__(self, p, watch):
        self.p, self.watch = p, watch
        self.seen: dict[int, int] = {}   # pid -> start time (clock ticks after boot)
        self.proc = os.path.isdir("/proc/self")
        self._add(p.pid)

    @staticmethod
    def _stat(pid):
        """(ppid, pgid, sid, state, start time) of `pid`, or None."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[1]), int(fields[2]), int(fields[3]), fields[0],
                    int(fields[19]))
        except (OSError, IndexError, ValueError):
            return None

    def _add(self, pid):
        st = self._stat(pid) if self.proc else None
        if st is not None and pid not in self.seen:
            self.seen[pid] = st[4]

    def scan(self):
        """Add the job's processes now running; returns {pid: (ppid, pgid, sid, state)}
        of the job's live processes."""
        if not self.proc:
            return {}
        for pid in self.watch.pids().values():
            self._add(pid)
        table = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = self._stat(int(name))
                if st is not None:
                    table[int(name)] = st
        grew = True
        while grew:
            grew = False
            for pid, (ppid, pgid, sid, _, start) in table.items():
                if pid in self.seen:
                    continue
                if ppid in self.seen or pgid in self.seen or sid in self.seen:
                    self.seen[pid] = start
                    grew = True
        return {pid: st[:4] for pid, st in table.items()
                if self.seen.get(pid) == st[4] and st[3] not in "ZX"}

    def _send(self, pids, sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _hydra(self):
        """mpiexec and its proxies (their children that are not ranks)."""
        ranks = set(self.watch.pids().values())
        return {self.p.pid} | {pid for pid, st in self.scan().items()
                               if st[0] == self.p.pid and pid not in ranks}

    def _wait(self, pids_of, seconds, signals=None, n_signals=1) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not pids_of():
                return True
            if signals is not None and len(signals.got) > n_signals:
                return False   # asked again: no more grace
            self.p.poll()      # reap mpiexec once it ends (it is our child)
            time.sleep(0.05)
        return not pids_of()

    def stop(self, sig, grace, signals=None):
        """Pass `sig` to the ranks and what they started; after `grace` seconds (or a
        second signal), end what is left of the job."""
        if not self.proc:   # pragma: no cover - no /proc: mpiexec's group and the ranks
            self._send(self.watch.pids().values(), sig)
            try:
                os.killpg(self.p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            self._wait(lambda: self.p.poll() is None, grace, signals)
            self.kill()
            return
        workers = lambda: set(self.scan()) - self._hydra()   # noqa: E731
        self._send(workers(), sig)
        if self._wait(workers, grace, signals, 1):
            self._send(self._hydra(), signal.SIGTERM)   # mpiexec cleans up after itself
            self._wait(lambda: set(self.scan()), 2.0, signals, 1)
        self.kill()

    def kill(self):
        """SIGKILL every process of the job still running, and reap mpiexec."""
        if not self.proc:   # pragma: no cover
            _kill(self.p)
            return
        for _ in range(3):   # a process forked while we kill is caught the next round
            left = self.scan()
            if not left:
                break
            self._send(left, signal.SIGKILL)
            self._wait(lambda: set(self.scan()), 2.0)
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:   # pragma: no cover
            pass


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
        return launch(a.nprocs, a.script, a.args, hostfile=a.hostfile, timeout=a.timeout,
                      host=a.host, iface=a.iface, grace=a.grace)
    except DistributedError as e:
        print(e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # SIGINT, passed on to the job, which has ended
        return 128 + signal.SIGINT


def register(sub):
    """Add `sampan launch` to the sampan command line."""
    import argparse
    p = sub.add_parser("launch", help="run a script on N ranks through mpiexec (MPI)")
    p.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    p.add_argument("--hostfile", default=None, help="MPI host file (one host per line, "
                   "optionally host:slots) for a multi-host job")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a collective waits for a peer before failing (default 60)")
    p.add_argument("--host", default=None, help="address the job's processes use to reach "
                   "this machine (Hydra's -localhost; without a host file, also the one host "
                   "the ranks run on). Default without a host file: 127.0.0.1, loopback only")
    p.add_argument("--iface", default=None, help="network interface Hydra connects over "
                   "(its -iface); default without a host file: loopback")
    p.add_argument("--grace", type=float, default=GRACE_S,
                   help="seconds the job gets to end after SIGINT/SIGTERM/SIGHUP before it "
                   f"is killed (default {GRACE_S:g})")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_launch_cmd)
