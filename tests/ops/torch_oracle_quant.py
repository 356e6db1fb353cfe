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
