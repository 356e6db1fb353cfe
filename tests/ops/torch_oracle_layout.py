"""(issue 17) PyTorch oracles for this area's ops: `ORACLE[name](torch, args, attrs)` for ops
in the table, `COMPOSITE_ORACLE[name]` for composites; merged by `harness.py`."""


def _diag_embed(t, a, k):
    # the primitive embeds into (size[0], size[1]) matrices: torch's square embedding,
    # cut (or padded) to that size
    x = a[0]
    off, d1, d2, (n1, n2) = k["offset"], k["dim1"], k["dim2"], k["size"]
    n = x.shape[-1] + abs(off)
    sq = t.diag_embed(x, off, d1, d2)
    sq = sq.narrow(d1, 0, min(n, n1)).narrow(d2, 0, min(n, n2))
    pads = [0] * (2 * sq.ndim)
    pads[2 * (sq.ndim - 1 - d1) + 1] = n1 - sq.shape[d1]
    pads[2 * (sq.ndim - 1 - d2) + 1] = n2 - sq.shape[d2]
    return t.nn.functional.pad(sq, pads)


def _roll(t, a, k):
    if k["dims"] is None:
        return t.roll(a[0], k["shifts"][0])
    return t.roll(a[0], k["shifts"], k["dims"])


def _rep(t, a, k):
    out = t.repeat_interleave(a[0])
    if k.get("output_size") is not None:
        assert out.shape[0] == k["output_size"]
    return out


ORACLE: dict = {
    "einsum": lambda t, a, k: t.einsum(k["equation"], *a),
    "tril": lambda t, a, k: t.tril(a[0], k["diagonal"]),
    "triu": lambda t, a, k: t.triu(a[0], k["diagonal"]),
    "roll": _roll,
    "diagonal": lambda t, a, k: t.diagonal(a[0], k["offset"], k["dim1"], k["dim2"]),
    "diag_embed": _diag_embed,
    "repeat_interleave": _rep,
}


def _ri(t, a, k):
    if len(a) == 1:
        return t.repeat_interleave(a[0], k["repeats"], dim=k["dim"])
    return t.repeat_interleave(a[0], a[1], dim=k["dim"], output_size=k["output_size"])


COMPOSITE_ORACLE: dict = {
    "mm": lambda t, a, k: t.mm(*a), "bmm": lambda t, a, k: t.bmm(*a),
    "mv": lambda t, a, k: t.mv(*a), "dot": lambda t, a, k: t.dot(*a),
    "vdot": lambda t, a, k: t.vdot(*a), "inner": lambda t, a, k: t.inner(*a),
    "outer": lambda t, a, k: t.outer(*a), "ger": lambda t, a, k: t.outer(*a),
    "addmm": lambda t, a, k: t.addmm(*a, **k), "addmv": lambda t, a, k: t.addmv(*a, **k),
    "addbmm": lambda t, a, k: t.addbmm(*a, **k), "baddbmm": lambda t, a, k: t.baddbmm(*a, **k),
    "tensordot": lambda t, a, k: t.tensordot(*a, dims=k["dims"]),
    "einsum_frontend": lambda t, a, k: t.einsum(k["equation"], *a),
    "t": lambda t, a, k: t.t(a[0]),
    "movedim": lambda t, a, k: t.movedim(a[0], k["source"], k["destination"]),
    "unbind": lambda t, a, k: t.stack(t.unbind(a[0], k["dim"]), 0),
    "tile": lambda t, a, k: t.tile(a[0], k["dims"]),
    "repeat": lambda t, a, k: a[0].repeat(*k["sizes"]),
    "repeat_interleave_composite": _ri,
    "meshgrid": lambda t, a, k: t.stack(t.meshgrid(*a, indexing=k["indexing"])),
    "vstack": lambda t, a, k: t.vstack(a), "hstack": lambda t, a, k: t.hstack(a),
    "dstack": lambda t, a, k: t.dstack(a), "column_stack": lambda t, a, k: t.column_stack(a),
    "atleast_1d": lambda t, a, k: t.atleast_1d(a[0]),
    "atleast_2d": lambda t, a, k: t.atleast_2d(a[0]),
    "atleast_3d": lambda t, a, k: t.atleast_3d(a[0]),
    "ravel": lambda t, a, k: t.ravel(a[0]), "take": lambda t, a, k: t.take(a[0], a[1]),
    "rot90": lambda t, a, k: t.rot90(a[0], k["k"], k["dims"]),
    "fliplr": lambda t, a, k: t.fliplr(a[0]), "flipud": lambda t, a, k: t.flipud(a[0]),
    "kron": lambda t, a, k: t.kron(a[0], a[1]),
    "cross": lambda t, a, k: (t.linalg.cross(a[0], a[1], dim=k["dim"]) if k["dim"] is not None
                              else t.cross(a[0], a[1], dim=0)),
    "trace": lambda t, a, k: t.trace(a[0]),
    "cartesian_prod": lambda t, a, k: t.cartesian_prod(*a),
    "block_diag": lambda t, a, k: t.block_diag(*a),
    "diag": lambda t, a, k: t.diag(a[0], k["diagonal"]),
}
