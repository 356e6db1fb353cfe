"""PyTorch oracles for the conv / pool / sort ops, for the op-table harness.

`ORACLE[name](torch, args, attrs)` takes the sample's args as torch tensors and its
attrs, and returns what the sampan op returns (a tuple for multi-output ops)."""


def _conv(torch, a, at):
    return torch.nn.functional.conv2d(a[0], a[1], None, at["stride"], at["padding"],
                                      at["dilation"], at["groups"])


def _conv_t(torch, a, at):
    return torch.nn.functional.conv_transpose2d(a[0], a[1], None, at["stride"], at["padding"],
                                                at["output_padding"], at["groups"],
                                                at["dilation"])


def _conv_gw(torch, a, at):
    x, g = a
    w_size = (g.shape[1], x.shape[1] // at["groups"]) + tuple(at["kernel_size"])
    return torch.nn.grad.conv2d_weight(x, w_size, g, at["stride"], at["padding"],
                                       at["dilation"], at["groups"])


def _max(torch, a, at, **kw):
    return torch.nn.functional.max_pool2d(a[0], at["kernel_size"], at["stride"], at["padding"],
                                          at["dilation"], **kw)


def _max_grad(torch, a, at):
    x = a[0].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        y = _max(torch, (x,), at)
        return torch.autograd.grad(y, x, a[1], create_graph=True)[0]


def _max_gather(torch, a, at):
    y, idx = _max(torch, a, at, return_indices=True)
    v = a[1].flatten(2)
    return v.gather(2, idx.flatten(2)).view(y.shape)


def _avg(torch, a, at):
    return torch.nn.functional.avg_pool2d(a[0], at["kernel_size"], at["stride"], at["padding"],
                                          count_include_pad=at["count_include_pad"])


def _avg_grad(torch, a, at):
    g = a[0]
    x = torch.zeros(tuple(g.shape[:2]) + tuple(at["input_size"]), dtype=g.dtype,
                    requires_grad=True)
    with torch.enable_grad():
        y = _avg(torch, (x,), at)
        return torch.autograd.grad(y, x, g, create_graph=True)[0]


def _sort(torch, a, at):
    r = torch.sort(a[0], dim=at["axis"], descending=at["descending"], stable=True)
    return r.values, r.indices


def _argsort(torch, a, at):
    return torch.argsort(a[0], dim=at["axis"], descending=at["descending"], stable=True)


def _topk(torch, a, at):
    r = torch.topk(a[0], at["k"], dim=at["axis"], largest=at["largest"], sorted=True)
    return r.values, r.indices


ORACLE = {
    "conv2d": _conv,
    "conv_transpose2d": _conv_t,
    "conv2d_grad_weight": _conv_gw,
    "max_pool2d": _max,
    "max_pool2d_grad": _max_grad,
    "max_pool2d_gather": _max_gather,
    "avg_pool2d": _avg,
    "avg_pool2d_grad": _avg_grad,
    "sort": _sort,
    "argsort": _argsort,
    "topk": _topk,
}


# ---------------------------------------------------------------------- nnbasic (issue 17)
def _ctc_true(torch, a, at):
    """The CTC negative log-likelihood of any log_probs (not only normalised ones), with
    its true gradient: torch's ctc_loss of log_softmax(lp) minus each frame's logsumexp
    (torch's own kernel returns exp(lp) - posterior as the gradient, see nn_ops.py)."""
    lp, tg, il, tl = a
    nll = torch.nn.functional.ctc_loss(lp.log_softmax(-1), tg, il, tl, blank=at["blank"],
                                       reduction="none", zero_infinity=False)
    lse = lp.logsumexp(-1)                                  # (T, N)
    mask = torch.arange(lp.shape[0])[:, None] < il[None, :]
    return nll - (lse * mask).sum(0)


def _ctc_posterior(torch, a, at):
    x = a[0].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        y = _ctc_true(torch, (x,) + tuple(a[1:]), at)
        return -torch.autograd.grad(y.sum(), x)[0]


ORACLE["ctc_loss"] = _ctc_true
ORACLE["ctc_loss_posterior"] = _ctc_posterior


def _tf(name, **kw):
    return lambda torch, a, at: getattr(torch.nn.functional, name)(*a, **at, **kw)


COMPOSITE_ORACLE = {
    "nn_hardswish": _tf("hardswish"), "nn_hardsigmoid": _tf("hardsigmoid"),
    "nn_mish": _tf("mish"), "nn_selu": _tf("selu"), "nn_celu": _tf("celu", alpha=0.7),
    "nn_softsign": _tf("softsign"), "nn_logsigmoid": _tf("logsigmoid"),
    "nn_softshrink": _tf("softshrink"), "nn_glu": _tf("glu"), "nn_prelu": _tf("prelu"),
}
