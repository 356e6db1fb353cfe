"""(issue 17) PyTorch oracles for this area's ops: `ORACLE[name](torch, args, attrs)` for ops
in the table, `COMPOSITE_ORACLE[name]` for composites; merged by `harness.py`."""


def _torch_arg(torch, v):
    import numpy as np
    return torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v


def _unique(t, a, k):
    if k["dim"] is None:
        return t.unique(a[0], sorted=True, return_inverse=True, return_counts=True)
    return t.unique(a[0], sorted=True, return_inverse=True, return_counts=True, dim=k["dim"])


def _ucons(t, a, k):
    kw = {} if k["dim"] is None else {"dim": k["dim"]}
    return t.unique_consecutive(a[0], return_inverse=True, return_counts=True, **kw)


def _bincount(t, a, k):
    return t.bincount(a[0], weights=a[1] if len(a) > 1 else None, minlength=k["minlength"])


def _interp(k):
    return k.get("interpolation", "linear")


ORACLE: dict = {
    "scatter": lambda t, a, k: a[0].scatter(k["axis"], a[1], a[2]),
    "scatter_reduce": lambda t, a, k: a[0].scatter_reduce(
        k["axis"], a[1], a[2], k["reduce"], include_self=k["include_self"]),
    "masked_select": lambda t, a, k: t.masked_select(a[0], a[1]),
    "masked_scatter": lambda t, a, k: a[0].masked_scatter(a[1], a[2]),
    "nonzero": lambda t, a, k: t.nonzero(a[0]),
    "unique": _unique,
    "unique_consecutive": _ucons,
    "bincount": _bincount,
    "histc": lambda t, a, k: t.histc(a[0], bins=k["bins"], min=k["min"], max=k["max"]),
    "cumprod": lambda t, a, k: t.cumprod(a[0], dim=k["axis"]),
    "cummax": lambda t, a, k: tuple(t.cummax(a[0], dim=k["axis"])),
    "cummin": lambda t, a, k: tuple(t.cummin(a[0], dim=k["axis"])),
    "logcumsumexp": lambda t, a, k: t.logcumsumexp(a[0], dim=k["axis"]),
    "mode": lambda t, a, k: tuple(t.mode(a[0], dim=k["axis"], keepdim=k["keepdim"])),
    "kthvalue": lambda t, a, k: tuple(t.kthvalue(a[0], k["k"], dim=k["axis"],
                                                 keepdim=k["keepdim"])),
    "searchsorted": lambda t, a, k: t.searchsorted(a[0], a[1], right=k["right"]),
}


COMPOSITE_ORACLE: dict = {
    "masked_fill": lambda t, a, k: a[0].masked_fill(a[1], a[2] if len(a) > 2 else k["value"]),
    "index_copy": lambda t, a, k: a[0].index_copy(a[1], a[2], a[3]),
    "index_fill": lambda t, a, k: a[0].index_fill(a[1], a[2], a[3]),
    "take_along_dim": lambda t, a, k: t.take_along_dim(a[0], a[1], dim=k.get("dim")),
    "index_put": lambda t, a, k: a[0].index_put((a[1], a[2]), a[3], accumulate=k["accumulate"]),
    "count_nonzero": lambda t, a, k: t.count_nonzero(a[0], dim=k.get("dim")),
    "diff": lambda t, a, k: t.diff(a[0], n=k.get("n", 1), dim=k.get("dim", -1),
                                   prepend=a[1] if len(a) > 1 else None,
                                   append=a[2] if len(a) > 2 else None),
    "median": lambda t, a, k: (t.median(a[0]) if "dim" not in k else
                               t.median(a[0], dim=k["dim"], keepdim=k.get("keepdim", False))[0]),
    "nanmedian": lambda t, a, k: (t.nanmedian(a[0]) if "dim" not in k else
                                  t.nanmedian(a[0], dim=k["dim"])[0]),
    "quantile": lambda t, a, k: t.quantile(a[0], _torch_arg(t, k["q"]), dim=k.get("dim"),
                                           keepdim=k.get("keepdim", False),
                                           interpolation=_interp(k)),
    "nanquantile": lambda t, a, k: t.nanquantile(a[0], _torch_arg(t, k["q"]), dim=k.get("dim"),
                                                 keepdim=k.get("keepdim", False),
                                                 interpolation=_interp(k)),
    "bucketize": lambda t, a, k: t.bucketize(a[0], a[1], right=k.get("right", False)),
    "msort": lambda t, a, k: t.msort(a[0]),
}
