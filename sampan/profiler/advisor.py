"""The advisor: read a profile, say what to change (`prof.advise()`).

Each rule looks for one known way a program wastes time, and reports it as a `Finding`
whose evidence is numbers read from the trace and whose fix is a concrete change. A rule
stays silent unless its evidence passes its thresholds (the named constants below), so a
reasonable program (a jitted step fed by a fast loader) gets no findings at all.
Rules read events' fields (op name, input/output shapes and dtypes, value ids, FLOPs:
see `runtime.profiled.node_events`), never the IR text, and which ops are GEMMs comes from
the op table (`OpDef.gemm`, `gemm_ops()`). The rules over rec and collective events are
in `advisor_dist`, the view and `Finding` they share in `_advice`.

=====================  ==================================================================
rule                   fires when
=====================  ==================================================================
input_bound            the training thread spends >= INPUT_BOUND_SHARE of its time in the
                       loader (queue wait, or fetch/collate run inline), first batch aside
dispatch_bound         >= DISPATCH_MIN_OPS eager ops, most shorter than
                       DISPATCH_TINY_OP_US, and >= DISPATCH_OVERHEAD_SHARE of the eager
                       time outside ops that long (dispatch, Python between ops)
unfused_elementwise    a jitted program runs >= UNFUSED_MIN_CHAIN elementwise nodes in a
                       row, each reading the one before, as separate kernels
recompilation_storm    one jitted function compiled >= RECOMPILE_MIN times
gemm_below_peak        a GEMM op (OpDef.gemm) of one shape (one eager shape, or one jit
                       node) takes >= GEMM_MIN_SHARE of the time at < GEMM_PEAK_FRACTION of this
                       machine's measured sgemm rate in its best call; why: small calls,
                       float64, or starved BLAS threads (calls varying >= GEMM_JITTER x, or
                       a GEMM that is not small below GEMM_STARVED_FRACTION of peak)
embedding_cache_misses the embedding hot cache misses >= REC_MISS_RATE of
                       >= REC_MIN_LOOKUPS lookups
ps_pull_wait           pulls / prefetch waits take >= REC_WAIT_SHARE of the time
exposed_communication  threads block in collectives' wait() >= EXPOSED_COMM_SHARE of their
                       collectives' time and >= EXPOSED_MIN_WALL_SHARE of the run
=====================  ==================================================================

    >>> for f in prof.advise():
    ...     print(f)
"""
from __future__ import annotations

import os
import re
from collections import defaultdict

import numpy as np

from ._advice import (_WORK, RULES, Finding, _by_tid, _inside, _merged, _ms, _rule, _sig,
                      _union_ns, _View)
from .machine import machine_peak_gflops

__all__ = ["RULES", "Finding", "advise", "gemm_ops", "machine_peak_gflops"]

# input_bound: share of the training thread's time in the loader (steady state)
INPUT_BOUND_SHARE = 0.20
INPUT_MIN_BATCHES = 3          # loader waits needed (after the first) before judging
# dispatch_bound: many short eager ops whose overhead dominates the eager time
DISPATCH_MIN_OPS = 200
DISPATCH_TINY_OP_US = 50.0
DISPATCH_TINY_FRACTION = 0.5   # of the ops must be tiny
DISPATCH_OVERHEAD_SHARE = 0.5
# unfused_elementwise: a chain of elementwise kernels this long, in one program call
UNFUSED_MIN_CHAIN = 3
# recompilation_storm: compiles of one function
RECOMPILE_MIN = 3
# gemm_below_peak
GEMM_PEAK_FRACTION = 0.10
GEMM_MIN_SHARE = 0.05          # of the profiled wall time, for one (op, shapes) group
GEMM_SMALL_DIM = 64            # a GEMM dimension below this is "too small"
GEMM_JITTER = 10.0             # median / best call time of one shape: threads contending
GEMM_STARVED_FRACTION = 0.01   # a GEMM that is not small this far below peak: starved


def advise(prof, rules=None) -> list:
    """Findings for a `Profile` (or a list of `Event`s), the most time at stake first.

    >>> findings = sampan.profiler.advisor.advise(prof)
    """
    view = _View(prof)
    out = []
    for rule in RULES if rules is None else rules:
        out.extend(rule(view))
    return sorted(out, key=lambda f: -f.share)


# ------------------------------------------------------------------------ input bound


@_rule
def input_bound(v: _View):
    """The training thread waits on the loader (or loads inline) a large share of its time."""
    found = []
    for tid, evs in v.by_tid.items():
        data = [e for e in evs if e.cat == "data"]
        if not data:
            continue
        merged = _merged((e.ts, e.end) for e in data)   # collate sits inside fetch
        if not any(e.cat in _WORK and not _inside(e, merged) for e in evs):
            continue   # a worker thread (its ops index the dataset), or no training here
        if len(merged) < INPUT_MIN_BATCHES + 1:
            continue
        first, rest = merged[0], merged[1:]        # the first batch: workers starting up
        end = max(e.end for e in evs)
        window = end - first[1]
        loader = sum(e - s for s, e in rest)
        share = loader / max(window, 1)
        if share < INPUT_BOUND_SHARE:
            continue
        inline = any(e.name == "fetch" for e in data)
        workers = {e.tid for e in v.by_cat["data"] if e.name == "fetch" and e.tid != tid}
        fetches = [e.dur for e in v.by_cat["data"] if e.name == "fetch"]
        work = _union_ns([(e.ts, e.end) for e in evs if e.cat in _WORK and e.ts >= first[1]])
        step_ms = work / len(rest) / 1e6
        fetch_ms = float(np.mean(fetches)) / 1e6 if fetches else None
        ev = {"loader_share": round(share, 3), "loader_ms": _ms(loader),
              "window_ms": _ms(window), "batches": len(rest), "worker_threads": len(workers),
              "compute_ms_per_batch": round(step_ms, 3)}
        if fetch_ms is not None:
            ev["fetch_ms_per_batch"] = round(fetch_ms, 3)
        if inline:
            how = ("batches are loaded on the training thread (num_workers=0): "
                   "DataLoader(num_workers=N) loads them ahead while the step runs")
        else:
            need = max(int(np.ceil(fetch_ms / max(step_ms, 1e-3))) if fetch_ms else 0,
                       len(workers) + 1)
            how = (f"the {len(workers)} worker(s) cannot keep up (a batch takes "
                   f"{fetch_ms or 0:.3g} ms to load, a step {step_ms:.3g} ms): raise "
                   f"num_workers (about {need} keep up"
                   + (", more than this machine's cores: make loading cheaper first"
                      if need > (os.cpu_count() or 1) else "") + ") and prefetch_factor")
        found.append(Finding(
            "input_bound", f"input-bound: the step waits on the data loader "
                           f"{share:.0%} of the time", ev,
            how + "; move per-sample transforms out of __getitem__ into batch ops in the "
                  "compiled step (sampan.jit) or precompute them", share=min(loader /
                                                                           v.wall_ns, 1.0)))
    return found


# ------------------------------------------------------------------------ dispatch bound
@_rule
def dispatch_bound(v: _View):
    """Many tiny eager ops: per-op overhead, not arithmetic, takes the time."""
    # ops run by the loader's workers or inside the rec pipeline are not the step's
    stages = {tid: _merged((e.ts, e.end) for e in es if e.cat in ("data", "rec"))
              for tid, es in v.by_tid.items()}
    ops = [e for e in v.by_cat["op"] if not _inside(e, stages[e.tid])]
    if len(ops) < DISPATCH_MIN_OPS:
        return []
    tiny_ns = DISPATCH_TINY_OP_US * 1e3
    durs = np.array([e.dur for e in ops], dtype=np.float64)
    n_tiny = int((durs < tiny_ns).sum())
    if n_tiny < DISPATCH_TINY_FRACTION * len(ops):
        return []
    by_tid = defaultdict(list)
    for e in ops:
        by_tid[e.tid].append(e)
    window = busy_big = other = in_ops = 0
    for tid, es in by_tid.items():
        t0, t1 = min(e.ts for e in es), max(e.end for e in es)
        window += t1 - t0
        # long ops are useful arithmetic; time in other stages is not dispatch overhead
        busy_big += _union_ns([(e.ts, e.end) for e in es if e.dur >= tiny_ns])
        in_ops += _union_ns([(e.ts, e.end) for e in es])
        other += _union_ns([(max(e.ts, t0), min(e.end, t1)) for e in v.by_tid[tid]
                            if e.cat in ("data", "rec", "jit", "kernel", "collective")
                            and e.end > t0 and e.ts < t1])
    eager = max(window - other, 1)
    overhead = max(eager - busy_big, 0) / eager
    if overhead < DISPATCH_OVERHEAD_SHARE:
        return []
    ev = {"eager_ops": len(ops), "tiny_ops": n_tiny, "median_op_us": round(
        float(np.median(durs)) / 1e3, 2), "ops_per_ms": round(len(ops) / (eager / 1e6), 1),
        "overhead_share": round(overhead, 3), "eager_ms": _ms(eager),
        "python_gap_ms": _ms(max(eager - in_ops, 0))}
    return [Finding(
        "dispatch_bound", f"dispatch-bound eager code: {len(ops)} ops, median "
                          f"{ev['median_op_us']} us each; {overhead:.0%} of the eager time "
                          "is per-op overhead", ev,
        "wrap the training step (forward, backward and optimiser) in sampan.jit: it is "
        "traced once and runs as one compiled program with fused kernels, without "
        "per-op dispatch", share=min((eager - busy_big) / v.wall_ns, 1.0))]


# ------------------------------------------------------------------------ unfused chains
def _kernel_op(e):
    """(op name, output value ids, input value ids, output dtypes) of a kernel event, read
    from its fields (see `runtime.profiled.node_events`); ids are empty when unknown."""
    a = e.args
    return (e.name, set(a.get("outputs") or ()), set(a.get("inputs") or ()),
            tuple(a.get("out_dtypes") or ()))


def _short_dtypes(names) -> set:
    """IR spellings ("f32", "bf16") of the float dtype names in `names`."""
    from ..dtypes import DTYPES, is_floating, short_name
    out = set()
    for n in names:
        d = DTYPES.get(str(n))
        if d is not None and is_floating(d):
            out.add(short_name(d))
    return out


@_rule
def unfused_elementwise(v: _View):
    """Elementwise nodes of a jitted program that run as separate kernels in a chain."""
    from ..ops.registry import OPS
    kernels = v.by_cat["kernel"]
    if not kernels:
        return []
    fused_progs = {e.args.get("program") for e in kernels
                   if _kernel_op(e)[0] == "fused" or e.name == "fused"}
    chains = defaultdict(lambda: {"count": 0, "ns": 0, "dtypes": set()})
    for es in _by_tid(kernels).values():
        run = []
        for e in es + [None]:
            info = None if e is None else _kernel_op(e)
            op = None if info is None else OPS.get(info[0])
            elementwise = op is not None and op.kind == "elementwise"
            linked = elementwise and run and e.args.get("program") == run[-1][0].args.get(
                "program")
            if linked and info[2] and run[-1][1][1]:     # IR known: it must read the chain
                linked = bool(info[2] & set().union(*(r[1][1] for r in run)))
            if elementwise and (not run or linked):
                run.append((e, info))
                continue
            if len(run) >= UNFUSED_MIN_CHAIN:
                key = (run[0][0].args.get("program"), tuple(r[1][0] for r in run))
                c = chains[key]
                c["count"] += 1
                c["ns"] += sum(r[0].dur for r in run)
                c["dtypes"].update(_short_dtypes(d for r in run for d in r[1][3]))
                c["src"] = run[0][0].args.get("src", "")
            run = [(e, info)] if elementwise else []
    found = []
    for (prog, names), c in sorted(chains.items(), key=lambda kv: -kv[1]["ns"]):
        ev = {"program": prog, "chain": " -> ".join(names), "length": len(names),
              "occurrences": c["count"], "chain_ms": _ms(c["ns"]),
              "share": round(c["ns"] / v.wall_ns, 3)}
        if c.get("src"):
            ev["src"] = c["src"]
        if prog not in fused_progs:
            why = ("no fused kernel ran in this program: its pipeline lacks the "
                   "'fuse_elementwise' pass (sampan.jit(fn, pipeline=...) or "
                   "sampan.passes.set_pipeline) or numba is missing; run it")
        else:
            never = [n for n in names if not OPS[n].fuse]
            f32 = [n for n in names if OPS[n].fuse == "float32"]
            if never:
                why = (f"{', '.join(sorted(set(never)))} are not fusible (fuse='' in the op "
                       "table): give them a scalar form there")
            elif f32 and c["dtypes"] - {"f32", "bf16"}:
                why = (f"{', '.join(sorted(set(f32)))} fuse only in float32/bfloat16, the "
                       f"chain runs in {'/'.join(sorted(c['dtypes']))}: compute in float32")
            else:
                why = ("the fusion pass left them apart (shapes that broadcast differently, or "
                       "a value used outside the chain): run sampan.jit(fn, debug=True) to "
                       "see the pass's groups")
        found.append(Finding(
            "unfused_elementwise", f"{len(names)} elementwise kernels in a row in "
                                   f"{prog} run unfused ({c['count']}x)", ev, why,
            share=ev["share"]))
    return found


# ------------------------------------------------------------------------ recompilation
_SHAPE = re.compile(r"\[([\d, ]*)\]")


def _shapes(sig):
    """Per-argument shapes from a signature: a dict {name: "f32[3,4]"}, a list of shapes,
    or a string "x: f32[32,10], y: i64[32]". Returns [(name, shape tuple)]."""
    if isinstance(sig, dict):
        items = list(sig.items())
    elif isinstance(sig, (list, tuple)):
        if all(isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s)
               for s in sig):
            return [(f"arg{i}", tuple(s)) for i, s in enumerate(sig)]
        items = [(f"arg{i}", s) for i, s in enumerate(sig)]
    else:
        parts = re.findall(r"(?:(\w+)\s*[:=]\s*)?[a-z]+\d*\[([\d, ]*)\]", str(sig))
        return [(n or f"arg{i}", tuple(int(d) for d in s.split(",") if d.strip()))
                for i, (n, s) in enumerate(parts)]
    out = []
    for n, s in items:
        m = _SHAPE.search(str(s))
        if isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s):
            out.append((str(n), tuple(s)))
        elif m:
            out.append((str(n), tuple(int(d) for d in m[1].split(",") if d.strip())))
    return out


@_rule
def recompilation_storm(v: _View):
    """One jitted function compiled again and again for new signatures."""
    jit = v.by_cat["jit"]
    compiles = defaultdict(list)
    misses = defaultdict(int)
    for e in jit:
        fn = str(e.args.get("fn", "?"))
        if e.name == "compile":
            compiles[fn].append(e)
        elif e.name == "cache_miss":
            misses[fn] += 1
    found = []
    for fn, es in compiles.items():
        if len(es) < RECOMPILE_MIN:
            continue
        sigs = [_shapes(e.args.get("signature")) for e in es]
        varying = []
        if sigs and all(len(s) == len(sigs[0]) for s in sigs):
            for i, (name, shape) in enumerate(sigs[0]):
                if not all(len(s[i][1]) == len(shape) for s in sigs):
                    continue
                for d in range(len(shape)):
                    vals = sorted({s[i][1][d] for s in sigs})
                    if len(vals) > 1:
                        varying.append((name, d, vals))
        ev = {"fn": fn, "compiles": len(es), "cache_misses": misses.get(fn, len(es)),
              "compile_ms": _ms(sum(e.dur for e in es)),
              "compile_share": round(sum(e.dur for e in es) / v.wall_ns, 3)}
        if varying:
            ev["varying"] = "; ".join(f"{n} dim {d}: {vals[:6]}" for n, d, vals in varying)
            spec = ", ".join(f'"{n}": {{{d}: "n{k}"}}' for k, (n, d, _) in
                             enumerate(varying))
            short = fn.split(".")[-1]
            short = short if short.isidentifier() else "fn"
            fix = (f"mark the varying dim symbolic so one program serves every size: "
                   f"sampan.jit({short}, dynamic={{{spec}}}) (or pad to a few fixed sizes)")
        else:
            fix = ("the signature did not change in a shape: a Python value the trace reads "
                   "(a float hyperparameter, a flag) changes per call; pass it as a tensor")
        title = f"recompilation storm: {fn} was compiled {len(es)} times"
        if varying and len(varying) == 1:
            title += f", its signatures differing only in {varying[0][0]} dim {varying[0][1]}"
        found.append(Finding("recompilation_storm", title, ev, fix,
                             share=ev["compile_share"]))
    return found


# ------------------------------------------------------------------------ GEMMs vs peak
def gemm_ops() -> frozenset:
    """Names of the ops the op table marks as GEMMs (`OpDef.gemm`: matmul, convolutions,
    einsum …), judged against the machine's sgemm rate. A new op marked there is judged
    too, with no list here to edit."""
    from ..ops.registry import OPS
    return frozenset(n for n, op in OPS.items() if op.gemm)


def _gemm_shapes(e):
    """(group key, shapes to show, the GEMM's dims) of one matmul/conv event. An eager op
    has its input shapes; a jit kernel its output shape, which with its FLOPs gives M, N
    and the reduction K (one node of one program: the same shapes every call)."""
    shapes = e.args.get("shapes") or []
    if e.cat == "op":
        dims = [d for s in shapes[-2:] for d in s[-2:]]
        return str(shapes), shapes, dims
    outs = e.args.get("out_shapes") or [[]]
    shape = [d for d in outs[0] if isinstance(d, int)]
    numel = int(np.prod(shape)) if shape else 1
    k = int(e.args["flops"]) // max(2 * numel, 1)
    label = f"out {shape}, K={k}"
    node = tuple(e.args.get("outputs") or ()) or str(shapes)
    return (e.args.get("program"), node), label, shape[-2:] + [k]


@_rule
def gemm_below_peak(v: _View):
    """matmul/conv groups taking real time at a small fraction of the machine's rate."""
    groups = {}
    gemms = gemm_ops()
    for e in v.by_cat["op"] + v.by_cat["kernel"]:
        name = e.name
        if name not in gemms or not e.args.get("flops"):
            continue
        key, shapes, dims = _gemm_shapes(e)
        g = groups.setdefault((name, key), {"calls": 0, "ns": 0, "flops": 0, "shapes": shapes,
                                            "dims": dims, "dtypes": e.args.get("dtypes"),
                                            "durs": []})
        g["calls"] += 1
        g["ns"] += e.dur
        g["flops"] += int(e.args["flops"])
        g["durs"].append(e.dur)
    cands = [(k, g) for k, g in groups.items() if g["ns"] >= GEMM_MIN_SHARE * v.wall_ns]
    if not cands:
        return []
    peak = machine_peak_gflops()
    found = []
    for (name, _), g in sorted(cands, key=lambda kv: -kv[1]["ns"]):
        calls, ns, fl, dims = g["calls"], g["ns"], g["flops"], g["dims"]
        per_call = fl / calls
        rate = fl / max(ns, 1)      # flops per ns = GFLOP/s
        # judged by the best call: a GEMM slowed only by a busy machine is fast sometimes,
        # one that is small or badly laid out is slow every time
        best = per_call / max(min(g["durs"]), 1)
        frac = best / peak
        if frac >= GEMM_PEAK_FRACTION:
            continue
        jitter = float(np.median(g["durs"])) / max(min(g["durs"]), 1)
        ev = {"op": name, "shapes": g["shapes"], "calls": calls,
              "achieved_gflops": _sig(rate), "best_call_gflops": _sig(best),
              "peak_gflops": round(peak, 1), "fraction_of_peak": _sig(frac),
              "time_ms": _ms(ns), "share": round(ns / v.wall_ns, 3),
              "median_over_best": _sig(jitter, 3)}
        if g["dtypes"]:
            ev["dtypes"] = g["dtypes"]
        reasons = []
        if (dims and min(dims) < GEMM_SMALL_DIM) or per_call < 2 * GEMM_SMALL_DIM ** 3:
            reasons.append(f"each call is small ({per_call / 1e6:.3g} MFLOP), so per-call "
                           "overhead and thin loops dominate: give each call more work "
                           "(larger batches; stack many small products into one batched "
                           "matmul)")
        if g["dtypes"] and any("float64" in str(d) for d in g["dtypes"]):
            reasons.append("the inputs are float64: float32 GEMMs run about twice as fast")
        small = bool(reasons)
        if jitter >= GEMM_JITTER or (not small and frac < GEMM_STARVED_FRACTION):
            what = (f"calls of this one shape vary {jitter:.0f}x in time" if jitter >=
                    GEMM_JITTER else f"a GEMM of this size at {frac:.2%} of peak is slower "
                    "than any layout explains")
            reasons.append(f"{what}: the BLAS threads wait for each other while the "
                           "scheduler runs other work on their cores (more busy threads "
                           "than cores): lower OPENBLAS_NUM_THREADS/OMP_NUM_THREADS or stop "
                           "the competing jobs")
        if not reasons:
            reasons.append("the shapes are badly laid out for GEMM (a transposed or strided "
                           "input is copied first, an inner dim that is not a multiple of 8, "
                           "grouped/dilated convolution): keep the reduction dim contiguous")
        found.append(Finding(
            "gemm_below_peak", f"{name} {g['shapes']} runs at {frac:.1%} of this machine's "
                               f"sgemm rate at best ({best:.3g} of {peak:.1f} GFLOP/s)", ev,
            "; ".join(reasons), share=ev["share"]))
    return found


# the rules over rec and distributed events register after the ones above
from .advisor_dist import (EXPOSED_COMM_SHARE, EXPOSED_MIN_COLLECTIVES,  # noqa: E402,F401
                           EXPOSED_MIN_WALL_SHARE, REC_MIN_LOOKUPS, REC_MISS_RATE,
                           REC_WAIT_SHARE, embedding_cache_misses, exposed_communication,
                           ps_pull_wait)
