"""`DataParallel`: one model replica per rank, gradients averaged over the ranks.

At construction the parameters and buffers of rank 0 are copied to every rank. The
parameters are laid out, in reverse registration order (backward meets the last layers
first), into buckets of about `bucket_mb` megabytes of one dtype each (the first one
at most `FIRST_BUCKET_MB`, 1 MB, as torch's reducer does). The first synchronised
backward records the order in which the gradients actually became ready, and the buckets
are then rebuilt in that order (rank 0's, broadcast, so that every rank lays them out
alike), as torch's reducer rebuilds its buckets: a parameter used early in forward but
whose gradient is ready early (or late) no longer holds its bucket back. The last
bucket holds only the gradients ready last (up to `LAST_BUCKET_MB`, 1 MB, or the last
one alone): its reduction cannot overlap anything. A grad-ready
hook on every parameter (`sampan.autograd.hooks.register_grad_ready_hook`: it fires as
soon as the parameter's `.grad` holds all of this backward's contributions) copies the
gradient into its bucket; a bucket whose gradients are all in starts its asynchronous
reduction at once, while backward goes on computing the earlier layers' grads: the
comm hook's (`register_comm_hook`, as torch DDP's; by default `comm_hooks.allreduce_hook`,
the mean over the ranks). The layout rule is `sampan.distributed.buckets.plan`, which the
`distribute` pass shares.
Buckets start in index order on every rank, so all ranks issue the same collectives in
the same order. MPI moves a nonblocking collective's bytes only inside MPI calls (there is
no progress thread: on a machine with no spare core one only steals the compute's), so
while reductions are in flight the backward's ops pass through a dispatch mode
(`sampan/ops/modes.py`) that tests the oldest one before each op: the reductions advance
between the ops of backward instead of waiting for its end (not inside one op: a
reduction started just before a long GEMM still waits for it; running such GEMMs in
blocks of rows with tests between them was measured: W1's middle bucket then finished
inside backward, but the step got 0.8 ms slower, more than the 0.3 ms it hid). When
backward ends (an end-of-backward callback, `queue_callback`, as torch's reducer does)
the remaining buckets are started and all are waited for; each parameter's `.grad` then
holds the average and `loss.backward()` returns, so the optimiser needs no hook and
`opt.step()` is the plain one.

`last_timing` holds the timestamps of the last synchronised backward (`time.perf_counter`,
CLOCK_MONOTONIC on Linux, so comparable across the ranks of one host):
`backward_end_t` (this rank's backward finished computing) and `reduced_t` (its
reductions were all done). The communication that backward failed to hide is
`reduced_t` minus the latest `backward_end_t` of all ranks: before that, a rank that waits
is waiting for a slower peer to arrive, not for communication
(`benchmarks/data_parallel.py` measures it so). `exposed_comm_s` is this rank's whole
wait after its own backward, both together.

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
import threading
import time

import numpy as np

from ..autograd.hooks import current_backward, queue_callback, register_grad_ready_hook
from ..errors import SampanError, SampanValueError
from ..nn.layer import Layer
from ..ops import modes as _modes
from ..ops.registry import STATE
from ..tensor import wrap
from . import _comm
from .buckets import FIRST_BUCKET_MB, LAST_BUCKET_MB, make_buckets  # noqa: F401
from .comm_hooks import GradBucket, allreduce_hook

__all__ = ["DataParallel"]



# ------------------------------------------------------------ progress during backward
class _Polling(threading.local):
    def __init__(self):
        self.dps = []         # this thread's DataParallels with reductions in flight
        self.pushed = False   # whether this thread has _progress pushed (a thread that
        #                       ends with it pushed is forgotten by the modes themselves)


_POLL = _Polling()


def _progress(op, inputs, attrs, call_next):
    """The dispatch mode of a thread whose backward has reductions in flight: before
    each op, test them (MPI advances them only inside its calls). A DataParallel whose
    backward is over (it raised, so its end callback never ran) is dropped here."""
    dps = _POLL.dps
    now = current_backward()
    for dp in list(dps):
        st = dp._step
        if st is None or st["queue"] is not now:
            dps.remove(dp)
        else:
            dp._poll()
    if not dps:
        _stop_polling(None)
    return call_next(op, inputs, attrs)


def _start_polling(dp):
    if dp not in _POLL.dps:
        _POLL.dps.append(dp)
    if not _POLL.pushed:
        _modes.push_mode(_progress)
        _POLL.pushed = True


def _stop_polling(dp):
    dps = _POLL.dps
    if dp in dps:
        dps.remove(dp)
    if not dps and _POLL.pushed:
        _POLL.pushed = False
        _modes.pop_mode(_progress)


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
        d["_rebuilt"] = False     # buckets still in reverse registration order
        d["_comm_hook"] = None    # (state, hook) from register_comm_hook; None: the default
        params, seen = [], set()
        for p in layer.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        d["_params"] = params
        d["_names"] = {id(p): n for n, p in layer.named_parameters()}
        self._broadcast_state(buffers=broadcast_buffers)
        d["_index"] = {id(p): i for i, p in enumerate(params)}
        self._set_buckets(params[::-1])
        d["_handles"] = [register_grad_ready_hook(p, self._on_ready) for p in params]

    def register_comm_hook(self, state, hook) -> None:
        """Reduce each bucket with `hook(state, bucket) -> Work` instead of the default
        mean all-reduce, as PyTorch DDP's `register_comm_hook` (once, before training).
        `sampan.distributed.comm_hooks` holds the default (`allreduce_hook`) and the
        compression hooks (`fp16_compress_hook`, `bf16_compress_hook`); see it for the
        contract. The hook runs in eager backward only: a traced step's gradients are
        all-reduced by the `distribute` pass, so tracing with a hook set is refused.

        Example::

            >>> from sampan.distributed import comm_hooks
            >>> dp.register_comm_hook(None, comm_hooks.fp16_compress_hook)
        """
        if self._comm_hook is not None:
            raise SampanError("DataParallel.register_comm_hook: a hook is already "
                              "registered (it can be set once)")
        if not callable(hook):
            raise SampanValueError(f"DataParallel.register_comm_hook: got hook={hook!r}; "
                                   "expected hook(state, bucket) -> Work")
        self.__dict__["_comm_hook"] = (state, hook)

    # ------------------------------------------------------------------ layout
    def _set_buckets(self, order):
        d = self.__dict__
        d["buckets"] = self._make_buckets(order)
        d["_where"] = {id(p): (b, k) for b in self.buckets for k, p in enumerate(b.params)}

    def _make_buckets(self, order):
        """Buckets over `order`, the parameters in the order their gradients are expected
        to be ready, laid out by the shared policy (`sampan.distributed.buckets.plan`:
        a small first bucket whose reduction starts early, a small last bucket holding
        only the last gradients, whose reduction nothing can overlap)."""
        return make_buckets(order, self.bucket_mb)

    def _rebuild(self, st):
        """Lay the buckets out in the order this backward's gradients became ready
        (rank 0's order on every rank: the ranks must issue the same collectives);
        parameters that got no gradient go last, in reverse registration order."""
        seen = set(st["order"])
        order = st["order"] + [i for i in range(len(self._params))[::-1] if i not in seen]
        arr = np.asarray(order, np.int64)
        _comm.broadcast_(arr, src=0)
        self.__dict__["_rebuilt"] = True
        if sorted(arr.tolist()) != list(range(len(self._params))):
            raise SampanError("DataParallel: rank 0 sent a gradient order that is not a "
                              "permutation of this rank's parameters (different models?)")
        self._set_buckets([self._params[i] for i in arr.tolist()])

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
            if self._comm_hook is not None:
                raise SampanError("DataParallel: a comm hook is registered but this step "
                                  "is being traced; the distribute pass reduces traced "
                                  "gradients by their mean, without the hook")
            tr.set_pass_option("distribute", bucket_mb=self.bucket_mb)
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
        if st is not None and st["queue"] is not current_backward():
            self._abandon(st)   # an earlier backward raised before its end callback ran
            st = None
        if st is None:
            st = self.__dict__["_step"] = {"left": [len(b.params) for b in self.buckets],
                                           "done": set(), "next": 0, "polled": 0,
                                           "order": [], "t0": time.perf_counter(),
                                           "queue": current_backward()}
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
        st["order"].append(self._index[id(p)])
        st["left"][b.index] -= 1
        self._launch_ready(st)
        self._poll()

    def _poll(self):
        """Test the oldest reduction in flight (MPI advances all of them inside the call);
        note the ones found done."""
        st = self._step
        if st is None:
            return
        bs = self.buckets
        j = st["polled"]
        while j < st["next"]:
            b = bs[j]
            if b.work is not None:
                test = getattr(b.work, "is_completed", None)
                if test is None or not test():
                    break
                self._settle(b)
                b.t_done = time.perf_counter()
            j += 1
        st["polled"] = j

    def _copy_in(self, b, k, g):
        off, n = b.offsets[k], int(b.params[k]._data.size)
        b.flat[off:off + n] = g.reshape(-1)

    def _launch_ready(self, st):
        bs = self.buckets
        while st["next"] < len(bs) and st["left"][st["next"]] == 0:
            b = bs[st["next"]]
            b.t_launch = time.perf_counter()
            self._note("launch", b.index)
            b.work = self._reduce(b)
            st["next"] += 1
            if b.work is not None:
                _start_polling(self)

    def _reduce(self, b):
        """Start bucket `b`'s reduction: the registered comm hook's, else the default
        (`comm_hooks.allreduce_hook`: the mean over the current group)."""
        state, hook = self._comm_hook or (None, allreduce_hook)
        return hook(state, GradBucket(b, b.index == len(self.buckets) - 1))

    def _settle(self, b):
        """Wait for `b`'s reduction; a hook's result that is not the buffer itself (a new
        array or tensor of the bucket's size) is copied into it."""
        w, b.work = b.work, None
        if w is None:
            return
        res = w.wait()
        if res is not None and res is not b.flat:
            arr = res.numpy() if hasattr(res, "numpy") else np.asarray(res)
            if arr is b.flat:
                return
            if arr.size != b.size:
                raise SampanError(f"DataParallel: the comm hook of bucket {b.index} "
                                  f"returned {arr.size} elements; expected {b.size}")
            np.copyto(b.flat, arr.reshape(-1))

    def _finish(self):
        st = self._step
        t_end = time.perf_counter()
        _stop_polling(self)
        self.__dict__["_step"] = None
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
                self._settle(b)
                b.t_done = time.perf_counter()
            self._note("reduced", b.index)
            for p, off in zip(b.params, b.offsets):
                view = b.flat[off:off + p._data.size].reshape(p._data.shape)
                if id(p) in st["done"] or id(p) in had_grad or view.any():
                    p.grad = wrap(view)
        t_all = time.perf_counter()
        self.__dict__["last_timing"] = {
            "backward_s": t_end - st["t0"], "exposed_comm_s": t_all - t_end,
            "backward_end_t": t_end, "reduced_t": t_all,
            "launch_s": [b.t_launch - st["t0"] for b in self.buckets],
            "done_s": [b.t_done - st["t0"] for b in self.buckets],
            "bucket_bytes": [b.nbytes() for b in self.buckets]}
        if not self._rebuilt:
            self._rebuild(st)

    def _abandon(self, st):
        """Forget a step whose backward failed: its launched reductions are waited for
        (their buffers stay untouched until done) and the gradients stay local."""
        _stop_polling(self)
        self.__dict__["_step"] = None
        for b in self.buckets:
            self._settle(b)

    def _drain(self, st):
        """Start and wait for every bucket (zeros where unfilled), so that a rank that
        raises leaves the collectives of the other ranks matched."""
        for b in self.buckets:
            if st["left"][b.index]:
                b.flat[:] = 0
                st["left"][b.index] = 0
        self._launch_ready(st)
        for b in self.buckets:
            self._settle(b)

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{b.nbytes() / 2 ** 20:.2f}" for b in self.buckets)
        return f"buckets=[{sizes}] MB, world_size={_comm.world_size()}"
