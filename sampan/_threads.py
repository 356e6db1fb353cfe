"""`set_num_threads` / `get_num_threads`: one thread count for sampan's two pools of
CPU threads, numba's (generated and hand-written parallel kernels) and the BLAS that
numpy calls for matmul and convolution (its bundled OpenBLAS, reached through ctypes
so no dependency is added). A missing piece (no numba, a BLAS without the symbol) is
skipped: the count then applies to what is there."""
from __future__ import annotations

import ctypes
import glob
import os

_SET_NAMES = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
              "openblas_set_num_threads64_", "openblas_set_num_threads",
              "MKL_Set_Num_Threads", "bli_thread_set_num_threads")
_GET_NAMES = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
              "openblas_get_num_threads64_", "openblas_get_num_threads", "MKL_Get_Max_Threads")
_state = {"n": None, "blas": False, "blas_cap": None}


def _blas_libraries():
    """Paths of the BLAS libraries numpy loaded (from /proc/self/maps on Linux), else
    those bundled next to numpy."""
    import numpy as np
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                low = os.path.basename(path).lower()
                if ("openblas" in low or "mkl_rt" in low or "blis" in low) and (
                        path not in found):
                    found.append(path)
    except OSError:
        pass
    if not found:
        root = os.path.dirname(os.path.dirname(np.__file__))
        found = sorted(glob.glob(os.path.join(root, "numpy.libs", "*openblas*")) +
                       glob.glob(os.path.join(root, "numpy", ".dylibs", "*openblas*")))
    return found


def _blas():
    """(set, get) ctypes functions of numpy's BLAS, or (None, None); looked up once.
    `set` sets every BLAS loaded in the process (numpy's and, e.g., scipy's own OpenBLAS:
    setting only the first found left numpy's at its default count)."""
    if _state["blas"] is False:
        _state["blas"] = (None, None)
        found = []
        # numpy's own BLAS first (its 64-bit-integer build), so `get` reads that one
        for path in sorted(_blas_libraries(), key=lambda q: "64_" not in q):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            s = next((getattr(lib, n) for n in _SET_NAMES if hasattr(lib, n)), None)
            g = next((getattr(lib, n) for n in _GET_NAMES if hasattr(lib, n)), None)
            if s is not None:
                s.restype = None
                s.argtypes = [ctypes.c_int]
                if g is not None:
                    g.restype = ctypes.c_int
                    g.argtypes = []
                found.append((s, g))
        if found:
            setters = [f[0] for f in found]

            def set_all(n):
                for f in setters:
                    f(n)
            _state["blas"] = (set_all, found[0][1])
    return _state["blas"]


def _numba():
    try:
        import numba
    except ImportError:
        return None
    return numba


def set_num_threads(n: int) -> None:
    """Use `n` CPU threads for numba kernels, numpy's BLAS and oneDNN's OpenMP (as
    ``torch.set_num_threads``).
    numba cannot start more threads than it was launched with (``NUMBA_NUM_THREADS``):
    its count is capped there.

    Example::

        >>> sampan.set_num_threads(2); sampan.get_num_threads()
        2
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: got {n!r}; expected a positive int")
    nb = _numba()
    if nb is not None:
        nb.set_num_threads(min(n, nb.config.NUMBA_NUM_THREADS))
    s, _ = _blas()
    if s is not None:
        s(min(n, _state["blas_cap"] or n))
    _state["n"] = n
    _omp_set(n)


def blas_cap() -> int | None:
    """The cap `cap_blas` set on numpy's BLAS threads, or None."""
    return _state["blas_cap"]


def cap_blas(cap: int | None) -> None:
    """Give numpy's BLAS at most `cap` threads whatever `set_num_threads` says (None: no
    cap): the "onednn" GEMM pool (backends/pool.py) keeps OpenBLAS on one thread so its
    workers never spin beside oneDNN's. `get_num_threads` still reports the count set;
    uncapping gives the BLAS that count back (or, if none was set, the one it had)."""
    if cap == _state["blas_cap"]:
        return
    s, g = _blas()
    if _state["blas_cap"] is None and g is not None:
        _state["blas_before"] = int(g())
    _state["blas_cap"] = cap
    target = _state["n"] if _state["n"] is not None else _state.get("blas_before")
    if s is not None and target is not None:
        s(min(target, cap) if cap else target)


def get_num_threads() -> int:
    """The thread count `set_num_threads` set; before that, numba's (else the BLAS's,
    else the CPU count)."""
    if _state["n"] is not None:
        return _state["n"]
    nb = _numba()
    if nb is not None:
        return int(nb.get_num_threads())
    _, g = _blas()
    if g is not None:
        return int(g())
    return os.cpu_count() or 1


# ----------------------------------------------------------------------------- OpenMP
# oneDNN (onednn-cpu-gomp) and numba's "omp" threading layer both run on the system's
# libgomp: one OpenMP pool, so they cannot oversubscribe each other; OpenBLAS keeps its
# own pthreads. What is left between the two pools is spin-waiting: after a parallel
# region libgomp's workers spin (GOMP_SPINCOUNT, 300k iterations by default) and
# OpenBLAS's threads spin after each GEMM, each stealing the other's cores on a small
# machine. libgomp reads its wait policy once, when it is loaded; `before_openmp` sets
# sampan's default (see WAIT_POLICY) unless the user set one.
# A passive worker costs a futex wake-up per parallel region (each oneDNN primitive of an
# `onednn_layout` region is one). Bounded spins were measured against it on the 2-core
# Zen 4 VM under load (2026-12-02, load 10-12, Predictor batch-1 p50 over interleaved
# blocks, processes stopped while not measuring): ResNet-18 21.8 ms passive, 40-62 ms at
# GOMP_SPINCOUNT=1000, 151-172 ms at 10^4, 612-856 ms at 10^5; YOLOv8n 13.5 / 26-33 /
# 144-194 / 1512-1751 ms: a spinning worker burns the time slice its descheduled partner
# needs. PASSIVE stays; a region of primitives too small to pay a wake-up runs on one
# thread instead (`backends/onednn/regionrace.py` `fastest`, measured per region).
WAIT_POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}


_POLICY = {"in_force": None}


def _gomp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line for line in f)
    except OSError:
        return False


def before_openmp() -> None:
    """Called at `import sampan` and before oneDNN loads libgomp: sampan's wait policy,
    unless one is set. Records which policy the process's libgomp runs under
    (`openmp_wait_policy`): one loaded before this call (e.g. by `import torch` first)
    read the environment already and keeps libgomp's default spinning."""
    if _POLICY["in_force"] is not None:
        return
    user = next((f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                 if k in os.environ), None)
    if user is None:
        if _gomp_loaded():
            _POLICY["in_force"] = "libgomp default (loaded before sampan)"
            return
        os.environ.update(WAIT_POLICY)
        user = ",".join(f"{k}={v}" for k, v in WAIT_POLICY.items())
    _POLICY["in_force"] = user


def openmp_wait_policy() -> str | None:
    """The OpenMP wait policy this process's libgomp runs under, as `before_openmp`
    found or set it (None before it ran)."""
    return _POLICY["in_force"]


# The OpenMP runtime a provider loaded (ctypes, with omp_set_num_threads), or None. This
# module sits below the providers: oneDNN's (`backends/onednn/_lib.py`) registers its
# libgomp here when it loads, as `sampan.distributed` registers into ops/collective.py.
_OMP = {"gomp": None}


def set_openmp_runtime(gomp) -> None:
    """Register the OpenMP runtime a provider loaded; `set_num_threads` then sets its
    count too (call `apply_policy` to give it the count chosen so far)."""
    _OMP["gomp"] = gomp


def _omp_set(n: int) -> None:
    g = _OMP["gomp"]
    if g is not None:
        g.omp_set_num_threads(ctypes.c_int(n))


def apply_policy() -> None:
    """Give a newly loaded OpenMP runtime the thread count set_num_threads chose."""
    if _state["n"] is not None:
        _omp_set(_state["n"])
