"""An int8 GEMM micro-kernel on AVX-512 VNNI (`vpdpbusd`: 64 u8 x s8 multiply-adds into
16 int32 lanes per instruction), written as LLVM IR with llvmlite (numba's own LLVM) and
compiled once for this CPU. numba's loops cannot reach the instruction: LLVM does not form
it from scalar code.

    c[m, n] = sum_k w[n, k] * xu[m, k]      (w int8 (N, K) rows; xu uint8, packed)

The weight is read as it is stored, (N, K) row-major: four weight rows at a time, each
4-byte group broadcast to a vector. The activations (M, K) are packed per call into
blocks of 16 rows by 4 k's, (M/16, K/4, 16, 4), one 64-byte vector each; a register block
is 4 weight rows x 32 activation rows (8 accumulators). N must be a multiple of 4, M of
32 and K of 4: the caller pads. `available()` is False without llvmlite or without VNNI
(`gemm` in qkernels then measures its other paths only).
"""
from __future__ import annotations

import ctypes

_R, _CB = 4, 2          # weight rows x 16-row activation blocks per register block
_STATE: dict = {}


def available() -> bool:
    return kernel() is not None


def kernel():
    """The compiled function `f(w, xp, c, N/4, K/4, M/32, K, N)`, or None."""
    if "fn" not in _STATE:
        _STATE["fn"] = None
        try:
            _STATE["fn"] = _build()
        except Exception:  # noqa: BLE001 - no llvmlite, no VNNI, an LLVM that refuses
            _STATE["fn"] = None
    return _STATE["fn"]


def run(w, xp, c, kp, mp, threads=None):
    """c (M', N') = xu @ w^T for padded w (N', K') and packed activations xp; the weight
    rows are split over `threads` (default: sampan's thread count; the kernel holds no
    GIL, ctypes releases it), the calling thread taking one share."""
    f = kernel()
    n4 = w.shape[0] // 4
    ldc = w.shape[0]
    parts = max(1, min(threads or _threads(), n4 // 16))    # >= 64 weight rows a share
    if parts == 1:
        f(w.ctypes.data, xp.ctypes.data, c.ctypes.data, n4, kp // 4, mp // 32, kp, ldc)
        return
    cuts = [n4 * i // parts for i in range(parts + 1)]

    def share(i):
        r0, r1 = cuts[i], cuts[i + 1]
        f(w.ctypes.data + 4 * r0 * kp, xp.ctypes.data, c.ctypes.data + 16 * r0,
          r1 - r0, kp // 4, mp // 32, kp, ldc)
    futures = [_pool(parts - 1).submit(share, i) for i in range(1, parts)]
    share(0)
    for fu in futures:
        fu.result()


def _threads():
    from ..._threads import get_num_threads
    try:
        return max(1, int(get_num_threads()))
    except Exception:  # noqa: BLE001
        return 1


def _pool(n):
    p = _STATE.get("pool")
    if p is None or _STATE.get("pool_n", 0) < n:
        from concurrent.futures import ThreadPoolExecutor
        p = _STATE["pool"] = ThreadPoolExecutor(n, thread_name_prefix="sampan-int8")
        _STATE["pool_n"] = n
    return p


def _loop(b, ir, i64, n, body):
    pre = b.block
    head, bod, end = (b.append_basic_block(s) for s in ("head", "body", "end"))
    b.branch(head)
    b.position_at_end(head)
    iv = b.phi(i64)
    iv.add_incoming(ir.Constant(i64, 0), pre)
    b.cbranch(b.icmp_signed("<", iv, n), bod, end)
    b.position_at_end(bod)
    body(iv)
    iv.add_incoming(b.add(iv, ir.Constant(i64, 1)), b.block)
    b.branch(head)
    b.position_at_end(end)


def _ir():
    import llvmlite.binding as llvm
    from llvmlite import ir
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v16 = ir.VectorType(i32, 16)
    mod = ir.Module("sampan_int8")
    mod.triple = llvm.get_process_triple()
    dp = ir.Function(mod, ir.FunctionType(v16, [v16, v16, v16]),
                     "llvm.x86.avx512.vpdpbusd.512")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8.as_pointer()] * 2 +
                                          [i32.as_pointer()] + [i64] * 5), "gemm_s8u8")
    w, xp, ct, n4, k4, m32, ldw, ldc = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v):
        return ir.Constant(i64, v)

    def rows(ib):
        def cols(jb):
            accs = [b.alloca(v16) for _ in range(_R * _CB)]     # mem2reg: registers
            for a in accs:
                b.store(ir.Constant(v16, None), a)
            blk = [b.mul(b.add(b.mul(jb, c(_CB)), c(j)), b.mul(k4, c(64))) for j in range(_CB)]
            r0 = b.mul(ib, c(_R))

            def inner(kk):
                xs = [b.load(b.bitcast(b.gep(xp, [b.add(blk[j], b.mul(kk, c(64)))]),
                                       v16.as_pointer()), align=1) for j in range(_CB)]
                for r in range(_R):
                    off = b.add(b.mul(b.add(r0, c(r)), ldw), b.mul(kk, c(4)))
                    w4 = b.load(b.bitcast(b.gep(w, [off]), i32.as_pointer()), align=1)
                    wv = b.insert_element(ir.Constant(v16, None), w4, ir.Constant(i32, 0))
                    wv = b.shuffle_vector(wv, ir.Constant(v16, None),
                                          ir.Constant(v16, [0] * 16))
                    for j in range(_CB):
                        acc = accs[r * _CB + j]
                        b.store(b.call(dp, [b.load(acc), xs[j], wv]), acc)
            _loop(b, ir, i64, k4, inner)
            for r in range(_R):          # c[m, n]: each lane to its activation row
                for j in range(_CB):
                    acc = b.load(accs[r * _CB + j])
                    m0 = b.mul(b.add(b.mul(jb, c(_CB)), c(j)), c(16))
                    for lane in range(16):
                        off = b.add(b.mul(b.add(m0, c(lane)), ldc), b.add(r0, c(r)))
                        b.store(b.extract_element(acc, ir.Constant(i32, lane)),
                                b.gep(ct, [off]))
        _loop(b, ir, i64, m32, cols)
    _loop(b, ir, i64, n4, rows)
    b.ret_void()
    return str(mod)


def _compile(ir_text, key):
    """The LLVM IR compiled for this CPU at -O3 into an MCJIT engine, kept in
    ``_STATE[key]`` (which keeps its code alive)."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=3)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(3))
    pb.getModulePassManager().run(mod, pb)
    ee = llvm.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    _STATE[key] = ee
    return ee


def _build():
    import llvmlite.binding as llvm
    feats = llvm.get_host_cpu_features()
    if not (feats.get("avx512vnni") and feats.get("avx512bw") and feats.get("avx512f")):
        return None
    ee = _compile(_ir(), "engine")
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5))
    return proto(ee.get_function_address("gemm_s8u8"))


# ------------------------------------------------------------------ packed, requantising
# The kernels of the fused int8 ops (`qlinear_dense`, `qdense`, `qlinear_conv2d`): one
# operand packed (NB, K/4, 16, 4), a 64-byte vector per (16 lanes, 4 k's); the other read
# as rows, each 4-byte group broadcast. The epilogue is in the kernel: the int32 sums plus
# a correction (bias - zx * colsum(w)), times a float32 multiplier, then either stored as
# float32 or rounded half to even, clamped to [qmin, qmax] around the zero point and
# stored as bytes. `lanes` (dense): the packed operand is the weight and the correction /
# multiplier vary along the lanes (output columns); otherwise (conv) the packed operand is
# the im2col of the image, the rows are the weight's and the parameters vary per row.
_RB, _CBK = 4, 4        # rows x 16-lane blocks per register block
_PACKED: dict = {}


def packed_kernel(lanes: bool, q8: bool, dyn: bool = False, direct: bool = False):
    """f(v, s, out, corr, mult, nimg, v_img, out_img, rows, lds, k4, nb, ldo, zy, qmin,
    qmax), or None without VNNI: out[img, r, 16 * jb + lane] for r < rows, jb < nb.

    `dyn` (dynamic quantisation, dense, float32 out): each row has its own zero point and
    scale; `corr` holds the weight's column sums (int32), `mult` its scales, and the
    last three arguments are the addresses of the rows' zero points (int32) and scales
    (float32), and 0: out = float32(acc - zx[r] * colsum) * sx[r] * ws. `dyn=2`: the
    last argument is the address of a float32 bias (16 * nb values), added after that
    (the same two roundings as the op's separate add).

    `direct` (conv, not `lanes`): no unfolded copy; `v` is the zero-padded image and three
    more arguments, `poff` (int32 per output position: its window's offset in the image),
    `koff` (int32 per group of 4 k's: their offset in a window, 4 adjacent bytes of one
    image row) and `scratch` (4 * K * 16 bytes), make each vector one AVX-512 gather of 16
    unaligned 32-bit words, gathered once per group of 4 position blocks into scratch.
    `direct=2` (needs AVX-512 VBMI; None without it): a fourth argument `pidx` (64 bytes
    per position block: byte indices relative to the block's first window) replaces each
    gather by one 64-byte load at the first window plus a byte permute (`vpermb`), for
    blocks whose 16 windows span at most 64 bytes (stride-1 rows of small images): the
    gathers were most of a batch-1 LeNet conv's time."""
    key = (bool(lanes), bool(q8), int(dyn), int(direct))
    if key not in _PACKED:
        _PACKED[key] = None
        if _has_vnni() and (direct != 2 or _STATE["vbmi"]):
            try:
                _PACKED[key] = _build_packed(*key)
            except Exception:  # noqa: BLE001 - an LLVM that refuses: the caller's reference
                _PACKED[key] = None
    return _PACKED[key]


def _has_vnni() -> bool:
    """Whether llvmlite loads and this CPU has AVX-512 VNNI (checked once, nothing
    compiled)."""
    if "vnni" not in _STATE:
        try:
            import llvmlite.binding as llvm
            f = llvm.get_host_cpu_features()
            _STATE["vnni"] = bool(f.get("avx512vnni") and f.get("avx512bw")
                                  and f.get("avx512f"))
            _STATE["vbmi"] = _STATE["vnni"] and bool(f.get("avx512vbmi"))
        except Exception:  # noqa: BLE001 - no llvmlite
            _STATE["vnni"] = _STATE["vbmi"] = False
    return _STATE["vnni"]


def _packed_ir(lanes, q8, dyn=False, direct=False):
    import llvmlite.binding as llvm
    from llvmlite import ir
    i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
    v16, vf, vb = ir.VectorType(i32, 16), ir.VectorType(f32, 16), ir.VectorType(i8, 16)
    mod = ir.Module("sampan_int8_packed")
    mod.triple = llvm.get_process_triple()
    dp = ir.Function(mod, ir.FunctionType(v16, [v16, v16, v16]),
                     "llvm.x86.avx512.vpdpbusd.512")
    rint = ir.Function(mod, ir.FunctionType(vf, [vf]), "llvm.rint.v16f32")
    p8 = i8.as_pointer()
    gather = ir.Function(mod, ir.FunctionType(v16, [v16, p8, v16, ir.VectorType(
        ir.IntType(1), 16), i32]), "llvm.x86.avx512.mask.gather.dpi.512")
    v64 = ir.VectorType(i8, 64)
    perm = ir.Function(mod, ir.FunctionType(v64, [v64, v64]), "llvm.x86.avx512.permvar.qi.512")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p8, p8, p8, p8, p8] + [i64] * 11
                                          + [p8] * _nextra(direct)), "qgemm")
    (vp, sp, outp, corrp, multp, nimg, v_img, out_img, rows, lds, k4, nb, ldo, zy, qmin,
     qmax) = fn.args[:16]
    poffp, koffp, scratch = fn.args[16:19] if direct else (None, None, None)
    pidxp = fn.args[19] if direct == 2 else None
    ones = ir.Constant(ir.VectorType(ir.IntType(1), 16), [1] * 16)
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(v):
        return ir.Constant(i64, v)

    def splat(x, ty):
        vec = b.insert_element(ir.Constant(ty, None), x, ir.Constant(i32, 0))
        return b.shuffle_vector(vec, ir.Constant(ty, None), ir.Constant(v16, [0] * 16))

    def fl(x):
        return b.sitofp(b.trunc(x, i32), f32)
    lo_f, hi_f = splat(fl(b.sub(qmin, zy)), vf), splat(fl(b.sub(qmax, zy)), vf)
    zyv = splat(b.trunc(zy, i32), v16)
    k64 = b.mul(k4, c(64))
    pool = [b.alloca(v16) for _ in range(_RB * _CBK)]   # in the entry block: registers

    def block(img, r0, jb0, nr, ncb, local=False):
        # `local`: the vectors were gathered into `scratch` (blocks from 0), not packed
        vbase = scratch if local else b.gep(vp, [b.mul(img, v_img)])
        vj0 = c(0) if local else jb0
        obase = b.mul(img, out_img)
        accs = pool[:nr * ncb]
        if direct and not local:   # the 16 window offsets of each block of positions
            pvec = [b.load(b.bitcast(b.gep(poffp, [b.mul(b.add(jb0, c(j)), c(64))]),
                                     v16.as_pointer()), align=1) for j in range(ncb)]
        for a in accs:
            b.store(ir.Constant(v16, None), a)

        def inner(kk):
            if direct and not local:
                ko = b.load(b.gep(b.bitcast(koffp, i32.as_pointer()), [kk]))
                wbase = b.gep(vbase, [b.sext(ko, i64)])
                vecs = [b.call(gather, [ir.Constant(v16, None), wbase, pvec[j], ones,
                                        ir.Constant(i32, 1)]) for j in range(ncb)]
            else:
                vecs = [b.load(b.bitcast(b.gep(vbase, [b.add(b.mul(b.add(vj0, c(j)), k64),
                                                              b.mul(kk, c(64)))]),
                                         v16.as_pointer()), align=1) for j in range(ncb)]
            for r in range(nr):
                off = b.add(b.mul(b.add(r0, c(r)), lds), b.mul(kk, c(4)))
                s4 = splat(b.load(b.bitcast(b.gep(sp, [off]), i32.as_pointer()), align=1),
                           v16)
                for j in range(ncb):
                    acc = accs[r * ncb + j]
                    u8, s8 = (s4, vecs[j]) if lanes else (vecs[j], s4)
                    b.store(b.call(dp, [b.load(acc), u8, s8]), acc)
        _loop(b, ir, i64, k4, inner)
        for r in range(nr):
            row = b.add(r0, c(r))
            for j in range(ncb):
                col = b.mul(b.add(jb0, c(j)), c(16))
                if lanes:
                    cv = b.load(b.bitcast(b.gep(corrp, [b.mul(col, c(4))]),
                                          v16.as_pointer()), align=1)
                    mv = b.load(b.bitcast(b.gep(multp, [b.mul(col, c(4))]),
                                          vf.as_pointer()), align=1)
                else:
                    cv = splat(b.load(b.bitcast(b.gep(corrp, [b.mul(row, c(4))]),
                                                i32.as_pointer())), v16)
                    mv = splat(b.load(b.bitcast(b.gep(multp, [b.mul(row, c(4))]),
                                                f32.as_pointer())), vf)
                if dyn:      # per-row zero point (zy: its address) and scale (qmin)
                    zr = b.load(b.gep(b.inttoptr(zy, i32.as_pointer()), [row]))
                    sr = b.load(b.gep(b.inttoptr(qmin, f32.as_pointer()), [row]))
                    acc = b.sub(b.load(accs[r * ncb + j]), b.mul(splat(zr, v16), cv))
                    f = b.fmul(b.fmul(b.sitofp(acc, vf), splat(sr, vf)), mv)
                    if dyn == 2:     # + bias (float32, its address: qmax), after scaling
                        bv = b.load(b.bitcast(b.gep(b.inttoptr(qmax, p8), [b.mul(col, c(4))]),
                                              vf.as_pointer()), align=1)
                        f = b.fadd(f, bv)
                else:
                    f = b.fmul(b.sitofp(b.add(b.load(accs[r * ncb + j]), cv), vf), mv)
                at = b.add(obase, b.add(b.mul(row, ldo), col))
                if not q8:
                    b.store(f, b.bitcast(b.gep(outp, [b.mul(at, c(4))]), vf.as_pointer()),
                            align=1)
                    continue
                f = b.call(rint, [f])
                f = b.select(b.fcmp_ordered("<", f, lo_f), lo_f, f)
                f = b.select(b.fcmp_ordered(">", f, hi_f), hi_f, f)
                q = b.trunc(b.add(b.fptosi(f, v16), zyv), vb)
                b.store(q, b.bitcast(b.gep(outp, [at]), vb.as_pointer()), align=1)

    rmain = b.mul(b.sdiv(rows, c(_RB)), c(_RB))
    cmain = b.mul(b.sdiv(nb, c(_CBK)), c(_CBK))

    def image(img):
        def rblocks(rg):
            r0 = b.mul(rg, c(_RB))
            _loop(b, ir, i64, b.sdiv(nb, c(_CBK)),
                  lambda cg: block(img, r0, b.mul(cg, c(_CBK)), _RB, _CBK))
            _loop(b, ir, i64, b.sub(nb, cmain),
                  lambda j: block(img, r0, b.add(cmain, j), _RB, 1))
        _loop(b, ir, i64, b.sdiv(rows, c(_RB)), rblocks)

        def rrest(ri):
            r0 = b.add(rmain, ri)
            _loop(b, ir, i64, b.sdiv(nb, c(_CBK)),
                  lambda cg: block(img, r0, b.mul(cg, c(_CBK)), 1, _CBK))
            _loop(b, ir, i64, b.sub(nb, cmain),
                  lambda j: block(img, r0, b.add(cmain, j), 1, 1))
        _loop(b, ir, i64, b.sub(rows, rmain), rrest)
    def image_direct(img):
        """Gather each group of position blocks once into `scratch`, then run every row
        block over it (a gather per row block would repeat it O/4 times)."""
        ibase = b.gep(vp, [b.mul(img, v_img)])

        def group(jb0, ncb):
            pv = [b.load(b.bitcast(b.gep(poffp, [b.mul(b.add(jb0, c(j)), c(64))]),
                                   v16.as_pointer()), align=1) for j in range(ncb)]
            if direct == 2:     # each block: its first window's offset, its byte indices
                p0 = [b.sext(b.extract_element(v, ir.Constant(i32, 0)), i64) for v in pv]
                ix = [b.load(b.bitcast(b.gep(pidxp, [b.mul(b.add(jb0, c(j)), c(64))]),
                                       v64.as_pointer()), align=1) for j in range(ncb)]

            def fill(kk):
                ko = b.load(b.gep(b.bitcast(koffp, i32.as_pointer()), [kk]))
                wbase = b.gep(ibase, [b.sext(ko, i64)])
                for j in range(ncb):
                    if direct == 2:
                        raw = b.load(b.bitcast(b.gep(wbase, [p0[j]]), v64.as_pointer()),
                                     align=1)
                        g = b.bitcast(b.call(perm, [raw, ix[j]]), v16)
                    else:
                        g = b.call(gather, [ir.Constant(v16, None), wbase, pv[j], ones,
                                            ir.Constant(i32, 1)])
                    at = b.gep(scratch, [b.add(b.mul(c(j), k64), b.mul(kk, c(64)))])
                    b.store(g, b.bitcast(at, v16.as_pointer()), align=1)
            _loop(b, ir, i64, k4, fill)
            _loop(b, ir, i64, b.sdiv(rows, c(_RB)),
                  lambda rg: block(img, b.mul(rg, c(_RB)), jb0, _RB, ncb, True))
            _loop(b, ir, i64, b.sub(rows, rmain),
                  lambda ri: block(img, b.add(rmain, ri), jb0, 1, ncb, True))
        # last block first, block 0 last: with rows `ldo` < 16 * nb apart (a compact
        # output) each row's padded tail spills into the next row's block 0, which is
        # written after it
        ng = b.sdiv(nb, c(_CBK))
        _loop(b, ir, i64, b.sub(nb, cmain), lambda j: group(b.sub(b.sub(nb, c(1)), j), 1))
        _loop(b, ir, i64, ng,
              lambda cg: group(b.mul(b.sub(b.sub(ng, c(1)), cg), c(_CBK)), _CBK))
    _loop(b, ir, i64, nimg, image_direct if direct else image)
    b.ret_void()
    return str(mod)


def _build_packed(lanes, q8, dyn, direct):
    ee = _compile(_packed_ir(lanes, q8, dyn, direct), ("engine", lanes, q8, dyn, direct))
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 5 + [ctypes.c_int64] * 11
                                     + [ctypes.c_void_p] * _nextra(direct)))
    return proto(ee.get_function_address("qgemm"))


def _nextra(direct):
    """The direct kernels' extra pointer arguments: poff, koff, scratch (and pidx)."""
    return {0: 0, 1: 3, 2: 4}[int(direct)]

