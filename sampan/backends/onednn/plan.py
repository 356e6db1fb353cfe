"""The planner of a oneDNN convolution region (`blocked.py` runs what it plans).

`plan(body, inputs, outputs, shapes)` reads a region's body (the `engine` node's
entries, op-table ops) as units, each one oneDNN primitive:

- "conv": a convolution with its epilogue as post-ops in order: the bias (per-channel
  constants added before anything else, folded), tensor terms added (a residual: another
  region value or an input of the same shape), then eltwise (relu, tanh, sigmoid, and
  x * sigmoid(x) as swish) and binary ops (add / mul of a tensor of the conv's shape or
  of a per-channel constant). The epilogue may be elementwise nodes or `fused` nodes of
  them. A sum (a + b) + (c + d) of two convolutions and their biases is one unit: the
  first's bias gains the other's, which is added as a term (ResNet's shortcut);
- "pool": a max-pool, the -inf `pad` before it taken as its padding;
- "slice": a channel range at multiples of `ALIGN` channels (a view, no copy);
- "concat": channels of region values;
- "gap": a mean over height and width (kept): global average pooling;
- "scale": x * s, s (N, C, 1, 1) of x's channels (squeeze-excite), a binary primitive;
- "resize": a nearest upsample by integer factors (YOLO's neck), written by the importer
  as an index_select of repeated rows then of repeated columns.

Whatever it cannot express raises `PlanError` naming the body entry, which the
`onednn_layout` pass leaves out of the region.

Example::

    >>> body = (("relu", (0,), (), 1),)
    >>> plan(body, [None], (1,), {0: (1, 16, 4, 4), 1: (1, 16, 4, 4)})
    Traceback (most recent call last):
    PlanError: an epilogue whose chain starts at no convolution of the region
"""
from __future__ import annotations

import numpy as np

from .primitives import Unsupported

F32 = np.dtype(np.float32)
# eltwise ops that become post-ops: name -> (oneDNN algorithm, alpha, beta)
_ELTWISE = {"relu": ("relu", 0.0, 0.0), "tanh": ("tanh", 0.0, 0.0),
            "hardswish": ("hardswish", 1.0 / 6.0, 0.5),
            "sigmoid": ("sigmoid", 0.0, 0.0)}


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


def _activations(inner, m, outs, scalar):
    """The entries of a fused body as (position, entry), the comparisons and selects of a
    clip (min(max(t, lo), hi): relu6) and of a hardswish (t * clip(t + 3, 0, 6) / 6, as
    an ONNX HardSwish or PaddlePaddle's export writes it) each as one entry ("clip" with
    lo and hi, "hardswish") at the position of their last."""
    n = len(inner)
    uses: dict = {}
    for sub in inner:
        for i in sub[1]:
            uses[i] = uses.get(i, 0) + 1
    for o in outs:
        uses[o] = uses.get(o, 0) + 1

    def at(p, op, nargs):
        return p < n and inner[p][0] == op and len(inner[p][1]) == nargs

    def clip_at(p, t):
        """(lo, hi) if entries p..p+3 are where(t < lo, lo, t) then where(. > hi, hi, .)."""
        v0, v1, v2 = m + p, m + p + 1, m + p + 2
        if not (at(p, "lt", 2) and at(p + 1, "where", 3) and at(p + 2, "gt", 2)
                and at(p + 3, "where", 3)):
            return None
        (a, lo_i), (c, lo2, x) = inner[p][1], inner[p + 1][1]
        (d, hi_i), (f, hi2, y) = inner[p + 2][1], inner[p + 3][1]
        lo, hi = scalar(lo_i), scalar(hi_i)
        if (a != t or c != v0 or x != t or lo is None or scalar(lo2) != lo or d != v1
                or f != v2 or y != v1 or hi is None or scalar(hi2) != hi or lo > hi):
            return None
        if uses.get(v0) != 1 or uses.get(v1) != 2 or uses.get(v2) != 1:
            return None
        return lo, hi

    out, p = [], 0
    while p < n:
        sub = inner[p]
        if sub[0] == "add" and len(sub[1]) == 2 and p + 6 < n:   # hardswish
            t, three = sub[1]
            if scalar(three) is None and scalar(t) is not None:
                t, three = three, t
            cl = clip_at(p + 1, m + p) if scalar(three) == 3.0 else None
            if cl == (0.0, 6.0) and uses.get(m + p) == 2 and at(p + 5, "mul", 2) \
                    and at(p + 6, "div", 2) and set(inner[p + 5][1]) == {t, m + p + 4} \
                    and inner[p + 6][1][0] == m + p + 5 \
                    and scalar(inner[p + 6][1][1]) == 6.0 and uses.get(m + p + 4) == 1 \
                    and uses.get(m + p + 5) == 1:
                out.append((p + 6, ("hardswish", (t,))))
                p += 7
                continue
        cl = clip_at(p, inner[p][1][0]) if sub[0] == "lt" else None
        if cl is not None:
            out.append((p + 3, ("clip", (inner[p][1][0],), (("lo", cl[0]), ("hi", cl[1])))))
            p += 4
            continue
        out.append((p, sub))
        p += 1
    return out


def _flatten(body, n_in, inputs=()):
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
            def scalar(i, idx=idx, m=m):
                c = inputs[idx[i]] if i < m and idx[i] < len(inputs) else None
                c = None if c is None else np.asarray(c)
                return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None
            for j, sub in _activations(inner, m, outs, scalar):
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
    atoms = _flatten(body, n_in, inputs)
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
            if us[0][1] == "mul" and _scale_args(us[0][2], shapes, const) is not None:
                return False            # x * s of an (N, C, 1, 1) s: a scale unit
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
        sc = _scale_args(args, shapes, const) if op == "mul" else None
        if sc is not None or op == "mean":
            if sc is not None:
                unit = Unit(key, e, sc[0], None, {}, kind="scale", xs=sc)
            elif tuple(a % 4 for a in attrs.get("axis", ())) == (2, 3) \
                    and attrs.get("keepdims") and len(shapes.get(args[0], ())) == 4:
                unit = Unit(key, e, args[0], None, {}, kind="gap")
            else:
                raise PlanError("a mean other than over height and width, kept", e)
            for x in (unit.xs or (unit.x,)):
                if x in pending:
                    materialize_conv(x)
                elif not isinstance(x, int) or isinstance(state.get(x), _Prog):
                    raise PlanError(f"{op} reading an unfinished epilogue", e)
            units.append(unit)
            state[key] = "mat"
            continue
        if op == "index_select":
            unit = _upsample(key, args, attrs, e, state, users, outset, const, shapes)
            if unit is None:                # the rows of a nearest upsample: wait
                continue
            if unit.x in pending:
                materialize_conv(unit.x)
            elif isinstance(state.get(unit.x), _Prog):
                raise PlanError("an upsample of an unfinished epilogue", e)
            units.append(unit)
            state[key] = "mat"
            continue
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
        elif op == "clip":
            p = as_prog(args[0], e)
            p.post.append(("eltwise", "clip", float(attrs["lo"]), float(attrs["hi"])))
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


_CHAIN = ("add", "sub", "mul", "div", "relu", "tanh", "sigmoid", "hardswish", "clip")
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


def nearest_factor(idx, n_in):
    """f where index array `idx` repeats each of 0..n_in-1 f times in order (a nearest
    upsample by an integer factor), else None."""
    a = np.asarray(idx)
    if a.ndim != 1 or a.dtype.kind not in "iu" or n_in < 1 or a.size % n_in:
        return None
    f = a.size // n_in
    return f if np.array_equal(a, np.arange(a.size) // f) else None


def _upsample(key, args, attrs, e, state, users, outset, const, shapes):
    """index_select(index_select(x, rows, axis=2), cols, axis=3) with `rows`, `cols` a
    nearest upsample's repeats: a "resize" unit at the second (None at the first)."""
    if len(args) != 2 or const(args[1]) is None or const(args[0]) is not None:
        raise PlanError("index_select of a tensor by a constant index only", e)
    x, idx = args
    axis = attrs.get("axis") % 4 if isinstance(attrs.get("axis"), int) else None
    s = state.get(x)
    if axis == 2:
        us = users.get(key, [])
        f = nearest_factor(const(idx), shapes.get(x, (0, 0, 0))[2])
        if f is None or key in outset or len(us) != 1 or us[0][1] != "index_select":
            raise PlanError("an index_select other than a nearest upsample's", e)
        state[key] = ("rows", x, f)
        return None
    if axis == 3 and isinstance(s, tuple) and s[0] == "rows":
        f = nearest_factor(const(idx), shapes.get(s[1], (0, 0, 0, 0))[3])
        if f is not None:
            return Unit(key, e, s[1], None, {"factors": (s[2], f)}, kind="resize")
    raise PlanError("an index_select other than a nearest upsample's", e)


def _scale_args(args, shapes, const):
    """(x, s) of a mul of two tensors where s is (N, C, 1, 1) of x's (N, C, H, W) (a
    squeeze-excite scale), else None."""
    if len(args) != 2 or any(const(a) is not None for a in args):
        return None
    for x, sc in (args, args[::-1]):
        xs, ss = shapes.get(x), shapes.get(sc)
        if xs is not None and ss is not None and len(xs) == len(ss) == 4 \
                and tuple(ss[2:]) == (1, 1) and tuple(xs[2:]) != (1, 1) \
                and ss[1] == xs[1] and isinstance(ss[1], int) and ss[0] == xs[0]:
            return x, sc
    return None


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
