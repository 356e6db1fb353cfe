"""(issue 17) PyTorch oracles for the spatial area's ops (pooling with ceil_mode and
indices, unpooling, padding modes, resampling): `ORACLE[name](torch, args, attrs)` for ops
in the table, `COMPOSITE_ORACLE[name]` for composites; merged by `harness.py` after the
nn oracles, so the pooling entries here (which read ceil_mode and divisor_override)
replace theirs."""


def _max(torch, a, at, **kw):
    return torch.nn.functional.max_pool2d(a[0], at["kernel_size"], at["stride"], at["padding"],
                                          at["dilation"], ceil_mode=at.get("ceil_mode", False),
                                          **kw)


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
    return torch.nn.functional.avg_pool2d(
        a[0], at["kernel_size"], at["stride"], at["padding"],
        ceil_mode=at.get("ceil_mode", False), count_include_pad=at["count_include_pad"],
        divisor_override=at.get("divisor_override") or None)


def _avg_grad(torch, a, at):
    g = a[0]
    x = torch.zeros(tuple(g.shape[:2]) + tuple(at["input_size"]), dtype=g.dtype,
                    requires_grad=True)
    with torch.enable_grad():
        y = _avg(torch, (x,), at)
        return torch.autograd.grad(y, x, g, create_graph=True)[0]


def _unpool(torch, a, at):
    x, i = a
    n, c = x.shape[:2]
    h, w = at["output_size"]
    out = torch.zeros(n, c, h * w, dtype=x.dtype).scatter(2, i.flatten(2), x.flatten(2))
    return out.view(n, c, h, w)


ORACLE: dict = {
    "max_pool2d": _max,
    "max_pool2d_grad": _max_grad,
    "max_pool2d_gather": _max_gather,
    "avg_pool2d": _avg,
    "avg_pool2d_grad": _avg_grad,
    "max_pool2d_indices": lambda torch, a, at: _max(torch, a, at, return_indices=True)[1],
    "adaptive_max_pool2d_indices": lambda torch, a, at: torch.nn.functional.adaptive_max_pool2d(
        a[0], at["output_size"], return_indices=True)[1],
    "max_unpool2d": _unpool,
}


def _pad_mode(mode):
    def oracle(torch, a, at):
        pairs = list(at["pads"])
        while pairs and pairs[0] == (0, 0):    # PyTorch takes amounts for the last dims only
            pairs.pop(0)
        flat = [v for pr in reversed(pairs) for v in pr]
        return torch.nn.functional.pad(a[0], flat, mode=mode)
    return oracle


COMPOSITE_ORACLE: dict = {f"pad_{m}": _pad_mode(m) for m in ("reflect", "replicate", "circular")}
COMPOSITE_ORACLE.update({
    "conv3d": lambda torch, a, at: torch.nn.functional.conv3d(*a, **at),
    "max_pool3d": lambda torch, a, at: torch.nn.functional.max_pool3d(*a, **at),
    "avg_pool3d": lambda torch, a, at: torch.nn.functional.avg_pool3d(*a, **at),
    "adaptive_avg_pool3d": lambda torch, a, at: torch.nn.functional.adaptive_avg_pool3d(*a,
                                                                                        **at),
})


def _interp(mode):
    def oracle(torch, a, at):
        return torch.nn.functional.interpolate(a[0], mode=mode, **at)
    return oracle


COMPOSITE_ORACLE.update({f"interpolate_{m.replace('-', '_')}": _interp(m) for m in (
    "nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear")})
COMPOSITE_ORACLE.update({
    "pixel_shuffle": lambda torch, a, at: torch.nn.functional.pixel_shuffle(a[0], **at),
    "pixel_unshuffle": lambda torch, a, at: torch.nn.functional.pixel_unshuffle(a[0], **at),
    "unfold": lambda torch, a, at: torch.nn.functional.unfold(a[0], **at),
    "fold": lambda torch, a, at: torch.nn.functional.fold(a[0], **at),
})


def _gs(mode, padding_mode, align):
    def oracle(torch, a, at):
        return torch.nn.functional.grid_sample(a[0], a[1], mode, padding_mode, align)
    return oracle


COMPOSITE_ORACLE.update({
    "grid_sample_bilinear_zeros": _gs("bilinear", "zeros", False),
    "grid_sample_bilinear_border": _gs("bilinear", "border", True),
    "grid_sample_bilinear_reflection": _gs("bilinear", "reflection", False),
    "grid_sample_nearest_reflection": _gs("nearest", "reflection", True),
    "affine_grid": lambda torch, a, at: torch.nn.functional.affine_grid(a[0], **at),
})


def _bag(mode):
    def oracle(torch, a, at):
        ids, w = a[0], a[1]
        off = a[2] if len(a) > 2 else None
        psw = a[3] if len(a) > 3 else None
        return torch.nn.functional.embedding_bag(ids, w, off, mode=mode, per_sample_weights=psw,
                                                 **at)
    return oracle


COMPOSITE_ORACLE.update({f"embedding_bag_{m}": _bag(m) for m in ("sum", "mean", "max")})
COMPOSITE_ORACLE.update({
    "instance_norm": lambda torch, a, at: torch.nn.functional.instance_norm(*a, **at),
    "local_response_norm": lambda torch, a, at: torch.nn.functional.local_response_norm(*a,
                                                                                        **at),
})
COMPOSITE_ORACLE.update({
    "channel_shuffle": lambda torch, a, at: torch.nn.functional.channel_shuffle(a[0], **at),
    "lp_pool1d": lambda torch, a, at: torch.nn.functional.lp_pool1d(a[0], **at),
    "lp_pool2d": lambda torch, a, at: torch.nn.functional.lp_pool2d(a[0], **at),
})
