"""The `inproc` backend: N replicas as threads of one process sharing memory.

The ParallelExecutor idea: each replica runs the same program with its own rank (the
process group is thread-local), and a collective is a rendezvous in shared memory. Rank r
posts its array in the slot of its k-th collective; the last rank to arrive reduces the
arrays (numpy releases the GIL, so the others keep computing) and wakes the waiters; each
rank then copies its part of the result into its own array. Every wait is bounded by the
group's timeout, and a replica that raises fails the waits of the others at once, so a
failing replica never hangs its peers.

Kernel table: `KERNELS`, one function per collective, `kernel(group, array, **attrs)`.
"""
from __future__ import annotations

import threading
import time
import traceback
from collections import deque

import numpy as np

from .group import DistributedError, ProcessGroup, Work, reduce_into, set_thread_group


class _Slot:
    __slots__ = ("sig", "inputs", "arrived", "ready", "result", "error", "taken")

    def __init__(self, sig, n):
        self.sig = sig
        self.inputs = [None] * n
        self.arrived = 0
        self.ready = False
        self.result = None
        self.error = None
        self.taken = 0


class World:
    """The shared state of one inproc group: collective slots, mailboxes, the failure."""

    def __init__(self, size, timeout=60.0):
        self.size, self.timeout = int(size), float(timeout)
        self.cond = threading.Condition()
        self.slots: dict[int, _Slot] = {}
        self.mail: dict[tuple, deque] = {}
        self.failed = None           # (rank, exception) of the first replica that raised
        self.groups = [InprocGroup(self, r) for r in range(self.size)]

    def fail(self, rank, exc):
        with self.cond:
            if self.failed is None:
                self.failed = (rank, exc)
            self.cond.notify_all()

    def peer_failed(self, rank):
        r, exc = self.failed
        return DistributedError(f"rank {r} failed ({type(exc).__name__}: {exc}); rank "
                                f"{rank} stopped waiting for it")


class InprocGroup(ProcessGroup):
    backend = "inproc"

    def __init__(self, world, rank):
        super().__init__(rank, world.size, world.timeout)
        self.world = world
        self.seq = 0
        self.kernels = KERNELS

    # --------------------------------------------------------------- the rendezvous
    def post(self, name, sig, payload, compute, take) -> Work:
        """Join collective number `seq`: `compute(inputs by rank)` runs once, on the last
        rank to arrive; `take(result)` runs on each rank to produce its own result."""
        w, r = self.world, self.rank
        full = (name,) + sig
        with w.cond:
            seq = self.seq
            self.seq += 1
            if w.failed is not None:
                raise w.peer_failed(r)
            slot = w.slots.get(seq)
            if slot is None:
                slot = w.slots[seq] = _Slot(full, w.size)
            elif slot.sig != full and slot.error is None:
                other = next(i for i, x in enumerate(slot.inputs) if x is not None)
                slot.error = DistributedError(
                    f"collective #{seq}: rank {r} called {_show(full)} but rank {other} "
                    f"called {_show(slot.sig)}; every rank must run the same collectives "
                    "in the same order")
            slot.inputs[r] = (payload,)
            slot.arrived += 1
            last = slot.arrived == w.size
        if last and slot.error is None:
            try:
                res, err = compute([x[0] for x in slot.inputs]), None
            except DistributedError as e:
                res, err = None, e
            with w.cond:
                slot.result, slot.error = res, err
                slot.inputs = [()] * w.size      # drop the references to the inputs
                slot.ready = True
                w.cond.notify_all()
        elif last:
            with w.cond:
                slot.ready = True
                w.cond.notify_all()

        def test():
            return slot.ready or slot.error is not None or w.failed is not None

        def block(limit):
            with w.cond:
                return w.cond.wait_for(test, timeout=limit)

        def finish():
            if slot.error is not None:
                raise slot.error
            if not slot.ready:
                raise w.peer_failed(r)
            out = take(slot.result)
            with w.cond:
                slot.taken += 1
                if slot.taken == w.size:
                    w.slots.pop(seq, None)
            return out

        return Work(self, name, seq, test, finish, block)

    def new_group(self, ranks, timeout=None):
        """Every rank of this group joins (a rendezvous like a collective); the last to
        arrive makes the new world of `ranks`, and each member takes its replica."""
        ranks = tuple(ranks)
        t = self.timeout if timeout is None else float(timeout)

        def take(world):
            return world.groups[ranks.index(self.rank)] if self.rank in ranks else None
        return self.post("new_group", (ranks,), None, lambda inputs: World(len(ranks), t),
                         take).wait()

    def stalled(self, name, seq, seconds):
        w = self.world
        with w.cond:
            slot = w.slots.get(seq)
            missing = ([i for i, x in enumerate(slot.inputs) if x is None]
                       if slot is not None else [])
        who = (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did "
               "not join it" if missing else "its peers did not answer")
        return DistributedError(f"{name} #{seq} on rank {self.rank} timed out after "
                                f"{seconds:g} s: {who}")


def _show(sig):
    name, *rest = sig
    return f"{name}({', '.join(map(str, rest))})"


def _same(name, inputs, key=lambda a: (a.shape, a.dtype)):
    k0 = key(inputs[0])
    for r, a in enumerate(inputs):
        if key(a) != k0:
            raise DistributedError(
                f"{name}: rank 0 passed {inputs[0].dtype}{list(inputs[0].shape)} but rank "
                f"{r} passed {a.dtype}{list(a.shape)}; expected the same shape and dtype "
                "on every rank")


# ------------------------------------------------------------------------- kernels
def all_reduce(g, arr, op="sum"):
    def compute(inputs):
        _same("all_reduce", inputs)
        return reduce_into(np.empty_like(inputs[0]), inputs, op)
    return g.post("all_reduce", (op,), arr, compute, lambda res: np.copyto(arr, res) or arr)


def broadcast(g, arr, src=0):
    def compute(inputs):
        _same("broadcast", inputs)
        return inputs[src].copy()

    def take(res):
        if g.rank != src:
            np.copyto(arr, res)
        return arr
    return g.post("broadcast", (src,), arr, compute, take)


def all_gather(g, arr):
    def compute(inputs):
        _same("all_gather", inputs, key=lambda a: (a.shape[1:], a.dtype, a.ndim))
        return [a.copy() for a in inputs]
    return g.post("all_gather", (), arr, compute,
                  lambda res: [a if r == g.rank else a.copy() for r, a in enumerate(res)])


def reduce_scatter(g, arr, op="sum"):
    n = g.size
    if arr.ndim == 0 or arr.shape[0] % n:
        raise DistributedError(f"reduce_scatter: got shape {list(arr.shape)}; expected a "
                               f"first dim divisible by the world size {n}")
    k = arr.shape[0] // n

    def compute(inputs):
        _same("reduce_scatter", inputs)
        return reduce_into(np.empty_like(inputs[0]), inputs, op)
    return g.post("reduce_scatter", (op,), arr, compute,
                  lambda res: res[g.rank * k:(g.rank + 1) * k].copy())


def barrier(g, arr=None):
    return g.post("barrier", (), None, lambda inputs: None, lambda res: None)


def send(g, arr, dst):
    w = g.world
    with w.cond:
        w.mail.setdefault((g.rank, dst), deque()).append(arr.copy())
        w.cond.notify_all()
    return Work.completed(g, "send")


def recv(g, out, src):
    w = g.world
    box = w.mail.setdefault((src, g.rank), deque())

    def test():
        return bool(box) or w.failed is not None

    def block(limit):
        with w.cond:
            return w.cond.wait_for(test, timeout=limit)

    def finish():
        with w.cond:
            if not box:
                raise w.peer_failed(g.rank)
            a = box.popleft()
        if a.shape != out.shape or a.dtype != out.dtype:
            raise DistributedError(f"recv: rank {src} sent {a.dtype}{list(a.shape)} but "
                                   f"rank {g.rank} expects {out.dtype}{list(out.shape)}")
        np.copyto(out, a)
        return out
    return Work(g, "recv", -1, test, finish, block)


KERNELS = {"all_reduce": all_reduce, "broadcast": broadcast, "all_gather": all_gather,
           "reduce_scatter": reduce_scatter, "barrier": barrier, "send": send, "recv": recv}


# --------------------------------------------------------------------------- spawn
class ReplicaError(DistributedError):
    """A replica started by `spawn` raised; `.rank` is its rank, the cause its error."""

    def __init__(self, msg, rank):
        super().__init__(msg)
        self.rank = rank


def spawn(fn, nprocs, args=(), timeout=60.0):
    """Run `fn(*args)` on `nprocs` in-process replicas (threads sharing memory), each with
    its own rank: inside `fn`, `rank()`/`world_size()` and every collective use that
    replica's group. Returns the list of results by rank. If a replica raises, the others'
    collectives fail at once and `spawn` raises `ReplicaError` naming the first failing
    rank, with its exception as the cause and its traceback in the message.

        >>> def step(x):
        ...     a = np.full(3, float(sampan.distributed.rank()))
        ...     return sampan.distributed.all_reduce(a)
        >>> sampan.distributed.spawn(step, 2)   # [array([1., 1., 1.]), array(...)]
    """
    n = int(nprocs)
    if n < 1:
        raise DistributedError(f"spawn: got nprocs={nprocs!r}; expected at least 1")
    world = World(n, timeout)
    results = [None] * n
    errors = {}

    def body(r):
        set_thread_group(world.groups[r])
        try:
            results[r] = fn(*args)
        except BaseException as e:          # noqa: BLE001 - reported by spawn
            errors[r] = (e, traceback.format_exc())
            world.fail(r, e)
        finally:
            set_thread_group(None)

    threads = [threading.Thread(target=body, args=(r,), name=f"sampan-replica-{r}",
                                daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    deadline = None
    for t in threads:
        while t.is_alive():
            t.join(0.1)
            if world.failed is not None and deadline is None:
                deadline = time.monotonic() + world.timeout + 1.0
            if deadline is not None and time.monotonic() > deadline:
                break                       # a replica stuck outside collectives
    if errors:
        root = world.failed[0] if world.failed is not None else min(errors)
        exc, tb = errors.get(root, next(iter(errors.values())))
        raise ReplicaError(f"spawn: rank {root} of {n} raised {type(exc).__name__}: {exc}"
                           f"\n--- traceback of rank {root} ---\n{tb}", root) from exc
    return results
