"""PyTorch as a test-only oracle: op name -> function(torch, args, attrs) giving the
torch result for one sample. `None` means: no PyTorch counterpart (random streams);
those ops are checked against numpy and for determinism instead."""
from __future__ import annotations

import numpy as np


def _idx(torch, enc, tensors):
    out = []
    for it in enc:
        k = it[0]
        out.append(slice(it[1], it[2], it[3]) if k == "s" else it[1] if k == "i" else
                   None if k == "n" else Ellipsis if k == "e" else tensors[it[1]])
    return tuple(out)


def _red(f):
    def g(torch, a, attrs):
        x = a[0]
        ax = attrs.get("axis")
        kd = attrs.get("keepdims", False)
        if ax is None:
            r = f(torch, x)
            return r.reshape((1,) * x.ndim) if kd else r
        return f(torch, x, dim=ax, keepdim=kd)
    return g


def _amax(torch, x, dim=None, keepdim=False):
    return torch.amax(x) if dim is None else torch.amax(x, dim=dim, keepdim=keepdim)


def _amin(torch, x, dim=None, keepdim=False):
    return torch.amin(x) if dim is None else torch.amin(x, dim=dim, keepdim=keepdim)


def _prod(torch, x, dim=None, keepdim=False):
    if dim is None:
        return torch.prod(x)
    for d in sorted(dim, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keepdim)
    return x


def _arg(name):
    def g(torch, a, attrs):
        f = getattr(torch, name)
        if attrs["axis"] is None:
            r = f(a[0])
            return r.reshape((1,) * a[0].ndim) if attrs["keepdims"] else r
        return f(a[0], dim=attrs["axis"], keepdim=attrs["keepdims"])
    return g


def _getitem_grad(torch, a, attrs):
    g, *idx = a
    out = torch.zeros(attrs["shape"], dtype=g.dtype)
    return out.index_put(_idx(torch, attrs["index"], idx), g, accumulate=True)


def _index_add(torch, a, attrs):
    return a[0].index_add(attrs["axis"], a[1], a[2])


def _pad(torch, a, attrs):
    flat = []
    for lo, hi in reversed(attrs["pads"]):
        flat += [lo, hi]
    return torch.nn.functional.pad(a[0], flat, value=attrs["value"])


ORACLE = {
    "add": lambda t, a, k: a[0] + a[1], "sub": lambda t, a, k: a[0] - a[1],
    "mul": lambda t, a, k: a[0] * a[1], "div": lambda t, a, k: a[0] / a[1],
    "pow": lambda t, a, k: a[0] ** a[1], "maximum": lambda t, a, k: t.maximum(a[0], a[1]),
    "minimum": lambda t, a, k: t.minimum(a[0], a[1]),
    "floor_divide": lambda t, a, k: t.floor_divide(a[0], a[1]),
    "mod": lambda t, a, k: t.remainder(a[0], a[1]),
    "eq": lambda t, a, k: a[0] == a[1], "ne": lambda t, a, k: a[0] != a[1],
    "lt": lambda t, a, k: a[0] < a[1], "le": lambda t, a, k: a[0] <= a[1],
    "gt": lambda t, a, k: a[0] > a[1], "ge": lambda t, a, k: a[0] >= a[1],
    "logical_and": lambda t, a, k: t.logical_and(a[0], a[1]),
    "logical_or": lambda t, a, k: t.logical_or(a[0], a[1]),
    "logical_xor": lambda t, a, k: t.logical_xor(a[0], a[1]),
    "logical_not": lambda t, a, k: t.logical_not(a[0]),
    "neg": lambda t, a, k: -a[0], "abs": lambda t, a, k: t.abs(a[0]),
    "exp": lambda t, a, k: t.exp(a[0]), "log": lambda t, a, k: t.log(a[0]),
    "sqrt": lambda t, a, k: t.sqrt(a[0]), "sin": lambda t, a, k: t.sin(a[0]),
    "cos": lambda t, a, k: t.cos(a[0]), "tanh": lambda t, a, k: t.tanh(a[0]),
    "sigmoid": lambda t, a, k: t.sigmoid(a[0]), "relu": lambda t, a, k: t.relu(a[0]),
    "erf": lambda t, a, k: t.erf(a[0]), "reciprocal": lambda t, a, k: t.reciprocal(a[0]),
    "log1p": lambda t, a, k: t.log1p(a[0]), "expm1": lambda t, a, k: t.expm1(a[0]),
    "softplus": lambda t, a, k: t.nn.functional.softplus(a[0]),
    "sign": lambda t, a, k: t.sign(a[0]), "floor": lambda t, a, k: t.floor(a[0]),
    "ceil": lambda t, a, k: t.ceil(a[0]), "round": lambda t, a, k: t.round(a[0]),
    "where": lambda t, a, k: t.where(a[0], a[1], a[2]),
    "cast": lambda t, a, k: a[0].to({"float64": t.float64, "float32": t.float32,
                                     "int32": t.int32, "bfloat16": t.bfloat16,
                                     "float16": t.float16}[k["dtype"]]),
    "sum": _red(lambda t, x, **kw: t.sum(x, **kw)),
    "mean": _red(lambda t, x, **kw: t.mean(x, **kw)),
    "max": _red(_amax), "min": _red(_amin), "prod": _red(_prod),
    "argmax": _arg("argmax"), "argmin": _arg("argmin"),
    "all": _red(lambda t, x, **kw: t.all(x) if not kw else _all(t, x, **kw)),
    "any": _red(lambda t, x, **kw: t.any(x) if not kw else _any(t, x, **kw)),
    "cumsum": lambda t, a, k: t.cumsum(a[0], dim=k["axis"]),
    "reshape": lambda t, a, k: a[0].reshape(k["shape"]),
    "permute": lambda t, a, k: a[0].permute(*k["dims"]),
    "expand": lambda t, a, k: a[0].expand(*k["shape"]),
    "concat": lambda t, a, k: t.cat(a, dim=k["axis"]),
    "pad": _pad, "flip": lambda t, a, k: t.flip(a[0], dims=k["axes"]),
    "copy": lambda t, a, k: a[0].clone(),
    "getitem": lambda t, a, k: a[0][_idx(t, k["index"], a[1:])],
    "getitem_grad": _getitem_grad,
    "setitem": lambda t, a, k: _setitem(t, a, k),
    "index_select": lambda t, a, k: t.index_select(a[0], k["axis"], a[1]),
    "index_add": _index_add,
    "take_along_axis": lambda t, a, k: t.gather(a[0], k["axis"], a[1]),
    "scatter_add": lambda t, a, k: a[0].scatter_add(k["axis"], a[1], a[2]),
    "matmul": lambda t, a, k: t.matmul(a[0], a[1]),
    "full": lambda t, a, k: t.full(k["shape"], k["value"], dtype=getattr(t, k["dtype"])),
    "arange": lambda t, a, k: t.arange(k["start"], k["stop"], k["step"],
                                       dtype=getattr(t, k["dtype"])),
    "uniform": None, "normal": None, "randint": None,
}


def _all(t, x, dim, keepdim):
    for d in sorted(dim, reverse=True):
        x = t.all(x, dim=d, keepdim=keepdim)
    return x


def _any(t, x, dim, keepdim):
    for d in sorted(dim, reverse=True):
        x = t.any(x, dim=d, keepdim=keepdim)
    return x


def _setitem(t, a, k):
    x = a[0].clone()
    x[_idx(t, k["index"], a[2:])] = a[1]
    return x


def _ce(t, a, k):
    return t.nn.functional.cross_entropy(*a, **k)   # (input, target[, weight])


COMPOSITE_ORACLE = {
    "softmax": lambda t, a, k: t.softmax(a[0], dim=k["axis"]),
    "log_softmax": lambda t, a, k: t.log_softmax(a[0], dim=k["axis"]),
    "logsumexp": lambda t, a, k: t.logsumexp(a[0], dim=k["axis"]),
    "var": lambda t, a, k: t.var(a[0], dim=k["axis"]),
    "std": lambda t, a, k: t.std(a[0], dim=k["axis"]),
    "layer_norm": lambda t, a, k: t.nn.functional.layer_norm(a[0], a[1], a[2], a[3]),
    "rms_norm": lambda t, a, k: t.nn.functional.rms_norm(a[0], a[1], a[2], eps=1e-6),
    "batch_norm": lambda t, a, k: t.nn.functional.batch_norm(a[0], None, None, a[3], a[4],
                                                             training=True),
    "gelu": lambda t, a, k: t.nn.functional.gelu(a[0], approximate=k.get("approximate",
                                                                         "none")),
    "silu": lambda t, a, k: t.nn.functional.silu(a[0]),
    "leaky_relu": lambda t, a, k: t.nn.functional.leaky_relu(a[0]),
    "softplus_beta": lambda t, a, k: t.nn.functional.softplus(a[0], beta=k["beta"]),
    "cross_entropy": _ce,
}


def to_torch(torch, x, dtype=None):
    if x is None or isinstance(x, (tuple, int, float)):
        return x
    x = np.asarray(x)
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(x.copy())


def _triu_scatter(t, a, k):
    g = a[0]
    n = k["k"]
    i, j = t.triu_indices(n, n, 1)
    out = t.zeros((g.shape[0], n, n), dtype=g.dtype)
    return out.index_put((t.arange(g.shape[0])[:, None], i[None], j[None]), g)


ORACLE.update({
    "rows_gather": lambda t, a, k: a[0][a[1]],
    "rows_scatter_add": lambda t, a, k: t.zeros((k["n"], a[0].shape[1]), dtype=a[0].dtype)
    .index_add(0, a[1], a[0]),
    "triu_gather": lambda t, a, k: a[0][:, t.triu_indices(a[0].shape[1], a[0].shape[1], 1)[0],
                                        t.triu_indices(a[0].shape[1], a[0].shape[1], 1)[1]],
    "triu_scatter": _triu_scatter,
})
ORACLE["fused"] = None  # the fusion pass's node: tests/fusion checks it against its body
ORACLE["engine"] = None  # the offload pass's node: tests/inference/test_offload.py checks it
# issue 34: control flow; tests/jit/test_control_jit.py checks them against numpy and eager
ORACLE["cond"] = ORACLE["while_loop"] = ORACLE["scan"] = None


def _pair_dots(t, a, k):
    x = a[0]
    n = x.shape[1]
    i, j = t.triu_indices(n, n, 1)
    return (x @ x.transpose(1, 2))[:, i, j]


def _pair_dots_grad(t, a, k):
    g, x = a
    n = x.shape[1]
    i, j = t.triu_indices(n, n, 1)
    m = t.zeros((g.shape[0], n, n), dtype=g.dtype)
    m = m.index_put((t.arange(g.shape[0])[:, None], i[None], j[None]), g)
    return (m + m.transpose(1, 2)) @ x


ORACLE.update({"pair_dots": _pair_dots, "pair_dots_grad": _pair_dots_grad})

def _ln_grad_oracle(which):
    def oracle(t, a, k):
        import torch
        if which == 0:
            x, w, g = a
        else:
            x, g = a
            w = t.ones(x.shape[-1], dtype=x.dtype)
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            w = w.detach().requires_grad_()
            y = t.nn.functional.layer_norm(x, x.shape[-1:], w, None, k["eps"])
            gx, gw = torch.autograd.grad(y, (x, w), g)
        return gx if which == 0 else gw
    return oracle


def _ln_grad_all_oracle(t, a, k):
    x, w, g = a
    lead = tuple(range(x.dim() - 1))
    return (_ln_grad_oracle(0)(t, a, k), _ln_grad_oracle(1)(t, (x, g), k),
            g.sum(lead) if lead else g)


def _xent_grad_oracle(t, a, k):
    x, tg, lse, g, h = a
    valid = tg != k["ignore_index"]
    w = g * valid.to(x.dtype)
    onehot = t.nn.functional.one_hot(t.where(valid, tg, 0), x.shape[1]).to(x.dtype)
    return t.exp(x - lse[:, None]) * (w + h)[:, None] - onehot * w[:, None]


def _std_grad_oracle(t, a, k):
    x, g = a
    m = x.mean(-1, keepdim=True)
    r = 1 / t.sqrt(((x - m) ** 2).mean(-1, keepdim=True) + k["eps"])
    y = (x - m) * r
    return r * (g - g.mean(-1, keepdim=True) - y * (g * y).mean(-1, keepdim=True))


ORACLE.update({"standardize": lambda t, a, k: t.nn.functional.layer_norm(
                   a[0], (a[0].shape[-1],), eps=k["eps"]),
               "standardize_grad": _std_grad_oracle,
               "softmax": lambda t, a, k: t.softmax(a[0], -1),
               "log_softmax": lambda t, a, k: t.log_softmax(a[0], -1),
               "softmax_grad": lambda t, a, k: a[0] * (a[1] - (a[1] * a[0]).sum(-1, keepdim=True)),
               "log_softmax_grad": lambda t, a, k: a[1] - t.exp(a[0]) * a[1].sum(-1, keepdim=True),
               "gelu": lambda t, a, k: t.nn.functional.gelu(a[0]),
               "gelu_grad": lambda t, a, k: a[1] * (0.5 * (1 + t.erf(a[0] * 0.7071067811865476))
                                                 + a[0] * 0.3989422804014327
                                                 * t.exp(-0.5 * a[0] * a[0])),
               "tanh_grad": lambda t, a, k: a[1] * (1 - a[0] * a[0]),
               "sigmoid_grad": lambda t, a, k: a[1] * a[0] * (1 - a[0]),
               "relu_grad": lambda t, a, k: t.where(a[0] > 0, a[1], t.zeros_like(a[1])),
               "softmax_cross_entropy": lambda t, a, k: (t.nn.functional.cross_entropy(
                   a[0], a[1], ignore_index=k["ignore_index"], reduction="none"),
                   t.logsumexp(a[0], -1)),
               "softmax_cross_entropy_grad": _xent_grad_oracle,
               "layer_norm_affine": lambda t, a, k: t.nn.functional.layer_norm(
                   a[0], a[0].shape[-1:], a[1], a[2], k["eps"]),
               "layer_norm_grad_input": _ln_grad_oracle(0),
               "layer_norm_grad_weight": _ln_grad_oracle(1),
               "layer_norm_grad": _ln_grad_all_oracle})


# issue 31: the Predictor's fused float layers (sampan/ops/dense.py)
def _dense(t, a, k):
    y = a[0] @ a[1] + a[2]
    return t.relu(y) if k.get("relu") else y


def _conv2d_block(t, a, k):
    F = t.nn.functional
    y = F.conv2d(a[0], a[1], a[2], stride=k["stride"], padding=k["padding"],
                 dilation=k["dilation"], groups=k["groups"])
    if k.get("relu"):
        y = t.relu(y)
    return F.max_pool2d(y, 2) if k.get("pool") else y


ORACLE.update({"dense": _dense, "conv2d_block": _conv2d_block})


# issue 31: BERT's self-attention in one node (sampan/ops/attention.py)
def _attention(t, a, k):
    q, kk, v = a[:3]
    b, s, h = q.shape
    nh = k["heads"]

    def split(x):
        return x.reshape(b, s, nh, h // nh).transpose(1, 2)
    mask = a[3] if len(a) > 3 else None
    o = t.nn.functional.scaled_dot_product_attention(split(q), split(kk), split(v),
                                                     attn_mask=mask, scale=k["scale"])
    return o.transpose(1, 2).reshape(b, s, h)


ORACLE.update({"attention": _attention})
