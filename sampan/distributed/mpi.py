"""The `mpi` backend: collectives through mpi4py on the MPI that `mpiexec` started.

Hot path: buffer-based nonblocking calls (`Iallreduce` with `MPI_IN_PLACE`, `Ibcast`,
`Iallgatherv`, `Ireduce_scatter_block`, `Isend`/`Irecv`) on the numpy arrays themselves, no
pickling. A blocking call is the nonblocking one followed by a Test loop bounded by the
group's timeout, so a peer that died or hangs makes the collective fail with an error
naming it instead of hanging.

bfloat16 and float16 reductions go through a float32 round trip (convert, reduce in float32,
round once): every rank gets the same, correctly rounded sum, at the cost of twice the
bytes on the wire for those dtypes. Their broadcasts and gathers move the 2-byte buffers
as they are (a uint16 view).

Before each collective the ranks exchange a small signature (collective, op/root, dtype,
shape) with an `Iallgather`: a dtype or shape that differs between ranks is an error
naming both ranks instead of a silent garbage reduction, and all_gather learns the uneven
first-dim sizes from it. SAMPAN_DIST_CHECK=0 turns the check off for all_reduce.

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

import numpy as np

from ..dtypes import bfloat16
from .group import DistributedError, ProcessGroup, Work

from mpi4py import MPI  # noqa: E402  (this module is imported by init("mpi") only)

_HB_INTERVAL = 0.5
_NAMES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "send",
          "recv")
_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
_OPCODE = {"sum": 1, "mean": 2, "max": 3, "min": 4}
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
        self.check = os.environ.get("SAMPAN_DIST_CHECK", "1") != "0"
        self.hb_dir, self.own_dir = hb_dir, own_dir
        self._stop = threading.Event()
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
        _install_excepthook(g)
        return g

    # ----------------------------------------------------------------- heartbeats
    def _hb_path(self, r):
        return os.path.join(self.hb_dir, f"rank-{r}.hb")

    def _beat(self):
        path = self._hb_path(self.rank)
        tmp = path + ".tmp"
        while True:
            try:
                with open(tmp, "w") as f:
                    f.write(f"{os.getpid()} {self.seq} {self.current}\n")
                os.replace(tmp, path)
            except OSError:
                pass
            if self._stop.wait(_HB_INTERVAL):
                return

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

    def request_work(self, name, seq, req, finish):
        def test():
            try:
                return req.Test()
            except MPI.Exception as e:
                raise DistributedError(f"{name} #{seq} on rank {self.rank} failed: "
                                       f"{e.Get_error_string()}") from None
        return Work(self, name, seq, test, finish)

    def signature(self, name, seq, arr, attr=0, compare_dim0=True):
        """Exchange (collective, attr, dtype, shape) with every rank; raise naming the ranks
        whose call differs. Returns the table of signatures (one row per rank)."""
        shape = arr.shape
        rest = shape[1:] if shape else ()
        sig = np.array([_NAMES.index(name), attr, _DTCODE[arr.dtype], arr.ndim,
                        shape[0] if shape else 1,
                        zlib.crc32(repr(tuple(rest)).encode())], np.int64)
        table = np.empty((self.size, sig.size), np.int64)
        req = self.comm.Iallgather([sig, MPI.INT64_T], [table, MPI.INT64_T])
        self.request_work(name, seq, req, lambda: None).wait()
        cols = slice(None) if compare_dim0 else [0, 1, 2, 3, 5]
        bad = [r for r in range(self.size) if not np.array_equal(table[r, cols], sig[cols])]
        if bad:
            r = bad[0]
            what = _describe(table[r])
            raise DistributedError(f"{name} #{seq}: rank {self.rank} passed "
                                   f"{_describe(sig, arr)} but rank {r} passed {what}; "
                                   "expected the same collective, dtype and shape on every "
                                   "rank")
        return table

    def destroy(self):
        self._stop.set()
        try:
            os.remove(self._hb_path(self.rank))
        except OSError:
            pass
        if self.own_dir:
            shutil.rmtree(self.hb_dir, ignore_errors=True)


def _describe(row, arr=None):
    if arr is not None:
        return f"{_NAMES[row[0]]} of {arr.dtype}{list(arr.shape)}"
    dt = _DTNAME.get(int(row[2]), "?")
    return f"{_NAMES[row[0]]} of {dt}[ndim {row[3]}, dim0 {row[4]}]"


def _buffer(arr):
    """(buffer, MPI type) for moving `arr`'s bytes as they are."""
    if arr.dtype in _LOW:
        return arr.view(np.uint16), MPI.UINT16_T
    return arr, _TYPES[arr.dtype]


# ------------------------------------------------------------------------- kernels
def all_reduce(g, arr, op="sum"):
    seq = g.start("all_reduce")
    if g.check:
        g.signature("all_reduce", seq, arr, _OPCODE[op])
    low = arr.dtype in _LOW
    buf = arr.astype(np.float32) if low else arr
    req = g.comm.Iallreduce(MPI.IN_PLACE, [buf, _TYPES[buf.dtype]], _OPS[op])

    def finish():
        if op == "mean":
            np.divide(buf, g.size, out=buf)
        if low:
            np.copyto(arr, buf, casting="unsafe")
        return arr
    return g.request_work("all_reduce", seq, req, finish)


def broadcast(g, arr, src=0):
    seq = g.start("broadcast")
    g.signature("broadcast", seq, arr, src)
    req = g.comm.Ibcast(list(_buffer(arr)), root=src)
    return g.request_work("broadcast", seq, req, lambda: arr)


def all_gather(g, arr):
    seq = g.start("all_gather")
    table = g.signature("all_gather", seq, arr, compare_dim0=False)
    scalar = arr.ndim == 0
    if scalar:
        arr = arr.reshape(1)
    rest = arr.shape[1:]
    per = int(np.prod(rest, dtype=np.int64))
    dims = [int(d) for d in table[:, 4]]
    out = np.empty((sum(dims),) + rest, arr.dtype)
    buf, t = _buffer(arr)
    obuf, _ = _buffer(out)
    counts = [d * per for d in dims]
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    req = g.comm.Iallgatherv([buf, t], [obuf, counts, displs, t])

    def finish():
        parts, at = [], 0
        for d in dims:
            parts.append(out[at:at + d])
            at += d
        return [p.reshape(()) for p in parts] if scalar else parts
    return g.request_work("all_gather", seq, req, finish)


def reduce_scatter(g, arr, op="sum"):
    n = g.size
    if arr.ndim == 0 or arr.shape[0] % n:
        raise DistributedError(f"reduce_scatter: got shape {list(arr.shape)}; expected a "
                               f"first dim divisible by the world size {n}")
    seq = g.start("reduce_scatter")
    g.signature("reduce_scatter", seq, arr, _OPCODE[op])
    low = arr.dtype in _LOW
    buf = arr.astype(np.float32) if low else arr
    out = np.empty((arr.shape[0] // n,) + arr.shape[1:], buf.dtype)
    t = _TYPES[buf.dtype]
    req = g.comm.Ireduce_scatter_block([buf, t], [out, t], _OPS[op])

    def finish():
        if op == "mean":
            out[...] /= n
        return out.astype(arr.dtype) if low else out
    return g.request_work("reduce_scatter", seq, req, finish)


def barrier(g, arr=None):
    seq = g.start("barrier")
    return g.request_work("barrier", seq, g.comm.Ibarrier(), lambda: None)


_TAG = 23


def send(g, arr, dst):
    seq = g.start("send")
    buf, t = _buffer(arr)
    req = g.comm.Isend([buf, t], dest=dst, tag=_TAG)
    return g.request_work("send", seq, req, lambda: None)


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


def _install_excepthook(g):
    """An uncaught exception on one rank: print its traceback (and leave it for `sampan
    launch`), then abort the job so that its peers stop at once."""
    if _HOOKED[0]:
        return
    _HOOKED[0] = True
    prev = sys.excepthook

    def hook(tp, value, tb):
        text = "".join(traceback.format_exception(tp, value, tb))
        report_failure(g.rank, text, g.hb_dir)
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
