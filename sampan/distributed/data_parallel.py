"""`DataParallel`: one model replica per rank, gradients averaged over the ranks.

At construction the parameters and buffers of rank 0 are copied to every rank. The
parameters are laid out, in reverse registration order (backward meets the last layers
first), into buckets of about `bucket_mb` megabytes of one dtype each (the first one
at most `FIRST_BUCKET_MB`, 1 MB, as torch's reducer does). A grad-ready
hook on every parameter (`sampan.autograd.hooks.register_grad_ready_hook`: it fires as
soon as the parameter's `.grad` holds all of this backward's contributions) copies the
gradient into its bucket; a bucket whose gradients are all in starts its asynchronous
all-reduce (mean) at once, while backward goes on computing the earlier layers' grads.
Buckets start in index order on every rank, so all ranks issue the same collectives in
the same order. When backward ends (an end-of-backward callback, `queue_callback`, as
torch's reducer does) the remaining buckets are started and all are waited for; each
parameter's `.grad` then holds the average and `loss.backward()` returns, so the
optimiser needs no hook and `opt.step()` is the plain one.

`.grad` after the reduction is a view into that step's bucket (a fresh buffer every
step: a `.grad` kept from an earlier step is never overwritten).

Buffers (BatchNorm's running statistics) are broadcast at construction and then kept
per rank: each rank's statistics follow its own shard of the data (torch broadcasts
them from rank 0 before every forward; here that is `sync_buffers()`, to call when
wanted, e.g. before evaluating).

Under `sampan.jit` the hooks do nothing: the traced step's gradients are all-reduced
by the `distribute` pass (pipeline "data_parallel") instead.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from ..autograd import hooks as _hooks
from ..autograd.hooks import queue_callback, register_grad_ready_hook
from ..errors import SampanError, SampanValueError
from ..nn.layer import Layer
from ..ops.registry import STATE
from ..tensor import wrap
from . import _comm

__all__ = ["DataParallel"]

FIRST_BUCKET_MB = 1.0


class _Bucket:
    __slots__ = ("index", "dtype", "params", "offsets", "size", "flat", "work", "left",
                 "t_launch", "t_done")

    def __init__(self, index, dtype):
        self.index, self.dtype = index, dtype
        self.params, self.offsets, self.size = [], [], 0

    def add(self, p):
        self.params.append(p)
        self.offsets.append(self.size)
        self.size += int(p._data.size)

    def nbytes(self):
        return self.size * np.dtype(self.dtype).itemsize


class DataParallel(Layer):
    """Wrap `layer` for data-parallel training over the ranks of `sampan.distributed`.

    `bucket_mb`: size of a gradient bucket (one all-reduce each). `find_unused_parameters`:
    allow parameters that get no gradient in a backward (they are reduced as zeros, or
    as the gradient they hold from accumulation steps); without it such a backward raises.
    `broadcast_buffers`: copy rank 0's buffers at construction (they are kept per rank
    afterwards; see the module docstring).

    Example::

        >>> dp = DataParallel(model)
        >>> loss = loss_fn(dp(x_shard), y_shard); loss.backward()   # grads averaged here
        >>> opt.step()
    """

    def __init__(self, layer, bucket_mb: float = 25, broadcast_buffers: bool = True,
                 find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(layer, Layer):
            raise SampanValueError(f"DataParallel: expected a sampan Layer, got "
                                   f"{type(layer).__name__}")
        if not bucket_mb > 0:
            raise SampanValueError(f"DataParallel: bucket_mb={bucket_mb}; expected > 0")
        self.module = layer
        self.bucket_mb = float(bucket_mb)
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        d = self.__dict__    # plain attributes, kept out of the Layer's registries
        d["_sync"] = True
        d["_step"] = None
        d["events"] = []          # (what, bucket index or param name, perf_counter time)
        d["record_events"] = False
        d["last_timing"] = None
        params, seen = [], set()
        for p in layer.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        d["_params"] = params
        d["_names"] = {id(p): n for n, p in layer.named_parameters()}
        self._broadcast_state(buffers=broadcast_buffers)
        d["buckets"] = self._make_buckets(params)
        d["_where"] = {id(p): (b, k) for b in self.buckets for k, p in enumerate(b.params)}
        d["_handles"] = [register_grad_ready_hook(p, self._on_ready) for p in params]

    # ------------------------------------------------------------------ layout
    def _make_buckets(self, params):
        full = self.bucket_mb * 2 ** 20
        buckets, open_ = [], {}          # dtype -> the bucket being filled
        for p in reversed(params):
            dt = p._data.dtype
            b = open_.get(dt)
            # the first bucket is small (torch's 1 MB): its reduction starts early in
            # backward, and the rest overlaps with the remaining gradients
            cap = min(FIRST_BUCKET_MB * 2 ** 20, full) if b is not None and b.index == 0 else full
            if b is None or (b.params and b.nbytes() + p._data.nbytes > cap):
                b = open_[dt] = _Bucket(len(buckets), dt)
                buckets.append(b)
            b.add(p)
        return buckets

    def _broadcast_state(self, buffers=True):
        arrays = [p._data for p in self._params]
        if buffers:
            arrays += [b._data for b in self.module.buffers() if b is not None]
        for a in arrays:
            _comm.broadcast_(a, src=0)

    def sync_buffers(self) -> None:
        """Copy rank 0's buffers (BatchNorm running statistics) to every rank.

        Example::

            >>> dp.sync_buffers(); dp.eval()
        """
        for b in self.module.buffers():
            if b is not None:
                _comm.broadcast_(b._data, src=0)

    # ------------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        tr = STATE.tracer
        if tr is not None:      # the distribute pass buckets the traced grads as we do
            tr.g.meta.setdefault("bucket_mb", self.bucket_mb)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, backward only accumulates local gradients; the first backward after
        it reduces the accumulated sums (gradient accumulation over micro-batches).

        Example::

            >>> with dp.no_sync():
            ...     loss_fn(dp(x1), y1).backward()
            >>> loss_fn(dp(x2), y2).backward()    # reduces the sum of both
        """
        prev = self._sync
        self.__dict__["_sync"] = False
        try:
            yield
        finally:
            self.__dict__["_sync"] = prev

    # ------------------------------------------------------------------ backward
    def _note(self, what, which):
        if self.record_events:
            self.events.append((what, which, time.perf_counter()))

    def _on_ready(self, p):
        if not self._sync or STATE.tracer is not None or _comm.world_size() == 1:
            return
        st = self._step
        if st is not None and st["queue"] is not _hooks._TL.queue:
            self._abandon(st)   # an earlier backward raised before its end callback ran
            st = None
        if st is None:
            st = self.__dict__["_step"] = {"left": [len(b.params) for b in self.buckets],
                                           "done": set(), "next": 0,
                                           "t0": time.perf_counter(),
                                           "queue": _hooks._TL.queue}
            for b in self.buckets:      # fresh buffers: an old .grad view stays intact
                b.flat = np.empty(b.size, b.dtype)
                b.work = None
            queue_callback(self._finish)
        if id(p) in st["done"]:
            return
        b, k = self._where[id(p)]
        self._note("ready", self._names.get(id(p)))
        self._copy_in(b, k, p.grad._data)
        st["done"].add(id(p))
        st["left"][b.index] -= 1
        self._launch_ready(st)
        for j in range(st["next"]):     # MPI progresses a nonblocking call when tested
            w = self.buckets[j].work
            if w is not None and w.is_completed():
                self.buckets[j].work = None
                self.buckets[j].t_done = time.perf_counter()

    def _copy_in(self, b, k, g):
        off, n = b.offsets[k], int(b.params[k]._data.size)
        b.flat[off:off + n] = g.reshape(-1)

    def _launch_ready(self, st):
        bs = self.buckets
        while st["next"] < len(bs) and st["left"][st["next"]] == 0:
            b = bs[st["next"]]
            b.t_launch = time.perf_counter()
            self._note("launch", b.index)
            b.work = _comm.all_reduce_mean(b.flat)
            st["next"] += 1

    def _finish(self):
        st = self._step
        self.__dict__["_step"] = None
        t_end = time.perf_counter()
        self._note("backward_end", None)
        unused = []
        for b in self.buckets:
            for k, p in enumerate(b.params):
                if id(p) not in st["done"]:
                    unused.append(p)
                    if self.find_unused_parameters:
                        g = p.grad
                        self._copy_in(b, k, g._data if g is not None else
                                      np.zeros(p._data.shape, b.dtype))
        if unused and not self.find_unused_parameters:
            names = [self._names.get(id(p), "?") for p in unused]
            self._drain(st)
            raise SampanError(
                f"DataParallel: {len(unused)} parameter(s) got no gradient in this backward "
                f"({', '.join(names[:5])}{' …' if len(names) > 5 else ''}); pass "
                "find_unused_parameters=True, or use every parameter in the loss")
        for b in self.buckets:
            st["left"][b.index] = 0
        self._launch_ready(st)
        had_grad = {id(p) for p in unused if p.grad is not None}
        for b in self.buckets:
            if b.work is not None:
                _comm.wait(b.work)
                b.t_done = time.perf_counter()
            self._note("reduced", b.index)
            for p, off in zip(b.params, b.offsets):
                view = b.flat[off:off + p._data.size].reshape(p._data.shape)
                if id(p) in st["done"] or id(p) in had_grad or view.any():
                    p.grad = wrap(view)
            b.work = None
        t_all = time.perf_counter()
        self.__dict__["last_timing"] = {
            "backward_s": t_end - st["t0"], "exposed_comm_s": t_all - t_end,
            "launch_s": [b.t_launch - st["t0"] for b in self.buckets],
            "done_s": [b.t_done - st["t0"] for b in self.buckets],
            "bucket_bytes": [b.nbytes() for b in self.buckets]}

    def _abandon(self, st):
        """Forget a step whose backward failed: its launched reductions are waited for
        (their buffers stay untouched until done) and the gradients stay local."""
        self.__dict__["_step"] = None
        for b in self.buckets:
            _comm.wait(b.work)
            b.work = None

    def _drain(self, st):
        """Start and wait for every bucket (zeros where unfilled), so that a rank that
        raises leaves the collectives of the other ranks matched."""
        for b in self.buckets:
            if st["left"][b.index]:
                b.flat[:] = 0
                st["left"][b.index] = 0
        self._launch_ready(st)
        for b in self.buckets:
            _comm.wait(b.work)
            b.work = None

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{b.nbytes() / 2 ** 20:.2f}" for b in self.buckets)
        return f"buckets=[{sizes}] MB, world_size={_comm.world_size()}"
