"""The `mpi` backend: collectives through mpi4py on the MPI that `mpiexec` started.

Hot path: buffer-based nonblocking calls (`Iallreduce` with `MPI_IN_PLACE`, `Ibcast`,
`Iallgatherv`, `Ireduce_scatter_block`, `Isend`/`Irecv`) on the numpy arrays themselves, no
pickling. A blocking call is the nonblocking one followed by a Test loop bounded by the
group's timeout, so a peer that died or hangs makes the collective fail with an error
naming it instead of hanging.

bfloat16 and float16 all-reduces (sum, max, min) travel as 2-byte elements: a user
MPI op over UINT16_T (`_low_op`) converts the two partial buffers of each reduction step
to float32, combines them and rounds back once, as gloo's and NCCL's half-precision
reductions do, so the fp16/bf16 compression comm hooks halve the traffic as in PyTorch.
The op is commutative, so MPICH combines the same two partials on every rank at each
step and all ranks get identical bits; with more than two ranks a sum is rounded at each
step (not once). Means (whose sum may overflow the 2-byte range before the division:
the compression hooks divide first and sum), products and reduce_scatter keep a float32
round trip (convert, reduce in float32, round once). Broadcasts and gathers move the
2-byte buffers as they are (a uint16 view).

With each collective the ranks exchange a small signature (collective, op/root, dtype,
shape) with an `Iallgather` started just before it (the two progress together, so the
check costs no extra round trip): a dtype or shape that differs between ranks is an error
naming both ranks instead of a silent garbage reduction; all_gather waits for it to learn
the uneven first-dim sizes. all_reduce, the hot path, checks its first 16 calls and every
16th after (SAMPAN_DIST_CHECK=1: every call, 0: none, N: every N-th): a mismatch that
persists (ranks with different models) is named within 16 calls, while one unchecked
call with a mismatch goes unnoticed (MPICH then reduces the common prefix).

Which rank died: every rank runs a heartbeat thread that rewrites
`<dir>/rank-<r>.hb` ("pid collective-number name") every 0.5 s; `<dir>` is the launcher's
SAMPAN_LAUNCH_DIR or a temporary directory rank 0 makes and broadcasts at init. A timed-out
collective reads the others' heartbeats and names the ranks that stopped beating or never
reached it. An uncaught exception on a rank prints its traceback and aborts the whole job
(`MPI_Abort`), so its peers do not wait out their timeout.

Kernel table: `KERNELS`, one function per collective, `kernel(group, array, **attrs)`.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections import deque

import numpy as np

from ..dtypes import bfloat16
from .collectives import TABLE
from .group import DistributedError, ProcessGroup, Work

from mpi4py import MPI  # noqa: E402  (this module is imported by init("mpi") only)

_HB_INTERVAL = 0.5
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_NAMES = tuple(TABLE)       # a collective's number in the signature exchange
_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}
_OPCODE = {"sum": 1, "mean": 2, "max": 3, "min": 4, "prod": 5}
_LOW = (bfloat16, np.dtype(np.float16))
_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
          np.dtype(np.int64): MPI.INT64_T, np.dtype(np.int32): MPI.INT32_T,
          np.dtype(np.int16): MPI.INT16_T, np.dtype(np.int8): MPI.INT8_T,
          np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.uint16): MPI.UINT16_T}
_DTCODE = {d: i for i, d in enumerate([np.dtype(np.float32), np.dtype(np.float64), bfloat16,
                                       np.dtype(np.int64), np.dtype(np.int32),
                                       np.dtype(np.float16), np.dtype(np.int8),
                                       np.dtype(np.uint8), np.dtype(np.int16)])}
_DTNAME = {i: d for d, i in _DTCODE.items()}


class MPIGroup(ProcessGroup):
    backend = "mpi"

    def __init__(self, comm, timeout, hb_dir, own_dir):
        super().__init__(comm.Get_rank(), comm.Get_size(), timeout)
        self.comm = comm
        self.kernels = KERNELS
        self.seq = 0
        self.current = "init"
        # all_reduce's signature check: every call (1), never (0), or the first 16 calls
        # and then every 16th (the default: the check's own small collective costs ~30 us,
        # 5% of a 4 MB reduction; which calls are checked depends only on the count of
        # calls, the same on every rank)
        raw = os.environ.get("SAMPAN_DIST_CHECK", "16")
        try:
            self.check_every = max(0, int(raw))
        except ValueError:
            raise DistributedError(f"SAMPAN_DIST_CHECK={raw!r}; expected 1 (check every "
                                   "all_reduce), 0 (none) or N (every N-th)") from None
        self.n_all_reduce = 0
        self.hb_dir, self.own_dir = hb_dir, own_dir
        self._lock = threading.RLock()
        self._queue = deque()
        self._stop = threading.Event()
        self._write_beat()      # the first one before init returns: a rank may die at once
        self._hb = threading.Thread(target=self._beat, name="sampan-mpi-heartbeat",
                                    daemon=True)
        self._hb.start()

    @classmethod
    def create(cls, timeout):
        comm = MPI.COMM_WORLD.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        hb_dir = os.environ.get("SAMPAN_LAUNCH_DIR")
        own = False
        if hb_dir is None:
            own = comm.Get_rank() == 0
            hb_dir = comm.bcast(tempfile.mkdtemp(prefix="sampan-mpi-") if own else None, 0)
        os.makedirs(hb_dir, exist_ok=True)
        g = cls(comm, timeout, hb_dir, own)
        os.environ["SAMPAN_RANK"], os.environ["SAMPAN_WORLD_SIZE"] = str(g.rank), str(g.size)
        _install_excepthook(g)
        return g

    def new_group(self, ranks, timeout=None):
        """A communicator of `ranks` split from this one (every rank calls it); its
        heartbeats go to a folder of their own inside this group's."""
        self.n_groups = getattr(self, "n_groups", 0) + 1
        member = self.rank in ranks
        try:
            comm = self.comm.Split(0 if member else MPI.UNDEFINED, self.rank)
        except MPI.Exception as e:
            raise DistributedError(f"new_group on rank {self.rank} failed: "
                                   f"{e.Get_error_string()}") from None
        if not member:
            return None
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        hb_dir = os.path.join(self.hb_dir, f"group-{self.n_groups}")
        os.makedirs(hb_dir, exist_ok=True)
        return MPIGroup(comm, self.timeout if timeout is None else float(timeout), hb_dir,
                        False)

    # ----------------------------------------------------------------- heartbeats
    def _hb_path(self, r):
        return os.path.join(self.hb_dir, f"rank-{r}.hb")

    def _write_beat(self):
        path = self._hb_path(self.rank)
        try:
            with open(path + ".tmp", "w") as f:
                f.write(f"{os.getpid()} {self.seq} {self.current}\n")
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def _beat(self):
        while not self._stop.wait(_HB_INTERVAL):
            self._write_beat()

    def peers(self):
        """{rank: (seconds since its last heartbeat, its collective number, its pid)}."""
        out = {}
        now = time.time()
        for r in range(self.size):
            try:
                p = self._hb_path(r)
                age = now - os.path.getmtime(p)
                with open(p) as f:
                    pid, seq, _ = f.read().split(" ", 2)
                out[r] = (age, int(seq), int(pid))
            except (OSError, ValueError):
                out[r] = None
        return out

    def stalled(self, name, seq, seconds):
        notes = []
        for r, info in self.peers().items():
            if r == self.rank:
                continue
            if info is None:
                notes.append(f"rank {r}: no heartbeat (dead, or on a host that does not "
                             f"share {self.hb_dir})")
            elif info[0] > 4 * _HB_INTERVAL:
                notes.append(f"rank {r} (pid {info[2]}) is dead: no heartbeat for "
                             f"{info[0]:.1f} s")
            elif info[1] <= seq:
                notes.append(f"rank {r} is alive but has not reached collective #{seq}")
        why = "; ".join(notes) or "every peer is alive and past it (a deadlock?)"
        return DistributedError(f"{name} #{seq} on rank {self.rank} timed out after "
                                f"{seconds:g} s: {why}")

    # ------------------------------------------------------------------ plumbing
    def start(self, name):
        seq = self.seq
        self.seq += 1
        self.current = name
        return seq

    def destroy(self):
        """Stop the heartbeat and leave the group; rank 0 removes the heartbeat directory
        it made once every rank has stopped writing there (a bounded barrier)."""
        self._stop.set()
        self._hb.join(2.0)
        try:
            os.remove(self._hb_path(self.rank))
        except OSError:
            pass
        try:
            done = _spin_request(self.comm.Ibarrier(), min(self.timeout, 5.0))
        except MPI.Exception:
            done = False
        if self.own_dir:
            shutil.rmtree(self.hb_dir, ignore_errors=True)
        if done:
            self.comm.Free()

    def _test(self, name, seq, req, status=None):
        try:
            return req.Test() if status is None else req.Test(status)
        except MPI.Exception as e:
            raise DistributedError(f"{name} #{seq} on rank {self.rank} failed: "
                                   f"{e.Get_error_string()}") from None

    def request_work(self, name, seq, req, finish):
        return Work(self, name, seq, lambda: self._test(name, seq, req), finish)

    def submit(self, name, arr, post, attr=0, check=True, needs_table=False) -> Work:
        """Start collective `name` on `arr`: the signature exchange (an Iallgather of
        (collective, attr, dtype, shape), when `check`) and `post(table) -> (request,
        finish)`, the collective itself. The collective starts right behind its signature
        (they progress together: the check costs no round trip) unless `needs_table`
        (all_gather learns the uneven sizes from it); it is verified when the handle is
        tested. Collectives must start in the same order on every rank, so collectives
        start in submission order (`_advance`), whichever handle is tested."""
        seq = self.start(name)
        p = _Pending(name, seq, post, needs_table)
        if check:
            shape = arr.shape
            rest = shape[1:] if shape else ()
            p.sig = np.array([_NAMES.index(name), attr, _DTCODE[arr.dtype], arr.ndim,
                              shape[0] if shape else 1,
                              zlib.crc32(repr(tuple(rest)).encode())], np.int64)
            p.table = np.empty((self.size, p.sig.size), np.int64)
            p.cols = [0, 1, 2, 3, 5] if needs_table else slice(None)
            p.what = arr                 # described only on a mismatch
        with self._lock:
            if check:
                p.sig_req = self.comm.Iallgather([p.sig, MPI.INT64_T],
                                                 [p.table, MPI.INT64_T])
            self._queue.append(p)
            self._advance()

        def test():
            self._advance()
            if p.error is None and p.sig_req is not None and not p.verified:
                try:
                    if not self._test(name, seq, p.sig_req):
                        return False
                    self._verify(p)
                except DistributedError as e:
                    p.error = e
                    self._drain(p)
            if p.error is not None:
                return True
            if p.req is None:
                return False
            try:
                return self._test(name, seq, p.req)
            except DistributedError as e:
                p.error = e
                return True

        def finish():
            if p.error is not None:
                raise p.error
            return p.finish()
        return Work(self, name, seq, test, finish, lambda limit: self._block(p, test, limit))

    def _block(self, p, test, limit):
        """Wait for `p` (True: done or failed; False: `limit` seconds passed). Once the
        collective itself is running, a tight loop on its request alone: MPI moves a large
        message's bytes only inside Test calls, and a Python round between two of them
        slowed a 4 MB reduction by ~10%. Every 128 polls it yields the core (sched_yield,
        as MPICH's blocking waits do): on an oversubscribed host the peer rank may be
        waiting for this very core."""
        t0 = time.perf_counter()
        deadline = t0 + limit
        while p.req is None or (p.sig_req is not None and not p.verified):
            if test():
                return True
            now = time.perf_counter()
            if now > deadline:
                return False
            if now - t0 > 1.0:
                time.sleep(1e-4)
        if p.error is not None:
            return True
        req, n, slow = p.req, 0, 0
        try:
            while not req.Test():
                n += 1
                if n & 127:
                    continue
                _yield()        # as MPICH's own wait loop: the peer may need this core
                now = time.perf_counter()
                if now > deadline:
                    return False
                if now - t0 > 1.0:      # a late peer rather than a long transfer
                    slow = min(slow + 1, 1000)
                    time.sleep(1e-6 * slow)
        except MPI.Exception as e:
            p.error = DistributedError(f"{p.name} #{p.seq} on rank {self.rank} failed: "
                                       f"{e.Get_error_string()}")
        return True

    def _advance(self):
        with self._lock:
            q = self._queue
            while q:
                p = q[0]
                if p.needs_table:
                    if p.sig_req is not None and not self._test(p.name, p.seq, p.sig_req):
                        return
                    try:
                        self._verify(p)
                    except DistributedError as e:
                        p.error = e
                q.popleft()
                if p.error is None:
                    p.req, p.finish = p.post(p.table)

    def _drain(self, p):
        """After a mismatch: let the collective that already started end (with an error,
        or garbage the caller will not see), briefly, so the group stays usable."""
        if p.req is None:
            return
        t = time.monotonic() + min(self.timeout, 2.0)
        while time.monotonic() < t:
            try:
                if p.req.Test():
                    return
            except MPI.Exception:
                return
            time.sleep(1e-4)

    def _verify(self, p):
        if p.verified or p.sig_req is None:
            return
        p.verified = True
        t = p.table
        bad = [r for r in range(self.size) if not np.array_equal(t[r, p.cols], p.sig[p.cols])]
        if bad:
            raise DistributedError(
                f"{p.name} #{p.seq}: rank {self.rank} passed {p.name} of {p.what.dtype}"
                f"{list(p.what.shape)} but rank {bad[0]} "
                f"passed {_describe(t[bad[0]])}; expected the same collective, dtype and "
                "shape on every rank")


class _Pending:
    __slots__ = ("name", "seq", "post", "needs_table", "sig", "table", "cols", "what",
                 "sig_req", "req", "finish", "error", "verified")

    def __init__(self, name, seq, post, needs_table):
        self.name, self.seq, self.post, self.needs_table = name, seq, post, needs_table
        self.sig = self.table = self.cols = self.what = self.sig_req = None
        self.req = self.finish = self.error = None
        self.verified = False


def _spin_request(req, limit):
    deadline = time.perf_counter() + limit
    while not req.Test():
        if time.perf_counter() > deadline:
            return False
        time.sleep(1e-4)
    return True


def _describe(row):
    # a peer that started another kind of collective (a barrier, which sends no
    # signature) leaves garbage in its row: describe that, not an IndexError
    k = int(row[0])
    if not 0 <= k < len(_NAMES):
        return "another collective (no matching signature)"
    dt = _DTNAME.get(int(row[2]), "?")
    return f"{_NAMES[k]} of {dt}[ndim {row[3]}, dim0 {row[4]}]"


def _buffer(arr):
    """(buffer, MPI type) for moving `arr`'s bytes as they are."""
    if arr.dtype in _LOW:
        return arr.view(np.uint16), MPI.UINT16_T
    return arr, _TYPES[arr.dtype]


# the 2-byte reductions (see the module doc): op name -> the numpy combination
_LOW_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_LOW_OPS: dict = {}           # (dtype, op) -> MPI.Op
STATS = {"low_precision_steps": 0}   # reduction steps the 2-byte ops ran (this process)


def _low_op(dtype, op):
    """The user MPI op reducing `dtype` (float16/bfloat16) elements sent as UINT16_T: each
    step converts both partials to float32, combines them and rounds the result back."""
    key = (dtype, op)
    if key not in _LOW_OPS:
        combine = _LOW_COMBINE[op]

        def reduce(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, np.uint16).view(dtype)
            b = np.frombuffer(inoutbuf, np.uint16).view(dtype)
            b[...] = combine(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
            STATS["low_precision_steps"] += 1
        _LOW_OPS[key] = MPI.Op.Create(reduce, commute=True)
    return _LOW_OPS[key]


def _all_reduce_low(g, arr, op):
    """all_reduce of a float16/bfloat16 array on the wire in its own 2 bytes."""
    def post(table):
        buf = np.array(arr, copy=True, order="C")
        req = g.comm.Iallreduce(MPI.IN_PLACE, [buf.view(np.uint16), MPI.UINT16_T],
                                _low_op(arr.dtype, op))

        def finish():
            np.copyto(arr, buf)
            return arr
        return req, finish
    return post


# ------------------------------------------------------------------------- kernels
def all_reduce(g, arr, op="sum"):
    def post(table):
        low = arr.dtype in _LOW
        buf = arr.astype(np.float32) if low else arr
        req = g.comm.Iallreduce(MPI.IN_PLACE, [buf, _TYPES[buf.dtype]], _OPS[op])

        def finish():
            if op == "mean":
                np.divide(buf, g.size, out=buf)
            if low:
                np.copyto(arr, buf, casting="unsafe")
            return arr
        return req, finish
    if arr.dtype in _LOW and op in _LOW_COMBINE:
        post = _all_reduce_low(g, arr, op)
    k, every = g.n_all_reduce, g.check_every
    g.n_all_reduce += 1
    check = every == 1 or (every > 0 and (k < 16 or k % every == 0))
    return g.submit("all_reduce", arr, post, _OPCODE[op], check=check)


def broadcast(g, arr, src=0):
    def post(table):
        return g.comm.Ibcast(list(_buffer(arr)), root=src), lambda: arr
    return g.submit("broadcast", arr, post, src)


def all_gather(g, arr):
    scalar = arr.ndim == 0
    a = arr.reshape(1) if scalar else arr

    def post(table):
        rest = a.shape[1:]
        per = int(np.prod(rest, dtype=np.int64))
        dims = [int(d) for d in table[:, 4]]
        out = np.empty((sum(dims),) + rest, a.dtype)
        buf, t = _buffer(a)
        counts = [d * per for d in dims]
        displs = [sum(counts[:i]) for i in range(len(counts))]
        req = g.comm.Iallgatherv([buf, t], [_buffer(out)[0], counts, displs, t])

        def finish():
            at = np.cumsum([0] + dims)
            parts = [out[at[i]:at[i + 1]] for i in range(len(dims))]
            return [q.reshape(()) for q in parts] if scalar else parts
        return req, finish
    return g.submit("all_gather", arr, post, needs_table=True)


def reduce_scatter(g, arr, op="sum"):
    n = g.size
    if arr.ndim == 0 or arr.shape[0] % n:
        raise DistributedError(f"reduce_scatter: got shape {list(arr.shape)}; expected a "
                               f"first dim divisible by the world size {n}")

    def post(table):
        low = arr.dtype in _LOW
        buf = arr.astype(np.float32) if low else arr
        out = np.empty((arr.shape[0] // n,) + arr.shape[1:], buf.dtype)
        t = _TYPES[buf.dtype]
        req = g.comm.Ireduce_scatter_block([buf, t], [out, t], _OPS[op])

        def finish():
            if op == "mean":
                np.divide(out, n, out=out)
            return out.astype(arr.dtype) if low else out
        return req, finish
    return g.submit("reduce_scatter", arr, post, _OPCODE[op])


def barrier(g, arr=None):
    return g.submit("barrier", None, lambda table: (g.comm.Ibarrier(), lambda: None),
                    check=False)


_TAG = 23


def send(g, arr, dst):
    seq = g.start("send")
    buf, t = _buffer(arr)
    req = g.comm.Isend([buf, t], dest=dst, tag=_TAG)
    return g.request_work("send", seq, req, lambda buf=buf: None)   # buf lives until done


def recv(g, out, src):
    seq = g.start("recv")
    buf, t = _buffer(out)
    status = MPI.Status()
    req = g.comm.Irecv([buf, t], source=src, tag=_TAG)

    def test():
        try:
            return req.Test(status)
        except MPI.Exception as e:
            raise DistributedError(f"recv from rank {src} into {out.dtype}"
                                   f"{list(out.shape)} failed: {e.Get_error_string()} "
                                   "(did it send another shape or dtype?)") from None

    def finish():
        got = status.Get_count(t)
        if got != buf.size:
            raise DistributedError(f"recv: rank {src} sent {got} elements but rank "
                                   f"{g.rank} expects {out.dtype}{list(out.shape)}")
        return out
    return Work(g, "recv", seq, test, finish)


KERNELS = {"all_reduce": all_reduce, "broadcast": broadcast, "all_gather": all_gather,
           "reduce_scatter": reduce_scatter, "barrier": barrier, "send": send, "recv": recv}


# ------------------------------------------------------------------ failing loudly
_HOOKED = [False]
_LATEST = [None]


def _install_excepthook(g):
    """An uncaught exception on one rank: print its traceback (and leave it for `sampan
    launch`), then abort the job so that its peers stop at once."""
    _LATEST[0] = g
    if _HOOKED[0]:
        return
    _HOOKED[0] = True
    prev = sys.excepthook

    def hook(tp, value, tb):
        g = _LATEST[0]              # the group of the latest init (init, destroy, init …)
        text = "".join(traceback.format_exception(tp, value, tb))
        report_failure(g.rank, text, g.hb_dir)
        if g.own_dir:               # the job ends here: no destroy() will clean it up
            shutil.rmtree(g.hb_dir, ignore_errors=True)
        try:
            prev(tp, value, tb)
        finally:
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
    sys.excepthook = hook


def report_failure(rank, text, directory=None):
    """Leave a rank's traceback where `sampan launch` looks for it."""
    directory = directory or os.environ.get("SAMPAN_LAUNCH_DIR")
    if directory:
        try:
            path = os.path.join(directory, f"rank-{rank}.traceback")
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
        except OSError:
            pass
