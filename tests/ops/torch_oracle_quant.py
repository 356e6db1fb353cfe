"""(issue 19) PyTorch oracles for the quantisation ops: quantize / dequantize through
torch's quantized tensors (qint8 / quint8, round half to even), fake_quant through
torch.fake_quantize_per_{tensor,channel}_affine (its gradient for the mask), and the int8
GEMM / conv ops through exact int64 / float64 arithmetic in torch."""


def _qdtype(torch, zp):
    return torch.quint8 if zp.dtype == torch.uint8 else torch.qint8


def _quantize(torch, a, at):
    x, s, z = a
    if s.ndim == 0:
        q = torch.quantize_per_tensor(x, float(s), int(z), _qdtype(torch, z))
    else:
        q = torch.quantize_per_channel(x, s.double(), z.long(), at.get("axis", 1) % x.ndim,
                                       _qdtype(torch, z))
    return q.int_repr()


def _dequantize(torch, a, at):
    q, s, z = a
    if s.ndim == 0:
        t = torch._make_per_tensor_quantized_tensor(q, float(s), int(z))
    else:
        t = torch._make_per_channel_quantized_tensor(q, s.double(), z.long(),
                                                     at.get("axis", 1) % q.ndim)
    return torch.dequantize(t).to(s.dtype)


def _fq(torch, a, at):
    x, s, z = a
    lo, hi = at.get("quant_min", -128), at.get("quant_max", 127)
    if s.ndim == 0:
        return torch.fake_quantize_per_tensor_affine(x, s.to(x.dtype) if x.dtype ==
                                                     torch.float32 else s.float(), z.int(),
                                                     lo, hi)
    return torch.fake_quantize_per_channel_affine(x, s.float(), z.int(),
                                                  at.get("axis", 1) % x.ndim, lo, hi)


def _fq_mask(torch, a, at):
    x = a[0].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        y = _fq(torch, (x,) + tuple(a[1:]), at)
        return torch.autograd.grad(y.sum(), x)[0]


def _chan(torch, v, n):
    return v.double().reshape(-1).expand(n) if v.ndim else v.double().expand(n)


def _acc(torch, a, b, za, zb):
    return (a.double() - za.double()) @ (b.double() - zb.double().reshape(1, -1))


def _mmi(torch, a, at):
    x, w, za, zb = a
    return _acc(torch, x, w, za, zb).to(torch.int32)


def _qmm(torch, a, at):
    x, w, sa, za, sb, zb = a
    if at.get("transposed"):
        w = w.t()
    acc = _acc(torch, x, w, za, zb)
    return (acc * (sa.double() * _chan(torch, sb, w.shape[1]))).float()


def _requant(torch, acc, mult, zy):
    lo, hi = (0, 255) if zy.dtype == torch.uint8 else (-128, 127)
    return (torch.round(acc * mult) + int(zy)).clamp(lo, hi).to(zy.dtype)


def _qlmm(torch, a, at):
    x, sa, za, w, sb, zb, sy, zy = a
    acc = _acc(torch, x, w, za, zb)
    return _requant(torch, acc, sa.double() * _chan(torch, sb, w.shape[1]) / sy.double(), zy)


def _conv_acc(torch, x, w, xz, wz, at):
    o = w.shape[0]
    xd = x.double() - xz.double()
    wd = w.double() - _chan(torch, wz, o).reshape(o, 1, 1, 1)
    return torch.nn.functional.conv2d(xd, wd, None, at["stride"], at["padding"],
                                      at["dilation"], at["groups"])


def _ci(torch, a, at):
    return _conv_acc(torch, a[0], a[1], a[2], a[3], at).to(torch.int32)


def _qc(torch, a, at):
    x, w, sx, xz, sw, wz = a
    acc = _conv_acc(torch, x, w, xz, wz, at)
    return (acc * (sx.double() * _chan(torch, sw, w.shape[0])).reshape(1, -1, 1, 1)).float()


def _qlc(torch, a, at):
    x, sx, xz, w, sw, wz, sy, zy = a
    acc = _conv_acc(torch, x, w, xz, wz, at)
    mult = (sx.double() * _chan(torch, sw, w.shape[0]) / sy.double()).reshape(1, -1, 1, 1)
    return _requant(torch, acc, mult, zy)


ORACLE: dict = {
    "quantize": _quantize,
    "dequantize": _dequantize,
    "fake_quant": _fq,
    "fake_quant_mask": _fq_mask,
    "matmul_integer": _mmi,
    "qmatmul": _qmm,
    "qlinear_matmul": _qlmm,
    "conv_integer": _ci,
    "qconv2d": _qc,
    "qlinear_conv": _qlc,
}

COMPOSITE_ORACLE: dict = {}


# ---- the requantising layers of fuse_quant (issue 31): exact sums in float64, the
# epilogue in float32 as the ops define it (multiplier xs * ws / ys in float32)
def _mult32(torch, xs, ws, ys, n):
    m = xs.float() * (ws.float().reshape(-1).expand(n) if ws.ndim else ws.float().expand(n))
    return m if ys is None else m / ys.float()


def _bounds(torch, yz, at):
    lo, hi = (0, 255) if yz.dtype == torch.uint8 else (-128, 127)
    qmin, qmax = at.get("qmin"), at.get("qmax")
    return max(lo, lo if qmin is None else int(qmin)), min(hi, hi if qmax is None else int(qmax))


def _finish(torch, acc, bias, m, yz, at):
    v = (acc + bias.double()).float() * m
    lo, hi = _bounds(torch, yz, at)
    return (torch.round(v) + int(yz)).clamp(lo, hi).to(yz.dtype)


def _qld(torch, a, at):
    x, xs, xz, w, ws, wz, bias, ys, yz = a
    acc = _acc(torch, x, w.t(), xz, wz)                      # w is (N, K)
    return _finish(torch, acc, bias, _mult32(torch, xs, ws, ys, w.shape[0]), yz, at)


def _qd(torch, a, at):
    x, xs, xz, w, ws, wz, bias = a
    acc = _acc(torch, x, w.t(), xz, wz)
    return (acc + bias.double()).float() * _mult32(torch, xs, ws, None, w.shape[0])


def _qlc2(torch, a, at):
    x, xs, xz, w, ws, wz, bias, ys, yz = a
    acc = _conv_acc(torch, x, w, xz, wz, at)
    o = w.shape[0]
    m = _mult32(torch, xs, ws, ys, o).reshape(1, o, 1, 1)
    return _finish(torch, acc, bias.reshape(1, o, 1, 1), m, yz, at)


def _qlc2_pool(torch, a, at):
    y = _qlc2(torch, a, at)                     # integers: exact in float32 for the pool
    return torch.nn.functional.max_pool2d(y.float(), 2, 2).to(y.dtype)


def _qdd(torch, a, at):
    x, w, w_scale = a[:3]                                   # per-row uint8 activations
    lo = torch.clamp(x.amin(1), max=0) if x.shape[1] else torch.zeros(x.shape[0])
    hi = torch.clamp(x.amax(1), min=0) if x.shape[1] else torch.zeros(x.shape[0])
    s = (hi - lo) / 255.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    z = torch.clamp(torch.round(-lo / s), 0, 255)
    q = torch.clamp(torch.round(x / s[:, None]) + z[:, None], 0, 255)
    acc = q.double() @ w.double().t() - z.double()[:, None] * w.double().sum(1)[None, :]
    y = (acc.float() * s[:, None]) * w_scale[None, :]
    return y if len(a) == 3 else y + a[3][None, :]


ORACLE.update({"qlinear_dense": _qld, "qdense": _qd, "qlinear_conv2d": _qlc2,
               "qlinear_conv2d_pool": _qlc2_pool, "qdense_dynamic": _qdd})
