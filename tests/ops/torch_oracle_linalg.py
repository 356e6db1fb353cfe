"""(issue 17) PyTorch oracles for this area's ops: `ORACLE[name](torch, args, attrs)` for ops
in the table, `COMPOSITE_ORACLE[name]` for composites; merged by `harness.py`.

qr, svd and eigh have sign freedom: the oracles bring torch's factors to sampan's
convention (diag(R) >= 0; each singular vector / eigenvector column with its largest-
magnitude entry positive) with signs taken from detached values, so forward values and
gradients of every output are comparable. cholesky/eigh/eigvalsh read one triangle: the
oracles symmetrise that triangle explicitly, so torch's gradient is the one of the
function sampan computes (see sampan/ops/decomp.py)."""

ORACLE: dict = {}
COMPOSITE_ORACLE: dict = {}


def _from_tri(torch, a, upper):
    t = a.triu() if upper else a.tril()
    s = a.triu(1) if upper else a.tril(-1)
    return t + s.mT


def _scale_cols(torch, x, s):
    """Multiply x's first len(s) columns by s (the rest by 1)."""
    k = s.shape[-1]
    extra = x.shape[-1] - k
    if extra:
        s = torch.cat([s, torch.ones(s.shape[:-1] + (extra,), dtype=s.dtype)], -1)
    return x * s.unsqueeze(-2)


def _col_sign(torch, u):
    idx = u.detach().abs().argmax(-2, keepdim=True)
    s = torch.sign(u.detach().gather(-2, idx)).squeeze(-2)
    return torch.where(s == 0, torch.ones_like(s), s)


def _qr(torch, a, attrs):
    q, r = torch.linalg.qr(a[0], mode=attrs["mode"])
    k = min(a[0].shape[-2:])
    s = torch.sign(r.detach().diagonal(0, -2, -1)[..., :k])
    s = torch.where(s == 0, torch.ones_like(s), s)
    return _scale_cols(torch, q, s), _scale_cols(torch, r.mT, s).mT


def _svd(torch, a, attrs):
    u, s, vh = torch.linalg.svd(a[0], full_matrices=attrs["full_matrices"])
    k = s.shape[-1]
    sg = _col_sign(torch, u[..., :k])
    return _scale_cols(torch, u, sg), s, _scale_cols(torch, vh.mT, sg).mT


def _eigh(torch, a, attrs):
    w, v = torch.linalg.eigh(_from_tri(torch, a[0], attrs["UPLO"] == "U"), UPLO=attrs["UPLO"])
    return w, v * _col_sign(torch, v).unsqueeze(-2)


ORACLE.update({
    "poisson": None,             # its own keyed stream: checked for statistics instead
    "linalg_inv": lambda torch, a, attrs: torch.linalg.inv(a[0]),
    "linalg_det": lambda torch, a, attrs: torch.linalg.det(a[0]),
    "linalg_slogdet": lambda torch, a, attrs: tuple(torch.linalg.slogdet(a[0])),
    "linalg_solve": lambda torch, a, attrs: torch.linalg.solve(a[0], a[1]),
    "linalg_cholesky": lambda torch, a, attrs: torch.linalg.cholesky(
        _from_tri(torch, a[0], attrs["upper"]), upper=attrs["upper"]),
    "linalg_qr": _qr,
    "linalg_svd": _svd,
    "linalg_svdvals": lambda torch, a, attrs: torch.linalg.svdvals(a[0]),
    "linalg_eigh": _eigh,
    "linalg_eigvalsh": lambda torch, a, attrs: torch.linalg.eigvalsh(
        _from_tri(torch, a[0], attrs["UPLO"] == "U"), UPLO=attrs["UPLO"]),
})


def _call(path):
    def f(torch, a, attrs):
        fn = torch
        for part in path.split("."):
            fn = getattr(fn, part)
        return fn(*a, **attrs)
    return f


COMPOSITE_ORACLE.update({
    "vector_norm": _call("linalg.vector_norm"),
    "vector_norm_inf": _call("linalg.vector_norm"),
    "matrix_norm": _call("linalg.matrix_norm"),
    "matrix_norm_2": _call("linalg.matrix_norm"),
    "linalg_norm": _call("linalg.norm"),
    "norm": _call("norm"),
    "cdist": _call("cdist"),
    "cdist_mm": _call("cdist"),
    "cosine_similarity": _call("nn.functional.cosine_similarity"),
    "pairwise_distance": _call("nn.functional.pairwise_distance"),
    "pdist": _call("nn.functional.pdist"),
})
COMPOSITE_ORACLE.update({
    "matrix_power": _call("linalg.matrix_power"),
    "pinv": _call("linalg.pinv"),
})
