"""Quantisation-aware training: fake-quant in every Linear / Conv2d of a Layer, fine-tune,
then convert to int8.

`prepare_qat(model)` makes each Linear and Conv2d compute with fake-quantised weights (per
output channel, symmetric, the scale following the weight) and inputs (per tensor, affine,
the range a moving average of each training batch's min and max, as PyTorch's
MovingAverageMinMaxObserver with averaging constant 0.01; the first batch sets it). The
gradient is straight-through (`fake_quant`), so training learns weights that survive int8
rounding. In eval mode the ranges stay fixed.

`convert(model)` returns a copy whose Linear / Conv2d run the int8 ops (`qmatmul`,
`qconv2d`) on int8 weights, quantising each input with the range learned in training (or
calibrated: `convert(model, calibration)` with a Layer `Calibration`).

Example::

    >>> qmodel = sampan.quant.prepare_qat(model)
    >>> ... fine-tune qmodel ...
    >>> int8_model = sampan.quant.convert(qmodel)
"""
from __future__ import annotations

import copy

import numpy as np

from .calibrate import QuantError
from .observers import affine_qparams, quantize_weight, weight_qparams

AVERAGING = 0.01


def _targets(model):
    from ..nn import Conv2d, Linear
    out = [(n, m) for n, m in model.named_layers() if isinstance(m, (Linear, Conv2d))]
    if not out:
        raise QuantError(f"sampan.quant: {type(model).__name__} has no Linear or Conv2d layer "
                         "to quantise")
    for n, m in out:
        if isinstance(m, Conv2d) and m.padding_mode != "zeros":
            raise QuantError(f"sampan.quant: {n} has padding_mode={m.padding_mode!r}; only "
                             "'zeros' is supported")
    return out


def _kind(m):
    from ..nn import Linear
    return "linear" if isinstance(m, Linear) else "conv"


def _qat_forward(m):
    from ..ops.quant import FAKE_QUANT
    from ..tensor import Tensor, apply
    st = m._qat

    def forward(x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        a = np.asarray(x.detach().numpy())
        if m.training and a.size:
            lo, hi = float(a.min()), float(a.max())
            if st["lo"] is None:
                st["lo"], st["hi"] = lo, hi
            else:
                st["lo"] += AVERAGING * (lo - st["lo"])
                st["hi"] += AVERAGING * (hi - st["hi"])
        if st["lo"] is not None:
            s, z = affine_qparams(st["lo"], st["hi"])
            x = apply(FAKE_QUANT, (x, Tensor(np.asarray(s, a.dtype)),
                                   Tensor(np.asarray(z, np.int32))), {})
        axis = 1 if st["kind"] == "linear" else 0
        ws, _ = weight_qparams(m.weight.detach().numpy(), axis)
        w = apply(FAKE_QUANT, (m.weight, Tensor(ws.astype(a.dtype)),
                               Tensor(np.zeros(ws.shape, np.int32))),
                  {"quant_min": -127, "quant_max": 127, "axis": axis})
        return st["float_forward"](x, w)
    return forward


def _float_forward(m):
    from ..nn import functional as F
    if _kind(m) == "linear":
        return lambda x, w: F.linear(x, w, m.bias)
    args = m._args()
    return lambda x, w: F.conv2d(x, w, m.bias, **args)


def prepare_qat(model, inplace=False):
    """Fake-quantise the weights and inputs of every Linear / Conv2d of `model` (a copy
    unless `inplace`) for quantisation-aware training. Returns the model.

    Example: ``qmodel = sampan.quant.prepare_qat(model); train(qmodel)``"""
    model = model if inplace else copy.deepcopy(model)
    for _, m in _targets(model):
        m._qat = {"lo": None, "hi": None, "kind": _kind(m), "float_forward": _float_forward(m)}
        m.forward = _qat_forward(m)
    return model


def _int8_forward(m, s, z):
    from ..ops.conv import _bias
    from ..ops.quant import QCONV2D, QMATMUL, QUANTIZE
    from ..tensor import Tensor, apply
    kind = _kind(m)
    axis = 1 if kind == "linear" else 0
    wq, ws, wz = quantize_weight(m.weight.detach().numpy(), axis)
    if kind == "linear":
        wq = np.ascontiguousarray(wq.T)
    consts = [Tensor(wq), Tensor(np.asarray(s, np.float32)), Tensor(np.asarray(z, np.int8)),
              Tensor(ws), Tensor(wz)]
    bias = None if m.bias is None else Tensor(m.bias.detach().numpy().copy())
    args = {} if kind == "linear" else m._args()
    m._int8 = {"weight": consts[0], "scale": ws, "x_scale": s, "x_zero_point": z}

    def forward(x):
        from ..nn import functional as F
        x = x if isinstance(x, Tensor) else Tensor(x)
        if x.dtype != np.float32:
            raise QuantError(f"sampan.quant: int8 {type(m).__name__} got a {x.dtype} input; "
                             "expected float32")
        q = apply(QUANTIZE, (x, consts[1], consts[2]), {})
        if kind == "linear":
            lead = tuple(x.shape[:-1])
            q2 = q.reshape(-1, x.shape[-1]) if len(lead) != 1 else q
            y = apply(QMATMUL, (q2, consts[0], consts[1], consts[2], consts[3], consts[4]),
                      {"transposed": True})
            if len(lead) != 1:
                y = y.reshape(lead + (wq.shape[0],))
            return y if bias is None else y + bias
        if isinstance(args["padding"], str):
            raise QuantError(f"sampan.quant: int8 Conv2d with padding={args['padding']!r} "
                             "is not supported; give the padding as ints")
        pair = {k: (v, v) if isinstance(v, int) else tuple(v) for k, v in args.items()
                if k != "groups"}
        y = apply(QCONV2D, (q, consts[0], consts[1], consts[2], consts[3], consts[4]),
                  dict(pair, groups=args["groups"]))
        del F
        return _bias(y, bias, 4, QCONV2D)
    return forward


def convert(model, calibration=None, inplace=False):
    """The int8 model: every Linear / Conv2d of `model` (prepared with `prepare_qat`, or a
    float model with a Layer `calibration` from `sampan.quant.calibrate`) runs int8 ops on
    int8 weights. Returns a copy unless `inplace`.

    Example: ``int8_model = sampan.quant.convert(qmodel)``"""
    model = model if inplace else copy.deepcopy(model)
    acts = calibration.acts if calibration is not None else {}
    for name, m in _targets(model):
        st = m.__dict__.get("_qat")
        if name in acts:
            s, z = acts[name]
        elif st is not None and st["lo"] is not None:
            s, z = affine_qparams(st["lo"], st["hi"])
        else:
            raise QuantError(f"sampan.quant.convert: {name} has no activation range: train "
                             "it after prepare_qat, or pass a calibration of this model")
        m.__dict__.pop("_qat", None)
        m.forward = _int8_forward(m, s, z)
    return model
