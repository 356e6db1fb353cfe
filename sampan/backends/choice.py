"""Kernel choice by measurement.

An op with kernels from more than one backend (`OpDef.kernels`: "numpy", the op table's
own kernel with its BLAS calls and numba loops, and e.g. "onednn") gets a `Chooser` as
its `kernel`, so eager dispatch (`tensor.apply`), the jit executor (which binds
`op.kernel` for opaque nodes, `runtime/codegen.py`) and gradients (written with ops) all
read one choice. The first time a chooser meets an (op, shapes, dtypes, attributes)
class it times every candidate a few repetitions (bounded time), keeps the winner in
memory and in an on-disk cache, and returns the numpy kernel's result of that call.

The cache (`cache.py`, the module below this one and `pool.py`; file
`$SAMPAN_KERNEL_CACHE`, default `kernels.json` in sampan's cache
directory) holds one section per machine key: the CPU model, its SIMD flags and the
versions of numpy, numba and oneDNN, so a winner measured elsewhere is never used here.
It is written atomically with a checksum; a corrupt or foreign file is ignored with a
warning and rebuilt. A choice measured while the machine was busy (1-minute load average
above one per core) is provisional: it keeps the load it was measured under, is used
while the machine stays that busy, and is measured again the first time a process meets
it on a quiet machine or on one clearly quieter than then (`cache.trusted`), so a winner
picked by noise does not stay for good, even on a machine that is never quiet.

Which classes race at all depends on the process's GEMM pool (`pool.py`): under the
"openblas" pool float32 stays on numpy unmeasured (oneDNN serves int8); under the
"onednn" pool OpenBLAS runs on one thread and every class is measured. The pool's name
is part of the class key, so a winner never crosses pools. bfloat16 is calibrated apart
(`pool.decide("bfloat16")`): where its library is forced, and for matmul under the
"openblas" float32 pool, every bfloat16 call goes to it; so does, under the "onednn"
pool, a bf16 GEMM of `BF16_DIRECT_FLOPS` or more where that calibration chose oneDNN
(numpy's side there is float32 sgemm plus casts on one thread: a busy race once picked it
at 4x oneDNN's time). Otherwise each bfloat16 class races like a float32 one (its key names
the dtype), so a bf16 convolution oneDNN serves slowly keeps the numba loops while bf16
GEMMs run oneDNN's AMX or AVX512-BF16 kernels.

`prefer("onednn")` (or `prefer("numpy", op="matmul")`) overrides the measurement, as a
context manager or globally. `SAMPAN_KERNEL_CHOICE=off` keeps every op on its numpy
kernel without measuring.

Example::

    >>> from sampan.backends import choice
    >>> with choice.prefer("numpy"):
    ...     pass
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from .. import dtypes as _dt
from ..ops.registry import OPS, default_kernel
from . import cache
from .cache import (BACKENDS, WIN_MARGIN, KernelCacheWarning, backends, cache_path,  # noqa: F401
                    cpu_flags, cpu_model, entries, flush, library_versions, machine_key,
                    store, stored)
from .onednn import KERNELS as _ONEDNN_KERNELS

_BF16 = _dt.bfloat16

# ops whose kernels another backend may provide: oneDNN's kernel table names them
OPS_WITH_CHOICE = tuple(_ONEDNN_KERNELS)
TIME_BUDGET_S = 0.25     # measuring one class stops after this (every candidate ran once)
REPS = 7
SMALL_S = 30e-6          # see _measure
MIN_ROUNDS = 3         # rounds run even past the budget (one noisy run decides nothing)

_prefer: dict = {}                   # op (None: every op) -> backend name
_lock = cache.LOCK


def reset() -> None:
    """Forget loaded backends, the GEMM pool and in-memory choices (tests that swap the
    loader)."""
    from . import pool
    with _lock:
        cache.reset_state()
        pool.reset()
        forget_classes()


def forget_classes() -> None:
    """Forget the in-memory per-class choices (they are re-read or measured again)."""
    with _lock:
        for name in OPS_WITH_CHOICE:
            k = OPS[name].kernel
            if isinstance(k, Chooser):
                k.table = {}
                k.ready = False


cache.on_forget(forget_classes)


def clear() -> None:
    """Delete the cache file and forget every choice."""
    with _lock:
        cache.delete_file()
        reset()


# ----------------------------------------------------------------------------- prefer
def prefer(backend: str | None, op: str | None = None):
    """Run `op` (None: every op with a choice) on `backend` ("numpy", "onednn") where it
    has a kernel for the call, whatever was measured; `backend=None` drops the override.
    Called plainly it holds until changed; used as ``with prefer(...)`` it is undone at
    the end of the block.

    Example::

        >>> with prefer("numpy", op="matmul"):
        ...     pass
    """
    if backend is not None and backend != "numpy" and backend not in BACKENDS:
        from ..errors import SampanError
        raise SampanError(f"prefer: unknown backend {backend!r}; expected 'numpy' or one "
                          f"of {sorted(BACKENDS)}")
    with _lock:
        prev = _prefer.get(op)
        if backend is None:
            _prefer.pop(op, None)
        else:
            _prefer[op] = backend
    return _PreferHandle(op, prev)


class _PreferHandle:
    """prefer()'s result: already in force; as a context manager, undone at exit."""

    def __init__(self, op, prev):
        self.op, self.prev = op, prev

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with _lock:
            if self.prev is None:
                _prefer.pop(self.op, None)
            else:
                _prefer[self.op] = self.prev
        return False


def preferred(op: str):
    """The backend `prefer` set for `op` (or for every op), else None."""
    return _prefer.get(op) or _prefer.get(None)


# ----------------------------------------------------------------------------- chooser
def _class_key(op, arrays, attrs, pool=None) -> str:
    parts = [f"{pool}:{op}" if pool else op] + [f"{a.dtype.str}{list(a.shape)}{'' if a.flags.c_contiguous else 'nc'}"
                    for a in arrays]
    if attrs:
        parts.append(",".join(f"{k}={v}" for k, v in sorted(attrs.items())))
    return ";".join(parts).replace(" ", "")


def _mem_key(arrays, attrs):
    """The in-memory class key (cheaper than the string the disk cache keeps)."""
    k = tuple([(a.shape, a.dtype, a.flags.c_contiguous) for a in arrays])
    return (k, tuple(attrs.items())) if attrs else k


def _measure(cands, arrays, attrs):
    """Best time of each candidate: one warm call each (builds primitives, compiles
    loops), then up to REPS rounds that alternate the candidates (a busy machine slows
    them alike), within TIME_BUDGET_S; a candidate 20x slower than the best leaves."""
    from .onednn import Unsupported
    best, live = {}, []
    for name, fn in cands.items():
        try:
            t = time.perf_counter()
            fn(*arrays, **attrs)
            best[name] = time.perf_counter() - t
            live.append(name)
            if name == "numpy" and best[name] < SMALL_S:
                # a call this small: oneDNN's per-call cost (~10 us of ctypes and
                # primitive execution) leaves nothing to win; keep numpy, stop measuring
                return {"numpy": best[name]}
        except Unsupported:
            continue
        except Exception:  # noqa: BLE001 - a backend failing here loses the choice
            continue
    deadline = time.perf_counter() + TIME_BUDGET_S
    for i in range(REPS):
        if len(live) < 2 or (i >= MIN_ROUNDS and time.perf_counter() > deadline):
            break
        for name in list(live):
            t = time.perf_counter()
            cands[name](*arrays, **attrs)
            best[name] = min(best[name], time.perf_counter() - t)
        low = min(best[n] for n in live)
        live = [n for n in live if best[n] < 20 * low]
    return best


BF16_DIRECT_FLOPS = 1 << 22     # see Chooser._decide


def _gemm_flops(arrays) -> int:
    """2 * batch * m * k * n of a matmul call (0 for what is not a matrix product)."""
    a, b = arrays[0], arrays[1]
    if a.ndim < 2 or b.ndim < 2:
        return 0
    batch = 1
    for n in np.broadcast_shapes(a.shape[:-2], b.shape[:-2]):
        batch *= n
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


class Chooser:
    """`op.kernel` for an op with several backends: picks per call class (see module)."""

    def __init__(self, op):
        self.op = op
        self.name = op.name
        # the kernel sampan runs without oneDNN: the numba loops' where numba is (the op
        # table's default backend), else the numpy kernel; "numpy" in the cache's names
        self.numpy = default_kernel(op.kernels)
        self.table = {}             # class key -> callable (memory)
        self.ready = False
        self.pool = None            # the process's GEMM pool (backends/pool.py)
        self.__name__ = getattr(self.numpy, "__name__", op.name)
        self.__doc__ = getattr(self.numpy, "__doc__", None)

    def candidates(self):
        out = {"numpy": self.numpy}      # first: a tiny call stops after it
        out.update((n, f) for n, f in self.op.kernels.items() if n in backends())
        return out

    def __call__(self, *arrays, **attrs):
        if not self.ready:
            self._settle()
        if self.table is None:
            return self.numpy(*arrays, **attrs)
        if _prefer:
            pref = preferred(self.name)
            if pref is not None:
                fn = self.op.kernels.get(pref) if (pref == "numpy" or pref in backends()) \
                    else None
                return self._run(fn or self.numpy, arrays, attrs)
        key = _mem_key(arrays, attrs)
        fn = self.table.get(key)
        if fn is None:
            return self._decide(key, arrays, attrs)
        return self._run(fn, arrays, attrs)

    def _settle(self):
        if not backends():          # nothing to choose from: exactly today's kernel
            self.table = None
        else:
            from . import pool
            self.pool = pool.decide()     # before `ready`: other threads wait for it
        self.ready = True

    def pick(self, arrays, attrs=None):
        """The chosen non-numpy kernel for this call (measured if new), or None: for
        callers that run the numpy side themselves (the jit's planned-buffer matmul)."""
        attrs = attrs or {}
        if not self.ready:
            self._settle()
        if self.table is None:
            return None
        if _prefer:
            pref = preferred(self.name)
            if pref is not None:
                return None if pref == "numpy" or pref not in backends() \
                    else self.op.kernels.get(pref)
        key = _mem_key(arrays, attrs)
        if key not in self.table:
            self._decide(key, arrays, attrs)
        fn = self.table[key]
        return None if fn is self.numpy else fn

    def _run(self, fn, arrays, attrs):
        if fn is self.numpy:
            return fn(*arrays, **attrs)
        from .onednn import Unsupported
        from .onednn._lib import OneDNNError
        try:
            return fn(*arrays, **attrs)
        except (Unsupported, OneDNNError):    # a call it does not serve: today's kernel
            return self.numpy(*arrays, **attrs)

    def provider(self, arrays, attrs) -> str:
        """The backend name this call would run on (measuring it if new)."""
        key = _mem_key(arrays, attrs)
        if self.table is not None and key not in self.table and backends():
            self._decide(key, arrays, attrs)
        fn = (self.table or {}).get(key, self.numpy)
        return next(n for n, f in self.op.kernels.items() if f is fn)

    def _decide(self, mkey, arrays, attrs):
        if "onednn" in self.op.kernels and any(a.dtype == _BF16 for a in arrays):
            # bfloat16: the library its own calibration chose (pool.decide("bfloat16")),
            # whatever the float32 pool, where that pool was forced, and for matmul under
            # the "openblas" float32 pool (timing the numpy kernel there would wake
            # OpenBLAS's spinning workers). Elsewhere each bf16 class races like a float32
            # one, under its own key (dtype "<V2"): oneDNN's bf16 convolutions on plain
            # NCHW run its im2col GEMM, slower than the numba loops on LeNet's few channels
            # while its bf16 matmul runs AMX tiles at 4-6x the float32 rate
            # A bf16 GEMM of BF16_DIRECT_FLOPS or more goes to the calibrated library
            # unraced too: numpy's side is float32 sgemm plus two casts (on one OpenBLAS
            # thread under the "onednn" pool), 4x oneDNN's time single-threaded at
            # (8,128,256) @ (256,1024) on Zen 4, and a race on a busy machine still
            # picked it (W3 eager bf16: 11.3 ms a call instead of 1.4 ms; W1 jit's
            # (128,512) @ (512,512).T: 1.5 ms instead of 0.2 ms)
            from . import pool
            lib = pool.decide("bfloat16")
            if pool.forced("bfloat16") or (self.name == "matmul" and (
                    self.pool == "openblas" or (lib == "onednn" and _gemm_flops(arrays)
                                                >= BF16_DIRECT_FLOPS))):
                self.table[mkey] = self.op.kernels["onednn"] if lib == "onednn" \
                    else self.numpy
                return self._run(self.table[mkey], arrays, attrs)
        if self.pool == "openblas" and all(a.dtype.kind == "f" and a.dtype.itemsize >= 4
                                           for a in arrays):
            # the OpenBLAS pool: float32/64 stay on numpy (no switch between thread
            # pools); oneDNN serves only what numpy has no BLAS for (bfloat16, int8)
            self.table[mkey] = self.numpy
            return self.numpy(*arrays, **attrs)
        key = _class_key(self.name, arrays, attrs, self.pool)
        stored = cache.stored(key)
        cands = self.candidates()
        if stored and stored.get("winner") in cands and cache.trusted(stored):
            # a choice measured on a busy machine is provisional: kept while the machine
            # is as busy, measured again once it is quiet or clearly quieter
            self.table[mkey] = cands[stored["winner"]]
            return self._run(self.table[mkey], arrays, attrs)
        result = self.numpy(*arrays, **attrs)
        machine = cache.conditions()          # the load it is measured under
        times = _measure(cands, arrays, attrs)
        winner = min(times, key=times.get) if times else "numpy"
        if "numpy" in times and times[winner] > times["numpy"] / WIN_MARGIN:
            winner = "numpy"        # a near tie stays on today's kernel (one thread pool)
        self.table[mkey] = cands[winner]
        store(key, {"winner": winner, **machine,
                     "times_us": {k: round(v * 1e6, 2) for k, v in times.items()}})
        return result


def install() -> None:
    """Put a Chooser in front of every op that has (or may get) a second backend. Cheap:
    nothing is loaded until a chooser is first called."""
    for name in OPS_WITH_CHOICE:
        op = OPS.get(name)
        if op is None or isinstance(op.kernel, Chooser) or "numpy" not in op.kernels:
            continue
        for b in BACKENDS:
            op.kernels.setdefault(b, _Lazy(b, name))
        op.kernel = Chooser(op)


class _Lazy:
    """A backend's kernel, imported on first call (keeps `import sampan` light)."""

    def __init__(self, backend, op):
        self.backend, self.opname, self.fn = backend, op, None

    def __call__(self, *arrays, **attrs):
        if self.fn is None:
            self.fn = cache.module(self.backend).KERNELS[self.opname]
        return self.fn(*arrays, **attrs)


def providers(op_names=OPS_WITH_CHOICE) -> dict:
    """{op: the backends that served its calls so far} (for benchmark records)."""
    out = {}
    for name in op_names:
        k = OPS[name].kernel if name in OPS else None
        if isinstance(k, Chooser):
            used = sorted({next((n for n, f in k.op.kernels.items() if f is fn), "?")
                           for fn in (k.table or {}).values()})
            if used:
                out[name] = "+".join(used)
    return out
