"""oneDNN primitives over numpy arrays: matmul (2-d and batched, bias, eltwise/binary
post-ops), convolution forward / backward-data / backward-weights, max/avg pooling, in
float32, bfloat16 and int8 (u8 x s8 and s8 x s8 into s32).

Memory is the numpy arrays themselves: every memory descriptor is made from the array's
own shape and strides (oneDNN's plain, strided layouts), so a transposed view or a batch
broadcast goes in without a copy. A primitive is built once per (op, shapes, strides,
dtypes, attributes) and kept in `CACHE` with its memory objects; a call points those at
the arrays (`dnnl_memory_set_data_handle`) and executes. A shape or dtype oneDNN does not
implement raises `Unsupported`, and callers keep their numpy kernel for it.
"""
from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

import numpy as np

from ... import dtypes as _dt
from . import _lib as L

_DT = {np.dtype(np.float32): L.F32, _dt.bfloat16: L.BF16, np.dtype(np.float16): L.F16,
       np.dtype(np.int32): L.S32, np.dtype(np.int8): L.S8, np.dtype(np.uint8): L.U8}
CACHE_MAX = 512


class Unsupported(Exception):
    """oneDNN has no implementation for this call (the caller falls back)."""


class _Prim:
    """A primitive, its memory objects (one per argument) and the prebuilt argument
    array; `run(arrays)` binds the arrays in argument order and executes."""
    __slots__ = ("prim", "mems", "args", "n", "lock", "impl", "hits")

    def __init__(self, pd, arg_ids, mds):
        dll = L.lib()
        prim = ctypes.c_void_p()
        info = ctypes.c_char_p()
        dll.dnnl_primitive_desc_query(pd, L.QUERY_IMPL_INFO_STR, 0, ctypes.byref(info))
        self.impl = (info.value or b"").decode()
        if self.impl.startswith("ref"):
            # oneDNN's reference loops (an unusual layout or dtype): far slower than numpy
            dll.dnnl_primitive_desc_destroy(pd)
            raise Unsupported(f"only oneDNN's reference implementation ({self.impl})")
        L.check(dll.dnnl_primitive_create(ctypes.byref(prim), pd), "dnnl_primitive_create")
        dll.dnnl_primitive_desc_destroy(pd)
        self.prim = prim
        self.mems = []
        for md in mds:
            m = ctypes.c_void_p()
            L.check(dll.dnnl_memory_create(ctypes.byref(m), md, L.engine(), None),
                    "dnnl_memory_create")
            self.mems.append(m)
        self.n = len(arg_ids)
        self.args = (L.ExecArg * self.n)(*[L.ExecArg(a, m) for a, m in zip(arg_ids,
                                                                          self.mems)])
        self.lock = threading.Lock()
        self.hits = 0

    def run(self, arrays):
        dll = L.lib()
        with self.lock:
            for m, a in zip(self.mems, arrays):
                dll.dnnl_memory_set_data_handle(m, a.ctypes.data)
            L.check(dll.dnnl_primitive_execute(self.prim, L.stream(), self.n, self.args),
                    "dnnl_primitive_execute")
            dll.dnnl_stream_wait(L.stream())


CACHE: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()
STATS = {"hits": 0, "misses": 0}


def _layout(a):
    return (a.dtype.str, a.shape, a.strides)


def _cached(key, build):
    with _cache_lock:
        p = CACHE.get(key)
        if p is not None:
            CACHE.move_to_end(key)
            STATS["hits"] += 1
            if isinstance(p, Unsupported):
                raise p
            p.hits += 1
            return p
    try:
        p = build()
    except Unsupported as e:       # remembered, so a rejected call is not rebuilt
        p = e
    with _cache_lock:
        STATS["misses"] += 1
        CACHE[key] = p
        while len(CACHE) > CACHE_MAX:
            CACHE.popitem(last=False)
    if isinstance(p, Unsupported):
        raise p
    return p


def clear_cache():
    with _cache_lock:
        CACHE.clear()
        STATS.update(hits=0, misses=0)


def _dims(vals):
    d = L.Dims()
    for i, v in enumerate(vals):
        d[i] = int(v)
    return d


def _md(shape, dtype, strides=None):
    """A memory descriptor of `shape` with element `strides` (default: C order)."""
    if dtype not in _DT:
        raise Unsupported(f"dtype {dtype}")
    shape = tuple(int(s) for s in shape)
    if strides is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= max(s, 1)
        strides = tuple(reversed(strides))
    md = ctypes.c_void_p()
    L.check(L.lib().dnnl_memory_desc_create_with_strides(
        ctypes.byref(md), len(shape), _dims(shape), _DT[dtype], _dims(strides)),
        "dnnl_memory_desc_create_with_strides")
    return md


def _amd(a, shape=None):
    """The memory descriptor of array `a` as it lies in memory (viewed as `shape`, with
    leading dims of 1 prepended)."""
    st = []
    for s, n in zip(a.strides, a.shape):
        if s <= 0 and n > 1 or s % a.itemsize:
            raise Unsupported("broadcast, negative or unaligned strides")
        st.append(s // a.itemsize if n > 1 else 0)
    shape = tuple(a.shape) if shape is None else tuple(shape)
    pad = len(shape) - a.ndim
    st = [0] * pad + st
    # broadcast (stride-0) dims carry size 1 for oneDNN; a stride of 0 on a real dim of
    # size 1 is given the row length so the descriptor stays a valid plain layout
    return _md(shape, a.dtype, _dense_strides(shape, st))


def _dense_strides(shape, st):
    out = list(st)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] <= 1:
            out[i] = acc
        acc = max(acc, out[i] * max(shape[i], 1))
    return out


def _destroy(*mds):
    dll = L.lib()
    for m in mds:
        if m:
            dll.dnnl_memory_desc_destroy(m)


def _attr(post_ops=(), scales=(), fpmath=None):
    """Primitive attributes: post-ops [(kind, alpha, beta) for eltwise, ('binary:add',
    md) ...], runtime scales masks per argument, fpmath mode. Returns (attr, mds)."""
    dll = L.lib()
    attr = ctypes.c_void_p()
    L.check(dll.dnnl_primitive_attr_create(ctypes.byref(attr)), "dnnl_primitive_attr_create")
    if post_ops:
        po = ctypes.c_void_p()
        L.check(dll.dnnl_post_ops_create(ctypes.byref(po)), "dnnl_post_ops_create")
        for p in post_ops:
            if p[0].startswith("binary:"):
                L.check(dll.dnnl_post_ops_append_binary(po, L.BINARY[p[0][7:]], p[1]),
                        "dnnl_post_ops_append_binary")
            else:
                L.check(dll.dnnl_post_ops_append_eltwise(po, L.ELTWISE[p[0]], p[1], p[2]),
                        "dnnl_post_ops_append_eltwise")
        L.check(dll.dnnl_primitive_attr_set_post_ops(attr, po), "set_post_ops")
        dll.dnnl_post_ops_destroy(po)
    for arg, mask in scales:
        L.check(dll.dnnl_primitive_attr_set_scales_mask(attr, arg, mask), "set_scales_mask")
    if fpmath is not None:
        L.check(dll.dnnl_primitive_attr_set_fpmath_mode(attr, fpmath), "set_fpmath_mode")
    return attr


def _pd(create, call, *args):
    pd = ctypes.c_void_p()
    st = create(ctypes.byref(pd), *args)
    if st == 3 or st == 2:
        raise Unsupported(f"{call}: status {st}")
    L.check(st, call)
    return pd


# ---------------------------------------------------------------------- matmul
def _out_dtype(a, b):
    if a.dtype.kind in "iu":
        return np.dtype(np.int32)
    return a.dtype


def matmul(a, b, bias=None, post_ops=(), out=None, out_dtype=None):
    """a @ b with numpy broadcasting of the batch dims; `bias` (broadcast to the output,
    e.g. (n,)) added, then `post_ops` in order: ("relu"|"gelu"|"tanh"|..., alpha, beta) or
    ("binary:add"|"binary:mul"|..., array broadcast to the output). int8 inputs (u8/s8 x
    s8) give int32. Writes into `out` when given (a C-contiguous array of the result)."""
    nd = max(a.ndim, b.ndim)
    ash = (1,) * (nd - a.ndim) + a.shape
    bsh = (1,) * (nd - b.ndim) + b.shape
    batch = tuple(max(x, y) for x, y in zip(ash[:-2], bsh[:-2]))
    oshape = batch + (ash[-2], bsh[-1])
    od = np.dtype(out_dtype) if out_dtype is not None else _out_dtype(a, b)
    if out is None:
        out = np.empty(oshape, od)
    elif out.shape != oshape or out.dtype != od or not out.flags.c_contiguous:
        raise Unsupported("out buffer")
    if 0 in oshape:
        return out
    if ash[-1] == 0:
        out[...] = 0
        return out
    bins = [p[1] for p in post_ops if p[0].startswith("binary:")]
    key = ("matmul", _layout(a), _layout(b), od.str,
           None if bias is None else _layout(bias),
           tuple((p[0], _layout(p[1])) if p[0].startswith("binary:") else p
                 for p in post_ops))
    prim = _cached(key, lambda: _build_matmul(a, b, ash, bsh, oshape, od, bias, post_ops))
    arrays = [a, b, out] + ([bias] if bias is not None else []) + bins
    prim.run(arrays)
    return out


def _build_matmul(a, b, ash, bsh, oshape, od, bias, post_ops):
    dll = L.lib()
    amd, bmd, omd = _amd(a, ash), _amd(b, bsh), _md(oshape, od)
    bias_md = None
    if bias is not None:
        bias_md = _amd(bias, (1,) * (len(oshape) - bias.ndim) + bias.shape)
    po, extra = [], []
    for p in post_ops:
        if p[0].startswith("binary:"):
            m = _amd(p[1], (1,) * (len(oshape) - p[1].ndim) + p[1].shape)
            extra.append(m)
            po.append((p[0], m))
        else:
            po.append(p)
    attr = _attr(po)
    try:
        pd = _pd(dll.dnnl_matmul_primitive_desc_create, "matmul", L.engine(), amd, bmd,
                 bias_md, omd, attr)
        ids = [L.ARG_SRC, L.ARG_WEIGHTS, L.ARG_DST] + ([L.ARG_BIAS] if bias is not None
                                                       else [])
        ids += [L.ARG_POST_OP_BASE * (i + 1) | L.ARG_SRC_1 for i, p in enumerate(post_ops)
                if p[0].startswith("binary:")]
        mds = [amd, bmd, omd] + ([bias_md] if bias is not None else []) + extra
        return _Prim(pd, ids, mds)
    finally:
        dll.dnnl_primitive_attr_destroy(attr)
        _destroy(amd, bmd, omd, bias_md, *extra)


# ---------------------------------------------------------------------- convolution
def _conv_geom(h, k, s, p, d, o):
    """oneDNN's padding_r for input length h, output length o (may be < padding_l)."""
    return (o - 1) * s + (k - 1) * d + 1 - h - p


def _wmd(w, groups, transposed=False):
    """Weights (O, I/g, kh, kw) as oneDNN's (g, O/g, I/g, kh, kw) when grouped."""
    if groups == 1:
        return _amd(w)
    o = w.shape[0]
    shape = (groups, o // groups) + tuple(w.shape[1:])
    st = (w.strides[0] * (o // groups),) + tuple(w.strides)
    v = np.lib.stride_tricks.as_strided(w, shape, st)
    return _amd(v)


def _conv_params(xs, ys, ks, stride, padding, dilation):
    pr = [_conv_geom(xs[i], ks[i], stride[i], padding[i], dilation[i], ys[i]) for i in (0, 1)]
    return (_dims(stride), _dims([d - 1 for d in dilation]), _dims(padding), _dims(pr))


def conv2d(x, w, stride, padding, dilation, groups, bias=None, post_ops=()):
    """Convolution forward (NCHW, weights (O, I/g, kh, kw)) -> (N, O, Ho, Wo)."""
    n, _c, h, wd = x.shape
    o, _cg, kh, kw = w.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.empty((n, o, ho, wo), x.dtype)
    if y.size == 0:
        return y
    key = ("conv", _layout(x), _layout(w), stride, padding, dilation, groups,
           None if bias is None else _layout(bias), tuple(post_ops))
    prim = _cached(key, lambda: _build_conv_fwd(x, w, y, stride, padding, dilation, groups,
                                                bias, post_ops)[0])
    prim.run([x, w, y] + ([bias] if bias is not None else []))
    return y


def _fwd_pd(x, w, y, stride, padding, dilation, groups, bias, post_ops, prop):
    dll = L.lib()
    xmd, wmd, ymd = _amd(x), _wmd(w, groups), _md(y.shape, y.dtype)
    bmd = _amd(bias) if bias is not None else None
    st, dl, pl, pr = _conv_params(x.shape[2:], y.shape[2:], w.shape[2:], stride, padding,
                                  dilation)
    attr = _attr(post_ops)
    try:
        pd = _pd(dll.dnnl_convolution_forward_primitive_desc_create, "conv forward",
                 L.engine(), prop, L.CONVOLUTION_DIRECT, xmd, wmd, bmd, ymd, st, dl, pl, pr,
                 attr)
    finally:
        dll.dnnl_primitive_attr_destroy(attr)
    return pd, (xmd, wmd, ymd, bmd), (st, dl, pl, pr)


def _build_conv_fwd(x, w, y, stride, padding, dilation, groups, bias, post_ops):
    pd, mds, _ = _fwd_pd(x, w, y, stride, padding, dilation, groups, bias, post_ops,
                         L.FORWARD_INFERENCE)
    try:
        ids = [L.ARG_SRC, L.ARG_WEIGHTS, L.ARG_DST] + ([L.ARG_BIAS] if bias is not None else [])
        return (_Prim(pd, ids, [m for m in mds if m is not None]),)
    finally:
        _destroy(*mds)


def conv2d_backward_data(g, w, in_hw, stride, padding, dilation, groups):
    """The input gradient of conv2d: g (N, O, Ho, Wo), w (O, I/g, kh, kw) -> (N, I, *in_hw)
    (sampan's conv_transpose2d with weight (in, out/g, kh, kw) is this with O = its in)."""
    n, o = g.shape[:2]
    c = w.shape[1] * groups
    dx = np.empty((n, c) + tuple(in_hw), g.dtype)
    if dx.size == 0:
        return dx
    key = ("conv_bwd_data", _layout(g), _layout(w), tuple(in_hw), stride, padding, dilation,
           groups)
    prim = _cached(key, lambda: _build_bwd(dx, w, g, stride, padding, dilation, groups,
                                           "data"))
    prim.run([g, w, dx])
    return dx


def conv2d_backward_weights(x, g, kernel_size, stride, padding, dilation, groups):
    """The weight gradient of conv2d: x (N, C, H, W), g (N, O, Ho, Wo) -> (O, C/g, kh, kw)."""
    o = g.shape[1]
    dw = np.empty((o, x.shape[1] // groups) + tuple(kernel_size), x.dtype)
    if dw.size == 0 or x.shape[0] == 0:
        dw[...] = 0
        return dw
    key = ("conv_bwd_weights", _layout(x), _layout(g), tuple(kernel_size), stride, padding,
           dilation, groups)
    prim = _cached(key, lambda: _build_bwd(x, dw, g, stride, padding, dilation, groups,
                                           "weights"))
    prim.run([x, g, dw])
    return dw


def _build_bwd(x, w, g, stride, padding, dilation, groups, which):
    dll = L.lib()
    hint, mds, (st, dl, pl, pr) = _fwd_pd(x, w, g, stride, padding, dilation, groups, None,
                                          (), L.FORWARD_TRAINING)
    xmd, wmd, gmd = mds[0], mds[1], _amd(g)
    attr = _attr()
    try:
        if which == "data":
            pd = _pd(dll.dnnl_convolution_backward_data_primitive_desc_create,
                     "conv backward data", L.engine(), L.CONVOLUTION_DIRECT, xmd, wmd, gmd,
                     st, dl, pl, pr, hint, attr)
            return _Prim(pd, [L.ARG_DIFF_DST, L.ARG_WEIGHTS, L.ARG_DIFF_SRC],
                         [gmd, wmd, xmd])
        pd = _pd(dll.dnnl_convolution_backward_weights_primitive_desc_create,
                 "conv backward weights", L.engine(), L.CONVOLUTION_DIRECT, xmd, wmd, None,
                 gmd, st, dl, pl, pr, hint, attr)
        return _Prim(pd, [L.ARG_SRC, L.ARG_DIFF_DST, L.ARG_DIFF_WEIGHTS], [xmd, gmd, wmd])
    finally:
        dll.dnnl_primitive_attr_destroy(attr)
        dll.dnnl_primitive_desc_destroy(hint)
        _destroy(*[m for m in mds if m is not None], gmd)


# ---------------------------------------------------------------------- pooling
def pool2d(x, kind, kernel_size, stride, padding, out_hw, dilation=(1, 1)):
    """Max ("max") or average ("avg_include" / "avg_exclude" padding) pooling forward
    with output size `out_hw` (ceil mode: a larger right padding)."""
    n, c = x.shape[:2]
    y = np.empty((n, c) + tuple(out_hw), x.dtype)
    if y.size == 0:
        return y
    alg = {"max": L.POOLING_MAX, "avg_include": L.POOLING_AVG_INCLUDE,
           "avg_exclude": L.POOLING_AVG_EXCLUDE}[kind]
    key = ("pool", kind, _layout(x), tuple(kernel_size), tuple(stride), tuple(padding),
           tuple(out_hw), tuple(dilation))
    prim = _cached(key, lambda: _build_pool(x, y, alg, kernel_size, stride, padding,
                                            dilation))
    prim.run([x, y])
    return y


def _build_pool(x, y, alg, kernel_size, stride, padding, dilation):
    dll = L.lib()
    xmd, ymd = _amd(x), _md(y.shape, y.dtype)
    st, dl, pl, pr = _conv_params(x.shape[2:], y.shape[2:], kernel_size, stride, padding,
                                  dilation)
    attr = _attr()
    try:
        pd = _pd(dll.dnnl_pooling_forward_primitive_desc_create, "pooling",
                 L.engine(), L.FORWARD_INFERENCE, alg, xmd, ymd, st, _dims(kernel_size), dl,
                 pl, pr, attr)
        return _Prim(pd, [L.ARG_SRC, L.ARG_DST], [xmd, ymd])
    finally:
        dll.dnnl_primitive_attr_destroy(attr)
        _destroy(xmd, ymd)
