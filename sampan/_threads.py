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
# sampan's (see `sampan_policy`) unless the user set one.
# A passive worker costs a futex wake-up per parallel region (each oneDNN primitive of an
# `onednn_layout` region is one): ResNet-18 on two threads ran no faster than on one
# (2-core Zen 4, 2026-12-02), while a bounded spin made every libgomp path faster and
# every path that hands the cores to OpenBLAS's threads right after slower (PP-OCR rec
# 1.37 -> 4.34x onnxruntime, W2 bf16 eager 0.96 -> 0.33x its fp32; benchmarks/RESULTS.md).
# So the spin may only go with the "onednn" GEMM pool (backends/pool.py), where OpenBLAS
# runs on one thread and libgomp owns the cores alone: with SAMPAN_OMP_SPIN=auto, PASSIVE
# where the pool may be "openblas", SPIN_POLICY where it is "onednn" (forced by
# SAMPAN_GEMM_POOL, or the pool this CPU's kernel choice cache holds; a process that spins
# keeps the "onednn" pool, pool.decide). Off by default (`sampan_policy`).
PASSIVE_POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}
SPIN_POLICY = {"GOMP_SPINCOUNT": "10000"}
WAIT_POLICY = PASSIVE_POLICY      # the policy without a one-pool hint


_POLICY = {"in_force": None}


def _gomp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line for line in f)
    except OSError:
        return False


def kernel_cache_path() -> str:
    """The kernel choice cache file (`backends/cache.py` reads and writes it):
    $SAMPAN_KERNEL_CACHE, else kernels.json in $SAMPAN_CACHE_DIR (~/.cache/sampan)."""
    p = os.environ.get("SAMPAN_KERNEL_CACHE")
    if p:
        return p
    d = os.environ.get("SAMPAN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "sampan")
    return os.path.join(d, "kernels.json")


def cpu_model() -> str:
    """The CPU's model name, as the kernel choice cache keys its records (`backends/cache.py`
    uses this one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def one_pool_hint() -> bool:
    """Whether this process's float32 GEMMs will run under the "onednn" pool (OpenBLAS on
    one thread beside libgomp): SAMPAN_GEMM_POOL says so, or the kernel choice cache holds
    that pool for this CPU model (every section of it that holds a pool; read before any
    kernel library loads, so without their versions). A damaged file says no."""
    forced = os.environ.get("SAMPAN_GEMM_POOL")
    if forced in ("openblas", "onednn"):
        return forced == "onednn"
    import json
    try:
        with open(kernel_cache_path(), "rb") as f:
            machines = json.loads(f.read().decode()).get("machines") or {}
        model = cpu_model()
        pools = [rec.get("winner") for key, sec in machines.items()
                 if isinstance(sec, dict) and key.split("|", 1)[0] == model
                 for name, rec in sec.items()
                 if name.startswith("pool:gemm:") and name[10:11].isdigit()
                 and isinstance(rec, dict)]
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return False
    return bool(pools) and all(p == "onednn" for p in pools)


def sampan_policy() -> dict:
    """The wait policy sampan gives libgomp in this process: PASSIVE by default;
    SAMPAN_OMP_SPIN=auto spins where the "onednn" pool owns the cores (`one_pool_hint`,
    the comment above), =1 spins whatever the pool. Default off: on the loaded 2-core Xeon
    (2026-12-02, load 1.4-3.4, benchmarks/RESULTS.md) the spin made PP-OCR cls 1.0-1.2 ms
    into 6-30 ms and YOLOv8n 21-25 into 34-60 ms."""
    want = os.environ.get("SAMPAN_OMP_SPIN", "0")
    spin = want == "1" or (want == "auto" and one_pool_hint())
    return dict(SPIN_POLICY if spin else PASSIVE_POLICY)


def before_openmp() -> None:
    """Called at `import sampan` and before oneDNN loads libgomp: sampan's wait policy
    (`sampan_policy`), unless one is set, goes into the environment. Records which policy
    sampan's libgomp runs under (`openmp_wait_policy`). A libgomp loaded before this call
    (e.g. PyTorch's own copy, by `import torch` first) read the environment already and
    keeps libgomp's default spinning, but the system's libgomp, which oneDNN and numba's
    omp layer load next to it, reads the policy set here (/proc/self/maps shows both)."""
    if _POLICY["in_force"] is not None:
        return
    user = next((f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                 if k in os.environ), None)
    if user is None:
        policy = sampan_policy()
        os.environ.update(policy)
        _POLICY["sampan_spin"] = policy == SPIN_POLICY
        user = ",".join(f"{k}={v}" for k, v in policy.items())
        if _gomp_loaded():
            user += " (a libgomp loaded before sampan keeps its default)"
    _POLICY["in_force"] = user


def openmp_wait_policy() -> str | None:
    """The OpenMP wait policy sampan's libgomp runs under, as `before_openmp` found or
    set it (None before it ran)."""
    return _POLICY["in_force"]


def openmp_spins() -> bool:
    """Whether sampan's libgomp workers spin after a region (any policy but PASSIVE or a
    spin count of 0)."""
    policy = (openmp_wait_policy() or "").upper()
    return "PASSIVE" not in policy and "GOMP_SPINCOUNT=0" not in policy.replace(" ", "")


def spin_by_sampan() -> bool:
    """Whether the spinning policy in force is sampan's own (`sampan_policy`), not the
    user's: then the "onednn" GEMM pool goes with it (backends/pool.py)."""
    return bool(_POLICY.get("sampan_spin"))


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
