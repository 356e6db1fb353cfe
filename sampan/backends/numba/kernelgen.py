"""Kernel generator: a `fused` node becomes the Python source of a numba kernel, written
from each primitive's scalar expression in the op table (no kernel per pattern).

The iteration space is the group's output shape. Inputs are read as `full` (same
shape), `scalar` (one element), `row` (broadcast over the leading dims) or `col`
(broadcast over the trailing dims); a kernel loops over rows in parallel (`prange`)
with a contiguous inner loop LLVM vectorises, or over one flat loop when every input is
full or scalar. Literals are typed (`np.float32(1.0)`, a bare `1.0` would promote to
float64); bfloat16 values are computed in float32; float32 exp/log/tanh/erf use the
vectorisable implementations of `mathlib`.

bfloat16 inputs and outputs stay bfloat16 in memory: the kernel's arrays hold their bits
as uint16 (`storage_dtype`, a view, no copy) and it converts each element as it loads and
stores it (`mathlib.bf16_load` / `bf16_store`, round to nearest even like ml_dtypes), so
fused ops around bf16 GEMMs make no float32 copy of their operands or results.

Each kernel is written to a module file in the cache directory (`$SAMPAN_CACHE_DIR`,
else `~/.cache/sampan/kernels`) and imported, with `@njit(cache=True)`, so a second
process loads the machine code instead of compiling. An unwritable directory degrades
to in-memory kernels with one warning. A module file is trusted only when it holds
exactly the source its name was made from: anything else is rewritten before it is run;
numba's pickled machine code beside it is checked against its sidecar digest first
(`cachefiles`).
`STATS` counts compilations, cache hits, rewritten module files and the compile time of
each kernel.

Example::

    >>> k = bind(fused_node); outs = k(x, y); print(k.source)
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
import types
import warnings

import numpy as np

from ... import dtypes as _dt
from ...ops._nb import mathlib_hash
from ...ops.fused import body_attrs
from ...ops.registry import OPS
from ..provider import consts_frozen
from . import cachefiles
from .scalarexpr import _MATHLIB, _NP_NAME, compute_dtype, scalar_expr  # noqa: F401
from .wrapper import build_wrapper

# Below this many elements a kernel runs serially. Measured on the 2-core machine: numba's
# worker threads compete with OpenBLAS's (which spin after each GEMM), so a parallel
# bias+relu kernel of 65k elements between two GEMMs took 3.9 ms instead of ~0.05 ms and
# W1 under jit ran at 0.4x eager; serial kernels made it 1.2x.
PARALLEL_MIN = 1 << 22
GEN_VERSION = "3"

# LLVM flags of the elementwise kernels that call mathlib's float32 functions: FMA
# contraction and no signed zeros, nothing that reorders arithmetic or assumes finite
# values (no reassociation, NaN/inf stay IEEE). Kernels of plain arithmetic compile without
# them, so that they stay bit-identical to numpy's eager result.
# On the W3 GELU-gradient kernel (polynomials of exp32/erf32 inlined) they took 4.4 ms to
# 2.7 ms per million elements; results moved by at most 1 ulp per contracted multiply-add.
ELEMENTWISE_FASTMATH = {"contract", "nsz"}

STATS = {"compiled": 0, "cache_hits": 0, "in_memory": 0, "rebuilt": 0, "kernels": {}}
_LOCK = threading.Lock()
_LOADED: dict = {}            # module name -> dispatcher, per process
_DIR_STATE: dict = {}         # cache dir -> usable (bool)

def cache_dir() -> str:
    """The kernel cache directory ($SAMPAN_CACHE_DIR or ~/.cache/sampan/kernels)."""
    d = os.environ.get("SAMPAN_CACHE_DIR")
    return d or os.path.join(os.path.expanduser("~"), ".cache", "sampan", "kernels")


_U16 = np.dtype(np.uint16)


def storage_dtype(d) -> np.dtype:
    """The dtype of a kernel's array holding `d` values: bfloat16 as its bits (uint16),
    converted in the kernel; others their compute dtype (float16 is converted by the
    wrapper: numba has no float16 arithmetic)."""
    d = np.dtype(d)
    return _U16 if d == _dt.bfloat16 else compute_dtype(d)


def load_expr(src, d) -> str:
    """Source reading element `src` of a `d` array as its compute dtype."""
    return f"bf16_load({src})" if np.dtype(d) == _dt.bfloat16 else src


def store_expr(val, d) -> str:
    """Source of compute-dtype value `val` as stored into a `d` array."""
    return f"bf16_store({val})" if np.dtype(d) == _dt.bfloat16 else val


def reset_stats() -> None:
    STATS.update(compiled=0, cache_hits=0, in_memory=0, rebuilt=0, kernels={})


# ---------------------------------------------------------------------- layouts
def _pattern(shape, S, k):
    """How an input of `shape` is read over iteration shape S split at dim k:
    'full', 'row', 'col', 'scalar', or None if this split cannot express it."""
    p = (1,) * (len(S) - len(shape)) + tuple(shape)
    parts = []
    for lo, hi in ((0, k), (k, len(S))):
        full = all(p[d] == S[d] for d in range(lo, hi))
        bcast = all(p[d] == 1 for d in range(lo, hi))
        if not (full or bcast):
            return None
        parts.append("full" if full else "bcast")
    # dims where S is 1 count as both: prefer the cheaper reading
    lead, trail = parts
    if lead == "full" and trail == "full":
        return "full"
    if lead == "bcast" and trail == "full":
        return "row"
    if lead == "full" and trail == "bcast":
        return "col"
    return "scalar"


def plan_layout(in_shapes, S, split=None):
    """(layout, split, patterns): 'flat' when all inputs are full or scalar, else 'rows'
    with the split that expresses most inputs ('bcast' marks one to materialise).
    `split` forces 'rows' split there."""
    S = tuple(S)
    if split is not None:
        return "rows", split, [_pattern(s, S, split) or "bcast" for s in in_shapes]
    n = int(np.prod(S)) if S else 1
    flat = []
    for s in in_shapes:
        size = int(np.prod(s)) if s else 1
        p = (1,) * (len(S) - len(s)) + tuple(s)
        flat.append("full" if p == S else "scalar" if size == 1 else None)
    if all(f is not None for f in flat):
        return "flat", len(S), flat
    best = None
    for k in range(1, len(S)):
        pats = [_pattern(s, S, k) for s in in_shapes]
        r = int(np.prod(S[:k]))
        score = (sum(p is not None for p in pats), min(r, 64), n // max(r, 1))
        if best is None or score > best[0]:
            best = (score, k, pats)
    _, k, pats = best
    return "rows", k, [p if p is not None else "bcast" for p in pats]


# ---------------------------------------------------------------------- source generation
def col_sums(body) -> set:
    """Indices of the body entries that are column sums (sum over leading axes, keepdims
    False; see `sampan.passes.fuse`). Fused row reductions always keep their dims."""
    return {k for k, e in enumerate(body)
            if e[0] == "sum" and not body_attrs(e).get("keepdims", False)}


def kernel_source(body, outputs, in_dtypes, out_dtypes, patterns, layout, parallel,
                  cache=True, inplace=None, row_len=None):
    """Python source of the numba kernel `kernel(x0, ..., o0, ...)` (see module doc).

    `inplace` ({output j: input i}, full-pattern inputs only) stores output j into input
    i's array and drops `oj` from the signature: with the same argument for the load and
    the store LLVM needs no overlap check, which otherwise sends a kernel whose output
    aliases an input to its scalar loop (3x slower, measured).

    Column sums in the body (rows layout, serial) become 1-d outputs of length nc that
    each row is added into, in row order like `np.sum` over leading axes; such a kernel
    takes `nr, nc` as its last arguments.

    `row_len` (the rows layout's row length, when known) lets a body that calls mathlib
    run one row per call of a separate `row` function (see ROW_FUNCTION_MIN)."""
    inplace = dict(inplace or {})
    n_in = len(in_dtypes)
    cols = col_sums(body)
    kdt = [compute_dtype(d) for d in in_dtypes]
    vdt = list(kdt)
    exprs = []
    for k, e in enumerate(body):
        if k in cols:
            vdt.append(vdt[e[1][0]])
            exprs.append("")
            continue
        op = OPS[e[0]]
        specs = [_spec(vdt[i]) for i in e[1]]
        out = op.shape_rule(*specs, **body_attrs(e))
        vdt.append(compute_dtype(out.dtype))
        exprs.append(scalar_expr(e[0], [f"t{i}" for i in e[1]], [vdt[i] for i in e[1]],
                                 out.dtype, body_attrs(e)))
    used = set()
    for e in body:
        used.update(i for i in e[1] if i < n_in)
    used.update(i for i in outputs if i < n_in)
    funcs = sorted({f for x in exprs for f in _MATHLIB if f + "(" in x})
    acc0 = {j for j, o in enumerate(outputs) if o - n_in in cols}
    # column sums accumulate into their output: it stays in the compute dtype
    sdt = [d if j not in acc0 else compute_dtype(d) for j, d in enumerate(out_dtypes)]
    bf = sorted({"bf16_load"} if any(np.dtype(d) == _dt.bfloat16 for d in in_dtypes) else set())
    bf += ["bf16_store"] if any(np.dtype(d) == _dt.bfloat16 for d in sdt) else []
    ins = [f"x{i}" for i in range(n_in)]
    outs = [f"o{j}" for j in range(len(outputs)) if j not in inplace]
    dst = [f"x{inplace[j]}" if j in inplace else f"o{j}" for j in range(len(outputs))]
    loop = "prange" if parallel else "range"
    flags = f"parallel={parallel}, cache={cache}, error_model='numpy', nogil=True"
    polys = set(funcs) - {"max_", "min_", "dgelu64"}    # mathlib's float32 polynomials
    if polys:
        # only kernels with mathlib's polynomials: plain arithmetic stays bit-identical
        # to numpy's eager result
        flags += ", fastmath={" + ", ".join(repr(f) for f in sorted(ELEMENTWISE_FASTMATH)) + "}"
    lines = ["# generated by sampan.backends.numba.kernelgen: do not edit",
             "import math", "", "import numpy as np", "from numba import njit, prange", ""]
    if funcs or bf:
        lines.append(f"from sampan.backends.numba.mathlib import {', '.join(funcs + bf)}")
    acc = {j: body[o - n_in][1][0] for j, o in enumerate(outputs) if o - n_in in cols}
    if acc and (layout != "rows" or parallel or set(acc) & set(inplace)):
        raise ValueError("column sums need a serial rows kernel and their own outputs")
    sizes = ["nr", "nc"] if acc else []
    at_kernel = len(lines)
    lines += ["", "", f"@njit({flags})", f"def kernel({', '.join(ins + outs + sizes)}):"]
    for i, e in enumerate(body):
        lines.append(f"    # t{n_in + i} = {e[0]}({', '.join(f't{a}' for a in e[1])})")
    body_lines = [f"t{n_in + i} = {x}" for i, x in enumerate(exprs) if i not in cols]
    for i, d in enumerate(vdt[n_in:]):
        if d.kind in "iu":  # numba widens small ints: wrap back like numpy does
            body_lines[i] = f"t{n_in + i} = {_NP_NAME[d.name]}({exprs[i]})"
    ld = {i: (lambda src, d=in_dtypes[i]: load_expr(src, d)) for i in range(n_in)}
    st = {o: store_expr(f"t{o}", sdt[j]) for j, o in enumerate(outputs)}
    lines += [f"    t{i} = {ld[i](f'x{i}[0]')}" for i in sorted(used)
              if patterns[i] == "scalar"]
    if layout == "flat":
        lines.append(f"    n = {dst[0]}.shape[0]")
        lines.append(f"    for i in {loop}(n):")
        for i in sorted(used):
            if patterns[i] == "full":
                lines.append(f"        t{i} = {ld[i](f'x{i}[i]')}")
        lines += [f"        {b}" for b in body_lines]
        lines += [f"        {dst[j]}[i] = {st[o]}" for j, o in enumerate(outputs)]
    else:
        if acc:
            lines.append("    for j in range(nc):")
            lines += [f"        {dst[j]}[j] = {_NP_NAME[vdt[src].name]}(0)"
                      for j, src in acc.items()]
        else:
            lines.append(f"    nr, nc = {dst[0]}.shape")
        if polys and (row_len or 0) >= ROW_FUNCTION_MIN:
            _row_function(lines, at_kernel, flags, parallel, loop, used, patterns, outputs,
                          inplace, acc, dst, body_lines, ld, st)
            return "\n".join(lines) + "\n"
        lines.append(f"    for i in {loop}(nr):")
        for i in sorted(used):
            if patterns[i] in ("full", "bcast"):
                lines.append(f"        r{i} = x{i}[i]")
            elif patterns[i] == "col":
                lines.append(f"        t{i} = {ld[i](f'x{i}[i]')}")
        for j in range(len(outputs)):
            if j not in acc:
                lines.append(f"        q{j} = {dst[j]}[i]")
        lines += _row_loop(used, patterns, body_lines,
                           [(f"q{j}", st[o]) for j, o in enumerate(outputs) if j not in acc],
                           [(dst[j], src) for j, src in acc.items()], " " * 8, ld)
    return "\n".join(lines) + "\n"


def _row_loop(used, patterns, body_lines, stores, accs, ind, ld):
    """Lines of the loop over one row's elements j, indented by `ind`: loads (`ld[i]`
    wraps input i's element read), the body, `stores` (row array, stored value source)
    and column-sum `accs` (array, value)."""
    out = [f"{ind}for j in range(nc):"]
    for i in sorted(used):
        if patterns[i] in ("full", "bcast"):
            out.append(f"{ind}    t{i} = {ld[i](f'r{i}[j]')}")
        elif patterns[i] == "row":
            out.append(f"{ind}    t{i} = {ld[i](f'x{i}[j]')}")
    out += [f"{ind}    {b}" for b in body_lines]
    out += [f"{ind}    {d}[j] = {v}" for d, v in stores]
    out += [f"{ind}    {a}[j] += t{src}" for a, src in accs]
    return out


# Rows of at least this many elements run through a `row` function when the body calls
# mathlib. As one nested loop, LLVM rematerialised every polynomial constant inside the
# inner loop (an address load and a broadcast each, ~40 extra instructions per vector):
# a bias+GELU kernel of 1024x1024 ran 1.11 ms nested, 0.96 ms by rows. Cheap bodies
# stay nested: there the call per row cost more (bias+ReLU 128x512: 12 -> 18 us).
ROW_FUNCTION_MIN = 64


def _row_function(lines, at_kernel, flags, parallel, loop, used, patterns, outputs,
                  inplace, acc, dst, body_lines, ld, st):
    """The rows loop of `kernel_source` as a call of `row(...)` per row (appended to
    `lines`, with `row` defined before the kernel at `at_kernel`)."""
    params, call = [], []
    for i in sorted(used):
        p = patterns[i]
        if p in ("full", "bcast"):
            params.append(f"r{i}")
            call.append(f"x{i}[i]")
        elif p == "row":
            params.append(f"x{i}")
            call.append(f"x{i}")
        elif p == "col":
            params.append(f"t{i}")
            call.append(ld[i](f"x{i}[i]"))
        else:   # scalar, loaded above
            params.append(f"t{i}")
            call.append(f"t{i}")
    store = {}
    for j in range(len(outputs)):
        if j in acc:
            params.append(f"a{j}")
            call.append(dst[j])
        elif j in inplace:   # the input's own row: one array for the load and the store
            store[j] = f"r{inplace[j]}"
        else:
            params.append(f"q{j}")
            call.append(f"{dst[j]}[i]")
            store[j] = f"q{j}"
    lines.append(f"    for i in {loop}(nr):")
    lines.append(f"        row({', '.join(call + ['nc'])})")
    rl = ["", "", f"@njit({flags.replace(f'parallel={parallel}', 'parallel=False')})",
          f"def row({', '.join(params + ['nc'])}):"]
    rl += _row_loop(used, patterns, body_lines,
                    [(store[j], st[o]) for j, o in enumerate(outputs) if j not in acc],
                    [(f"a{j}", src) for j, src in acc.items()], " " * 4, ld)
    lines[at_kernel:at_kernel] = rl


def _spec(d):
    from ...ops.registry import Spec
    return Spec((), d)


# ---------------------------------------------------------------------- compile + cache
def _usable(d):
    if d not in _DIR_STATE:
        try:
            os.makedirs(d, exist_ok=True)
            fd, p = tempfile.mkstemp(dir=d, suffix=".probe")
            os.close(fd)
            os.unlink(p)
            os.makedirs(os.path.join(d, "__pycache__"), exist_ok=True)
            _DIR_STATE[d] = True
        except OSError as e:
            _DIR_STATE[d] = False
            warnings.warn(f"sampan: the kernel cache directory {d} cannot be written ({e}); "
                          "fused kernels are compiled in memory and every process compiles "
                          "them again (set SAMPAN_CACHE_DIR to a writable directory)",
                          RuntimeWarning, stacklevel=4)
    return _DIR_STATE[d]


def load_kernel(src):
    """Import (or reuse) the kernel module of `src`; returns (dispatcher, module name, path).

    The module file is named by a hash of `src`, but a name proves nothing about what the
    file holds now: it is read, compared with `src` byte for byte, rewritten when it
    differs (edited, truncated by a full disk, left half-written), and the bytes that
    were checked are compiled and run, not whatever the file holds a moment later."""
    h = hashlib.sha256((GEN_VERSION + mathlib_hash()[:12] + src).encode()).hexdigest()[:20]
    name = f"sampan_kernel_{h}"
    with _LOCK:
        if name in _LOADED:
            return _LOADED[name], name, getattr(_LOADED[name], "_sampan_path", None)
        d = cache_dir()
        if _usable(d):
            cachefiles.install()   # numba's pickles of it are checked as well
            path = os.path.join(d, name + ".py")
            want = src.encode("utf-8")
            have = _cached_bytes(path, len(want) + 1)
            if have != want:
                if have is not None:
                    STATS["rebuilt"] += 1
                fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(want)
                os.replace(tmp, path)   # atomic: a concurrent process sees all or nothing
            mod = types.ModuleType(name)
            mod.__file__ = path      # numba's cache locates its files from the module's
            sys.modules[name] = mod
            exec(compile(want, path, "exec"), mod.__dict__)  # noqa: S102 - checked bytes
            k = mod.kernel
        else:
            path = None
            env = {}
            exec(compile(src.replace("cache=True", "cache=False"), f"<{name}>", "exec"), env)
            k = env["kernel"]
            STATS["in_memory"] += 1
        k._sampan_path = path
        _LOADED[name] = k
        return k, name, path


def _cached_bytes(path, limit):
    """Up to `limit` bytes of the cached module at `path`; None when there is none."""
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except FileNotFoundError:
        return None
    except OSError:   # unreadable: rewritten like a damaged one
        return b""


def _nb_sig(in_dtypes, patterns, layout, out_dtypes, col_outs=()):
    """Signature: inputs, outputs (`col_outs`: positions in `out_dtypes` of column sums,
    1-d, after which come the int64 sizes nr, nc)."""
    from numba import types
    from numba.np.numpy_support import from_dtype
    arrs = []
    for d, p in zip(in_dtypes, patterns):
        nd = 2 if (layout == "rows" and p in ("full", "bcast")) else 1
        arrs.append(types.Array(from_dtype(storage_dtype(d)), nd, "C"))
    nd = 2 if layout == "rows" else 1
    arrs += [types.Array(from_dtype(compute_dtype(d) if j in col_outs else storage_dtype(d)),
                         1 if j in col_outs else nd, "C")
             for j, d in enumerate(out_dtypes)]
    if col_outs:
        arrs += [types.int64, types.int64]
    return types.void(*arrs)


def compile_kernel(k, name, sig, slp=False):
    """Compile `k` for `sig` (loading it from numba's cache when there); counts STATS.

    `slp`: run LLVM's SLP vectoriser on it (numba leaves it off by default; it packs
    unrolled straight-line arithmetic, e.g. short dot products, into vector registers).
    numba reads the switch whenever it optimises a module, so it is on only while this
    kernel compiles."""
    t0 = time.perf_counter()
    before = _hits(k)
    if sig.args not in [tuple(s) for s in k.signatures]:
        if slp:
            from numba.core import config
            with _LOCK:
                old = config.SLP_VECTORIZE
                config.SLP_VECTORIZE = 1
                try:
                    k.compile(sig)
                finally:
                    config.SLP_VECTORIZE = old
        else:
            k.compile(sig)
    dt = time.perf_counter() - t0
    hit = _hits(k) > before
    rec = STATS["kernels"].setdefault(name, {"compile_s": 0.0, "cache_hit": hit})
    if dt > 1e-3 or not rec["compile_s"]:
        rec["compile_s"] = round(dt, 4)
        rec["cache_hit"] = hit
        STATS["cache_hits" if hit else "compiled"] += 1
    return k


def _hits(k):
    try:
        return sum(k.stats.cache_hits.values())
    except Exception:
        return 0


# ---------------------------------------------------------------------- binding a node
def bind(node, inplace=None):
    """A callable over the node's input arrays running its generated kernel; returns one
    array for one output, else a tuple. `.source` holds the kernel and wrapper source.

    The callable takes `out=` (an array or None per output) to write into planned
    buffers; `inplace` ({output j: input i}) makes output j overwrite input i's array
    (see `inplace_ok`)."""
    body, outputs = node.attrs["body"], node.attrs["outputs"]
    from . import reducegen
    if reducegen.has_reduction(body):
        if inplace:
            raise ValueError("row-reduction kernels do not write into their inputs")
        return reducegen.bind(node)
    in_shapes = [tuple(v.shape) for v in node.inputs]
    in_dtypes = [v.dtype for v in node.inputs]
    out_dtypes = [v.dtype for v in node.outputs]
    n_in = len(in_shapes)
    cols = col_sums(body)
    col_outs = [j for j, o in enumerate(outputs) if o - n_in in cols]
    if cols:   # iterate over what the column sums read, split before the summed axes' end
        e = body[min(cols)]
        S = tuple(_value_shape(node, e[1][0]))
        layout, k, pats = plan_layout(in_shapes, S, split=len(body_attrs(e)["axis"]))
    else:
        S = tuple(node.outputs[0].shape)
        layout, k, pats = plan_layout(in_shapes, S)
    inplace = {j: i for j, i in (inplace or {}).items()
               if pats[i] == "full" and compute_dtype(in_dtypes[i]) == in_dtypes[i]
               and in_dtypes[i] == out_dtypes[j] and in_shapes[i] == S and j not in col_outs}
    n = int(np.prod(S)) if S else 1
    parallel = n >= PARALLEL_MIN and not cols
    row_len = int(np.prod(S[k:])) if layout == "rows" else None
    src = kernel_source(body, outputs, in_dtypes, out_dtypes, pats, layout, parallel,
                        inplace=inplace, row_len=row_len)
    kern, name, path = load_kernel(src)
    kept = [j for j in range(len(out_dtypes)) if j not in inplace]
    compile_kernel(kern, name, _nb_sig(in_dtypes, pats, layout, [out_dtypes[j] for j in kept],
                                       [kept.index(j) for j in col_outs]))
    shape2 = (n,) if layout == "flat" else (int(np.prod(S[:k])), int(np.prod(S[k:])))
    env = {"_k": kern, "_c": np.ascontiguousarray, "_bt": np.broadcast_to, "_e": np.empty,
           "np": np, "_bf16": _dt.bfloat16}
    args = []
    frozen = consts_frozen()
    for i, (s, d, p) in enumerate(zip(in_shapes, in_dtypes, pats)):
        conv = input_conversion(d)
        const = node.inputs[i].const
        if const is not None and i not in inplace.values() and frozen:
            # a frozen constant (a served program's bias): made contiguous, converted,
            # broadcast where the split cannot express it and reshaped once, here, not
            # on every call (a conv's bias+ReLU epilogue at batch 64 copied its bias to
            # 1.2 MB a call; at batch 1 the wrapper's per-call work was 3x the kernel's)
            env[f"_m{i}"] = _prepared(const, p, S, shape2, d)
            args.append(f"_m{i}")
            continue
        if p == "full":
            shp = shape2
        elif p == "scalar":
            shp = (1,)
        elif p == "row":
            shp = (shape2[1],)
        elif p == "col":
            shp = (shape2[0],)
        else:   # broadcast this split cannot express: materialise it
            args.append(f"_c(_bt(x{i}, {S!r}){conv}.reshape({shape2!r})")
            continue
        args.append(f"{'a' if i in inplace.values() else '_c(x'}{i}"
                    f"{'' if i in inplace.values() else conv}.reshape({shp!r})")
    outs = [((shape2[1],), d, tuple(v.shape)) if j in col_outs else (shape2, d, S)
            for j, (d, v) in enumerate(zip(out_dtypes, node.outputs))]
    return build_wrapper(len(in_shapes), args, outs, env, name, src, path, inplace,
                         tail=[str(x) for x in shape2] if cols else (),
                         storage=[compute_dtype(d) if j in col_outs else storage_dtype(d)
                                  for j, d in enumerate(out_dtypes)])


def input_conversion(d) -> str:
    """What the wrapper appends to ``_c(x`` for a `d` input (closing the call): bfloat16
    viewed as its bits, float16 converted to float32, others as they are."""
    sd = storage_dtype(d)
    if sd == d:
        return ")"
    if sd == _U16:
        return ").view(np.uint16)"
    return f", dtype=np.{sd.name})"


def _prepared(const, pattern, S, shape2, d):
    """A constant input of dtype `d` as the kernel reads it under `pattern` (see `bind`),
    in its storage dtype (bfloat16 as its uint16 bits). Left writable: a read-only array
    is another numba type, a second compile of the kernel."""
    if pattern == "bcast":
        a = np.broadcast_to(const, S)
    else:
        a = const
    shp = {"full": shape2, "scalar": (1,), "row": (shape2[-1],), "col": (shape2[0],),
           "bcast": shape2}[pattern]
    sd = storage_dtype(d)
    if sd == _U16 and np.dtype(d) == _dt.bfloat16:
        return np.ascontiguousarray(a, dtype=_dt.bfloat16).view(np.uint16).reshape(shp)
    return np.ascontiguousarray(a, dtype=sd).reshape(shp)


def _value_shape(node, idx):
    """Shape of value `idx` of a fused node's body (inputs first, then entries), from
    the fused op's own shape rule."""
    from ...ops.registry import Spec
    specs = [Spec(tuple(v.shape), v.dtype) for v in node.inputs]
    return OPS["fused"].shape_rule(*specs, body=node.attrs["body"], outputs=(idx,))[0].shape

