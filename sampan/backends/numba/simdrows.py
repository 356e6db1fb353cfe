"""AVX-512 row kernels written as LLVM IR with llvmlite (compiled once for this CPU, as
`vnni.py`'s): the compare-and-select reductions over float32 rows that numba's loops do
not vectorise.

- `quant_kernel`: dynamic int8's per-row quantisation (`qdynamic.quant_rows`);
- `rowmax_kernel`: the rows' maxima of the float32 softmax (`loops/rowwise.py`).

Both are None without llvmlite or AVX-512 (`vnni._has_vnni`); the callers then run
their numba / numpy loops.
"""
from __future__ import annotations

import ctypes

from .vnni import _STATE, _compile, _has_vnni, _loop


def quant_kernel():
    """f(x, ldx, rows, k, out, ldq, scale, zp), or None without AVX-512: each float32 row
    of x (row stride `ldx` elements) to uint8 with its own scale and zero point, as
    `ops.quant_fused.row_qparams` (the range [min(0, x), max(0, x)] over 255 steps, scale
    1 for a row of zeros, zero point rint(-lo / s) in [0, 255], q = clip(rint(x / s) + z,
    0, 255); true float32 divisions, round half to even), 16 lanes at a time with the
    row in L1 between its range and its bytes. numba's loops do not vectorise the range
    (a compare-and-select reduction): with numba's, 1.8 G elements/s; 5-7 G here, the
    divisions bounding it. A NaN is skipped by the range (the op gives it no meaning)."""
    p, n = ctypes.c_void_p, ctypes.c_int64
    return _kernel("quant", _quant_ir, "quant_rows", [p, n, n, n, p, n, p, p])


def _kernel(key, build_ir, name, argtypes):
    """The AVX-512 function `name` of the module `build_ir()` makes, compiled once and
    kept under `key` (None where the CPU lacks AVX-512 VNNI or LLVM refuses it: the
    callers then run numba's loops)."""
    if key not in _STATE:
        _STATE[key] = None
        if _has_vnni():
            try:
                ee = _compile(build_ir(), f"{key}-engine")
                proto = ctypes.CFUNCTYPE(None, *argtypes)
                _STATE[key] = proto(ee.get_function_address(name))
            except Exception:  # noqa: BLE001 - an LLVM that refuses: numba's loops
                _STATE[key] = None
    return _STATE[key]


def _quant_ir():
    import llvmlite.binding as llvm
    from llvmlite import ir
    i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    vf, vi, vb = ir.VectorType(f32, 16), ir.VectorType(i32, 16), ir.VectorType(i8, 16)
    p8 = i8.as_pointer()
    mod = ir.Module("sampan_row_quant")
    mod.triple = llvm.get_process_triple()
    rint = ir.Function(mod, ir.FunctionType(vf, [vf]), "llvm.rint.v16f32")
    rint1 = ir.Function(mod, ir.FunctionType(f32, [f32]), "llvm.rint.f32")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p8, i64, i64, i64, p8, i64, p8,
                                                          p8]), "quant_rows")
    xp, ldx, rows, k, outp, ldq, scp, zpp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v):
        return ir.Constant(i64, v)

    def fc(v):
        return ir.Constant(f32, v)

    def splat(x):
        vec = b.insert_element(ir.Constant(vf, None), x, ir.Constant(i32, 0))
        return b.shuffle_vector(vec, ir.Constant(vf, None), ir.Constant(vi, [0] * 16))

    def clamp(q, lo, hi):         # the select forms of max(q, lo) then min(., hi)
        q = b.select(b.fcmp_ordered("<", q, lo), lo, q)
        return b.select(b.fcmp_ordered(">", q, hi), hi, q)
    k16 = b.sdiv(k, c(16))
    acc_lo, acc_hi = b.alloca(vf), b.alloca(vf)
    s_lo, s_hi = b.alloca(f32), b.alloca(f32)
    zero_v = ir.Constant(vf, [0.0] * 16)

    def row(r):
        xr = b.bitcast(b.gep(xp, [b.mul(b.mul(r, ldx), c(4))]), f32.as_pointer())
        qr = b.gep(outp, [b.mul(r, ldq)])
        b.store(zero_v, acc_lo)
        b.store(zero_v, acc_hi)

        def vload(j):
            return b.load(b.bitcast(b.gep(xr, [b.mul(j, c(16))]), vf.as_pointer()), align=4)

        def rng16(j):
            v = vload(j)
            a, h = b.load(acc_lo), b.load(acc_hi)
            b.store(b.select(b.fcmp_ordered("<", v, a), v, a), acc_lo)
            b.store(b.select(b.fcmp_ordered(">", v, h), v, h), acc_hi)
        _loop(b, ir, i64, k16, rng16)
        a, h = b.load(acc_lo), b.load(acc_hi)
        lo, hi = fc(0.0), fc(0.0)
        for lane in range(16):
            ea = b.extract_element(a, ir.Constant(i32, lane))
            eh = b.extract_element(h, ir.Constant(i32, lane))
            lo = b.select(b.fcmp_ordered("<", ea, lo), ea, lo)
            hi = b.select(b.fcmp_ordered(">", eh, hi), eh, hi)
        b.store(lo, s_lo)
        b.store(hi, s_hi)

        def rng1(j):
            v = b.load(b.gep(xr, [b.add(b.mul(k16, c(16)), j)]))
            a1, h1 = b.load(s_lo), b.load(s_hi)
            b.store(b.select(b.fcmp_ordered("<", v, a1), v, a1), s_lo)
            b.store(b.select(b.fcmp_ordered(">", v, h1), v, h1), s_hi)
        _loop(b, ir, i64, b.sub(k, b.mul(k16, c(16))), rng1)
        lo, hi = b.load(s_lo), b.load(s_hi)
        s = b.fdiv(b.fsub(hi, lo), fc(255.0))
        s = b.select(b.fcmp_ordered(">", s, fc(0.0)), s, fc(1.0))
        z = clamp(b.call(rint1, [b.fdiv(b.fsub(fc(-0.0), lo), s)]), fc(0.0), fc(255.0))
        b.store(s, b.gep(b.bitcast(scp, f32.as_pointer()), [r]))
        b.store(b.fptosi(z, i32), b.gep(b.bitcast(zpp, i32.as_pointer()), [r]))
        sv, zv = splat(s), splat(z)
        lo_v, hi_v = zero_v, ir.Constant(vf, [255.0] * 16)

        def q16(j):
            q = clamp(b.fadd(b.call(rint, [b.fdiv(vload(j), sv)]), zv), lo_v, hi_v)
            b.store(b.trunc(b.fptosi(q, vi), vb),
                    b.bitcast(b.gep(qr, [b.mul(j, c(16))]), vb.as_pointer()), align=1)
        _loop(b, ir, i64, k16, q16)

        def q1(j):
            jj = b.add(b.mul(k16, c(16)), j)
            q = clamp(b.fadd(b.call(rint1, [b.fdiv(b.load(b.gep(xr, [jj])), s)]), z),
                      fc(0.0), fc(255.0))
            b.store(b.trunc(b.fptosi(q, i32), i8), b.gep(qr, [jj]))
        _loop(b, ir, i64, b.sub(k, b.mul(k16, c(16))), q1)
    _loop(b, ir, i64, rows, row)
    b.ret_void()
    return str(mod)


def rowmax_kernel():
    """f(x, ldx, rows, k, out), or None without AVX-512: out[r] = the max of float32 row
    r of x (k >= 1 elements, rows `ldx` elements apart) by compare-and-select from its
    first element, 16 lanes at a time (exact in any order; a NaN first element stays the
    max, a later one is skipped, as in the row loops' scalar form). For the softmax rows
    (`loops/rowwise.py`): numba's loop does not vectorise the reduction."""
    p, n = ctypes.c_void_p, ctypes.c_int64
    return _kernel("rowmax", _rowmax_ir, "row_max", [p, n, n, n, p])


def _rowmax_ir():
    import llvmlite.binding as llvm
    from llvmlite import ir
    i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    vf, vi = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
    p8 = i8.as_pointer()
    mod = ir.Module("sampan_row_max")
    mod.triple = llvm.get_process_triple()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p8, i64, i64, i64, p8]), "row_max")
    xp, ldx, rows, k, outp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v):
        return ir.Constant(i64, v)
    k16 = b.sdiv(k, c(16))
    accs = [b.alloca(vf) for _ in range(4)]
    s_m = b.alloca(f32)

    def pick(v, m):               # m = v if v > m else m
        return b.select(b.fcmp_ordered(">", v, m), v, m)

    def row(r):
        xr = b.bitcast(b.gep(xp, [b.mul(b.mul(r, ldx), c(4))]), f32.as_pointer())
        first = b.load(xr)
        vec = b.insert_element(ir.Constant(vf, None), first, ir.Constant(i32, 0))
        vec = b.shuffle_vector(vec, ir.Constant(vf, None), ir.Constant(vi, [0] * 16))
        for a in accs:
            b.store(vec, a)

        def vload(j):
            return b.load(b.bitcast(b.gep(xr, [b.mul(j, c(16))]), vf.as_pointer()), align=4)

        def four(j4):             # four independent accumulators: compare latency
            for i, a in enumerate(accs):
                b.store(pick(vload(b.add(b.mul(j4, c(4)), c(i))), b.load(a)), a)
        _loop(b, ir, i64, b.sdiv(k16, c(4)), four)

        def one(j):
            a = accs[0]
            b.store(pick(vload(b.add(b.mul(b.sdiv(k16, c(4)), c(4)), j)), b.load(a)), a)
        _loop(b, ir, i64, b.srem(k16, c(4)), one)
        v = b.load(accs[0])
        for a in accs[1:]:
            v = pick(b.load(a), v)
        m = b.extract_element(v, ir.Constant(i32, 0))
        for lane in range(1, 16):
            m = pick(b.extract_element(v, ir.Constant(i32, lane)), m)
        b.store(m, s_m)

        def tail(j):
            b.store(pick(b.load(b.gep(xr, [b.add(b.mul(k16, c(16)), j)])), b.load(s_m)), s_m)
        _loop(b, ir, i64, b.sub(k, b.mul(k16, c(16))), tail)
        b.store(b.load(s_m), b.gep(b.bitcast(outp, f32.as_pointer()), [r]))
    _loop(b, ir, i64, rows, row)
    b.ret_void()
    return str(mod)
