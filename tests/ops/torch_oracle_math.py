"""(issue 17) PyTorch oracles for this area's ops: `ORACLE[name](torch, args, attrs)` for ops
in the table, `COMPOSITE_ORACLE[name]` for composites; merged by `harness.py`."""


def _u(name):
    return lambda t, a, k: getattr(t, name)(a[0])


def _b(name):
    return lambda t, a, k: getattr(t, name)(a[0], a[1])


ORACLE: dict = {n: _u(n) for n in (
    "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2", "log10",
    "exp2", "erfc", "sinc", "lgamma", "erfinv", "trunc", "isnan", "isinf", "isfinite", "isposinf",
    "isneginf", "signbit")}
ORACLE.update({n: _b(n) for n in ("atan2", "logaddexp", "logaddexp2", "hypot", "copysign",
                                  "xlogy", "fmod", "heaviside")})
ORACLE["polygamma"] = lambda t, a, k: t.polygamma(k["n"], a[0])
ORACLE["lerp"] = lambda t, a, k: t.lerp(a[0], a[1], a[2])

COMPOSITE_ORACLE: dict = {
    "frac": _u("frac"),
    "clamp_min": lambda t, a, k: t.clamp_min(a[0], a[1] if len(a) > 1 else k["min"]),
    "clamp_max": lambda t, a, k: t.clamp_max(a[0], a[1] if len(a) > 1 else k["max"]),
    "addcmul": lambda t, a, k: t.addcmul(a[0], a[1], a[2], **k),
    "addcdiv": lambda t, a, k: t.addcdiv(a[0], a[1], a[2], **k),
    "nan_to_num": lambda t, a, k: t.nan_to_num(a[0], **k),
    "isclose": lambda t, a, k: t.isclose(a[0], a[1], **k),
}
