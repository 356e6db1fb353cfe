"""`sampan deploy --target c`: a saved program as a dependency-free C99 library.

Writes into the output folder:

- `model.h`: the API, every exported name under the prefix (`model_` by default, so two
  models link into one program): `<p>_create(path)`, `<p>_create_from_memory(data,
  size)`, `<p>_run(m, batch, inputs, outputs)`, `<p>_destroy(m)`, `<p>_last_error()`,
  the input and output descriptors (name, dtype, shape with -1 for the batch dim) and
  their byte sizes at a batch.
- `model.c`: one function per graph, in execution order, over static offsets into one
  arena (the memory plan, sized for `max_batch`, allocated by create: `run` allocates
  nothing), calling only the kernels the program's nodes use, each from one template per
  op family (`ctemplates`, `csteps`).
- `weights.bin` (`cweights`): checksummed, versioned, with the program's lineage; the
  generated code refuses a damaged or foreign file with an error string.
- `Makefile` (`libmodel.so`, and the driver `model_run IN OUT [-b N]`) and `model_run.c`.

Example::

    >>> sampan.deploy.generate("m.sampan", "out", target="c")   # sampan deploy m.sampan --target c -o out
    >>> # cd out && make && ./model_run in.bin out.bin -b 1
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...ops.registry import OPS
from ...runtime import emit
from . import qsteps, steps as csteps, templates as T, weights as cweights
from .emit_c import DTYPE_CODES, cfill, cname, cstr, ctype, join, num
from .files import DRIVER, HEADER, MAKEFILE, OMP_DETECT, SOURCE
from .lower import Buf, Poly, batch_symbol, lower, plan
from .report import write_manifest
from ..kernelsource import DeployError, check_guards

DEFAULT_MAX_BATCH = 64


@dataclass
class CGenerated:
    """What the C target wrote: paths, sizes in bytes, the ops and kernels included."""
    outdir: str
    prefix: str
    ops: tuple
    kernels: tuple
    code_bytes: int
    weights_bytes: int
    arena_bytes: int
    max_batch: int

    def report(self) -> str:
        kb = 1024
        return (f"{self.outdir}: model.c + model.h {self.code_bytes / kb:.1f} KiB for "
                f"{len(self.ops)} ops ({', '.join(self.ops)}), kernels "
                f"{', '.join(self.kernels) or '-'}; weights.bin {self.weights_bytes / kb:.1f} "
                f"KiB; arena {self.arena_bytes / kb:.1f} KiB at batch {self.max_batch}")


def _check_ops(g):
    ok = set(csteps.covered_ops())
    for n in g.nodes:
        ops = [n.op] + ([e[0] for e in n.attrs["body"]] if n.op == "fused" else [])
        for op in ops:
            if op not in ok:
                raise DeployError(
                    f"sampan deploy --target c: op {op!r} at {emit.inert(n.loc or '?')} has no "
                    f"C template; the C target covers: {', '.join(sorted(ok))}")


def generate_c(program_dir, outdir, *, prefix="model", max_batch=DEFAULT_MAX_BATCH,
               sizes=None, threads=1) -> CGenerated:
    """Write the C library of a saved program into `outdir` (see the module doc).

    `max_batch`: the largest batch `run` takes (buffers are sized for it); `sizes`:
    sizes of symbolic dims other than the batch (e.g. ``{"seq": 128}``); `threads`: the
    threads splitting the big GEMM loops (OpenMP, where the compiler has it; one thread
    otherwise)."""
    if type(threads) is not int or not 1 <= threads <= 1024:
        raise DeployError(f"sampan deploy: threads={threads!r}; expected an int in 1..1024")
    from ...jit.program import SavedProgram
    if type(max_batch) is not int or max_batch < 1:
        raise DeployError(f"sampan deploy: max_batch={max_batch!r}; expected an int >= 1")
    pfx = cname(prefix, "the C prefix")
    prog = SavedProgram.read(program_dir)
    g, meta = prog.graph, prog.meta
    check_guards(program_dir, meta)
    _check_ops(g)
    if any(k != "out" for k in meta["outputs"]):
        raise DeployError("sampan deploy --target c: the program returns constants or "
                          "non-tensor outputs; the C target returns tensors only")
    bsym, fixed = batch_symbol(g, sizes)
    try:
        steps, inputs, consts, outputs, bufs = lower(g, meta, prog.arrays, bsym, fixed,
                                                     max_batch)
    except emit.EmitError as e:
        raise DeployError(f"sampan deploy: {e}") from None

    def new(dtype, dims, kind):
        b = Buf(len(bufs), np.dtype(dtype), dims, kind)
        bufs.append(b)
        return b
    for s in steps:
        if s.op == "matmul" and s.ins[1].kind == "const" and s.ins[1].const.ndim == 2 \
                and s.ins[1].dtype == np.float32 and s.ins[1].packed is None:
            s.ins[1].packed = cweights.pack_panels(s.ins[1].const, T.NR)
        if s.op == "conv2d" and s.ins[1].kind == "const" and s.ins[1].packed is None \
                and csteps.conv_packs(s):
            s.ins[1].packed = csteps.pack_conv_weight(s.ins[1].const,
                                                      int(s.attrs.get("groups", 1)))
        if s.op == "conv2d":
            csteps.conv2d_scratch(s, new)
        if s.op in qsteps.SCRATCH:
            qsteps.SCRATCH[s.op](s, new)
    steps = csteps.fuse_relu(steps, outputs)
    arena = plan(steps, outputs, max_batch)
    derived = []

    def new_const(a):
        b = Buf(len(bufs), a.dtype, [Poly.const(int(d)) for d in a.shape], "const", const=a)
        bufs.append(b)
        consts.append(b)
        derived.append(b.n)
        return b
    ctx = csteps.Ctx(new_const)
    body = []
    for s in steps:
        em = csteps.EMITTERS.get(s.op)
        if em is None:
            raise DeployError(f"sampan deploy --target c: op {s.op!r} at "
                              f"{emit.inert(s.loc)} has no C template; the C target covers: "
                              f"{', '.join(csteps.covered_ops())}")
        body.append(cfill("    /* @c@ */", c=_comment(f"{s.op} at {s.loc}")))
        body.append(em(s, ctx))
    # weights: every const read plainly (not only as a packed GEMM operand), and the
    # packed forms
    plain = {b.n for b in outputs} | set(derived)
    for s in steps:
        for j, b in enumerate(s.ins):
            if s.op in qsteps.EMITTERS and j > 0:
                continue      # scales, zero points, weights: read at generation
            if not (j == 1 and s.op in ("matmul", "conv2d") and b.packed is not None):
                plain.add(b.storage.n)
    tensors, owners = [], []
    for b in consts:
        if b.n in plain:
            tensors.append(b.const.astype(b.dtype, copy=False))
            owners.append((b, False))
        if b.packed is not None:
            tensors.append(b.packed)
            owners.append((b, True))
    os.makedirs(outdir, exist_ok=True)
    wpath = os.path.join(outdir, "weights.bin")
    offs, payload, h = cweights.write(wpath, tensors, cweights.lineage(program_dir))
    for (b, packed), o in zip(owners, offs):
        if packed:
            b.packed_offset = o
        else:
            b.offset = o
    used = _used(steps, outputs) | set(derived)
    decls = _decls(bufs, used, plain)
    src = _source(pfx, g, meta, inputs, outputs, decls, body, ctx, steps, arena, payload, h,
                  len(tensors), cweights.lineage(program_dir), max_batch, bsym, threads)
    hdr = cfill(HEADER, P=pfx, PU=emit.own(pfx.upper()))
    files = {"model.c": src, "model.h": hdr, "Makefile": cfill(MAKEFILE, P=pfx, omp=emit.own(
                 OMP_DETECT if threads > 1 else "OMP =")),
             "model_run.c": cfill(DRIVER, P=pfx)}
    from ...io import _atomic
    for name, text in files.items():
        _atomic.write_file(os.path.join(outdir, name),
                           lambda f, t=text: f.write(t.encode("ascii")))
    ops = sorted({s_op for n in g.nodes for s_op in
                  ([n.op] + ([e[0] for e in n.attrs["body"]] if n.op == "fused" else []))})
    write_manifest(outdir, pfx, ops, ctx.kernels, len(csteps.covered_ops()), max_batch,
                   threads, list(files) + ["weights.bin"])
    return CGenerated(os.fspath(outdir), pfx, tuple(ops), tuple(ctx.kernels),
                      len(src) + len(hdr), os.path.getsize(wpath), arena, max_batch)


def _comment(text) -> emit.Code:
    """Text for a C block comment: printable ASCII, no comment end."""
    s = emit.inert(text).replace("*/", "* /").replace("/*", "/ *")
    return emit.own("".join(c if 32 <= ord(c) < 127 else "?" for c in s))


def _used(steps, outputs):
    u = set()
    for s in steps:
        for b in s.ins + s.outs + s.scratch:
            u.add(b.n)
            while b.kind == "alias":
                b = b.root
                u.add(b.n)
    for b in outputs:
        u.add(b.n)
    return u


def _decls(bufs, used, plain):
    lines = []
    for b in bufs:
        if b.n not in used:
            continue
        t = ctype(b.dtype)
        st = b.storage
        const = st.kind in ("input", "const")
        q = emit.own("const ") if const else emit.own("")
        if b.kind == "input":
            lines.append(cfill("    const @t@ *@v@ = (const @t@ *)inputs[@i@];", t=t, v=b.name,
                               i=num(b.index)))
        elif b.kind == "const":
            if b.n in plain:
                lines.append(cfill("    const @t@ *@v@ = (const @t@ *)(m->w + @o@);", t=t,
                                   v=b.name, o=num(b.offset)))
            if b.packed is not None:
                lines.append(cfill("    const float *@p@ = (const float *)(m->w + @o@);",
                                   p=emit.fresh("p", b.n), o=num(b.packed_offset)))
        elif b.kind == "alias":
            lines.append(cfill("    @q@@t@ *@v@ = (@q@@t@ *)@r@;", q=q, t=t, v=b.name,
                               r=b.root.name))
        else:
            lines.append(cfill("    @t@ *@v@ = (@t@ *)(m->arena + @o@);", t=t, v=b.name,
                               o=num(b.offset)))
    lines.append(emit.own("    (void)m; (void)B; (void)inputs; (void)outputs;"))
    return lines


def _desc_rows(bufs, names, which):
    rows, shapes = [], []
    for k, b in enumerate(bufs):
        sh = emit.fresh("shape_", which, "_", k)
        dims = [num(-1) if not d.is_const else num(d.value) for d in b.dims] or [num(0)]
        shapes.append(cfill("static const int64_t @s@[] = {@d@};", s=sh, d=join(dims, ", ")))
        rows.append(cfill("    {@n@, @dt@, @nd@, @s@},", n=cstr(names[k]),
                          dt=num(DTYPE_CODES[b.dtype.name]), nd=num(len(b.dims)), s=sh))
    return shapes, rows


def _bytes_fn(bufs):
    cases = []
    for k, b in enumerate(bufs):
        cases.append(cfill("    case @k@: return (size_t)(@n@) * @es@;", k=num(k),
                           n=b.numel.code(), es=num(b.dtype.itemsize)))
    return join(cases, "\n") if cases else emit.own("")


def _source(pfx, g, meta, inputs, outputs, decls, body, ctx, steps, arena, payload, h,
            ntensors, lin, max_batch, bsym, threads):
    names = [str(n) for n in meta.get("arg_names", [])]
    in_names = [names[k] if k < len(names) else f"input{k}" for k in range(len(inputs))]
    out_names = [f"output{k}" for k in range(len(outputs))]
    shapes_i, rows_i = _desc_rows(inputs, in_names, "in")
    shapes_o, rows_o = _desc_rows(outputs, out_names, "out")
    copies = [cfill("    memcpy(outputs[@k@], @v@, (size_t)(@n@) * @es@);", k=num(k),
                    v=b.name, n=b.numel.code(), es=num(b.dtype.itemsize))
              for k, b in enumerate(outputs)]
    helpers = [emit.own(T.HELPERS[h_]) for h_ in sorted(ctx.helpers)]
    kernels = [emit.own(code) for code in ctx.kernels.values()]
    return cfill(
        SOURCE, P=pfx, threads=num(threads), helpers=join(helpers, "\n") if helpers else emit.own(""),
        kernels=join(kernels, "\n"), lineage=join([num(x) for x in lin], ", "),
        payload=num(payload), ntensors=num(ntensors), checksum=emit.own(f"{h}ULL"),
        arena=num(max(arena, 64)), max_batch=num(max_batch if bsym else 1),
        n_in=num(len(inputs)), n_out=num(len(outputs)),
        shapes=join(shapes_i + shapes_o, "\n"), rows_in=join(rows_i, "\n") or emit.own(""),
        rows_out=join(rows_o, "\n"), in_bytes=_bytes_fn(inputs), out_bytes=_bytes_fn(outputs),
        decls=join(decls, "\n"), body=join(body, "\n"), copies=join(copies, "\n"),
        graph=emit.fresh("graph_", "main"), symbolic=num(int(bsym is not None)))
