"""oneDNN's int8 GEMM for constant weights: u8 activations (M, K) x an s8 weight (K, N)
into exact int32 sums, the weight reordered once into the layout oneDNN's kernel reads
(on Sapphire Rapids and later: the AMX tiles' VNNI-blocked layout), so a call repacks
nothing. `WeightGemm(w_nk).run(xq, acc)`; `impl()` names oneDNN's implementation
(e.g. "brg:avx512_core_amx"), or "" where oneDNN does not load.

Raises `primitives.Unsupported` where oneDNN has no int8 matmul for the call (callers keep
their own kernel then).
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import _lib as L
from . import primitives as P

_QUERY_WEIGHTS_MD = 131           # dnnl_query_weights_md (dnnl_query_some_md 128, src 129)
_FORMAT_ANY = 1                   # dnnl_format_tag_any
_EXTRA = {
    "dnnl_memory_desc_create_with_tag": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                         L.Dims, ctypes.c_int, ctypes.c_int],
    "dnnl_memory_desc_get_size": [ctypes.c_void_p],
    "dnnl_memory_desc_equal": [ctypes.c_void_p, ctypes.c_void_p],
    "dnnl_memory_desc_clone": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p],
    "dnnl_primitive_desc_query_md": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
    "dnnl_reorder_primitive_desc_create": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_void_p],
}
_RESTYPE = {"dnnl_memory_desc_get_size": ctypes.c_size_t,
            "dnnl_memory_desc_equal": ctypes.c_int,
            "dnnl_primitive_desc_query_md": ctypes.c_void_p}
_ready = {"ok": None}
_lock = threading.Lock()


def _dll():
    dll = L.lib()
    if dll is None:
        raise P.Unsupported(L.why_unavailable())
    if _ready["ok"] is None:
        with _lock:
            if _ready["ok"] is None:
                try:
                    for name, args in _EXTRA.items():
                        fn = getattr(dll, name)
                        fn.argtypes = args
                        fn.restype = _RESTYPE.get(name, ctypes.c_int)
                    _ready["ok"] = True
                except AttributeError:
                    _ready["ok"] = False
    if not _ready["ok"]:
        raise P.Unsupported("oneDNN's library lacks the reorder / query entry points")
    return dll


def _any_md(shape, dt):
    md = ctypes.c_void_p()
    L.check(_dll().dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(shape),
                                                    P._dims(shape), dt, _FORMAT_ANY),
            "dnnl_memory_desc_create_with_tag")
    return md


class _Gemm:
    """One matmul primitive for M rows: src u8 (M, K) plain, weights in oneDNN's chosen
    layout `wmd`, dst s32 (M, N) plain."""

    def __init__(self, m, k, n):
        dll = _dll()
        amd = P._md((m, k), np.dtype(np.uint8))
        omd = P._md((m, n), np.dtype(np.int32))
        bmd = _any_md((k, n), L.S8)
        attr = P._attr()
        try:
            pd = P._pd(dll.dnnl_matmul_primitive_desc_create, "int8 matmul", L.engine(),
                       amd, bmd, None, omd, attr)
            got = dll.dnnl_primitive_desc_query_md(pd, _QUERY_WEIGHTS_MD, 0)
            self.wmd = ctypes.c_void_p()
            L.check(dll.dnnl_memory_desc_clone(ctypes.byref(self.wmd), got),
                    "dnnl_memory_desc_clone")
            self.prim = P._Prim(pd, [L.ARG_SRC, L.ARG_WEIGHTS, L.ARG_DST],
                                [amd, self.wmd, omd])
        finally:
            dll.dnnl_primitive_attr_destroy(attr)
            P._destroy(amd, bmd, omd)


def _reorder(w_kn, wmd):
    """w (K, N) int8 plain -> a byte buffer in layout `wmd` (oneDNN's reorder)."""
    dll = _dll()
    size = int(dll.dnnl_memory_desc_get_size(wmd))
    buf = np.zeros(size + 64, np.uint8)
    off = (-buf.ctypes.data) % 64                 # 64-byte aligned, as oneDNN's own
    dst = buf[off:off + size]
    smd = P._amd(w_kn)
    attr = P._attr()
    pd = ctypes.c_void_p()
    try:
        st = dll.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), smd, L.engine(), wmd,
                                                    L.engine(), attr)
        if st in (2, 3):
            raise P.Unsupported(f"int8 weight reorder: status {st}")
        L.check(st, "dnnl_reorder_primitive_desc_create")
        prim = P._Prim(pd, [1, 17], [smd, wmd])      # DNNL_ARG_FROM, DNNL_ARG_TO
        prim.run([w_kn, dst])
    finally:
        dll.dnnl_primitive_attr_destroy(attr)
        P._destroy(smd)
    return dst


_streams: dict = {}


def _stream(slot):
    """A oneDNN stream per caller slot (slot 0: the library's own): callers running
    primitives at once from several threads each use their own."""
    if slot == 0:
        return L.stream()
    st = _streams.get(slot)
    if st is None:
        with _lock:
            st = _streams.get(slot)
            if st is None:
                st = ctypes.c_void_p()
                L.check(L.lib().dnnl_stream_create(ctypes.byref(st), L.engine(),
                                                   L.STREAM_IN_ORDER), "dnnl_stream_create")
                _streams[slot] = st
    return st


class one_thread:
    """Within the block, oneDNN's OpenMP regions opened by this thread run on it alone
    (libgomp's per-thread thread count), restored after: for callers that split the work
    over their own threads."""

    def __enter__(self):
        g = L.gomp()
        self.prev = int(g.omp_get_max_threads()) if g is not None else None
        if g is not None:
            g.omp_set_num_threads(1)
        return self

    def __exit__(self, *exc):
        g = L.gomp()
        if g is not None and self.prev is not None:
            g.omp_set_num_threads(self.prev)
        return False


class WeightGemm:
    """xq (M, K) uint8 @ w^T -> int32 (M, N), for one constant int8 weight w (N, K): the
    weight is reordered once per layout oneDNN asks for (the same for every M on a given
    machine, checked per primitive); primitives are kept per (M, caller slot), the last
    16, so threads running blocks at once never share one's memory objects."""

    MAX_PRIMS = 16

    def __init__(self, w_nk):
        if w_nk.dtype != np.int8 or w_nk.ndim != 2:
            raise P.Unsupported(f"weight {w_nk.dtype}{w_nk.shape}")
        self.n, self.k = w_nk.shape
        self.w_kn = np.ascontiguousarray(w_nk.T)
        self._prims: dict = {}
        self._layouts: list = []          # [(wmd, reordered buffer)]
        self._lock = threading.Lock()

    def _for(self, m, slot=0):
        key = (m, slot)
        hit = self._prims.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._prims.get(key)
            if hit is not None:
                return hit
            g = _Gemm(m, self.k, self.n)
            dll = _dll()
            buf = None
            for md, b in self._layouts:
                if dll.dnnl_memory_desc_equal(md, g.wmd):
                    buf = b
                    break
            if buf is None:
                buf = _reorder(self.w_kn, g.wmd)
                self._layouts.append((g.wmd, buf))
            if len(self._prims) >= self.MAX_PRIMS:
                self._prims.pop(next(iter(self._prims)))
            self._prims[key] = hit = (g, buf)
            return hit

    def impl(self, m=64):
        return self._for(m)[0].prim.impl

    def run(self, xq, acc, slot=0):
        """acc[:] = xq @ w^T (int32, exact); xq (M, K) uint8 and acc (M, N) int32, both
        C-contiguous. `slot`: which of a caller's threads runs it (0 from any thread
        that runs one call at a time)."""
        m = xq.shape[0]
        if (xq.dtype != np.uint8 or xq.shape != (m, self.k) or not xq.flags.c_contiguous
                or acc.dtype != np.int32 or acc.shape != (m, self.n)
                or not acc.flags.c_contiguous):
            raise P.Unsupported(f"int8 gemm operands {xq.dtype}{xq.shape} -> "
                                f"{acc.dtype}{acc.shape} (want uint8 (M, {self.k}) -> "
                                f"int32 (M, {self.n}), contiguous)")
        if m == 0:
            return acc
        g, buf = self._for(m, slot)
        if slot == 0:
            g.prim.run([xq, buf, acc])
            return acc
        dll, p = L.lib(), g.prim
        st = _stream(slot)
        with p.lock:
            for mem, a in zip(p.mems, (xq, buf, acc)):
                dll.dnnl_memory_set_data_handle(mem, a.ctypes.data)
            L.check(dll.dnnl_primitive_execute(p.prim, st, p.n, p.args),
                    "dnnl_primitive_execute")
            dll.dnnl_stream_wait(st)
        return acc


def impl() -> str:
    """oneDNN's implementation of a u8 x s8 matmul here ('' without oneDNN)."""
    try:
        return WeightGemm(np.zeros((64, 64), np.int8)).impl(64)
    except (P.Unsupported, L.OneDNNError):
        return ""
