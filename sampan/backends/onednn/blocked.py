"""Float32 convolution regions run in oneDNN's own (blocked) layouts.

oneDNN's fastest float32 convolutions on AVX-512 read and write blocked layouts
(nChw16c, or channels-last for its brgemm kernels) with weights in the layout the
primitive picks; on plain NCHW it falls back to im2col + GEMM at about half the speed
(ResNet-18's 3x3 layers on a 2-core Sapphire Rapids: 2.9 -> 1.4 ms, onnxruntime 1.3 ms).
A reorder at every convolution would spend that gain, so the `onednn_layout` pass
(`sampan/passes/onednn_layout.py`) gives a connected region of convolutions, their
epilogues, max-pools, channel slices and concats to one `engine` node (engine="onednn"),
planned by `plan.py`, and this module runs it: values inside the region stay in the
layouts oneDNN picks, reorders run only where the region reads or returns a plain array
or where a primitive takes no fast kernel for its producer's layout.

`Region(node)` builds, at compile time for concrete shapes: per unit a primitive with its
source, weights and destination in "any" format (a region input is read in place where a
fast kernel takes the plain layout, e.g. a 3-channel first layer), weights reordered
once, one buffer per value inside the region (a channel slice is a view of its parent's),
reorders at the plain edges; a call sets the plain arrays' handles and executes the list.
The onednn provider binds it once per node and shape (`provider.bind_region`), so a served program
pays nothing per call but the primitives; `labels` name the steps (with oneDNN's
implementation) for profiling.

Threads: `regionrace.fastest(node)` races a region on the process's OpenMP threads
against the same region on one thread (`regionrace.ThreadedRegion`) and keeps the faster.

Example::

    >>> run = Region(node)             # an engine node compiled for concrete shapes
    >>> y = run(x, w1, b1)             # the node's inputs, constants included
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import _lib as L
from .plan import F32, PlanError, Unsupported, plan  # noqa: F401 (PlanError: re-exported)
from .primitives import _attr, _conv_params, _destroy, _dims, _md, _pd

_FORMAT_ANY = 1                  # dnnl_format_tag_any
_Q_SRC, _Q_WEIGHTS, _Q_DST = 129, 131, 133     # dnnl_query_{src,weights,dst}_md
_ARG_MULTIPLE_SRC = 1024         # DNNL_ARG_MULTIPLE_SRC (concat's sources: + i)
_RESAMPLING_NEAREST = 0x2fff0    # dnnl_resampling_nearest
_READY = {"done": False}
_P, _I, _D = ctypes.c_void_p, ctypes.c_int, L.Dims
_PP = ctypes.POINTER(ctypes.c_void_p)
# the C calls this module uses beyond `_lib`'s list: name -> (argument types, result type)
_PROTOS = {
    "dnnl_memory_desc_create_with_tag": ([_PP, _I, _D, _I, _I], _I),
    "dnnl_memory_desc_create_with_string_tag": ([_PP, _I, _D, _I, ctypes.c_char_p], _I),
    "dnnl_memory_desc_create_submemory": ([_PP, _P, _D, _D], _I),
    "dnnl_memory_desc_clone": ([_PP, _P], _I),
    "dnnl_memory_desc_equal": ([_P, _P], _I),
    "dnnl_memory_desc_get_size": ([_P], ctypes.c_size_t),
    "dnnl_primitive_desc_query_md": ([_P, _I, _I], _P),
    "dnnl_reorder_primitive_desc_create": ([_PP, _P, _P, _P, _P, _P], _I),
    "dnnl_binary_primitive_desc_create": ([_PP, _P, _I, _P, _P, _P, _P], _I),
    "dnnl_concat_primitive_desc_create": ([_PP, _P, _P, _I, _I, _PP, _P], _I),
    "dnnl_resampling_forward_primitive_desc_create": ([_PP, _P, _I, _I, _P, _P, _P, _P],
                                                      _I),
}


def _protos():
    if _READY["done"]:
        return
    dll = L.lib()
    for name, (args, res) in _PROTOS.items():
        fn = getattr(dll, name)
        fn.argtypes, fn.restype = args, res
    _READY["done"] = True


def _any(shape):
    md = ctypes.c_void_p()
    L.check(L.lib().dnnl_memory_desc_create_with_tag(
        ctypes.byref(md), len(shape), _dims(shape), L.F32, _FORMAT_ANY),
        "dnnl_memory_desc_create_with_tag")
    return md


def _tagged(shape, tag):
    """A memory descriptor of `shape` in the layout oneDNN's string `tag` names."""
    md = ctypes.c_void_p()
    L.check(L.lib().dnnl_memory_desc_create_with_string_tag(
        ctypes.byref(md), len(shape), _dims(shape), L.F32, tag.encode()),
        "dnnl_memory_desc_create_with_string_tag")
    return md


def _query(pd, what):
    dll = L.lib()
    md = ctypes.c_void_p()
    L.check(dll.dnnl_memory_desc_clone(ctypes.byref(md),
                                       dll.dnnl_primitive_desc_query_md(pd, what, 0)),
            "dnnl_memory_desc_clone")
    return md


def _slow(impl):
    """oneDNN's fallbacks: reference loops, or im2col + GEMM on plain layouts."""
    return impl.startswith("ref") or "gemm" in impl


def _impl(pd):
    info = ctypes.c_char_p()
    L.lib().dnnl_primitive_desc_query(pd, L.QUERY_IMPL_INFO_STR, 0, ctypes.byref(info))
    return (info.value or b"").decode()


class Region:
    """The compiled kernel of one onednn engine node (concrete shapes, constant weights):
    `region(*arrays, out=None)` -> the node's outputs (see module doc)."""

    threads = None     # the calling thread's OpenMP count (regionrace.ThreadedRegion: n)

    def __init__(self, node):
        _protos()
        if L.lib() is None:
            raise Unsupported(L.why_unavailable())
        self.lock = threading.Lock()
        self._mds, self._mems, self._prims, self._keep = [], [], [], []
        try:
            self._build(node)
        except BaseException:
            self.close()
            raise

    # -- helpers that remember what they made (freed by close)
    def _md_keep(self, md):
        self._mds.append(md)
        return md

    def _mem(self, md, data=None):
        m = ctypes.c_void_p()
        L.check(L.lib().dnnl_memory_create(ctypes.byref(m), md, L.engine(),
                                           ctypes.c_void_p(data) if data else None),
                "dnnl_memory_create")
        self._mems.append(m)
        return m

    def _buffer(self, md):
        n = int(L.lib().dnnl_memory_desc_get_size(md))
        raw = np.empty(n + 64, np.uint8)
        off = (-raw.ctypes.data) % 64
        buf = raw[off:off + n]
        self._keep.append(raw)
        return buf

    def _prim(self, pd, once=False):
        impl = _impl(pd)
        if impl.startswith("ref") and not once:   # a one-time weight reorder may be ref
            L.lib().dnnl_primitive_desc_destroy(pd)
            raise Unsupported(f"{self.what}: only oneDNN's reference implementation ({impl})")
        prim = ctypes.c_void_p()
        st = L.lib().dnnl_primitive_create(ctypes.byref(prim), pd)
        L.lib().dnnl_primitive_desc_destroy(pd)
        L.check(st, "dnnl_primitive_create")
        self._prims.append(prim)
        self.impls.append(impl)
        self.last_impl = impl
        return prim

    def _step(self, prim, args, label):
        arr = (L.ExecArg * len(args))(*[L.ExecArg(a, m) for a, m in args])
        self.steps.append((prim, len(args), arr))
        self.labels.append(label)

    def _reorder(self, src_md, dst_md, once=False):
        pd = ctypes.c_void_p()
        st = L.lib().dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src_md, L.engine(),
                                                        dst_md, L.engine(), None)
        if st in (2, 3):
            raise Unsupported(f"reorder: status {st}")
        L.check(st, "dnnl_reorder_primitive_desc_create")
        return self._prim(pd, once)

    def _equal(self, a, b):
        return bool(L.lib().dnnl_memory_desc_equal(a, b))

    # -- build
    def _build(self, node):
        from ...ops.registry import OPS, Spec
        a = node.attrs
        body, outputs = a["body"], tuple(a["outputs"])
        self.impls, self.steps, self.post_steps, self.labels = [], [], [], []
        self.what = "region"
        ins = node.inputs
        consts = [np.asarray(v.const) if v.is_const else None for v in ins]
        specs = [Spec(tuple(v.shape), v.dtype) for v in ins]
        for ent in body:
            r = OPS[ent[0]].shape_rule(*[specs[i] for i in ent[1]], **dict(ent[2]))
            specs.extend(r if isinstance(r, (list, tuple)) else [r])
        shapes = {i: tuple(s.shape) for i, s in enumerate(specs)}
        for i, s in enumerate(specs):
            if not all(isinstance(d, int) for d in s.shape):
                raise Unsupported("symbolic shapes: compile for concrete sizes")
            if s.dtype != F32 and not (i < len(ins) and consts[i] is not None):
                raise Unsupported(f"dtype {s.dtype}")      # (index constants may be int)
        units = plan(body, consts, outputs, shapes)
        self.units = units
        self.out_shapes = [shapes[o] for o in outputs]
        self.feed = [i for i, c in enumerate(consts) if c is None]
        self.in_shapes = {i: shapes[i] for i in self.feed}
        self.node_inputs = len(ins)
        md_of = {}                   # internal value key -> its (blocked) md
        mem_of = {}                  # value key -> [(md, memory object over its data)]
        self.ext_in = []             # (memory, node input index): handles set per call
        self.ext_out = []            # (memory, output position)
        plain = {}                   # node input index -> its plain md
        out_pos = {o: j for j, o in enumerate(outputs)}

        def plain_md(shape):
            return self._md_keep(_md(shape, F32))

        def ext_mem(i, md):
            """A memory over node input `i` in layout `md`: the plain array itself, or a
            buffer reordered from it before the steps that read it (one per layout)."""
            if i not in plain:
                plain[i] = plain_md(shapes[i])
            for m_md, mem in mem_of.get(i, ()):
                if self._equal(m_md, md):
                    return mem
            if self._equal(plain[i], md):
                mem = self._mem(md)
                self.ext_in.append((mem, i))
            else:
                src = self._mem(plain[i])
                self.ext_in.append((src, i))
                buf = self._buffer(md)
                mem = self._mem(md, buf.ctypes.data)
                self.pre.append((self._reorder(plain[i], md), src, mem,
                                 f"reorder input {i} {list(shapes[i])} ({self.last_impl})"))
            mem_of.setdefault(i, []).append((md, mem))
            return mem

        self.pre = []                # input reorders: (prim, src mem, dst mem)
        ptr_of, direct_out = {}, {}  # internal key -> its buffer's address / output index

        def dest(key, dmd, ys):
            """The memory a unit writes value `key` into: a buffer in layout `dmd`
            (reordered out after the steps if the node returns it), or the returned
            plain array itself where `dmd` is the plain layout."""
            out_plain = plain_md(ys)
            if key in out_pos and self._equal(dmd, out_plain):
                ymem = self._mem(dmd)
                self.ext_out.append((ymem, out_pos[key]))
                direct_out[key] = out_pos[key]
            else:
                buf = self._buffer(dmd)
                ymem = self._mem(dmd, buf.ctypes.data)
                ptr_of[key] = buf.ctypes.data
                if key in out_pos:
                    omem = self._mem(out_plain)
                    self.ext_out.append((omem, out_pos[key]))
                    self.post_steps.append((self._reorder(dmd, out_plain), ymem, omem,
                                            f"reorder output {list(ys)} ({self.last_impl})"))
            md_of[key] = dmd
            mem_of[key] = [(dmd, ymem)]
            return ymem

        def view(key, md, parent):
            """Value `key` as `md` over the data of internal value `parent` (no copy)."""
            if parent in direct_out:
                mem = self._mem(md)
                self.ext_out.append((mem, direct_out[parent]))
                direct_out[key] = direct_out[parent]
            else:
                mem = self._mem(md, ptr_of[parent])
                ptr_of[key] = ptr_of[parent]
            md_of[key] = md
            mem_of[key] = [(md, mem)]
            if key in out_pos:
                out_plain = plain_md(shapes[key])
                omem = self._mem(out_plain)
                self.ext_out.append((omem, out_pos[key]))
                self.post_steps.append((self._reorder(md, out_plain), mem, omem,
                                        f"reorder output {list(shapes[key])} "
                                        f"({self.last_impl})"))

        def source(x, md, label):
            """The memory of value `x` in layout `md`: its own, or reordered into `md`
            (a step before the one that reads it)."""
            if x not in md_of:
                return ext_mem(x, md)
            for m_md, mem in mem_of[x]:          # its own layout, or one made already
                if self._equal(m_md, md):
                    return mem
            buf = self._buffer(md)
            dst = self._mem(md, buf.ctypes.data)
            self._step(self._reorder(md_of[x], md), [(L.ARG_SRC, mem_of[x][0][1]),
                                                     (L.ARG_DST, dst)],
                       f"reorder {label} ({self.last_impl})")
            mem_of[x].append((md, dst))
            return dst

        for u in units:
            if u.kind != "conv":
                self._layout(u, shapes, md_of, mem_of, dest, view, source, plain_md)
                continue
            xs = shapes[u.x]
            self.what = (f"conv2d {list(xs)} x {list(consts[u.w].shape)} "
                         f"{dict(u.attrs)} + {[p[:2] for p in u.post]}")
            w = consts[u.w]
            o = w.shape[0]
            at = u.attrs
            stride, padding = tuple(at["stride"]), tuple(at["padding"])
            dilation, groups = tuple(at["dilation"]), int(at["groups"])
            kh, kw = w.shape[2:]
            ho = (xs[2] + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
            wo = (xs[3] + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
            ys = (xs[0], o, ho, wo)
            wshape = tuple(w.shape) if groups == 1 else (groups, o // groups) + tuple(
                w.shape[1:])
            internal_x = u.x in md_of
            # a region input: read in place where a fast kernel takes the plain layout
            # (a 3-channel first layer), else reordered into the layout oneDNN picks
            xmd = md_of[u.x] if internal_x else plain_md(xs)
            wmd = self._md_keep(_any(wshape))
            bmd = plain_md((o,)) if u.bias is not None else None
            st, dl, pl, pr = _conv_params(xs[2:], ys[2:], (kh, kw), stride, padding,
                                          dilation)
            # post-ops: tensor terms (binary add) first, then the epilogue in order
            post = [("binary", "add", t) for t in u.terms] + list(u.post)

            def make_pd(dst_md, bin_md):
                po = []
                for item in post:
                    if item[0] == "eltwise":
                        po.append(item[1:])
                    else:
                        src1 = item[2]
                        md = (plain_md((1, o, 1, 1)) if isinstance(src1, np.ndarray)
                              else bin_md)
                        po.append(("binary:" + item[1], md))
                attr = _attr(po)
                try:
                    return _pd(L.lib().dnnl_convolution_forward_primitive_desc_create,
                               "conv forward", L.engine(), L.FORWARD_INFERENCE,
                               L.CONVOLUTION_DIRECT, xmd, wmd, bmd, dst_md, st, dl, pl, pr,
                               attr)
                finally:
                    L.lib().dnnl_primitive_attr_destroy(attr)
            has_tensor = any(it[0] == "binary" and not isinstance(it[2], np.ndarray)
                             for it in post)
            dmd = self._md_keep(_any(ys))
            conv_pd = L.lib().dnnl_convolution_forward_primitive_desc_create
            pd0 = _pd(conv_pd, "conv forward", L.engine(), L.FORWARD_INFERENCE,
                      L.CONVOLUTION_DIRECT, xmd, wmd, bmd, dmd, st, dl, pl, pr, None)
            if _slow(_impl(pd0)):
                # no fast kernel reads the producer's layout (a depthwise conv after a
                # 16-channel-blocked one): reorder into the layout oneDNN picks for it
                L.lib().dnnl_primitive_desc_destroy(pd0)
                xmd = self._md_keep(_any(xs))
                pd0 = _pd(conv_pd, "conv forward", L.engine(), L.FORWARD_INFERENCE,
                          L.CONVOLUTION_DIRECT, xmd, wmd, bmd, dmd, st, dl, pl, pr, None)
            if has_tensor:           # the destination's layout first, then the tensors in it
                dmd = self._md_keep(_query(pd0, _Q_DST))
            L.lib().dnnl_primitive_desc_destroy(pd0)
            pd = make_pd(dmd, dmd)
            smd = self._md_keep(_query(pd, _Q_SRC))
            wq = self._md_keep(_query(pd, _Q_WEIGHTS))
            dmd = self._md_keep(_query(pd, _Q_DST))
            conv = self._prim(pd)
            conv_impl = self.last_impl
            # weights: reordered once into the primitive's layout
            from .primitives import _wmd
            wc = np.ascontiguousarray(w, F32)
            self._keep.append(wc)
            wsrc = _wmd(wc, groups)
            self._md_keep(wsrc)
            wbuf = self._buffer(wq)
            wmem = self._mem(wq, wbuf.ctypes.data)
            if self._equal(wsrc, wq):
                wbuf[...] = wc.reshape(-1).view(np.uint8)
            else:
                rp = self._reorder(wsrc, wq, once=True)
                m_src = self._mem(wsrc, wc.ctypes.data)
                args = (L.ExecArg * 2)(L.ExecArg(L.ARG_SRC, m_src), L.ExecArg(L.ARG_DST, wmem))
                L.check(L.lib().dnnl_primitive_execute(rp, L.stream(), 2, args),
                        "dnnl_primitive_execute")
                L.lib().dnnl_stream_wait(L.stream())
            # source
            xmem = source(u.x, smd, f"{list(xs)} before a conv")
            args = [(L.ARG_SRC, xmem), (L.ARG_WEIGHTS, wmem)]
            if bmd is not None:
                bias = np.ascontiguousarray(u.bias, F32)
                self._keep.append(bias)
                args.append((L.ARG_BIAS, self._mem(bmd, bias.ctypes.data)))
            for i, item in enumerate(post):
                if item[0] != "binary":
                    continue
                arg = L.ARG_POST_OP_BASE * (i + 1) | L.ARG_SRC_1
                src1 = item[2]
                if isinstance(src1, np.ndarray):
                    c = np.ascontiguousarray(src1, F32).reshape(1, o, 1, 1)
                    self._keep.append(c)
                    args.append((arg, self._mem(plain_md((1, o, 1, 1)), c.ctypes.data)))
                else:                  # a residual, in the conv's destination layout
                    args.append((arg, source(src1, dmd, f"residual {list(ys)}")))
            ymem = dest(u.out, dmd, ys)
            args.append((L.ARG_DST, ymem))
            self._step(conv, args, f"{self.what} ({conv_impl})")
        for o in outputs:
            if o not in md_of:
                raise Unsupported("a region output that no unit computes")

        def two(p, s, d):
            return (p, 2, (L.ExecArg * 2)(L.ExecArg(L.ARG_SRC, s), L.ExecArg(L.ARG_DST, d)))
        self.steps = [two(*r[:3]) for r in self.pre] + self.steps + [
            two(*r[:3]) for r in self.post_steps]
        self.labels = [r[3] for r in self.pre] + self.labels + [r[3] for r in self.post_steps]

    def _layout(self, u, shapes, md_of, mem_of, dest, view, source, plain_md):
        """A max-pool, channel slice or channel concat inside the region."""
        dll = L.lib()
        ys = shapes[u.out]
        if u.kind == "slice":
            a, b = u.attrs["channels"]
            dims = (ys[0], b - a) + tuple(ys[2:])
            md = ctypes.c_void_p()
            st = dll.dnnl_memory_desc_create_submemory(ctypes.byref(md), md_of[u.x],
                                                        _dims(dims), _dims((0, a, 0, 0)))
            if st != 0:
                raise Unsupported(f"channels {a}:{b} of a {list(shapes[u.x])} value: "
                                  f"no view in its layout (status {st})")
            view(u.out, self._md_keep(md), u.x)
            return
        if u.kind == "gap":                 # mean over height and width: avg pooling
            xs = shapes[u.x]
            self.what = f"mean {list(xs)} over height and width"
            xmd = md_of[u.x] if u.x in md_of else plain_md(xs)
            dmd = self._md_keep(_any(ys))
            pd = _pd(dll.dnnl_pooling_forward_primitive_desc_create, "pooling",
                     L.engine(), L.FORWARD_INFERENCE, L.POOLING_AVG_EXCLUDE, xmd, dmd,
                     _dims((1, 1)), _dims(xs[2:]), _dims((0, 0)), _dims((0, 0)),
                     _dims((0, 0)), None)
            dmd = self._md_keep(_query(pd, _Q_DST))
            prim = self._prim(pd)
            impl = self.last_impl
            xmem = source(u.x, xmd, f"{list(xs)} before a mean")
            self._step(prim, [(L.ARG_SRC, xmem), (L.ARG_DST, dest(u.out, dmd, ys))],
                       f"{self.what} ({impl})")
            return
        if u.kind == "resize":              # nearest upsample: a resampling primitive
            xs = shapes[u.x]
            self.what = f"nearest upsample {list(xs)} -> {list(ys)}"
            xmd = md_of[u.x] if u.x in md_of else plain_md(xs)
            pd = _pd(dll.dnnl_resampling_forward_primitive_desc_create, "resampling",
                     L.engine(), L.FORWARD_INFERENCE, _RESAMPLING_NEAREST, None, xmd,
                     self._md_keep(_any(ys)), None)
            dmd = self._md_keep(_query(pd, _Q_DST))
            prim = self._prim(pd)
            impl = self.last_impl
            xmem = source(u.x, xmd, f"{list(xs)} before an upsample")
            self._step(prim, [(L.ARG_SRC, xmem), (L.ARG_DST, dest(u.out, dmd, ys))],
                       f"{self.what} ({impl})")
            return
        if u.kind == "scale":               # x * s, s per channel: a binary primitive
            x, sc = u.xs
            xs = shapes[x]
            self.what = f"mul {list(xs)} by {list(shapes[sc])}"
            xmd = md_of[x] if x in md_of else plain_md(xs)
            dmd = self._md_keep(_any(ys))
            # the scale in x's layout: oneDNN's fast binary kernels want both alike
            for x_tag, s_tag in ((None, None), (None, "acdb"), (None, "aBcd16b"),
                                 (None, "aBcd8b"), ("acdb", "acdb")):
                if x_tag is not None:
                    xmd = self._md_keep(_tagged(xs, x_tag))
                smd = plain_md(shapes[sc]) if s_tag is None else self._md_keep(
                    _tagged(shapes[sc], s_tag))
                try:
                    pd = _pd(dll.dnnl_binary_primitive_desc_create, "binary", L.engine(),
                             L.BINARY["mul"], xmd, smd, dmd, None)
                except Unsupported:
                    continue
                if not _slow(_impl(pd)):
                    break
                dll.dnnl_primitive_desc_destroy(pd)
            else:
                raise Unsupported(f"{self.what}: no fast binary kernel for its layouts")
            dmd = self._md_keep(_query(pd, _Q_DST))
            prim = self._prim(pd)
            impl = self.last_impl
            args = [(L.ARG_SRC, source(x, xmd, f"{list(xs)} before a mul")),
                    (L.ARG_SRC_1, source(sc, smd, f"{list(shapes[sc])} before a mul")),
                    (L.ARG_DST, dest(u.out, dmd, ys))]
            self._step(prim, args, f"{self.what} ({impl})")
            return
        if u.kind == "pool":
            at = u.attrs
            xs = shapes[u.x]
            self.what = f"max_pool2d {list(xs)} {at}"
            xmd = md_of[u.x] if u.x in md_of else plain_md(xs)
            dmd = self._md_keep(_any(ys))

            def pool_pd(xmd):
                return _pd(dll.dnnl_pooling_forward_primitive_desc_create, "pooling",
                           L.engine(), L.FORWARD_INFERENCE, L.POOLING_MAX, xmd, dmd,
                           _dims(at["stride"]), _dims(at["kernel"]), _dims((0, 0)),
                           _dims(at["pad_l"]), _dims(at["pad_r"]), None)
            pd = pool_pd(xmd)
            if _slow(_impl(pd)):
                dll.dnnl_primitive_desc_destroy(pd)
                pd = pool_pd(self._md_keep(_any(xs)))
            smd = self._md_keep(_query(pd, _Q_SRC))
            dmd = self._md_keep(_query(pd, _Q_DST))
            prim = self._prim(pd)
            impl = self.last_impl
            xmem = source(u.x, smd, f"{list(xs)} before a max-pool")
            ymem = dest(u.out, dmd, ys)
            self._step(prim, [(L.ARG_SRC, xmem), (L.ARG_DST, ymem)], f"{self.what} ({impl})")
            return
        # concat of channels: of the sources as they lie, or (where only oneDNN's
        # reference concat takes their mix of layouts) each reordered to channels-last
        self.what = f"concat {[list(shapes[x]) for x in u.xs]}"

        def concat_pd(mds, dst):
            pd = ctypes.c_void_p()
            srcs = (ctypes.c_void_p * len(mds))(*mds)
            st = dll.dnnl_concat_primitive_desc_create(ctypes.byref(pd), L.engine(), dst,
                                                       len(mds), 1, srcs, None)
            if st in (2, 3):
                raise Unsupported(f"{self.what}: status {st}")
            L.check(st, "dnnl_concat_primitive_desc_create")
            return pd
        mds = [md_of[x] for x in u.xs]
        pd = concat_pd(mds, self._md_keep(_any(ys)))
        if _slow(_impl(pd)):
            dll.dnnl_primitive_desc_destroy(pd)
            mds = [self._md_keep(_tagged(shapes[x], "acdb")) for x in u.xs]
            pd = concat_pd(mds, self._md_keep(_tagged(ys, "acdb")))
        dmd = self._md_keep(_query(pd, _Q_DST))
        prim = self._prim(pd)
        impl = self.last_impl
        args = [(_ARG_MULTIPLE_SRC + i, source(x, md, f"{list(shapes[x])} before a concat"))
                for i, (x, md) in enumerate(zip(u.xs, mds))]
        args.append((L.ARG_DST, dest(u.out, dmd, ys)))
        self._step(prim, args, f"{self.what} ({impl})")

    def __call__(self, *arrays, out=None):
        dll = L.lib()
        outs = []
        for j, shape in enumerate(self.out_shapes):
            b = out[j] if out is not None and j < len(out) else None
            if b is None or b.dtype != F32 or not b.flags.c_contiguous \
                    or tuple(b.shape) != shape:
                b = np.empty(shape, F32)
            outs.append(b)
        xs = list(arrays)
        if len(xs) != self.node_inputs:
            raise L.OneDNNError(f"onednn region: got {len(xs)} arrays; expected its "
                                f"{self.node_inputs} inputs")
        for i in self.feed:
            a = xs[i]
            if tuple(a.shape) != self.in_shapes[i]:      # the primitives' sizes are fixed
                raise L.OneDNNError(f"onednn region: input {i} is {list(a.shape)}; expected "
                                    f"{list(self.in_shapes[i])} (what it was built for)")
            if a.dtype != F32 or not a.flags.c_contiguous:
                xs[i] = np.ascontiguousarray(a, F32)
        with self.lock:
            for mem, i in self.ext_in:
                dll.dnnl_memory_set_data_handle(mem, xs[i].ctypes.data)
            for mem, j in self.ext_out:
                dll.dnnl_memory_set_data_handle(mem, outs[j].ctypes.data)
            strm = L.stream()
            for prim, n, args in self.steps:
                L.check(dll.dnnl_primitive_execute(prim, strm, n, args),
                        "dnnl_primitive_execute")
            dll.dnnl_stream_wait(strm)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def example_inputs(self, node, seed=0):
        """The node's inputs for a timing call: its constants, and standard normal
        float32 arrays of the fed inputs' shapes."""
        rng = np.random.default_rng(seed)
        return [np.asarray(v.const) if v.is_const else
                rng.standard_normal(self.in_shapes[i]).astype(F32)
                for i, v in enumerate(node.inputs)]

    def close(self):
        dll = L.lib()
        if dll is None:
            return
        for m in self._mems:
            dll.dnnl_memory_destroy(m)
        for p in self._prims:
            dll.dnnl_primitive_destroy(p)
        _destroy(*self._mds)
        self._mems, self._prims, self._mds = [], [], []

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the library may be gone
            pass

