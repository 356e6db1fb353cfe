"""The C of each step of a lowered program (`clower.Step`): one emitter per op family,
calling the family's template (`ctemplates`) or writing its loop nest. Every piece of
text is Code: identifiers this package made, literals `cemit` formatted, templates."""
from __future__ import annotations

import numpy as np

from ...ops.registry import OPS
from ...runtime import emit
from . import templates as T
from .emit_c import cfill, ctype, join, num, scalar_c
from .lower import Poly, prod
from ..kernelsource import DeployError

own = emit.own


class Ctx:
    """What the steps of one program need: kernels (name -> C text, in the order they
    must appear) and helpers to include, and the constants the steps derive (`const`:
    packed or precomputed arrays that go into weights.bin)."""

    def __init__(self, new_const=None):
        self.kernels, self.helpers = {}, set()
        self.new_const = new_const

    def need(self, k, code=None):
        from .qtemplates import QKERNELS
        if k in ("gemm_packed", "gemm_wcol", "gemm"):
            self.need("vec")
        if k == "conv2d":
            self.need("gemm_packed")
        if k == "conv2d_wcol":
            self.need("gemm_wcol")
        if k in ("qgemm", "qconv2d_wcol"):
            self.need("qbase")
        if k == "qconv2d":
            self.need("qgemm")
        if k not in self.kernels:
            self.kernels[k] = code or T.KERNELS.get(k) or QKERNELS[k]

    def const(self, array):
        return self.new_const(np.ascontiguousarray(array))


def _fail(step, what):
    raise DeployError(f"sampan deploy: {step.op} at {emit.inert(step.loc)}: {what}")


def ptr(b) -> emit.Code:
    return b.name


def strides(dims):
    """Contiguous strides (Poly) of dims."""
    out, s = [], Poly.const(1)
    for d in reversed(dims):
        out.append(s)
        s = s * d
    return out[::-1]


def _loop_nest(out, loads, body_lines):
    """A loop over every element of contiguous `out`: `loads` are (var, C type, pointer,
    base offset Poly, stride Poly per out dim or None), `body_lines` the Code computing
    the element (reads the vars, writes `out` at `o`)."""
    flat = all(all(s is None for s in st) or st == strides(out.dims) for _, _, _, base, st in loads
               if base == Poly.const(0)) and all(base == Poly.const(0) for *_, base, _ in loads)
    lines = [own("    {")]
    if flat:
        lines.append(cfill("    for (idx o = 0; o < @n@; o++) {", n=out.numel.code()))
        for var, t, p, base, st in loads:
            at = own("0") if all(s is None for s in st) else own("o")
            lines.append(cfill("        const @t@ @v@ = @p@[@at@];", t=t, v=var, p=p, at=at))
    else:
        r = len(out.dims)
        for d, n in enumerate(out.dims):
            lines.append(cfill("    for (idx i@d@ = 0; i@d@ < @n@; i@d@++)", d=num(d), n=n.code()))
        lines.append(own("    {"))
        ost = strides(out.dims)
        lines.append(cfill("        idx o = @e@;", e=_offset(Poly.const(0), ost, r)))
        for var, t, p, base, st in loads:
            lines.append(cfill("        const @t@ @v@ = @p@[@e@];", t=t, v=var, p=p,
                               e=_offset(base, st, r)))
    lines += body_lines
    lines.append(own("    }"))
    lines.append(own("    }"))
    return join(lines, "\n")


def _offset(base, st, r):
    terms = [] if base == Poly.const(0) else [base.code()]
    for d, s in enumerate(st):
        if s is not None and s != Poly.const(0):
            terms.append(own(f"i{d}") if s == Poly.const(1) else cfill("i@d@ * @s@", d=num(d), s=s.code()))
    return join(terms, " + ") if terms else own("0")


def _broadcast(step, b, out):
    """(base, strides per out dim) of input `b` broadcast to `out`."""
    r, k = len(out.dims), len(b.dims)
    if k > r:
        _fail(step, f"input of rank {k} broadcasts to an output of rank {r}")
    st = strides(b.dims)
    res = [None] * (r - k)
    for d, (bd, od) in enumerate(zip(b.dims, out.dims[r - k:])):
        if bd == od:
            res.append(st[d])
        elif bd == Poly.const(1):
            res.append(None)
        else:
            _fail(step, "an input does not broadcast to the output")
    return Poly.const(0), res


# ---------------------------------------------------------------------- elementwise
def elementwise(step, ctx, views=None):
    """A fused elementwise body (or one elementwise op) as one loop; `views` gives the
    inputs' (base, strides) where they are not broadcasts (permute, getitem, expand)."""
    out = step.outs[0]
    loads, lines = [], []
    vals = []
    for j, b in enumerate(step.ins):
        base, st = views[j] if views else _broadcast(step, b, out)
        var = emit.fresh("a", j)
        loads.append((var, ctype(b.dtype), ptr(b), base, st))
        vals.append(var)
    dts = step.body_specs
    for k, e in enumerate(step.body):
        op = OPS[e[0]]
        args = [vals[p] for p in e[1]]
        ind = [dts[p] for p in e[1]]
        od = dts[len(step.ins) + k]
        x, used = scalar_c(op, args, ind, od, step.loc)
        ctx.helpers |= used
        t = emit.fresh("t", k)
        lines.append(cfill("        const @ct@ @t@ = (@ct@)(@x@);", ct=ctype(od), t=t, x=x))
        vals.append(t)
    positions = list(step.attrs.get("outputs", ())) if not views else []
    positions = positions or [len(vals) - 1]
    for b, p in zip(step.outs, positions):
        lines.append(cfill("        @o@[o] = @v@;", o=ptr(b), v=vals[p]))
    return _loop_nest(out, loads, lines)


def _copy_view(step, ctx, base, st):
    step.body = (("copy", (0,)),)
    step.body_specs = [step.ins[0].dtype, step.outs[0].dtype]
    return elementwise(step, ctx, views=[(base, st)])


def permute(step, ctx):
    x = step.ins[0]
    st = strides(x.dims)
    return _copy_view(step, ctx, Poly.const(0), [st[d % len(x.dims)] for d in step.attrs["dims"]])


def expand(step, ctx):
    return _copy_view(step, ctx, *_broadcast(step, step.ins[0], step.outs[0]))


def getitem(step, ctx):
    if len(step.ins) != 1:
        _fail(step, "indexing with tensors has no C template")
    x = step.ins[0]
    st, items = strides(x.dims), list(step.attrs["index"])
    n_in = sum(1 for it in items if it[0] in ("s", "i"))
    if ("e",) in items:
        e = items.index(("e",))
        items[e:e + 1] = [("s", None, None, None)] * (len(x.dims) - n_in)
    items += [("s", None, None, None)] * (len(x.dims) - sum(1 for it in items if it[0] in "si"))
    base, out_st, d = Poly.const(0), [], 0
    for it in items:
        if it[0] == "n":
            out_st.append(None)
            continue
        dim = x.dims[d]
        if it[0] == "i":
            if not dim.is_const and it[1] != 0:
                _fail(step, "an integer index other than 0 on the batch dim")
            k = it[1] + dim.value if it[1] < 0 else it[1]
            if dim.is_const and not 0 <= k < dim.value:
                _fail(step, f"index {it[1]} is out of range for a dim of {dim.value}")
            base = base + st[d] * Poly.const(k)
        else:
            start, stop, step_ = it[1], it[2], it[3]
            if (start in (None, 0)) and stop is None and step_ in (None, 1):
                out_st.append(st[d])
            else:
                if not dim.is_const:
                    _fail(step, "a slice of the batch dim")
                s0, _, s2 = slice(start, stop, step_).indices(dim.value)
                base = base + st[d] * Poly.const(s0)
                out_st.append(st[d] * Poly.const(s2))
        d += 1
    return _copy_view(step, ctx, base, out_st)


# ---------------------------------------------------------------------- GEMM family
def _float32(step):
    for b in step.ins + step.outs:
        if b.dtype != np.float32:
            _fail(step, f"{b.dtype.name} operands; the C template is float32")


def matmul(step, ctx):
    _float32(step)
    a, b = step.ins[0], step.ins[1]
    y = step.outs[0]
    if len(a.dims) < 2 or len(b.dims) < 2:
        _fail(step, "a 1-d operand; the C template takes matrices")
    M, K, N = a.dims[-2], a.dims[-1], b.dims[-1]
    if b.packed is not None:
        ctx.need("gemm_packed")
        rows = prod(a.dims[:-1])
        return cfill("    k_gemm_packed(@m@, @n@, @k@, @a@, @k@, @bp@, NULL, @y@, @n@, @act@);",
                     m=rows.code(), n=N.code(), k=K.code(), a=ptr(a), bp=emit.fresh("p", b.n),
                     y=ptr(y), act=num(int(step.attrs.get("act") == "relu")))
    ctx.need("gemm")
    r = len(y.dims) - 2
    lines = [own("    {")]
    ast, bst = _batch_strides(step, a, y, r), _batch_strides(step, b, y, r)
    yst = strides(y.dims[:-2] + [Poly.const(1)])
    for d in range(r):
        lines.append(cfill("    for (idx i@d@ = 0; i@d@ < @n@; i@d@++)", d=num(d),
                           n=y.dims[d].code()))
    mk, kn, mn = M * K, K * N, M * N
    lines.append(cfill("        k_gemm(@m@, @n@, @k@, @a@ + (@ao@) * @mk@, @b@ + (@bo@) * @kn@, "
                       "@y@ + (@yo@) * @mn@);", m=M.code(), n=N.code(), k=K.code(), a=ptr(a),
                       b=ptr(b), y=ptr(y), ao=_offset(Poly.const(0), ast, r), mk=mk.code(),
                       bo=_offset(Poly.const(0), bst, r), kn=kn.code(),
                       yo=_offset(Poly.const(0), yst[:r], r), mn=mn.code()))
    lines.append(own("    }"))
    return join(lines, "\n")


def _batch_strides(step, x, y, r):
    """Strides in matrices of x's batch dims broadcast to y's r batch dims."""
    xb = x.dims[:-2]
    st = strides(xb + [Poly.const(1)])[:-1] if xb else []
    out = [None] * (r - len(xb))
    for d, (xd, yd) in enumerate(zip(xb, y.dims[r - len(xb):r])):
        out.append(st[d] if xd == yd else None if xd == Poly.const(1) else _fail(
            step, "batch dims that do not broadcast"))
    return out


def conv2d(step, ctx):
    _float32(step)
    x, w = step.ins[0], step.ins[1]
    bias = step.ins[2] if len(step.ins) > 2 else None
    y = step.outs[0]
    a = step.attrs
    groups = int(a.get("groups", 1))
    if any(not d.is_const for d in x.dims[1:] + w.dims):
        _fail(step, "a batch-sized channel or weight dim")
    col = step.scratch[0]
    lines = []
    if w.packed is None:       # computed, or few output channels: the weight as it is
        ctx.need("conv2d_wcol")
    else:
        ctx.need("conv2d")
        wp = emit.fresh("p", w.n)
    C, H, W = (d.code() for d in x.dims[1:])
    OC, _, KH, KW = (d.code() for d in w.dims)
    OH, OW = y.dims[2].code(), y.dims[3].code()
    chw, ohw = prod(x.dims[1:]).code(), prod(y.dims[1:]).code()
    if w.packed is None:
        lines.append(cfill(
            "    for (idx n = 0; n < @nb@; n++)\n"
            "        k_conv2d_wcol(@G@, @C@, @H@, @W@, @x@ + n * @chw@, @OC@, @KH@, @KW@, @w@, "
            "@bias@, @OH@, @OW@, @sh@, @sw@, @ph@, @pw@, @dh@, @dw@, @col@, @y@ + n * @ohw@, "
            "@act@);", act=num(int(a.get("act") == "relu")),
            nb=y.dims[0].code(), G=num(groups), C=C, H=H, W=W, x=ptr(x), chw=chw, OC=OC,
            KH=KH, KW=KW, w=ptr(w), bias=ptr(bias) if bias is not None else own("NULL"),
            OH=OH, OW=OW, sh=num(a["stride"][0]), sw=num(a["stride"][1]),
            ph=num(a["padding"][0]), pw=num(a["padding"][1]), dh=num(a["dilation"][0]),
            dw=num(a["dilation"][1]), col=ptr(col), y=ptr(y), ohw=ohw))
        return join(lines, "\n")
    tmp = step.scratch[1]
    lines.append(cfill(
        "    for (idx n = 0; n < @nb@; n++)\n"
        "        k_conv2d(@G@, @C@, @H@, @W@, @x@ + n * @chw@, @OC@, @KH@, @KW@, @wp@, @bias@, "
        "@OH@, @OW@, @sh@, @sw@, @ph@, @pw@, @dh@, @dw@, @col@, @tmp@, @y@ + n * @ohw@, "
        "@act@);", act=num(int(a.get("act") == "relu")),
        nb=y.dims[0].code(), G=num(groups), C=C, H=H, W=W, x=ptr(x), chw=chw, OC=OC, KH=KH,
        KW=KW, wp=wp, bias=ptr(bias) if bias is not None else own("NULL"),
        OH=OH, OW=OW, sh=num(a["stride"][0]), sw=num(a["stride"][1]),
        ph=num(a["padding"][0]), pw=num(a["padding"][1]), dh=num(a["dilation"][0]),
        dw=num(a["dilation"][1]), col=ptr(col), tmp=ptr(tmp), y=ptr(y), ohw=ohw))
    return join(lines, "\n")


def fuse_relu(steps, outputs):
    """A ReLU whose one input is a GEMM or conv2d output read nowhere else runs in that
    kernel's epilogue (the product is written once, clamped)."""
    reads = {}
    for s in steps:
        for b in s.ins:
            reads[b.storage.n] = reads.get(b.storage.n, 0) + 1
    for b in outputs:
        reads[b.storage.n] = reads.get(b.storage.n, 0) + 2
    out = []
    for s in steps:
        prev = out[-1] if out else None
        body = tuple(s.body)
        if (prev is not None and prev.op in ("matmul", "conv2d") and s.op == "fused"
                and len(body) == 1 and body[0][0] == "relu" and len(s.ins) == 1
                and s.ins[0] is prev.outs[0] and reads.get(prev.outs[0].n) == 1
                and (prev.op == "conv2d" or prev.ins[1].packed is not None)
                and s.outs[0].dtype == np.float32 and "act" not in prev.attrs):
            prev.attrs = dict(prev.attrs, act="relu")
            prev.outs = list(s.outs)
            continue
        out.append(s)
    return out


def conv2d_scratch(step, new):
    """The im2row and product buffers of a conv2d step (one image, one group each), and
    the packed weight where it is computed."""
    w, y = step.ins[1], step.outs[0]
    g = int(step.attrs.get("groups", 1))
    k = prod(w.dims[1:])
    p = prod(y.dims[2:])
    ocg = w.dims[0].value // g
    step.scratch = [new(np.float32, [p * k], "arena")]
    if w.packed is not None:       # the (pixels, channels) product before its transpose
        step.scratch.append(new(np.float32, [p * Poly.const(ocg)], "arena"))


def conv_packs(step) -> bool:
    """Whether a conv2d with constant weight runs as im2row x the packed weight (output
    channels in the vector lanes), or as the weight x im2col (pixels in the lanes): the
    layout that leaves fewer of its 16 lanes idle."""
    w, y = step.ins[1], step.outs[0]
    ocg = w.dims[0].value // int(step.attrs.get("groups", 1))
    p = prod(y.dims[2:])
    if not p.is_const:
        return True
    return ocg / (16 * -(-ocg // 16)) >= p.value / (16 * -(-p.value // 16))


def pack_conv_weight(w, groups):
    """A constant conv weight (OC, Cg, KH, KW) packed per group as k_conv2d reads it."""
    from .weights import pack_panels
    oc = w.shape[0]
    ocg = oc // groups
    m = np.asarray(w, np.float32).reshape(oc, -1)
    return np.concatenate([pack_panels(np.ascontiguousarray(m[g * ocg:(g + 1) * ocg].T), T.NR)
                           .ravel() for g in range(groups)])


def pool2d(step, ctx):
    x, y = step.ins[0], step.outs[0]
    a = step.attrs
    if step.op == "max_pool2d" and x.dtype != np.float32:
        return _int_maxpool(step, ctx, x, y, a)
    _float32(step)
    nc = (x.dims[0] * x.dims[1]).code()
    H, W = x.dims[2].code(), x.dims[3].code()
    common = dict(nc=nc, H=H, W=W, x=ptr(x), OH=y.dims[2].code(), OW=y.dims[3].code(),
                  KH=num(a["kernel_size"][0]), KW=num(a["kernel_size"][1]),
                  sh=num(a["stride"][0]), sw=num(a["stride"][1]), ph=num(a["padding"][0]),
                  pw=num(a["padding"][1]), y=ptr(y))
    if step.op == "max_pool2d":
        ctx.need("maxpool2d")
        return cfill("    k_maxpool2d(@nc@, @H@, @W@, @x@, @OH@, @OW@, @KH@, @KW@, @sh@, @sw@, "
                     "@ph@, @pw@, @dh@, @dw@, @y@);", dh=num(a["dilation"][0]),
                     dw=num(a["dilation"][1]), **common)
    ctx.need("avgpool2d")
    return cfill("    k_avgpool2d(@nc@, @H@, @W@, @x@, @OH@, @OW@, @KH@, @KW@, @sh@, @sw@, "
                 "@ph@, @pw@, @inc@, @div@, @y@);", inc=num(int(bool(a["count_include_pad"]))),
                 div=num(int(a.get("divisor_override") or 0)), **common)


def _int_maxpool(step, ctx, x, y, a):
    from .qtemplates import maxpool_kernel
    lows = {"uint8": "0", "int8": "(-128)", "int32": "INT32_MIN", "int64": "INT64_MIN"}
    if x.dtype.name not in lows:
        _fail(step, f"a {x.dtype.name} input")
    ct = ctype(x.dtype)
    ctx.need(f"maxpool2d_{x.dtype.name}", maxpool_kernel(ct, lows[x.dtype.name]))
    return cfill("    k_maxpool2d_@t@(@nc@, @H@, @W@, @x@, @OH@, @OW@, @KH@, @KW@, @sh@, @sw@, "
                 "@ph@, @pw@, @dh@, @dw@, @y@);", t=own(ct.replace("_t", "")),
                 nc=(x.dims[0] * x.dims[1]).code(), H=x.dims[2].code(), W=x.dims[3].code(),
                 x=ptr(x), OH=y.dims[2].code(), OW=y.dims[3].code(),
                 KH=num(a["kernel_size"][0]), KW=num(a["kernel_size"][1]),
                 sh=num(a["stride"][0]), sw=num(a["stride"][1]), ph=num(a["padding"][0]),
                 pw=num(a["padding"][1]), dh=num(a["dilation"][0]), dw=num(a["dilation"][1]),
                 y=ptr(y))


# ---------------------------------------------------------------------- row ops
def softmax(step, ctx):
    _float32(step)
    x, y = step.ins[0], step.outs[0]
    ctx.need("softmax")
    ctx.helpers |= {"sp_maxf", "sp_expf"}
    return cfill("    k_softmax_rows(@r@, @n@, @x@, @y@, @log@);", r=prod(x.dims[:-1]).code(),
                 n=x.dims[-1].code(), x=ptr(x), y=ptr(y),
                 log=num(int(step.op == "log_softmax")))


def layer_norm(step, ctx):
    _float32(step)
    x, y = step.ins[0], step.outs[0]
    w, b = (step.ins[1], step.ins[2]) if len(step.ins) == 3 else (None, None)
    ctx.need("layernorm")
    return cfill("    k_layernorm_rows(@r@, @n@, @x@, @w@, @b@, @eps@, @y@);",
                 r=prod(x.dims[:-1]).code(), n=x.dims[-1].code(), x=ptr(x),
                 w=ptr(w) if w is not None else own("NULL"),
                 b=ptr(b) if b is not None else own("NULL"),
                 eps=num(step.attrs["eps"], np.float32), y=ptr(y))


def reduce(step, ctx):
    x, y = step.ins[0], step.outs[0]
    r = len(x.dims)
    axes = step.attrs.get("axis")
    axes = list(range(r)) if axes is None else sorted(a % r for a in (
        axes if isinstance(axes, (tuple, list)) else (axes,)))
    if not axes:
        return _copy_view(step, ctx, Poly.const(0), strides(x.dims))
    outer = prod(x.dims[:axes[0]])
    red = prod(x.dims[axes[0]:axes[-1] + 1])
    inner = prod(x.dims[axes[-1] + 1:])
    fl = x.dtype.kind == "f"
    acc_t = own("double") if fl else own("int64_t")
    op = step.op
    init = {"sum": "0", "mean": "0", "prod": "1", "max": "-INFINITY" if fl else "INT64_MIN",
            "min": "INFINITY" if fl else "INT64_MAX"}[op]
    upd = {"sum": "acc += v;", "mean": "acc += v;", "prod": "acc *= v;",
           "max": "if (v > acc || v != v) acc = v;", "min": "if (v < acc || v != v) acc = v;"}[op]
    fin = "acc / (double)(@red@)" if op == "mean" else "acc"
    if axes != list(range(axes[0], axes[-1] + 1)):
        red = prod([x.dims[d] for d in axes])
        return _reduce_strided(x, y, axes, red, acc_t, init, upd, fin)
    return cfill(
        "    for (idx o = 0; o < @outer@; o++)\n"
        "        for (idx i = 0; i < @inner@; i++) {\n"
        "            @acc_t@ acc = @init@;\n"
        "            for (idx r = 0; r < @red@; r++) {\n"
        "                @acc_t@ v = (@acc_t@)@x@[(o * @red@ + r) * @inner@ + i];\n"
        "                @upd@\n"
        "            }\n"
        "            @y@[o * @inner@ + i] = (@yt@)(" + fin + ");\n"
        "        }", outer=outer.code(), inner=inner.code(), red=red.code(), acc_t=acc_t,
        init=own(init), upd=own(upd), x=ptr(x), y=ptr(y), yt=ctype(y.dtype))


def _reduce_strided(x, y, axes, red, acc_t, init, upd, fin):
    """A reduction over axes that are not adjacent: loops over the kept dims, then over
    the reduced ones, reading x through its strides."""
    st = strides(x.dims)
    kept = [d for d in range(len(x.dims)) if d not in axes]
    lines = [own("    {"), own("    idx o = 0;")]
    for d in kept:
        lines.append(cfill("    for (idx i@d@ = 0; i@d@ < @n@; i@d@++)", d=num(d),
                           n=x.dims[d].code()))
    lines.append(cfill("    {\n        @acc_t@ acc = @init@;", acc_t=acc_t, init=own(init)))
    for d in axes:
        lines.append(cfill("        for (idx i@d@ = 0; i@d@ < @n@; i@d@++)", d=num(d),
                           n=x.dims[d].code()))
    off = _offset(Poly.const(0), st, len(st))
    lines.append(cfill("        {\n            @acc_t@ v = (@acc_t@)@x@[@off@];\n"
                       "            @upd@\n        }", acc_t=acc_t, x=ptr(x), off=off,
                       upd=own(upd)))
    lines.append(cfill("        @y@[o++] = (@yt@)(" + fin + ");\n    }\n    }", y=ptr(y),
                       yt=ctype(y.dtype), red=red.code()))
    return join(lines, "\n")


# ---------------------------------------------------------------------- layout
def index_select(step, ctx):
    x, ix = step.ins
    y = step.outs[0]
    if ix.dtype != np.int64:
        _fail(step, f"{ix.dtype.name} indices; the C template takes int64")
    ax = step.attrs["axis"] % len(x.dims)
    ctx.need("gather")
    return cfill(
        "    if (k_gather(@outer@, @A@, @inner@, @es@, (const unsigned char *)@x@, @n@, @ix@, "
        "(unsigned char *)@y@))\n"
        "        return sp_fail(@msg@);", outer=prod(x.dims[:ax]).code(), A=x.dims[ax].code(),
        inner=prod(x.dims[ax + 1:]).code(), es=num(x.dtype.itemsize), x=ptr(x),
        n=ix.numel.code(), ix=ptr(ix), y=ptr(y),
        msg=_msg(step, "an index is out of range"))


def _msg(step, text):
    from .emit_c import cstr
    return cstr(f"{step.op} at {step.loc}: {text}")


def cumsum(step, ctx):
    x, y = step.ins[0], step.outs[0]
    ax = step.attrs["axis"] % len(x.dims)
    acc = own("double") if x.dtype.kind == "f" else own("int64_t")
    return cfill(
        "    for (idx o = 0; o < @outer@; o++)\n"
        "        for (idx i = 0; i < @inner@; i++) {\n"
        "            @acc@ acc = 0;\n"
        "            for (idx r = 0; r < @n@; r++) {\n"
        "                acc += @x@[(o * @n@ + r) * @inner@ + i];\n"
        "                @y@[(o * @n@ + r) * @inner@ + i] = (@yt@)acc;\n"
        "            }\n"
        "        }", outer=prod(x.dims[:ax]).code(), inner=prod(x.dims[ax + 1:]).code(),
        n=x.dims[ax].code(), acc=acc, x=ptr(x), y=ptr(y), yt=ctype(y.dtype))


def concat(step, ctx):
    y = step.outs[0]
    ax = step.attrs["axis"] % len(y.dims)
    ctx.need("concat")
    es = y.dtype.itemsize
    total = prod(y.dims[ax:]) * Poly.const(es)
    lines, at = [], Poly.const(0)
    for x in step.ins:
        chunk = prod(x.dims[ax:]) * Poly.const(es)
        lines.append(cfill("    k_concat_part(@outer@, (size_t)(@chunk@), (size_t)(@total@), "
                           "(size_t)(@at@), (const unsigned char *)@x@, (unsigned char *)@y@);",
                           outer=prod(y.dims[:ax]).code(), chunk=chunk.code(),
                           total=total.code(), at=at.code(), x=ptr(x), y=ptr(y)))
        at = at + chunk
    return join(lines, "\n")


def reshape_copy(step, ctx):
    return _copy_view(step, ctx, Poly.const(0), strides(step.outs[0].dims))


EMITTERS = {"fused": elementwise, "permute": permute, "expand": expand, "getitem": getitem,
            "matmul": matmul, "conv2d": conv2d, "max_pool2d": pool2d, "avg_pool2d": pool2d,
            "softmax": softmax, "log_softmax": softmax, "layer_norm_affine": layer_norm,
            "standardize": layer_norm, "sum": reduce, "mean": reduce, "max": reduce,
            "min": reduce, "prod": reduce, "index_select": index_select, "cumsum": cumsum,
            "concat": concat}


def _int8_emitters():
    from .qsteps import EMITTERS as Q
    EMITTERS.update(Q)


_int8_emitters()


def covered_ops() -> list:
    """The op table's ops the C target writes (elementwise ones through their scalar
    forms)."""
    ew = [n for n, o in OPS.items() if o.kind == "elementwise" and o.scalar and _c_scalar_ok(o)]
    return sorted(set(ew) | (set(EMITTERS) - {"fused"}) | {"fused", "reshape"})


def _c_scalar_ok(op) -> bool:
    try:
        scalar_c(op, [emit.own("a0"), emit.own("a1"), emit.own("a2")],
                 [np.float32] * 3, np.float32)
        return True
    except DeployError:
        return False
