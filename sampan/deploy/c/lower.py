"""The C target's view of a saved program: its Graph lowered to a list of steps over
buffers whose dims are polynomials in the one run-time batch symbol, and the memory plan
that gives every intermediate buffer a fixed offset in one arena (sized for the maximum
batch given at generation, so `run` allocates nothing).

Every other symbol of the program must be fixed at generation (`sizes={"seq": 128}`);
a dim is found as `k*B + c` by concretising the program at three batch sizes (and a dim
that is not of that form is a `DeployError`). Fused nodes whose bodies are elementwise
stay one step (one loop); a body holding a reduction runs as one step per body op.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...ir import symbolic as _sym
from ...ops.registry import OPS, Spec
from ...runtime import emit
from ..kernelsource import DeployError

ALIGN = 64


class Poly:
    """An integer polynomial in the batch symbol B: {power: coefficient}."""
    __slots__ = ("t",)

    def __init__(self, t=None):
        self.t = {p: c for p, c in (t or {}).items() if c}

    @classmethod
    def dim(cls, k, c):
        return cls({1: k, 0: c})

    @classmethod
    def const(cls, c):
        return cls({0: c})

    def __mul__(self, o):
        out = {}
        for p, c in self.t.items():
            for q, d in o.t.items():
                out[p + q] = out.get(p + q, 0) + c * d
        return Poly(out)

    def __add__(self, o):
        return Poly({p: self.t.get(p, 0) + o.t.get(p, 0) for p in set(self.t) | set(o.t)})

    def __eq__(self, o):
        return isinstance(o, Poly) and self.t == o.t

    def __hash__(self):
        return hash(tuple(sorted(self.t.items())))

    def at(self, b):
        return sum(c * b ** p for p, c in self.t.items())

    @property
    def is_const(self):
        return all(p == 0 for p in self.t)

    @property
    def value(self):
        return self.t.get(0, 0)

    def code(self) -> emit.Code:
        """C source over the run-time batch `B` (an `idx`)."""
        from .emit_c import num
        if not self.t:
            return emit.own("0")
        terms = []
        for p in sorted(self.t, reverse=True):
            c = self.t[p]
            fs = ([] if c == 1 and p else [num(c)]) + [emit.own("B")] * p
            terms.append(emit.own(" * ".join(fs)))
        s = " + ".join(terms)
        return emit.own(s if len(terms) == 1 and "+" not in s else f"({s})")


def prod(polys) -> Poly:
    out = Poly.const(1)
    for p in polys:
        out = out * p
    return out


@dataclass(eq=False)
class Buf:
    """One tensor of the C program."""
    n: int                   # its number in the C file (v<n>)
    dtype: np.dtype
    dims: list               # Poly per dim
    kind: str                # "input" | "const" | "arena" | "alias"
    index: int = -1          # input position / const number
    const: object = None     # the array of a const
    root: "Buf" = None       # an alias's storage
    offset: int = 0          # bytes into the arena / the weights payload
    packed: object = None    # weights packed for the GEMM micro-kernel (const)
    packed_offset: int = 0

    @property
    def storage(self):
        return self.root.storage if self.kind == "alias" else self

    @property
    def numel(self) -> Poly:
        return prod(self.dims)

    def bytes_at(self, b) -> int:
        return self.numel.at(b) * self.dtype.itemsize

    @property
    def name(self) -> emit.Code:
        return emit.fresh("v", self.n)


@dataclass(eq=False)
class Step:
    op: str
    ins: list
    outs: list
    attrs: dict
    loc: str
    body: tuple = ()          # an elementwise fused body: ((op, operand ids, attrs), ...)
    body_specs: list = field(default_factory=list)   # dtype of each body value
    scratch: list = field(default_factory=list)      # arena buffers this step alone uses


# ---------------------------------------------------------------------- lowering
def batch_symbol(g, sizes):
    """(the run-time batch symbol or None, the fixed sizes)."""
    syms = _sym.symbols_of(g)
    fixed = dict(sizes or {})
    for k, v in fixed.items():
        if k not in syms:
            raise DeployError(f"sampan deploy: sizes names {emit.inert(k)!r}, which is no "
                              f"symbol of the program (its symbols: {sorted(syms)})")
        if type(v) is not int or v < 1:
            raise DeployError(f"sampan deploy: size {emit.inert(k)}={v!r}; expected an int >= 1")
    left = sorted(syms - set(fixed))
    if len(left) > 1:
        raise DeployError(f"sampan deploy: the program has symbolic dims {left}; the C "
                          f"target keeps one (the batch) as a run-time argument: fix the "
                          f"others at generation, e.g. sizes={{{left[1]!r}: 128}}")
    return (left[0] if left else None), fixed


def _dims(shapes, maxb, where):
    s1, s2, sm = shapes
    out = []
    for a, b, m in zip(s1, s2, sm):
        k = b - a
        c = a - k
        if k * maxb + c != m:
            raise DeployError(f"sampan deploy: a dim of {where} is not linear in the batch "
                              f"({a}, {b}, {m} at batch 1, 2, {maxb})")
        out.append(Poly.dim(k, c))
    return out


def _elementwise_body(n) -> bool:
    return all(OPS[e[0]].kind == "elementwise" and OPS[e[0]].scalar for e in n.attrs["body"])


def lower(g, meta, arrays, bsym, fixed, max_batch):
    """(steps, input bufs, const bufs, output bufs, all bufs) of Graph `g`."""
    if bsym is None:
        gs = [_sym.concrete(g, fixed) if fixed else g] * 3
        bs = (1, 2, max_batch)
    else:
        bs = (1, 2, max_batch)
        gs = [_sym.concrete(g, {bsym: b, **fixed}) for b in bs]
    vals = [list(c.values()) for c in gs]
    pos = {v.id: k for k, v in enumerate(vals[0])}
    bufs, by_id = [], {}

    def new(dtype, dims, kind, **kw):
        b = Buf(len(bufs), np.dtype(dtype), dims, kind, **kw)
        bufs.append(b)
        return b

    def buf_of(v, kind, **kw):
        k = pos[v.id]
        dims = _dims([tuple(vs[k].shape) for vs in vals], max_batch, f"value %{k}")
        b = new(v.dtype, dims, kind, **kw)
        by_id[v.id] = b
        return b

    read = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
    inputs, consts = [], []
    for k, (spec, v) in enumerate(zip(meta["inputs"], g.inputs)):
        if spec["kind"] == "arg":
            inputs.append(buf_of(v, "input", index=len(inputs)))
        elif v.id in read:
            if spec["kind"] == "rng":
                raise DeployError("sampan deploy: the program reads random state (dropout "
                                  "in training mode?); save the model in eval mode")
            b = buf_of(v, "const", const=np.asarray(arrays[spec["key"]]))
            consts.append(b)
    for v in g.consts:
        if v.id in read:
            consts.append(buf_of(v, "const", const=np.asarray(v.const)))
    steps = []
    nodes = [c.nodes for c in gs]
    for i, n in enumerate(g.nodes):
        where = n.loc or "?"
        if n.attrs.get("body") is not None and n.op != "fused" or any(
                hasattr(x, "nodes") for x in n.attrs.values()):
            raise DeployError(f"sampan deploy: {n.op} at {emit.inert(where)} holds a nested "
                              "graph (control flow), which the C target does not lower")
        ins = [by_id[v.id] for v in n.inputs]
        if n.op == "reshape" and ins[0].dtype == n.outputs[0].dtype:
            buf_of(n.outputs[0], "alias", root=ins[0])
            continue
        outs = [buf_of(v, "arena") for v in n.outputs]
        op = OPS[n.op]
        if n.op == "fused" and _elementwise_body(n):
            steps.append(Step("fused", ins, outs, {"outputs": tuple(n.attrs["outputs"])},
                              where, body=tuple(n.attrs["body"]),
                              body_specs=_body_dtypes(n.attrs["body"], ins)))
        elif op.kind == "elementwise" and op.scalar and len(outs) == 1:
            body = ((n.op, tuple(range(len(ins))), tuple(n.attrs.items())),)
            steps.append(Step("fused", ins, outs, {}, where, body=body,
                              body_specs=[b.dtype for b in ins] + [outs[0].dtype]))
        elif n.op == "fused":
            steps += _split_body(n, [nd[i] for nd in nodes], ins, outs, new, max_batch, where)
        else:
            steps.append(Step(n.op, ins, outs, dict(gs[-1].nodes[i].attrs), where))
    outputs = [by_id[v.id] for v in g.outputs]
    return steps, inputs, consts, outputs, bufs


def _body_dtypes(body, ins):
    """dtype of every value of an elementwise fused body (inputs first)."""
    dts = [b.dtype for b in ins]
    for e in body:
        specs = [Spec((1,) * 1, dts[p]) for p in e[1]]
        attrs = dict(e[2]) if len(e) > 2 else {}
        dts.append(np.dtype(OPS[e[0]].shape_rule(*specs, **attrs).dtype))
    return dts


def _split_body(n, ncs, ins, outs, new, max_batch, where):
    """A fused node whose body holds a non-elementwise op: one step per body op, the
    intermediate values in arena buffers of their own."""
    body = n.attrs["body"]
    specs = [[Spec(tuple(v.shape), v.dtype) for v in nc.inputs] for nc in ncs]
    for k, e in enumerate(body):
        attrs = dict(e[2]) if len(e) > 2 else {}
        for s in specs:
            s.append(OPS[e[0]].shape_rule(*[s[p] for p in e[1]], **attrs))
    vals = list(ins)
    out_at = {p: o for p, o in zip(n.attrs["outputs"], outs)}
    steps = []
    for k, e in enumerate(body):
        p = len(ins) + k
        attrs = dict(e[2]) if len(e) > 2 else {}
        if p in out_at and out_at[p] not in vals:
            b = out_at[p]
        else:
            dims = _dims([tuple(s[p].shape) for s in specs], max_batch, f"fused body value {k}")
            b = new(specs[0][p].dtype, dims, "arena")
        vals.append(b)
        op = OPS[e[0]]
        if op.kind == "elementwise" and op.scalar:
            steps.append(Step("fused", [vals[q] for q in e[1]], [b], {}, where,
                              body=((e[0], tuple(range(len(e[1]))), tuple(attrs.items())),),
                              body_specs=[vals[q].dtype for q in e[1]] + [b.dtype]))
        else:
            steps.append(Step(e[0], [vals[q] for q in e[1]], [b], attrs, where))
    for p, o in out_at.items():
        if vals[p] is not o:     # an output that is an input or another output of the body
            steps.append(Step("fused", [vals[p]], [o], {}, where, body=(("copy", (0,)),),
                              body_specs=[vals[p].dtype, o.dtype]))
    return steps


# ---------------------------------------------------------------------- memory plan
def plan(steps, outputs, max_batch):
    """Give every arena buffer an offset (first fit over live intervals, 64-byte
    aligned); returns the arena's size in bytes at the maximum batch."""
    first, last = {}, {}
    for i, s in enumerate(steps):
        for b in s.outs + s.scratch:
            first.setdefault(b.storage.n, i)
            last[b.storage.n] = max(last.get(b.storage.n, i), i)
        for b in s.ins + s.scratch:
            last[b.storage.n] = max(last.get(b.storage.n, i), i)
    end = len(steps)
    for b in outputs:
        last[b.storage.n] = end
    arena = {b.storage.n: b.storage for s in steps for b in s.outs + s.scratch
             if b.storage.kind == "arena"}
    live, top = [], 0
    for n in sorted(arena, key=lambda n: (first[n], n)):
        b = arena[n]
        size = -(-max(b.bytes_at(max_batch), 1) // ALIGN) * ALIGN
        live = [x for x in live if last[x[2]] >= first[n]]
        off = 0
        for lo, hi, _ in sorted(live):
            if off + size <= lo:
                break
            off = max(off, hi)
        b.offset = off
        live.append((off, off + size, n))
        top = max(top, off + size)
    return top
