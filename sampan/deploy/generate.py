"""Generate the standalone module of a saved program (see the package doc)."""
from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass

import numpy as np

from ..io import _atomic
from ..ir import symbolic as _sym
from ..ir.text import node_str
from ..ops.registry import OPS
from ..runtime import emit
from . import kernelsource as _ks
from .kernelsource import DeployError, check_guards as _check_guards

MODULE = "model.py"
WEIGHTS = "weights.npz"


@dataclass
class Generated:
    """What `generate` wrote: paths and sizes in bytes (see `report`)."""
    module: str
    weights: str
    module_bytes: int
    weights_bytes: int
    package_bytes: int
    ops: tuple

    def report(self) -> str:
        kb = 1024
        return (f"{self.module}: {self.module_bytes / kb:.1f} KiB of code for "
                f"{len(self.ops)} ops ({', '.join(self.ops)}); {self.weights}: "
                f"{self.weights_bytes / kb:.1f} KiB; the sampan package's Python source: "
                f"{self.package_bytes / kb:.0f} KiB "
                f"({self.package_bytes / max(self.module_bytes, 1):.0f}x the module)")


def package_bytes() -> int:
    """Bytes of the sampan package's Python source files (what a deployment would ship)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    n = 0
    for d, _, files in os.walk(root):
        n += sum(os.path.getsize(os.path.join(d, f)) for f in files if f.endswith(".py"))
    return n


# ---------------------------------------------------------------------- source helpers
# Every name, key, literal and docstring of the module goes through `sampan.runtime.emit`
# (a program folder, its graph.ir and meta.json are files anyone can write: nothing read
# from them is pasted into source).
_OPS = ("+", "-", "*", "/", "//", "%")


def _expr(e: str) -> emit.Code:
    """A symbolic expression ('5*batch', '0.5/batch', '(batch-1)//2') as Python over the
    sizes `_s`, written by the emitter from its parsed form (`sampan.ir.symbolic`), as
    `sampan.jit.dynamic.evaluate` computes it."""
    try:
        return _expr_code(_sym.parse(e))
    except _sym.ExprError as err:
        raise DeployError(f"sampan deploy: {emit.inert(str(err))}") from None


def _expr_code(t) -> emit.Code:
    if t[0] == "p":                      # a polynomial: (monomial symbols, coefficient) terms
        if not t[1]:
            return emit.lit(0)
        terms = []
        for syms, c in t[1]:
            factors = [] if c == 1 and syms else [emit.lit(c)]
            factors += [emit.fill("_s[{k}]", k=emit.lit(emit.name(s, "size name")))
                        for s in syms]
            terms.append(emit.join(factors, " * "))
        return emit.fill("({t})", t=emit.join(terms, " + "))
    op, a, b = t
    if op not in _OPS:
        raise DeployError(f"sampan deploy: size operator {emit.inert(str(op))!r} is not one "
                          f"of {_OPS}")
    return emit.fill("({a} {op} {b})", a=_expr_code(a), op=emit.own(op), b=_expr_code(b))


def _py(x, what="attribute value") -> emit.Code:
    """Source of plain attribute data; '$'-strings are symbolic sizes."""
    if _sym.is_attr(x):
        return _expr(_sym.attr_text(x))
    if isinstance(x, tuple):
        return emit.tuple_of(_py(v, what) for v in x)
    if isinstance(x, list):
        return emit.fill("[{xs}]", xs=emit.join(_py(v, what) for v in x))
    try:
        return emit.lit(x, what=what)
    except emit.EmitError as e:
        raise DeployError(f"sampan deploy: {e}") from None


def _kernel_name(op) -> emit.Code | None:
    """The name the module calls `op`'s kernel by (None: no standalone kernel)."""
    if not (op == _ks.PLANNED or _ks.standalone(op)):
        return None
    k = _ks.kernel_of(op)
    u = _ks.ufunc_name(k)
    return emit.dotted("np", u) if u else emit.name(k.__name__)


def _kernel_source(ops) -> tuple[list, dict]:
    """(source blocks, {op: callable name}) for the kernels of `ops`: the op table's own
    numpy kernels (`sampan.deploy.kernelsource`)."""
    return _ks.kernel_source(ops)


supported_ops = _ks.supported_ops


# ---------------------------------------------------------------------- the graph
def _plannable_matmuls(g) -> set:
    """Ids of matmul outputs the memory plan may give a buffer (at >= 256 bytes)."""
    from ..runtime.memory import plan
    sizes = {s: 2 for s in _sym.symbols_of(g)}
    c = _sym.concrete(g, sizes) if sizes else g
    assign = plan(c, min_bytes=0)["assign"]
    return {n.outputs[0].id for n in c.nodes if n.op == "matmul" and n.outputs[0].id in assign}


def _check_ops(g):
    ok = set(supported_ops())
    for h in g.walk():                  # the program and every block of its control flow
        for n in h.nodes:
            ops = [n.op] + ([e[0] for e in n.attrs["body"]] if n.op == "fused" else [])
            for op in ops:
                if op not in ok and op not in _CONTROL:
                    raise DeployError(f"sampan deploy: op {op!r} (node {node_str(n)[:120]}) "
                                      "has no standalone numpy kernel; supported: "
                                      f"{', '.join(sorted(ok | set(_CONTROL)))}")
            for v in n.outputs + list(n.inputs):
                if v.dtype.name == "bfloat16":
                    raise DeployError(f"sampan deploy: {n.op} at {n.loc or '?'} uses "
                                      "bfloat16, which numpy alone cannot hold; save the "
                                      "program in float32")


class _Body:
    """The function being written: its lines, the arrays of weights.npz, the op names
    whose kernels it calls, and a count of the blocks written (their names' stems)."""

    def __init__(self):
        self.lines, self.npz, self.used, self.blocks = [], {}, set(), 0


def _body_lines(g, meta, arrays):
    """(function lines, npz arrays, op names used, parameter names, input specs), every
    line made by `emit` (names the generator makes, keys it checks, literals it formats)."""
    names, params, in_specs = {}, [], []
    body = _Body()
    read = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
    for k, (spec, v) in enumerate(zip(meta["inputs"], g.inputs)):
        nm = emit.fresh("x", k)
        names[v.id] = nm
        if spec["kind"] == "arg":
            params.append(nm)
            in_specs.append((nm, v.dtype.name, tuple(v.shape)))
        elif v.id in read:
            if spec["kind"] == "rng":
                raise DeployError("sampan deploy: the program reads random state (dropout "
                                  "in training mode?); save the model in eval mode")
            body.npz[nm] = np.asarray(arrays[spec["key"]])
    outs = emit.join(_graph_lines(g, names, body, emit.own("    "), ""))
    body.lines.append(emit.fill("    return ({outs}{comma})", outs=outs,
                                comma=emit.own("," if len(g.outputs) == 1 else "")))
    return body.lines, body.npz, body.used, params, in_specs


def _graph_lines(g, names, body, ind, stem) -> list:
    """Append the lines of `g`'s nodes at indent `ind` to `body`; `names` maps the ids of
    `g`'s inputs to their names; returns the names of `g`'s outputs. `stem` ("" for the
    program, "b<k>_" for its k-th block) starts the names of `g`'s values; a block's
    values are not deleted after their last use (a loop runs its lines again), and only
    the program's matmuls get planned buffers."""
    top = not stem
    ren = {v.id: k for k, v in enumerate(g.values())}
    read = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
    for v in g.consts:
        if v.id in read:
            names[v.id] = emit.fresh(stem + "c", ren[v.id])
            body.npz[names[v.id]] = np.asarray(v.const)
    planned = _plannable_matmuls(g) if top else set()
    last = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            last[v.id] = i
    keep = {v.id for v in g.outputs}
    lines, used = body.lines, body.used

    def call(op, args, attrs, outs, ndim0, comment, where):
        used.add(op)
        kw = [(_key(k, op, where), _py(x, f"attribute {emit.inert(k)} of {op} at {where}"))
              for k, x in attrs.items()]
        c = emit.call(_kernel_name(op), args, kw)
        if len(outs) == 1 and ndim0:
            c = emit.call(emit.dotted("np", "asarray"), [c])
        lines.append(emit.fill("{ind}{outs} = {c}  {comment}", ind=ind, outs=emit.join(outs),
                               c=c, comment=emit.comment(comment)))

    def sub(block, in_names, indent):
        body.blocks += 1
        return _graph_lines(block, dict(zip([v.id for v in block.inputs], in_names)), body,
                            indent, f"b{body.blocks}_")

    for i, n in enumerate(g.nodes):
        where = emit.inert(n.loc or "?")
        ir = node_str(n, lambda v: f"%{ren[v.id]}").replace("\n", " ")
        ir = ir if len(ir) <= 150 else ir[:147] + "..."
        for v in n.outputs:
            names[v.id] = emit.fresh(stem + "v", ren[v.id])
        ins = [names[v.id] for v in n.inputs]
        if n.op in _CONTROL:
            lines.append(emit.fill("{ind}{c}", ind=ind, c=emit.comment(ir)))
            _control_lines(n, ins, [names[v.id] for v in n.outputs], ind,
                                emit.fresh(stem + "n", ren[n.outputs[0].id], "_"), lines,
                                sub, where)
        elif n.op == "fused":   # the body one op a line (what the numpy runtime interprets)
            vals = list(ins)
            lines.append(emit.fill("{ind}{c}", ind=ind, c=emit.comment(ir)))
            temps = []
            for j, e in enumerate(n.attrs["body"]):
                t = emit.fresh(stem + "t", ren[n.outputs[0].id], "_", j)
                attrs = dict(e[2]) if len(e) > 2 else {}
                call(e[0], [_operand(vals, p, n, where) for p in e[1]], attrs, [t], True,
                     e[0], where)
                vals.append(t)
                temps.append(t)
            for v, p in zip(n.outputs, n.attrs["outputs"]):
                lines.append(emit.fill("{ind}{v} = {t}", ind=ind, v=names[v.id],
                                       t=_operand(vals, p, n, where)))
            lines.append(emit.fill("{ind}del {ts}", ind=ind, ts=emit.join(temps)))
        else:
            op = _ks.PLANNED if n.outputs[0].id in planned else n.op
            call(op, ins, n.attrs, [names[v.id] for v in n.outputs],
                 OPS[n.op].n_out == 1 and n.outputs[0].ndim == 0, ir, where)
        dead = [names[v.id] for v in dict.fromkeys(n.inputs) if top and last.get(v.id) == i
                and v.id not in keep and v.const is None and not names[v.id].startswith("c")
                and names[v.id] not in body.npz]
        if dead:
            lines.append(emit.fill("{ind}del {dead}", ind=ind, dead=emit.join(dead)))
    return [names[v.id] for v in g.outputs]


# ---------------------------------------------------------------------- control flow
# A `cond`, `while_loop` or `scan` node (nested Graphs, `sampan/ops/control.py`) is written
# as a real Python if/else, while or for around its blocks' kernels, inline in `_program`;
# a block reads nothing from the enclosing graph, so its inputs are bound to the names of
# the node's inputs (or of the loop's carry) and its lines are made by `_graph_lines`
# (`sub` below). Loop variables are names the generator makes from `tag`.
_CONTROL = ("cond", "while_loop", "scan")
_STEP = "    "


def _set(lines, ind, lhs, rhs):
    if lhs:
        lines.append(emit.fill("{ind}{l} = {r}", ind=ind, l=emit.join(lhs), r=emit.join(rhs)))


def _count_attr(n, key, where, allow_none=False):
    v = n.attrs.get(key)
    if (v is None and allow_none) or (type(v) is int and v >= 0):
        return v
    raise DeployError(f"sampan deploy: {n.op} at {where}: attribute {key} is "
                      f"{emit.inert(repr(v))}; expected an int >= 0")


def _control_lines(n, ins, outs, ind, tag, lines, sub, where):
    """Append the lines of control-flow node `n` at indent `ind` (Code) to `lines`:
    `ins`/`outs` the names of its input and output values, `tag` a fresh name stem for
    its loop variables, `sub(block, input_names, indent) -> output names` the writer of a
    block's lines."""
    inner = emit.own(ind + _STEP)
    if n.op == "cond":
        _count_attr(n, "n_operands", where)
        lines.append(emit.fill("{ind}if {p}:", ind=ind, p=ins[0]))
        _set(lines, inner, outs, sub(n.blocks[0], ins[1:], inner))
        lines.append(emit.fill("{ind}else:", ind=ind))
        _set(lines, inner, outs, sub(n.blocks[1], ins[1:], inner))
        return
    k = _count_attr(n, "n_carry", where)
    carry = [emit.fresh(tag, "c", j) for j in range(k)]
    _set(lines, ind, carry, ins[:k])
    if n.op == "while_loop":
        caps = ins[k:]
        most = _count_attr(n, "max_iterations", where, allow_none=True)
        it = emit.fresh(tag, "it")
        lines.append(emit.fill("{ind}{it} = 0", ind=ind, it=it))
        if most is None:
            lines.append(emit.fill("{ind}while True:", ind=ind))
        else:
            lines.append(emit.fill("{ind}while {it} < {m}:", ind=ind, it=it, m=emit.lit(most)))
        go = sub(n.blocks[0], carry + caps, inner)
        lines.append(emit.fill("{ind}if not {go}:", ind=inner, go=go[0]))
        lines.append(emit.fill("{ind}break", ind=emit.own(inner + _STEP)))
        _set(lines, inner, carry, sub(n.blocks[1], carry + caps, inner))
        lines.append(emit.fill("{ind}{it} += 1", ind=inner, it=it))
        _set(lines, ind, outs, carry)
        return
    if n.op != "scan":
        raise DeployError(f"sampan deploy: no control-flow writer for op {n.op!r}")
    m = _count_attr(n, "n_xs", where)
    length = _count_attr(n, "length", where)
    xs, caps = ins[k:k + m], ins[k + m:]
    n_ys = len(outs) - k
    if length == 0:
        raise DeployError(f"sampan deploy: scan at {where} has length 0")
    ys = [emit.fresh(tag, "ys", j) for j in range(n_ys)]
    for y in ys:
        lines.append(emit.fill("{ind}{y} = []", ind=ind, y=y))
    i = emit.fresh(tag, "i")
    order = ([emit.lit(length - 1), emit.lit(-1), emit.lit(-1)] if n.attrs.get("reverse")
             else [emit.lit(length)])
    lines.append(emit.fill("{ind}for {i} in {r}:", ind=ind, i=i,
                           r=emit.call(emit.own("range"), order)))
    sl = [emit.fresh(tag, "x", j) for j in range(m)]
    for s, x in zip(sl, xs):
        lines.append(emit.fill("{ind}{s} = {x}[{i}]", ind=inner, s=s, x=x, i=i))
    res = sub(n.blocks[0], carry + sl + caps, inner)
    _set(lines, inner, carry, res[:k])
    for y, r in zip(ys, res[k:]):
        lines.append(emit.fill("{ind}{y}.append({r})", ind=inner, y=y, r=r))
    for y in ys:
        if n.attrs.get("reverse"):
            lines.append(emit.fill("{ind}{y}.reverse()", ind=ind, y=y))
    stacked = [emit.call(emit.dotted("np", "stack"), [y]) for y in ys]
    _set(lines, ind, outs, carry + stacked)


def _key(k, op, where) -> emit.Code:
    try:
        return emit.name(k, "attribute key")
    except emit.EmitError as e:
        raise DeployError(f"sampan deploy: op {op} at {where}: {e}") from None


def _operand(vals, p, n, where) -> emit.Code:
    """Value `p` of a fused body (an index the file gave: checked, never pasted)."""
    if type(p) is not int or not 0 <= p < len(vals):
        raise DeployError(f"sampan deploy: fused node at {where} reads body value "
                          f"{emit.inert(repr(p))}; expected an index in 0..{len(vals) - 1}")
    return vals[p]


# ---------------------------------------------------------------------- writing
TARGETS = ("numpy", "c", "wasm", "web")


def generate(program_dir, outdir, name: str = MODULE, *, target: str = "numpy", **options):
    """Write `outdir/<name>` (numpy only) and `outdir/weights.npz` for a saved program.

    `target="c"` writes a C library instead (`sampan.deploy.cgen.generate_c`: model.h,
    model.c, weights.bin, Makefile; `options`: prefix, max_batch, sizes); "wasm" that C
    compiled to model.wasm + model.mjs (`sampan.deploy.wasm.generate_wasm`), "web" a page
    running it (`sampan.deploy.web.build_web`).

    Example: ``sampan.deploy.generate("m.sampan", "out")``, then without sampan::

        import model; m = model.load(); y = m(x)"""
    if target == "c":
        from .c.gen import generate_c
        return generate_c(program_dir, outdir, **options)
    if target == "wasm":     # `sampan.deploy.wasm`: options simd and the C target's
        from .wasm import generate_wasm
        return generate_wasm(program_dir, outdir, **options)
    if target == "web":      # `sampan.deploy.web`: options sample, onnx, simd, title ...
        from .web import build_web
        return build_web(program_dir, outdir, **options)
    if target != "numpy":
        raise DeployError(f"sampan deploy: target {emit.inert(str(target))!r}; expected one "
                          f"of {', '.join(TARGETS)}")
    if options:
        raise DeployError(f"sampan deploy: options {sorted(options)} are for target='c'")
    from ..jit.program import SavedProgram
    prog = SavedProgram.read(program_dir)
    g, meta, arrays = prog.graph, prog.meta, prog.arrays
    _check_ops(g)
    _check_guards(program_dir, meta)
    try:
        body, npz, used, params, in_specs = _body_lines(g, meta, arrays)
    except emit.EmitError as e:
        raise DeployError(f"sampan deploy: {e}") from None
    kernels, knames = _kernel_source(used)
    n_out = sum(k == "out" for k in meta["outputs"])
    out_kinds = [k == "out" for k in meta["outputs"]]
    out_consts = [np.asarray(a) for a in prog.out_consts]
    for i, a in enumerate(out_consts):
        npz[f"outconst{i}"] = a
    os.makedirs(outdir, exist_ok=True)
    wpath = os.path.join(outdir, WEIGHTS)
    h = hashlib.sha256()

    def write_npz(f):
        import io
        buf = io.BytesIO()
        np.savez(buf, **npz)
        data = buf.getvalue()
        h.update(data)
        f.write(data)
    _atomic.write_file(wpath, write_npz)
    manifest = {k: (a.dtype.name, tuple(a.shape)) for k, a in npz.items()}
    src = _module_source(program_dir, g, params, in_specs, body, kernels, manifest,
                         h.hexdigest(), meta["out_tree"], out_kinds, n_out, len(out_consts),
                         sorted(set(knames) - {"planned_matmul"} | (
                             {"matmul"} if "planned_matmul" in knames else set())))
    mpath = os.path.join(outdir, name)
    _atomic.write_file(mpath, lambda f: f.write(src.encode("utf-8")))
    ops = tuple(sorted(set(knames) - {"planned_matmul"}
                       | ({"matmul"} if "planned_matmul" in knames else set())))
    return Generated(mpath, wpath, len(src.encode("utf-8")), os.path.getsize(wpath),
                     package_bytes(), ops)


# The module's docstring: text, written by `emit.docstring` (the program's folder name
# is anyone's text; escaped there, it reads back as itself and cannot end the string).
_DOC = """Standalone inference module generated by `sampan deploy` from {program}.

It needs numpy alone: the kernels below are those of the {n_ops} ops the program uses.
The weights are read from {weights} (next to this file, or the path given to `load`)
without pickle, after their sha256 is checked against the one recorded here.

    import model
    m = model.load()
    y = m(x)            # numpy arrays in, numpy arrays out
"""

# The module's code: the generator's own text, its {holes} filled by `emit.fill` with
# Code only (names, literals and kernel source the emitter made or checked).
_TEMPLATE = '''\
{doc}
import hashlib
import io
import os

import numpy as np

_inf = float("inf")
_nan = float("nan")
WEIGHTS = {weights}
WEIGHTS_SHA256 = {sha}
# name -> (dtype, shape) of every array in the weights
MANIFEST = {manifest}
# the call's inputs: (name, dtype, shape); a str dim is a symbol bound by the call
INPUTS = {inputs}
OUT_TREE = {out_tree}
OUT_KINDS = {out_kinds}
N_OUTCONST = {n_outconst}


class DeployError(Exception):
    """Damaged weights, or inputs of the wrong shape or dtype."""


# ---------------------------------------------------------------------- kernels
{kernels}

# ---------------------------------------------------------------------- program
def _program(c, _s{sig}):
{unpack}
{body}


{decoder}


def _sizes(arrays):
    """The symbols' sizes in this call, every input checked against INPUTS."""
    if len(arrays) != len(INPUTS):
        raise DeployError(f"expected {{len(INPUTS)}} inputs, got {{len(arrays)}}")
    s, where = {{}}, {{}}
    for i, (a, (_name, dtype, shape)) in enumerate(zip(arrays, INPUTS)):
        ok = a.dtype == np.dtype(dtype) and a.ndim == len(shape)
        for d, (n, want) in enumerate(zip(a.shape, shape) if ok else ()):
            if isinstance(want, str) and want.isidentifier():
                if s.get(want, n) != n:
                    raise DeployError(f"input {{i}}: dim {{d}} is {{n}}, but {{want!r}} is "
                                      f"{{s[want]}} from {{where[want]}}")
                s[want], where[want] = n, f"dim {{d}} of input {{i}}"
            elif not isinstance(want, str) and want != n:
                ok = False
        if not ok:
            raise DeployError(f"input {{i}} is {{a.dtype}}{{list(a.shape)}}; the model expects "
                              f"{{dtype}}{{list(shape)}}")
    return s


class Model:
    """The program with its weights: call it with numpy arrays."""

    def __init__(self, path=None):
        path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), WEIGHTS)
        with open(path, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != WEIGHTS_SHA256:
            raise DeployError(f"{{path}} is damaged or not this model's: its sha256 is not "
                              f"the one recorded in this module")
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {{k: z[k] for k in z.files}}
        if sorted(arrays) != sorted(MANIFEST):
            raise DeployError(f"{{path}} holds {{sorted(arrays)}}; expected {{sorted(MANIFEST)}}")
        for k, (dtype, shape) in MANIFEST.items():
            a = arrays[k]
            if a.dtype != np.dtype(dtype) or a.shape != tuple(shape):
                raise DeployError(f"{{path}}: array {{k}} is {{a.dtype}}{{list(a.shape)}}; "
                                  f"expected {{dtype}}{{list(shape)}}")
        self.arrays = arrays
        self.consts = [arrays[f"outconst{{i}}"] for i in range(N_OUTCONST)]

    def __call__(self, *inputs):
        arrays = [np.asarray(a) for a in inputs]
        outs = _program(self.arrays, _sizes(arrays), *arrays)
        leaves = [o for o, keep in zip(outs, OUT_KINDS) if keep]
        return decode_tree(OUT_TREE, leaves, lambda i: self.consts[i].copy())


def load(path=None):
    """The model with its weights (default: {weights_doc} next to this file)."""
    return Model(path)
'''


def _decoder_source() -> emit.Code:
    """The output-tree decoder of saved programs (`sampan.jit.pytree.decode_tree`, plain
    Python), copied as the kernels are."""
    from ..jit import pytree
    return emit.block(_ks.function_source(pytree.decode_tree, (pytree.__name__,)), "\n\n")


def _module_source(program_dir, g, params, in_specs, body, kernels, manifest, sha, out_tree,
                   out_kinds, n_out, n_outconst, ops):
    program = os.path.basename(os.path.abspath(os.fspath(program_dir)))
    doc = _DOC.format(program=repr(program), n_ops=len(ops), weights=repr(WEIGHTS))
    unpack = [emit.fill("    {k} = c[{key}]", k=emit.name(k), key=emit.lit(k))
              for k in manifest if not k.startswith("outconst")]
    try:
        src = emit.fill(
            _TEMPLATE, doc=emit.docstring(doc), weights=emit.lit(WEIGHTS),
            weights_doc=emit.own(WEIGHTS), sha=emit.lit(sha),
            manifest=_pretty(manifest, "{", "}"), inputs=_pretty(in_specs, "[", "]"),
            out_tree=emit.lit(out_tree, what="the output tree in meta.json"),
            out_kinds=emit.lit(out_kinds), n_outconst=emit.lit(n_outconst),
            kernels=emit.block([k for k in kernels if k.strip()], "\n\n"),
            decoder=_decoder_source(),
            sig=emit.join([emit.own("")] + params) if params else emit.own(""),
            unpack=emit.block(unpack) if unpack else emit.own("    pass"),
            body=emit.block(body))
    except emit.EmitError as e:
        raise DeployError(f"sampan deploy: {e}") from None
    tree = ast.parse(src, "<generated>")   # a generator bug fails here, not at the user's
    if ast.get_docstring(tree, clean=False) != doc:
        raise DeployError("sampan deploy: the generated module's docstring is not the text "
                          "given for it (a generator bug)")
    compile(tree, "<generated>", "exec")
    return src


def _pretty(x, open_, close) -> emit.Code:
    """A dict ({key: value}) or a list of values, one entry a line."""
    if isinstance(x, dict):
        rows = [emit.fill("    {k}: {v},", k=emit.lit(k), v=emit.lit(v)) for k, v in x.items()]
    else:
        rows = [emit.fill("    {v},", v=emit.lit(v)) for v in x]
    return emit.block([emit.own(open_)] + rows + [emit.own(close)])
