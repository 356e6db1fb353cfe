"""Loading oneDNN's C library (the `onednn-cpu-gomp` package: oneDNN 3.2 built on GNU
OpenMP) through ctypes, and the few enum values of its C API that sampan uses (from
oneDNN 3.2's dnnl_types.h / dnnl_common_types.h; the wheel ships no headers).

Nothing here runs at `import sampan`: `lib()` loads on first use and returns None when the
package is missing or cannot be loaded (then every caller keeps its numpy path).
`SAMPAN_ONEDNN=0` turns the backend off."""
from __future__ import annotations

import ctypes
import os
import sys
import threading

from ...errors import SampanError

# dnnl_data_type_t
F16, BF16, F32, S32, S8, U8 = 1, 2, 3, 4, 5, 6
# dnnl_prop_kind_t
FORWARD_TRAINING, FORWARD_INFERENCE = 64, 96
# dnnl_alg_kind_t
CONVOLUTION_DIRECT = 0x1
ELTWISE = {"relu": 0x20, "tanh": 0x21, "elu": 0x22, "square": 0x23, "abs": 0x24,
           "sqrt": 0x25, "linear": 0x26, "soft_relu": 0x27, "hardsigmoid": 0x28,
           "sigmoid": 0x29, "exp": 0x2a, "gelu_tanh": 0x2b, "swish": 0x2c, "log": 0x2d,
           "clip": 0x2e, "clip_v2": 0x2f, "pow": 0x30, "gelu": 0x31, "round": 0x32,
           "mish": 0x33, "hardswish": 0x34}
POOLING_MAX, POOLING_AVG_INCLUDE, POOLING_AVG_EXCLUDE = 0x1ff, 0x2ff, 0x3ff
BINARY = {"add": 0x1fff0, "mul": 0x1fff1, "max": 0x1fff2, "min": 0x1fff3, "div": 0x1fff4,
          "sub": 0x1fff5}
# execution argument indices (DNNL_ARG_*)
ARG_SRC, ARG_SRC_1, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 2, 17, 33, 41
ARG_DIFF_SRC, ARG_DIFF_DST, ARG_DIFF_WEIGHTS = 129, 145, 161
ARG_ATTR_SCALES = 4096
ARG_POST_OP_BASE = 32768            # DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) = base * (i + 1)
QUERY_IMPL_INFO_STR = 8
CPU_ENGINE = 1
STREAM_IN_ORDER = 1
FPMATH_BF16 = 1
MAX_NDIMS = 12

Dims = ctypes.c_int64 * MAX_NDIMS
p = ctypes.c_void_p


class ExecArg(ctypes.Structure):
    """dnnl_exec_arg_t: an argument index and a memory object."""
    _fields_ = [("arg", ctypes.c_int), ("memory", p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]


class OneDNNError(SampanError):
    """A oneDNN call failed (status code and the call are named)."""


_PROTOS = {
    "dnnl_engine_create": [ctypes.POINTER(p), ctypes.c_int, ctypes.c_size_t],
    "dnnl_stream_create": [ctypes.POINTER(p), p, ctypes.c_uint],
    "dnnl_stream_wait": [p],
    "dnnl_memory_desc_create_with_strides": [ctypes.POINTER(p), ctypes.c_int, Dims,
                                             ctypes.c_int, Dims],
    "dnnl_memory_desc_destroy": [p],
    "dnnl_memory_create": [ctypes.POINTER(p), p, p, p],
    "dnnl_memory_set_data_handle": [p, p],
    "dnnl_memory_destroy": [p],
    "dnnl_primitive_attr_create": [ctypes.POINTER(p)],
    "dnnl_primitive_attr_destroy": [p],
    "dnnl_primitive_attr_set_post_ops": [p, p],
    "dnnl_primitive_attr_set_scales_mask": [p, ctypes.c_int, ctypes.c_int],
    "dnnl_primitive_attr_set_fpmath_mode": [p, ctypes.c_int],
    "dnnl_post_ops_create": [ctypes.POINTER(p)],
    "dnnl_post_ops_destroy": [p],
    "dnnl_post_ops_append_eltwise": [p, ctypes.c_int, ctypes.c_float, ctypes.c_float],
    "dnnl_post_ops_append_binary": [p, ctypes.c_int, p],
    "dnnl_matmul_primitive_desc_create": [ctypes.POINTER(p), p, p, p, p, p, p],
    "dnnl_convolution_forward_primitive_desc_create": [
        ctypes.POINTER(p), p, ctypes.c_int, ctypes.c_int, p, p, p, p, Dims, Dims, Dims,
        Dims, p],
    "dnnl_convolution_backward_data_primitive_desc_create": [
        ctypes.POINTER(p), p, ctypes.c_int, p, p, p, Dims, Dims, Dims, Dims, p, p],
    "dnnl_convolution_backward_weights_primitive_desc_create": [
        ctypes.POINTER(p), p, ctypes.c_int, p, p, p, p, Dims, Dims, Dims, Dims, p, p],
    "dnnl_pooling_forward_primitive_desc_create": [
        ctypes.POINTER(p), p, ctypes.c_int, ctypes.c_int, p, p, Dims, Dims, Dims, Dims,
        Dims, p],
    "dnnl_primitive_desc_query": [p, ctypes.c_int, ctypes.c_int, p],
    "dnnl_primitive_desc_destroy": [p],
    "dnnl_primitive_create": [ctypes.POINTER(p), p],
    "dnnl_primitive_execute": [p, p, ctypes.c_int, ctypes.POINTER(ExecArg)],
    "dnnl_primitive_destroy": [p],
}

_state = {"lib": False, "engine": None, "stream": None, "gomp": None, "why": ""}
_lock = threading.Lock()


def _candidates():
    """Paths of libdnnl.so.3: `$SAMPAN_ONEDNN_LIB` (another build, e.g. to compare the
    `onednn` package's), the installed package's own files, then the environment's lib
    folder (where the wheel puts it)."""
    out = [os.environ["SAMPAN_ONEDNN_LIB"]] if os.environ.get("SAMPAN_ONEDNN_LIB") else []
    try:
        import importlib.metadata as md
        dist = md.distribution("onednn-cpu-gomp")
        for f in dist.files or ():
            if os.path.basename(str(f)).startswith("libdnnl.so"):
                out.append(str(dist.locate_file(f)))
    except Exception:
        pass
    for root in dict.fromkeys((sys.prefix, sys.exec_prefix)):
        out.append(os.path.join(root, "lib", "libdnnl.so.3"))
    return [c for c in dict.fromkeys(out) if os.path.exists(c)]


def _load():
    if os.environ.get("SAMPAN_ONEDNN", "1") == "0":
        _state["why"] = "SAMPAN_ONEDNN=0"
        return None
    paths = _candidates()
    if not paths:
        _state["why"] = "the onednn-cpu-gomp package is not installed"
        return None
    if not os.environ.get("SAMPAN_ONEDNN_LIB"):
        paths.sort(key=lambda s: (not s.endswith(".so.3"), s))
    try:
        dll = ctypes.CDLL(paths[0])
    except OSError as e:
        _state["why"] = f"loading {paths[0]} failed: {e}"
        return None
    for name, args in _PROTOS.items():
        fn = getattr(dll, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    dll.dnnl_version.restype = ctypes.POINTER(_Version)
    dll.dnnl_version.argtypes = []
    eng, strm = p(), p()
    st = dll.dnnl_engine_create(ctypes.byref(eng), CPU_ENGINE, 0)
    if st == 0:
        st = dll.dnnl_stream_create(ctypes.byref(strm), eng, STREAM_IN_ORDER)
    if st != 0:
        # e.g. the `onednn` 2026.1 wheel: its CPU runtime is SYCL, which finds no CPU
        # device without Intel's OpenCL CPU runtime
        _state["why"] = f"{paths[0]}: no CPU engine (dnnl_engine_create status {st})"
        return None
    _state["engine"], _state["stream"] = eng, strm
    try:   # the OpenMP runtime oneDNN runs on (already loaded with it: same soname)
        _state["gomp"] = ctypes.CDLL("libgomp.so.1")
    except OSError:
        _state["gomp"] = None
    return dll


def lib():
    """The loaded library (ctypes.CDLL) or None; see `why_unavailable`."""
    if _state["lib"] is False:
        with _lock:
            if _state["lib"] is False:
                from ... import _threads
                _threads.before_openmp()
                _state["lib"] = _load()
                if _state["lib"] is not None:
                    _threads.set_openmp_runtime(_state["gomp"])
                    _threads.apply_policy()
    return _state["lib"]


def loaded() -> bool:
    """Whether the library was loaded already (asks, never loads it)."""
    return _state["lib"] not in (False, None)


def why_unavailable() -> str:
    lib()
    return _state["why"]


def engine():
    return _state["engine"]


def stream():
    return _state["stream"]


def gomp():
    """libgomp (the OpenMP runtime oneDNN and numba's omp layer share), or None."""
    return _state["gomp"]


def version() -> str:
    """oneDNN's version string, e.g. '3.2.0', or '' when not loaded."""
    dll = lib()
    if dll is None:
        return ""
    v = dll.dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def check(status: int, call: str) -> None:
    if status != 0:
        raise OneDNNError(f"oneDNN: {call} returned status {status} (1: out of memory, "
                          "2: invalid arguments, 3: unimplemented, 5: runtime error)")
