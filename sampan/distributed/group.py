"""Process groups: the current group, the `Work` handle and the checks every backend shares.

A backend is a kernel table: a dict from collective name (the names of
`sampan.distributed.collectives.TABLE`) to a function `kernel(group, array, **attrs) ->
Work`. `ProcessGroup.run(name, ...)` validates the input once (dtype, op, ranks) and
calls the backend's kernel, or the table entry's fallback when the backend has none; the
public functions in `sampan.distributed` and the collective ops in the op table both go
through it (the ops find the current group through the hook this module registers with
`sampan.ops.collective.set_group_source`: the op table sits below this floor).

The current group is thread-local first (an in-process replica started by `spawn` has its
own) and process-wide second (an MPI rank has one for every thread).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from ..dtypes import bfloat16
from ..errors import SampanError
from .. import _recorder as _rec

REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
DTYPES = tuple(np.dtype(d) for d in (np.float32, np.float64, bfloat16, np.int64, np.int32,
                                     np.float16, np.int8, np.uint8, np.int16))
_DTYPE_SET = frozenset(DTYPES)

# {name: Collective}: the one table of collectives. It is filled, and documented, by
# collectives.py (`@collective`), which builds on this module; it is held here so that a
# group finds an entry's fallback without importing the module above it.
TABLE: dict = {}


class DistributedError(SampanError, RuntimeError):
    """A collective failed: a peer died or timed out, inputs disagree across ranks, or the
    process group is missing."""


class Work:
    """The handle an asynchronous collective returns (`async_op=True`).

    `wait(timeout=None)` blocks until the collective is done (its result is in the input
    array, or returned for all_gather/recv) and raises `DistributedError` naming the ranks
    that did not take part when it takes longer than `timeout` (the group's timeout when
    None). `is_completed()` never blocks."""

    __slots__ = ("group", "name", "seq", "_test", "_block", "_finish", "_done", "_result",
                 "_lock", "_t0", "_tid")

    def __init__(self, group, name, seq, test, finish, block=None):
        self.group, self.name, self.seq = group, name, seq
        self._test = test          # () -> bool: done (never blocks)
        self._block = block        # (seconds) -> bool: blocks until done or the time is up
        self._finish = finish      # () -> result, run once when done
        self._done = False
        self._result = None
        self._lock = threading.Lock()
        # sampan.profiler: the collective is a span from its start to its completion, on
        # the thread that started it
        self._t0 = _rec.now() if _rec.ACTIVE else None
        self._tid = threading.get_ident() if self._t0 is not None else 0

    @classmethod
    def completed(cls, group, name, result=None):
        w = cls(group, name, -1, None, None)
        w._done, w._result = True, result
        return w

    def _complete(self):
        with self._lock:
            if not self._done:
                self._result = self._finish()
                self._done = True
                if self._t0 is not None and _rec.ACTIVE:
                    _rec.emit_event(_rec.Event(self.name, "collective", self._t0,
                                               _rec.now() - self._t0, self._tid,
                                               {"seq": self.seq, "ranks": self.group.size}))

    def is_completed(self) -> bool:
        if not self._done and self._test():
            self._complete()
        return self._done

    def wait(self, timeout=None):
        """Block until done; return the result (the reduced array, the gathered list …)."""
        if self._done:
            return self._result
        limit = self.group.timeout if timeout is None else float(timeout)
        t = _rec.now() if _rec.ACTIVE else None
        if self._block is not None:
            ok = self._block(limit)
        else:
            ok = _spin(self._test, limit)
        if t is not None:            # the time this thread was blocked on it
            _rec.emit("wait", "collective", t, _rec.now() - t, op=self.name, seq=self.seq)
        if not ok:
            raise self.group.stalled(self.name, self.seq, limit)
        self._complete()
        return self._result

    def result(self):
        return self.wait()

    def then(self, fn):
        """Run `fn(result)` when the collective completes; its value becomes the result."""
        if self._done:
            self._result = fn(self._result)
        else:
            inner = self._finish
            self._finish = lambda: fn(inner())
        return self

    def get_future(self) -> "Future":
        """torch's `Work.get_future()`: a `Future` whose value is ``[result]`` (a list,
        as torch's collectives' futures), so torch-style comm hooks port unchanged."""
        return Future(lambda: [self.wait()], self.is_completed)

    def __repr__(self):
        state = "done" if self._done else "pending"
        return f"<Work {self.name} #{self.seq} {state}>"


class Future:
    """torch.futures.Future's few methods a comm hook uses: `then(callback)` (the
    callback gets this future and its return value is the new future's value),
    `value()`/`wait()` (block until done; the value), `done()`."""

    __slots__ = ("_get", "_test", "_has", "_value")

    def __init__(self, get, test):
        self._get, self._test = get, test
        self._has, self._value = False, None

    def wait(self):
        if not self._has:
            self._value, self._has = self._get(), True
        return self._value

    value = wait

    def done(self) -> bool:
        return self._has or self._test()

    is_completed = done

    def then(self, callback) -> "Future":
        return Future(lambda: callback(self._ready()), self.done)

    def _ready(self):
        self.wait()
        return self

    def __repr__(self):
        return f"<Future {'done' if self._has else 'pending'}>"


def _spin(test, limit):
    """Poll `test` until true or `limit` seconds pass. MPI moves a large message's bytes
    only inside Test calls (no progress thread), so the first second is a tight loop, as
    MPI's own blocking calls are (mpi4py releases the GIL inside Test, so other threads
    run), yielding the core every 64 polls as MPICH does (on an oversubscribed host the
    peer may be waiting for it); after that the peer is late rather than the transfer
    long, and sleeps that grow to 1 ms keep a long wait from burning a core."""
    t0 = time.perf_counter()
    deadline = t0 + limit
    n = 0
    slow = 0
    while not test():
        n += 1
        if n % 64:
            continue
        _yield()
        now = time.perf_counter()
        if now > deadline:
            return test()
        if now - t0 > 1.0:
            slow = min(slow + 1, 1000)
            time.sleep(1e-6 * slow)
    return True


_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class ProcessGroup:
    """Ranks that run collectives together. Subclasses set `kernels`, `backend`,
    `rank`, `size` and `timeout` and define `stalled(name, seq, seconds)`."""

    backend = "?"
    kernels: dict = {}

    def __init__(self, rank, size, timeout):
        self.rank, self.size, self.timeout = int(rank), int(size), float(timeout)

    def run(self, name, arr, **attrs) -> Work:
        check_array(name, arr)
        if "op" in attrs:
            check_reduce_op(name, attrs["op"], arr.dtype)
        for key in ("src", "dst"):
            if key in attrs:
                self.check_peer(name, key, attrs[key])
        kernel = self.kernels.get(name)
        if kernel is None:
            kernel = self.fallback(name)
        return kernel(self, arr, **attrs)

    def fallback(self, name):
        """The table's implementation of collective `name` over this backend's others
        (`sampan.distributed.collectives.TABLE`), for a backend without its own."""
        entry = TABLE.get(name)
        if entry is None or entry.fallback is None:
            raise DistributedError(f"{name}: the {self.backend} backend has no such "
                                   f"collective; expected one of {sorted(TABLE)}")
        return entry.fallback

    def new_group(self, ranks, timeout=None):
        """A new group of `ranks` (of this group; every rank of this group must call it,
        as torch's new_group); None on a rank that is not in `ranks`."""
        raise DistributedError(f"new_group: the {self.backend} backend cannot make "
                               "subgroups")

    def check_peer(self, name, key, r):
        if not isinstance(r, (int, np.integer)) or not 0 <= r < self.size:
            raise DistributedError(f"{name}: got {key}={r!r}; expected a rank in "
                                   f"0..{self.size - 1} (world size {self.size})")

    def stalled(self, name, seq, seconds) -> DistributedError:
        return DistributedError(f"{name} #{seq} on rank {self.rank} timed out after "
                                f"{seconds:g} s")

    def destroy(self):
        pass

    def __repr__(self):
        return f"<ProcessGroup {self.backend} rank {self.rank} of {self.size}>"


def check_array(name, arr):
    if not isinstance(arr, np.ndarray):
        raise DistributedError(f"{name}: got {type(arr).__name__}; expected a numpy array "
                               "or a sampan Tensor")
    if arr.dtype not in _DTYPE_SET:
        raise DistributedError(f"{name}: got dtype {arr.dtype}; expected one of "
                               f"{', '.join(str(d) for d in DTYPES)}")


def check_reduce_op(name, op, dtype):
    if op not in REDUCE_OPS:
        raise DistributedError(f"{name}: got op={op!r}; expected one of {REDUCE_OPS}")
    if op == "mean" and dtype.kind in "iu":
        raise DistributedError(f"{name}: got op='mean' on {dtype}; expected a floating "
                               "dtype (an integer mean would round; use op='sum')")


def reduce_into(out, arrays, op):
    """Reduce same-shaped `arrays` elementwise into `out` (bfloat16/float16 accumulate in
    float32 and round once); "mean" divides the sum by their number."""
    low = out.dtype in (bfloat16, np.dtype(np.float16))
    acc = arrays[0].astype(np.float32) if low else np.array(arrays[0], copy=True)
    f = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum,
         "prod": np.multiply}[op]
    for a in arrays[1:]:
        f(acc, a, out=acc)
    if op == "mean":
        acc /= len(arrays)
    np.copyto(out, acc, casting="unsafe")
    return out


# ------------------------------------------------------------------------ current group
class _Local(threading.local):
    group = None


_LOCAL = _Local()
_PROCESS = [None]


def current(required=True, what="a collective"):
    """The group of this thread (an inproc replica) or of this process (an MPI rank)."""
    g = _LOCAL.group or _PROCESS[0]
    if g is None and required:
        raise DistributedError(f"{what} needs a process group: call "
                               "sampan.distributed.init() first (or run inside "
                               "sampan.distributed.spawn)")
    return g


def thread_group():
    """This thread's own group (an in-process replica's), or None."""
    return _LOCAL.group


def set_thread_group(g):
    _LOCAL.group = g


def set_process_group(g):
    _PROCESS[0] = g


class use_group:
    """Make `group` current in this thread for a block (e.g. a helper thread started by
    an in-process replica): ``with sampan.distributed.use_group(g): ...``."""

    def __init__(self, group):
        self.group = group

    def __enter__(self):
        self.prev = _LOCAL.group
        _LOCAL.group = self.group
        return self.group

    def __exit__(self, *exc):
        _LOCAL.group = self.prev


def _register_with_the_ops():
    """The collective ops (`sampan/ops/collective.py`, a lower floor) find the current
    group and the error to raise through this hook instead of importing this module."""
    from ..ops import collective as _ops
    _ops.set_group_source(lambda: current(required=False), DistributedError)


_register_with_the_ops()
