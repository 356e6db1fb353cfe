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


def _build():
    import llvmlite.binding as llvm
    feats = llvm.get_host_cpu_features()
    if not (feats.get("avx512vnni") and feats.get("avx512bw") and feats.get("avx512f")):
        return None
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(_ir())
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=feats.flatten(), opt=3)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(3))
    pb.getModulePassManager().run(mod, pb)
    ee = llvm.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    _STATE["engine"] = ee          # keeps the code alive
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5))
    return proto(ee.get_function_address("gemm_s8u8"))
