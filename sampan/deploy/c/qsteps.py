"""The C of the int8 steps: quantize, dequantize, and the requantising layers of
`sampan/ops/quant_fused.py` (qlinear_dense, qdense, qlinear_conv2d) over `qtemplates`.

Scales and zero points are the program's constants: the float32 multipliers are computed
at generation by the op table's own `multiplier` and `bounds`, and the zero-point
corrections (bias - xz * colsum(w) + K * xz * wz) are exact integers, so the C computes
the numbers of the op table's reference bit for bit."""
from __future__ import annotations

import numpy as np

from ...ops import quant_fused as _qf
from ...runtime import emit
from .emit_c import cfill, ctype, join, num
from .lower import Poly, prod
from .qtemplates import pack_int8
from ..kernelsource import DeployError

own = emit.own
_KIND = {"float32": 0, "uint8": 1, "int8": 2}


def _fail(step, what):
    raise DeployError(f"sampan deploy: {step.op} at {emit.inert(step.loc)}: {what}")


def _const(step, b, what):
    if b.storage.kind != "const":
        _fail(step, f"{what} is computed; the C template takes it as a constant")
    return np.asarray(b.storage.const)


def _qparams(step, ctx, w2d, packed=None):
    """(packed weight, corr, wz or None, mult, kind, zy, lo, hi, xz) Bufs/literals of a
    requantising layer whose weight is `w2d` (N, K) int8."""
    x, xs, xz, w, ws, wz, bias = step.ins[:7]
    y = step.outs[0]
    n, k = w2d.shape
    xzv = int(_const(step, xz, "the x zero point"))
    wzv = np.broadcast_to(_const(step, wz, "the weight zero point").astype(np.int64).reshape(-1),
                          (n,))
    bv = _const(step, bias, "the bias").astype(np.int64)
    colsum = w2d.astype(np.int64).sum(1)
    corr = bv - xzv * colsum + k * xzv * wzv
    if np.abs(corr).max(initial=0) >= 2 ** 31:
        _fail(step, "a zero-point correction outside int32")
    # |sum x w| <= K * 255 * 128: with the correction it stays in int32 (vector epilogue)
    i32ok = k * 255 * 128 + int(np.abs(corr).max(initial=0)) < 2 ** 31
    if len(step.ins) > 7:
        ys, yz = step.ins[7], step.ins[8]
        yzv = _const(step, yz, "the y zero point")
        mult = _qf.multiplier(_const(step, xs, "the x scale"), _const(step, ws, "the w scale"),
                              _const(step, ys, "the y scale"), n)
        lo, hi = _qf.bounds(yzv, step.attrs.get("qmin"), step.attrs.get("qmax"))
        zy = int(yzv)
    else:
        mult = _qf.multiplier(_const(step, xs, "the x scale"), _const(step, ws, "the w scale"),
                              None, n)
        lo, hi, zy = 0, 0, 0
    if y.dtype.name not in _KIND:
        _fail(step, f"output dtype {y.dtype.name}")
    wp = ctx.const(pack_int8(w2d) if packed is None else packed)
    cb = ctx.const(corr.astype(np.int32))
    mb = ctx.const(mult.astype(np.float32))
    wzb = ctx.const(wzv.astype(np.int32)) if np.any(wzv) else None
    return dict(wp=wp.name, corr=cb.name, wz=wzb.name if wzb is not None else own("NULL"),
                mult=mb.name, kind=num(_KIND[y.dtype.name]), zy=num(zy), lo=num(lo),
                hi=num(hi), xz=num(xzv), signed=num(int(x.dtype == np.int8)),
                i32ok=num(int(i32ok)))


def qdense(step, ctx):
    x, y = step.ins[0], step.outs[0]
    w = _const(step, step.ins[3], "the int8 weight")
    if len(x.dims) != 2:
        _fail(step, "an input that is not a matrix")
    ctx.need("qgemm")
    q = _qparams(step, ctx, w)
    return cfill("    k_qgemm(@m@, @n@, @k@, @x@, @signed@, @k@, (const int8_t *)@wp@, "
                 "(const int32_t *)@corr@, @wz@, @mult@, @kind@, @zy@, @lo@, @hi@, @y@, @n@, 1, @i32ok@);",
                 m=x.dims[0].code(), n=num(w.shape[0]), k=num(w.shape[1]), x=x.name,
                 y=y.name, **q)


def qconv2d(step, ctx):
    x, y = step.ins[0], step.outs[0]
    w = _const(step, step.ins[3], "the int8 weight")
    a = step.attrs
    g = int(a.get("groups", 1))
    oc = w.shape[0]
    ocg = oc // g
    w2 = w.reshape(oc, -1)
    wcol = step.attrs.get("layout") == "wcol"
    if wcol:        # the weight as rows of Kg bytes rounded up to 4
        ctx.need("qconv2d_wcol")
        kp = -(-w2.shape[1] // 4) * 4
        wp = np.zeros((oc, kp), np.int8)
        wp[:, :w2.shape[1]] = w2
        wp = wp.ravel()
    else:           # per group, the packed weights one after another
        ctx.need("qconv2d")
        wp = np.concatenate([pack_int8(w2[i * ocg:(i + 1) * ocg]) for i in range(g)])
    q = _qparams(step, ctx, w2, wp)
    col = step.scratch[0]
    return cfill(
        "    for (idx n = 0; n < @nb@; n++)\n"
        "        @fn@(@G@, @C@, @H@, @W@, (const unsigned char *)@x@ + n * @chw@, @signed@, "
        "@OC@, @KH@, @KW@, (const int8_t *)@wp@, (const int32_t *)@corr@, @wz@, @mult@, "
        "@kind@, @zy@, @lo@, @hi@, @xz@, @OH@, @OW@, @sh@, @sw@, @ph@, @pw@, @dh@, @dw@, "
        "(unsigned char *)@col@, (unsigned char *)@y@ + (size_t)(n * @ohw@) * @es@, @es@, "
        "@i32ok@);",
        nb=y.dims[0].code(), G=num(g), C=x.dims[1].code(), H=x.dims[2].code(),
        W=x.dims[3].code(), x=x.name, chw=prod(x.dims[1:]).code(), OC=num(oc),
        KH=num(w.shape[2]), KW=num(w.shape[3]), OH=y.dims[2].code(), OW=y.dims[3].code(),
        sh=num(a["stride"][0]), sw=num(a["stride"][1]), ph=num(a["padding"][0]),
        pw=num(a["padding"][1]), dh=num(a["dilation"][0]), dw=num(a["dilation"][1]),
        col=col.name, y=y.name, ohw=prod(y.dims[1:]).code(), es=num(y.dtype.itemsize),
        fn=own("k_qconv2d_wcol" if wcol else "k_qconv2d"), **q)


def qconv2d_scratch(step, new):
    w, y = step.ins[3], step.outs[0]
    g = int(step.attrs.get("groups", 1))
    k = prod(w.dims[1:])
    kp = Poly.const(-(-k.value // 4) * 4)       # rows rounded up to 4 bytes
    p = prod(y.dims[2:])
    ocg = w.dims[0].value // g
    # few output channels, many pixels: the pixels go in the vector lanes
    if p.is_const and ocg / (16 * -(-ocg // 16)) < p.value / (16 * -(-p.value // 16)):
        step.attrs = dict(step.attrs, layout="wcol")
        # 64 bytes of slack: a last 16-pixel load may read past the last row
        step.scratch = [new(np.uint8, [p * kp + Poly.const(64)], "arena")]
        return
    step.scratch = [new(np.uint8, [p * kp], "arena")]


def _channels(step, x, scale, zp, axis):
    """(outer, channels, inner) Polys of x along `axis` for a per-channel scale."""
    c = int(np.asarray(scale).size)
    if c == 1:
        return None
    ax = axis % len(x.dims)
    return prod(x.dims[:ax]), x.dims[ax], prod(x.dims[ax + 1:])


def quantize(step, ctx):
    # rint(x / s) + z in float32 equals the reference's float64 sum wherever it is not
    # saturated: both are exact below 2**24, and beyond it both saturate alike
    x, sb, zb = step.ins
    y = step.outs[0]
    if x.dtype != np.float32:
        _fail(step, f"a {x.dtype.name} input; the C template takes float32")
    s = _const(step, sb, "the scale").astype(np.float32)
    z = _const(step, zb, "the zero point").astype(np.int64)
    lo, hi = (0, 255) if y.dtype == np.uint8 else (-128, 127)
    ch = _channels(step, x, s, z, step.attrs.get("axis", 1))
    sc, zc = ctx.const(s.reshape(-1)), ctx.const(z.reshape(-1).astype(np.int32))
    outer, c, inner = ch if ch else (x.numel, Poly.const(1), Poly.const(1))
    return cfill(
        "    for (idx o = 0; o < @outer@; o++)\n"
        "        for (idx c = 0; c < @c@; c++)\n"
        "            for (idx i = 0; i < @inner@; i++) {\n"
        "                idx at = (o * @c@ + c) * @inner@ + i;\n"
        "                float v = @x@[at] / @s@[c];\n"
        "                float d = (v != v ? 0.0f : rintf(v)) + (float)@z@[c];\n"
        "                @y@[at] = (@yt@)(d < @lo@ ? @lo@ : (d > @hi@ ? @hi@ : d));\n"
        "            }", outer=outer.code(), c=c.code(), inner=inner.code(), x=x.name,
        s=sc.name, z=zc.name, y=y.name, yt=ctype(y.dtype), lo=num(lo), hi=num(hi))


def dequantize(step, ctx):
    q, sb, zb = step.ins
    y = step.outs[0]
    s = _const(step, sb, "the scale")
    if y.dtype != np.float32:
        _fail(step, f"a {y.dtype.name} output; the C template writes float32")
    z = _const(step, zb, "the zero point").astype(np.int32)
    ch = _channels(step, q, s, z, step.attrs.get("axis", 1))
    sc, zc = ctx.const(s.astype(np.float32).reshape(-1)), ctx.const(z.reshape(-1))
    outer, c, inner = ch if ch else (q.numel, Poly.const(1), Poly.const(1))
    return cfill(
        "    for (idx o = 0; o < @outer@; o++)\n"
        "        for (idx c = 0; c < @c@; c++)\n"
        "            for (idx i = 0; i < @inner@; i++) {\n"
        "                idx at = (o * @c@ + c) * @inner@ + i;\n"
        "                @y@[at] = (float)((int32_t)@q@[at] - @z@[c]) * @s@[c];\n"
        "            }", outer=outer.code(), c=c.code(), inner=inner.code(), q=q.name,
        s=sc.name, z=zc.name, y=y.name)


EMITTERS = {"quantize": quantize, "dequantize": dequantize, "qlinear_dense": qdense,
            "qdense": qdense, "qlinear_conv2d": qconv2d}
SCRATCH = {"qlinear_conv2d": qconv2d_scratch}
__all__ = ["EMITTERS", "SCRATCH", "join"]
