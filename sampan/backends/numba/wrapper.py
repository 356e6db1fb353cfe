"""The Python wrapper around a generated numba kernel (`kernelgen`, `reducegen`): it
allocates or takes the outputs, converts what the kernel does not read itself, calls the
kernel and returns its results in their dtypes (bfloat16 outputs written as uint16 bits
are viewed, not copied)."""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from .scalarexpr import compute_dtype

_U16 = np.dtype(np.uint16)


def build_wrapper(n_in, args, outs, env, name, src, path, inplace=None, tail=(),
                  storage=None):
    """`run(x0, ..., out=None)` around a loaded kernel: the kernel writes each output
    (alloc shape, dtype, final shape) into a new array, or into `out[j]` when given (a
    buffer of the output's storage dtype, viewed in the kernel's shape without copying;
    other buffers receive a copy). `storage[j]` is the dtype the kernel writes output j
    in (default its compute dtype, then rounded to bfloat16 here; uint16: the kernel
    writes bfloat16 bits, viewed as bfloat16 without a copy). `inplace` {j: i}: the
    kernel stores output j into input i (passed as `a{i}` in `args`, contiguous; a
    non-contiguous input is computed in a copy written back), whose array is returned.
    `tail`: arguments after the outputs."""
    inplace = dict(inplace or {})
    xs = "".join(f"x{i}, " for i in range(n_in))
    lines = [f"def run({xs}out=None):"]
    for i in sorted(set(inplace.values())):
        lines.append(f"    a{i} = _c(x{i})")
    kouts = [f"o{j}" for j in range(len(outs)) if j not in inplace]
    call = f"_k({', '.join(list(args) + kouts + list(tail))})"
    back = [f"    if a{i} is not x{i}:\n        x{i}[...] = a{i}"
            for i in sorted(set(inplace.values()))]
    fresh, given, rets_f, rets_g = [], [], [], []
    for j, (shape, d, final) in enumerate(outs):
        if j in inplace:
            rets_f.append(f"x{inplace[j]}")
            rets_g.append(f"x{inplace[j]}")
            continue
        cd = compute_dtype(d) if storage is None else np.dtype(storage[j])
        bits = cd == _U16 and d == _dt.bfloat16
        fresh.append(f"    o{j} = _e({shape!r}, np.{cd.name})")
        given.append(f"    p{j} = out[{j}]")
        view = (f"_v(_u16(p{j}) if p{j} is not None else None, {shape!r}, _dt{j})" if bits
                else f"_v(p{j}, {shape!r}, _dt{j})")
        # a planned buffer is the same array on every call: its view is made once and kept
        # as one (buffer, view) tuple, read and replaced whole (threads may share a kernel)
        given.append(f"    m{j} = _mv{j}[0]")
        given.append(f"    if p{j} is m{j}[0]:\n        q{j} = m{j}[1]")
        given.append(f"    else:\n        q{j} = {view}\n"
                     f"        if q{j} is not None:\n            _mv{j}[0] = (p{j}, q{j})")
        env[f"_mv{j}"] = [(None, None)]
        given.append(f"    o{j} = _e({shape!r}, _dt{j}) if q{j} is None else q{j}")
        env[f"_dt{j}"] = cd
        r = f"o{j}.reshape({final!r})"
        r = r if cd == d else f"{r}.view(_bf16)" if bits else f"{r}.astype(_bf16)"
        rets_f.append(r)
        rets_g.append(f"({r} if p{j} is None else p{j} if q{j} is not None else _put(p{j}, {r}))")
    lines.append("    if out is None:")
    lines += ["    " + x for x in fresh]
    lines.append(f"        {call}")
    lines += ["    " + x.replace("\n", "\n    ") for x in back]
    lines.append(f"        return {', '.join(rets_f)}")
    lines += given
    lines.append(f"    {call}")
    lines += back
    lines.append(f"    return {', '.join(rets_g)}")
    env["_v"], env["_put"], env["_u16"] = _out_view, _put, _bits_view
    wsrc = "\n".join(lines) + "\n"
    exec(compile(wsrc, f"<sampan fused wrapper {name}>", "exec"), env)
    run = env["run"]
    run.source = f"# kernel module: {path or 'in memory'}\n{src}\n# wrapper\n{wsrc}"
    run.kernel_name = name
    return run


def _out_view(p, shape, dt):
    """`p` viewed as a C-contiguous array of `shape` (no copy), or None when it cannot be."""
    if p is None or p.dtype != dt:
        return None
    v = p.view()
    try:
        v.shape = shape
    except AttributeError:   # not contiguous: the kernel writes a new array, copied in
        return None
    return v if v.flags.c_contiguous else None


def _bits_view(p):
    """A bfloat16 buffer as its uint16 bits (the kernel's storage); others as they are."""
    return p.view(np.uint16) if p.dtype == _dt.bfloat16 else p


def _put(p, r):
    p[...] = r
    return p
