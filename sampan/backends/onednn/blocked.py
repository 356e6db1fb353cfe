"""Float32 convolution regions in oneDNN's own (blocked) layouts.

oneDNN's fastest float32 convolutions on AVX-512 read and write blocked layouts
(nChw16c: 16 channels side by side) with weights in the layout the primitive picks; on
plain NCHW it falls back to im2col + GEMM at about half the speed (ResNet-18's 3x3
layers here: 2.9 -> 1.4 ms, onnxruntime 1.3 ms). Reordering at every convolution would
spend that gain, so the `onednn_layout` pass (`sampan/passes/onednn_layout.py`) gives a
connected region of convolutions and their epilogues to one `engine` node
(engine="onednn"), and this module runs it: values inside the region stay blocked,
reorders run only where the region reads or returns a plain array.

`plan(body, inputs, outputs, shapes)` reads a region's body (the engine node's entries,
op-table ops: conv2d, and the elementwise nodes or `fused` nodes after it) as units:
one convolution with its epilogue as oneDNN post-ops in order: the bias (per-channel
constants added before anything else, folded), tensor terms added (a residual: another
region value or an input of the same shape), then eltwise (relu, tanh, sigmoid, and
x * sigmoid(x) as swish) and binary ops (add / mul of a tensor of the conv's shape or of
a per-channel constant). A sum (a + b) + (c + d) of two convolutions and their biases is
one unit: the first's bias gains the other's, which is added as a term. Whatever it
cannot express raises `Unsupported` naming the entry (the pass leaves that node out).

`Region(node)` builds, at compile time for concrete shapes: per unit a convolution
primitive with source, weights and destination in "any" format (what oneDNN picks),
weights reordered once, a buffer per value inside the region, reorders at the region's
plain inputs and outputs (none where oneDNN picked the plain layout itself); a call sets
the plain arrays' handles and executes the list. Built once per node and shape by the
provider's binder (`provider.bind`), so a served program pays nothing per call but the
primitives.

Example::

    >>> units = plan(node.attrs["body"], kinds, node.attrs["outputs"], shapes)
    >>> run = Region(node)            # node compiled for concrete shapes
    >>> y = run(x)
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import _lib as L
from .primitives import Unsupported, _attr, _conv_params, _destroy, _dims, _md, _pd

F32 = np.dtype(np.float32)
# eltwise ops that become post-ops: name -> (oneDNN algorithm, alpha, beta)
_ELTWISE = {"relu": ("relu", 0.0, 0.0), "tanh": ("tanh", 0.0, 0.0),
            "sigmoid": ("sigmoid", 0.0, 0.0)}
EPILOGUE_OPS = ("add", "sub", "mul", "div", "relu", "tanh", "sigmoid", "fused")


class PlanError(Unsupported):
    """A region entry the planner cannot express (`entry`: its body index, or None)."""

    def __init__(self, msg, entry=None):
        super().__init__(msg)
        self.entry = entry


class Unit:
    """One primitive computing value `out` (a body value index): `kind` "conv" (with its
    epilogue), "pool" (max pooling; `attrs` its kernel, stride and (left, right)
    padding), "slice" (a channel range of `x`: a view, no copy) or "concat" (channels of
    `xs`)."""
    __slots__ = ("out", "conv", "x", "w", "attrs", "bias", "terms", "post", "kind", "xs")

    def __init__(self, out, conv, x, w, attrs, kind="conv", xs=()):
        self.out, self.conv, self.x, self.w, self.attrs = out, conv, x, w, attrs
        self.kind, self.xs = kind, tuple(xs)
        self.bias = None        # float64 (C,) or None
        self.terms = []         # value keys added before the post-ops (binary add)
        self.post = []          # ("eltwise", alg, alpha, beta) | ("binary", alg, key|array)

    def __repr__(self):
        return (f"Unit(out={self.out}, conv={self.conv}, bias={self.bias is not None}, "
                f"terms={self.terms}, post={[p[:2] for p in self.post]})")


class _Prog:
    """An epilogue value: (sum of `terms` + bias) then `post`, over a conv's shape."""
    __slots__ = ("terms", "bias", "post", "shape")

    def __init__(self, terms, shape, bias=None, post=()):
        self.terms, self.shape, self.bias, self.post = list(terms), shape, bias, list(post)

    def copy(self):
        return _Prog(self.terms, self.shape, None if self.bias is None else self.bias.copy(),
                     self.post)


def _flatten(body, n_in):
    """Body entries as atoms (key, op, arg keys, attrs dict, entry index): a fused entry
    contributes its own body (inner values keyed ("f", entry, local index)); the key of an
    entry's (single) output is its value index."""
    atoms, k = [], n_in
    for e, ent in enumerate(body):
        op, idx, attrs, n_out = ent
        attrs = dict(attrs)
        if op == "fused":
            inner, outs = attrs["body"], tuple(attrs["outputs"])
            m = len(idx)
            if len(outs) != 1 or n_out != 1:
                raise PlanError("a fused entry with several outputs", e)

            def key(i, e=e, idx=idx, m=m, last=outs[0], k=k):
                if i < m:
                    return idx[i]
                return k if i == last else ("f", e, i)
            for j, sub in enumerate(inner):
                sattrs = dict(sub[2]) if len(sub) > 2 else {}
                atoms.append((key(m + j), sub[0], tuple(key(i) for i in sub[1]), sattrs, e))
            if outs[0] < m:
                raise PlanError("a fused entry that returns its input", e)
        else:
            if n_out != 1:
                raise PlanError(f"op {op!r} with {n_out} outputs", e)
            atoms.append((k, op, tuple(idx), attrs, e))
        k += n_out
    return atoms


def plan(body, inputs, outputs, shapes):
    """The units of a region body (see module doc), in execution order.

    `inputs`: per node input, an ndarray (a graph constant) or None (a tensor);
    `outputs`: the value indices the node returns; `shapes`: value index -> shape (the
    node's inputs and every entry's output; dims may be symbolic except channels)."""
    n_in = len(inputs)
    atoms = _flatten(body, n_in)
    uses: dict = {}
    users: dict = {}
    for a in atoms:
        for x in a[2]:
            uses[x] = uses.get(x, 0) + 1
            users.setdefault(x, []).append(a)
    for o in outputs:
        uses[o] = uses.get(o, 0) + 1
    outset = set(outputs)
    state: dict = {}           # key -> "mat" | ("conv", unit) | _Prog | ("sig", key)
    units = []
    pending = {}               # conv key -> Unit not yet placed (main of a prog, or raw)

    def const(x):
        return inputs[x] if isinstance(x, int) and x < n_in else None

    def materialize_conv(x):
        """A raw conv output needed as a plain value: its unit has no epilogue."""
        u = pending.pop(x)
        units.append(u)
        state[x] = "mat"

    def as_prog(x, e):
        s = state.get(x, "mat" if const(x) is None else None)
        if s is None:
            raise PlanError("an epilogue on constants only", e)
        if isinstance(s, _Prog):
            return s.copy()
        if isinstance(s, tuple) and s[0] == "sig":     # sigmoid used other than in swish
            p = as_prog(s[1], e)
            p.post.append(("eltwise", "sigmoid", 0.0, 0.0))
            return p
        return _Prog([x], tuple(shapes[x]) if x in shapes else None)

    def per_channel(c, shape, e):
        C = shape[1]
        if not isinstance(C, int):
            raise PlanError("a symbolic channel count", e)
        a = np.asarray(c)
        if a.dtype.kind not in "fiu" or a.ndim > 4:
            raise PlanError("a constant that is not per channel", e)
        s = (1,) * (4 - a.ndim) + tuple(a.shape)
        if s[0] != 1 or s[2] != 1 or s[3] != 1 or s[1] not in (1, C):
            raise PlanError(f"constant of shape {a.shape} is not per channel of {C}", e)
        return np.broadcast_to(np.asarray(a, np.float64).reshape(-1), (C,)).copy()

    def add_terms(p, q, e):
        """p + q, q a prog without post-ops (terms + bias)."""
        if not p.post:
            p.terms += q.terms
            if q.bias is not None:
                p.bias = q.bias if p.bias is None else p.bias + q.bias
            return p
        for t in q.terms:
            p.post.append(("binary", "add", t))
        if q.bias is not None:
            p.post.append(("binary", "add", q.bias))
        return p

    def finish(key, p, e):
        """Prog `p` becomes the unit computing `key`: its main conv is its last raw conv
        term used only here; other raw conv terms are materialized (binary inputs)."""
        mains = [t for t in p.terms if t in pending and continues(t)]
        if not mains:
            raise PlanError("an epilogue whose chain starts at no convolution of the "
                            "region", e)
        main = mains[-1]
        u = pending.pop(main)
        for t in p.terms:
            if t != main and t in pending:
                materialize_conv(t)
        u.out, u.bias = key, p.bias
        u.terms = [t for t in p.terms if t != main]
        u.post = p.post
        for item in u.post:
            if item[0] == "binary" and not isinstance(item[2], np.ndarray) \
                    and item[2] in pending:
                materialize_conv(item[2])
        units.append(u)
        state[key] = "mat"

    def continues(key):
        """Whether the value `key` feeds one epilogue atom only (or is the input of a
        swish pair), so its prog goes on instead of becoming a unit."""
        if key in outset:
            return False
        us = users.get(key, [])
        if len(us) == 1:
            return us[0][1] in _CHAIN
        if len(us) == 2:
            ops = sorted(a[1] for a in us)
            if ops == ["mul", "sigmoid"]:
                sig = next(a for a in us if a[1] == "sigmoid")
                mul = next(a for a in us if a[1] == "mul")
                return set(mul[2]) == {key, sig[0]} and len(users.get(sig[0], [])) == 1
        return False

    for key, op, args, attrs, e in atoms:
        if op == "conv2d":
            x, w = args[0], args[1]
            if len(args) != 2 or const(w) is None or const(x) is not None:
                raise PlanError("conv2d needs a tensor input and a constant weight", e)
            if np.asarray(const(w)).dtype != F32 or len(shapes[x]) != 4:
                raise PlanError("conv2d: float32 NCHW only", e)
            if x in pending:
                materialize_conv(x)
            elif isinstance(state.get(x), _Prog):
                raise PlanError("a conv reading an unfinished epilogue", e)
            pending[key] = Unit(key, e, x, w, attrs)
            state[key] = ("conv",)
            continue
        if op == "pad" and (key in outset or [a[1] for a in users.get(key, [])]
                            != ["max_pool2d"]):
            raise PlanError("a pad that is not a max-pool's padding", e)
        if op in _LAYOUT_OPS:
            unit = _layout_unit(key, op, args, attrs, e, state, n_in, shapes)
            if unit is None:               # a pad absorbed by the max-pool after it
                continue
            for x in (unit.xs or (unit.x,)):
                if x in pending:
                    materialize_conv(x)
                elif isinstance(state.get(x), _Prog):
                    raise PlanError(f"{op} reading an unfinished epilogue", e)
            units.append(unit)
            state[key] = "mat"
            continue
        if op not in _CHAIN:
            raise PlanError(f"op {op!r} has no oneDNN post-op", e)
        shape = None
        if op == "sigmoid" and continues_sig(key, args, users, continues):
            state[key] = ("sig", args[0])
            continue
        if op in _ELTWISE:
            p = as_prog(args[0], e)
            p.post.append(("eltwise",) + _ELTWISE[op])
        else:
            if len(args) != 2:
                raise PlanError(f"{op} with {len(args)} operands", e)
            a, b = args
            ca, cb = const(a), const(b)
            if ca is not None and cb is not None:
                raise PlanError("an epilogue on constants only", e)
            if op == "mul" and _is_sig_of(state, a, b):
                p = as_prog(b, e)
                p.post.append(("eltwise", "swish", 1.0, 0.0))
            elif op == "mul" and _is_sig_of(state, b, a):
                p = as_prog(a, e)
                p.post.append(("eltwise", "swish", 1.0, 0.0))
            elif ca is not None or cb is not None:
                if ca is not None and op in ("sub", "div"):
                    raise PlanError(f"constant {op} tensor", e)
                t, c = (b, ca) if ca is not None else (a, cb)
                p = as_prog(t, e)
                shape = p.shape
                if shape is None:
                    raise PlanError("unknown shape", e)
                vec = per_channel(c, shape, e)
                if op == "sub":
                    op, vec = "add", -vec
                elif op == "div":
                    if not np.all(vec != 0):
                        raise PlanError("division by a zero constant", e)
                    op, vec = "mul", 1.0 / vec
                if op == "add":
                    if not p.post:
                        p.bias = vec if p.bias is None else p.bias + vec
                    else:
                        p.post.append(("binary", "add", vec))
                else:
                    p.post.append(("binary", "mul", vec))
            else:
                p, q = as_prog(a, e), as_prog(b, e)
                if p.shape is None or q.shape is None or p.shape != q.shape:
                    raise PlanError(f"{op} of tensors of shapes {p.shape} and {q.shape}", e)
                if op == "add":
                    if p.post and not q.post:
                        p = add_terms(p, q, e)
                    elif q.post and not p.post:
                        p = add_terms(q, p, e)
                    elif not p.post and not q.post:
                        p = add_terms(p, q, e)
                    else:
                        raise PlanError("a sum of two activated values", e)
                elif op == "mul" and not q.post and q.bias is None and len(q.terms) == 1:
                    p.post.append(("binary", "mul", q.terms[0]))
                elif op == "mul" and not p.post and p.bias is None and len(p.terms) == 1:
                    q.post.append(("binary", "mul", p.terms[0]))
                    p = q
                else:
                    raise PlanError(f"{op} of two tensors", e)
        # operands that were materialized conv outputs become binary inputs (plain keys)
        if continues(key):
            state[key] = p
        else:
            finish(key, p, e)
    for x in list(pending):
        materialize_conv(x)
    for key, s in state.items():
        if isinstance(s, (_Prog, tuple)) and s != ("conv",) and key in outset:
            raise PlanError("an unfinished epilogue returned")
    order = {}
    for i, a in enumerate(atoms):
        order.setdefault(a[0], i)
    units.sort(key=lambda u: order[u.out])
    return units


_CHAIN = ("add", "sub", "mul", "div", "relu", "tanh", "sigmoid")
_LAYOUT_OPS = ("max_pool2d", "pad", "getitem", "concat")
ALIGN = 16                 # channel slices at multiples of this stay views in every layout


def channel_slice(index, shape):
    """(first, end) of a getitem index that takes channels first:end of an NCHW tensor
    (every other axis whole, step 1), else None."""
    if len(index) != 4 or len(shape) != 4 or not isinstance(shape[1], int):
        return None
    for d, it in enumerate(index):
        if not (isinstance(it, tuple) and len(it) == 4 and it[0] == "s" and it[3] in (None, 1)):
            return None
        if d != 1 and (it[1] not in (None, 0) or it[2] is not None):
            return None
    c = shape[1]
    a, b = index[1][1], index[1][2]
    a = 0 if a is None else a
    b = c if b is None else min(b, c)
    if not (isinstance(a, int) and isinstance(b, int)) or not 0 <= a < b <= c:
        return None
    return a, b


def neg_inf_pad(attrs) -> bool:
    """A pad of spatial dims only with -inf (what a max-pool's own padding means)."""
    pads, value = attrs.get("pads"), attrs.get("value", 0.0)
    try:
        return (len(pads) == 4 and tuple(pads[0]) == (0, 0) and tuple(pads[1]) == (0, 0)
                and float(value) == float("-inf"))
    except (TypeError, ValueError):
        return False


def _layout_unit(key, op, args, attrs, e, state, n_in, shapes):
    """The unit of a max-pool / channel slice / channel concat, or None for a pad that
    the max-pool after it takes as its padding."""
    if op == "pad":
        if not neg_inf_pad(attrs):
            raise PlanError("a pad other than -inf on height and width", e)
        state[key] = ("pad", args[0], tuple(tuple(p) for p in attrs["pads"][2:]))
        return None
    if op == "max_pool2d":
        if attrs.get("ceil_mode") or tuple(attrs.get("dilation", (1, 1))) != (1, 1):
            raise PlanError("max_pool2d with ceil_mode or dilation", e)
        x = args[0]
        (pt, pl), (pb, pr) = attrs["padding"], attrs["padding"]
        s = state.get(x)
        if isinstance(s, tuple) and s[0] == "pad":
            (a0, a1), (b0, b1) = s[2]
            x, pt, pb, pl, pr = s[1], pt + a0, pb + a1, pl + b0, pr + b1
        ks = tuple(attrs["kernel_size"])
        if pt >= ks[0] or pb >= ks[0] or pl >= ks[1] or pr >= ks[1]:
            raise PlanError("max_pool2d padding as large as its window", e)
        return Unit(key, e, x, None, {"kernel": ks, "stride": tuple(attrs["stride"]),
                                      "pad_l": (pt, pl), "pad_r": (pb, pr)}, kind="pool")
    for x in args:
        if isinstance(x, int) and x < n_in:
            raise PlanError(f"{op} of a region input (it stays outside)", e)
        s = state.get(x)
        if isinstance(s, tuple) and s[0] == "pad":
            raise PlanError(f"{op} of a pad", e)
    if op == "getitem":
        if len(args) != 1:
            raise PlanError("getitem with index tensors", e)
        cs = channel_slice(attrs.get("index", ()), shapes.get(args[0], ()))
        if cs is None or cs[0] % ALIGN or cs[1] % ALIGN:
            raise PlanError(f"getitem other than channels at multiples of {ALIGN}", e)
        return Unit(key, e, args[0], None, {"channels": cs}, kind="slice")
    if attrs.get("axis") not in (1, -3) or len(args) < 2:
        raise PlanError("concat other than of channels", e)
    return Unit(key, e, None, None, {}, kind="concat", xs=args)


def continues_sig(key, args, users, continues):
    """A sigmoid whose only user is mul(its input, it), its input feeding nothing else."""
    if len(args) != 1:
        return False
    us = users.get(key, [])
    return (len(us) == 1 and us[0][1] == "mul" and set(us[0][2]) == {key, args[0]}
            and continues(args[0]))


def _is_sig_of(state, s, x):
    v = state.get(s)
    return isinstance(v, tuple) and v[0] == "sig" and v[1] == x


# ---------------------------------------------------------------------- execution
_FORMAT_ANY = 1                  # dnnl_format_tag_any
_Q_SRC, _Q_WEIGHTS, _Q_DST = 129, 131, 133     # dnnl_query_{src,weights,dst}_md
_ARG_MULTIPLE_SRC = 1024         # DNNL_ARG_MULTIPLE_SRC (concat's sources: + i)
_READY = {"done": False}


def _protos():
    """The C calls this module uses beyond `_lib`'s list (their result types differ)."""
    if _READY["done"]:
        return
    dll, p = L.lib(), ctypes.c_void_p
    dll.dnnl_memory_desc_create_with_tag.argtypes = [ctypes.POINTER(p), ctypes.c_int,
                                                     L.Dims, ctypes.c_int, ctypes.c_int]
    dll.dnnl_memory_desc_create_with_tag.restype = ctypes.c_int
    dll.dnnl_primitive_desc_query_md.argtypes = [p, ctypes.c_int, ctypes.c_int]
    dll.dnnl_primitive_desc_query_md.restype = p
    dll.dnnl_memory_desc_get_size.argtypes = [p]
    dll.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    dll.dnnl_memory_desc_equal.argtypes = [p, p]
    dll.dnnl_memory_desc_equal.restype = ctypes.c_int
    dll.dnnl_memory_desc_clone.argtypes = [ctypes.POINTER(p), p]
    dll.dnnl_memory_desc_clone.restype = ctypes.c_int
    dll.dnnl_reorder_primitive_desc_create.argtypes = [ctypes.POINTER(p), p, p, p, p, p]
    dll.dnnl_reorder_primitive_desc_create.restype = ctypes.c_int
    dll.dnnl_memory_desc_create_with_string_tag.argtypes = [ctypes.POINTER(p), ctypes.c_int,
                                                            L.Dims, ctypes.c_int,
                                                            ctypes.c_char_p]
    dll.dnnl_memory_desc_create_with_string_tag.restype = ctypes.c_int
    dll.dnnl_memory_desc_create_submemory.argtypes = [ctypes.POINTER(p), p, L.Dims, L.Dims]
    dll.dnnl_memory_desc_create_submemory.restype = ctypes.c_int
    dll.dnnl_concat_primitive_desc_create.argtypes = [ctypes.POINTER(p), p, p, ctypes.c_int,
                                                      ctypes.c_int, ctypes.POINTER(p), p]
    dll.dnnl_concat_primitive_desc_create.restype = ctypes.c_int
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
            if s.dtype != F32:
                raise Unsupported(f"dtype {s.dtype}")
        units = plan(body, consts, outputs, shapes)
        self.units = units
        self.out_shapes = [shapes[o] for o in outputs]
        self.feed = [i for i, c in enumerate(consts) if c is None]
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
            mem = mem_of[x][0][1]
            if self._equal(md_of[x], md):
                return mem
            buf = self._buffer(md)
            dst = self._mem(md, buf.ctypes.data)
            self._step(self._reorder(md_of[x], md), [(L.ARG_SRC, mem), (L.ARG_DST, dst)],
                       f"reorder {label} ({self.last_impl})")
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
        for i in self.feed:
            a = xs[i]
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


def bind_region(node):
    """The compiled kernel of an engine node of engine "onednn": a `Region` (built once per
    node and shape); where oneDNN refuses one of its primitives, the body with the op
    table's kernels (a warning names why)."""
    try:
        region = Region(node)
    except Unsupported as e:
        import warnings
        warnings.warn(f"onednn region at {node.loc or '?'}: {e}; its {len(node.attrs['body'])}"
                      " ops run their op-table kernels instead", RuntimeWarning, stacklevel=2)
        return _interpreter(node)
    return region


def _interpreter(node):
    from ...ops.registry import OPS
    body, outputs = node.attrs["body"], node.attrs["outputs"]
    n = len(node.inputs)
    consts = {i: v.const for i, v in enumerate(node.inputs) if v.is_const}
    single = len(outputs) == 1

    def run(*arrays, out=None):
        vals = [consts.get(i, arrays[i]) for i in range(n)]
        for op_name, idx, attrs, _ in body:
            op = OPS[op_name]
            r = op.kernel(*[vals[k] for k in idx], **dict(attrs))
            vals.extend([np.asarray(x) for x in r] if op.n_out != 1 else [np.asarray(r)])
        res = [vals[k] for k in outputs]
        if out is not None:
            for j, b in enumerate(out):
                if b is not None:
                    np.copyto(b, res[j])
                    res[j] = b
        return res[0] if single else tuple(res)
    return run
