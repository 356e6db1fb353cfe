"""A seeded random-program fuzzer for in-place ops through views.

A program is a short list of instructions over a pool of float64 tensors: views (int,
slice and tensor indexing, .T, permute, transpose, reshape, unsqueeze/squeeze, narrow,
expand, flip, detach), in-place ops (add_ ... pow_, copy_, fill_, zero_, the augmented
operators, __setitem__) and ordinary ops (add, mul, tanh, sum, matmul, cat ...). The
same program runs on PyTorch (the oracle), on sampan eager, and on sampan under
`sampan.jit` (gradients taken inside the jitted function, or from outside it), and the
forward values of every tensor, the gradients of the inputs and which runs raised are
compared.

Run many programs from the command line (bounded by --n and --seconds)::

    python -m tests.autograd.fuzz_inplace --n 2000 --seed 0

The pytest in test_fuzz_inplace.py runs a fixed, small set of seeds.
"""
from __future__ import annotations

import random
import time

import numpy as np
import torch

import sampan
from sampan.errors import SampanError

SHAPES = {"x": (3, 4), "u": (4,), "z": (2, 3, 2)}
UNARY = ["tanh", "exp", "sigmoid", "relu", "neg", "abs"]
INPLACE_UNARY = ["tanh_", "exp_", "sigmoid_", "relu_", "neg_", "zero_"]
SKIP_VIEWS = set()       # view kinds left out (to find other mismatches first)
INPLACE_BIN = ["add_", "sub_", "mul_", "div_", "+=", "-=", "*=", "/="]


# ---------------------------------------------------------------------- generator
class _Var:
    __slots__ = ("shape", "group", "leafview", "expanded")

    def __init__(self, shape, group, leafview=False, expanded=0):
        self.shape, self.group = tuple(shape), group
        self.leafview = leafview    # a leaf requiring grad, or a view of one
        self.expanded = expanded    # 1: an expand (read-only in sampan, overlapping in
        #                             torch), 2: a view of one


class _Gen:
    def __init__(self, seed, n_ops):
        self.r = random.Random(seed)
        self.vars = []
        self.prog = []
        self.frozen = set()        # storage groups a flip aliases (torch copies, sampan views)
        self.ngroups = 0
        for name in SHAPES:
            self.vars.append(_Var(SHAPES[name], self._group(), leafview=True))
        self.n_ops = n_ops

    def _group(self):
        self.ngroups += 1
        return self.ngroups

    def _new(self, shape, group=None, **kw):
        self.vars.append(_Var(shape, self._group() if group is None else group, **kw))
        return len(self.vars) - 1

    def pick(self, pred=lambda v: True, prefer_nonleaf=True):
        cand = [i for i, v in enumerate(self.vars) if pred(v)]
        if not cand:
            return None
        if prefer_nonleaf:
            nl = [i for i in cand if not self.vars[i].leafview]
            if nl and self.r.random() < 0.93:
                cand = nl
        # recent tensors more often
        w = [1.0 + k for k in range(len(cand))]
        return self.r.choices(cand, w)[0]

    def emit(self, *ins):
        self.prog.append(ins)

    def run(self):
        r = self.r
        # start from a few tensors with a history
        for _ in range(r.randint(1, 2)):
            i = self.pick(prefer_nonleaf=False)
            self.emit("scal", self._new(self.vars[i].shape), i, r.choice(["*", "+"]),
                      r.choice([1.0, 2.0, 0.5, -1.5]))
        for _ in range(self.n_ops):
            k = r.random()
            if k < 0.32:
                self.view()
            elif k < 0.62:
                self.inplace()
            elif k < 0.72:
                self.binary()
            elif k < 0.80:
                self.unary()
            else:
                self.other()
        return self.prog

    # -- views
    def view(self):
        r = self.r
        i = self.pick(lambda v: True)
        v = self.vars[i]
        shape, nd = v.shape, len(v.shape)
        kind = r.choice(["int", "slice", "T", "permute", "transpose", "reshape", "unsqueeze",
                         "squeeze", "narrow", "flip", "expand", "detach", "mixed", "tensor_idx",
                         "split"])
        if kind in SKIP_VIEWS:
            return
        g, lv = v.group, v.leafview
        new = self._new
        if v.expanded:
            # views of an expand: torch writes through those without internal overlap;
            # sampan refuses writes through any expand (documented): no in-place on them
            def new(shape, group=None, **kw):
                kw.setdefault("expanded", 2 if kind != "detach" else v.expanded)
                return self._new(shape, group, **kw)
        if kind in ("int", "slice", "mixed", "narrow", "tensor_idx", "split") and nd == 0:
            kind = "unsqueeze"
        if kind == "int":
            d = r.randrange(nd)
            idx = (slice(None),) * d + (r.randrange(-shape[d], shape[d]),)
            self.emit("index", new(_shape_of(shape, idx), g, leafview=lv), i, idx)
        elif kind == "slice":
            d = r.randrange(nd)
            n = shape[d]
            a = r.randrange(0, max(n, 1))
            b = r.randrange(a + 1, n + 1) if n > a else a
            step = r.choice([1, 1, 2])
            idx = (slice(None),) * d + (slice(a, b, step),)
            self.emit("index", new(_shape_of(shape, idx), g, leafview=lv), i, idx)
        elif kind == "mixed":
            idx = []
            for n in shape:
                c = r.random()
                if c < 0.3:
                    idx.append(r.randrange(n) if n else slice(None))
                elif c < 0.6 and n > 1:
                    idx.append(slice(r.randrange(n), None))
                elif c < 0.7:
                    idx.append(None)
                    idx.append(slice(None))
                else:
                    idx.append(slice(None))
            if r.random() < 0.3:
                idx = [Ellipsis] + idx[len(idx) // 2:]
                if sum(1 for e in idx if e is not None and e is not Ellipsis) > nd:
                    idx = [Ellipsis]
            idx = tuple(idx)
            self.emit("index", new(_shape_of(shape, idx), g, leafview=lv), i, idx)
        elif kind == "tensor_idx":
            d = r.randrange(nd)
            n = shape[d]
            if n == 0:
                return
            ids = [r.randrange(n) for _ in range(r.randint(1, 3))]
            s = list(shape)
            s[d] = len(ids)
            self.emit("tindex", self._new(s), i, d, tuple(ids))
        elif kind == "T":
            self.emit("T", new(shape[::-1], g, leafview=lv), i)
        elif kind == "permute":
            if nd == 0:
                return
            p = list(range(nd))
            r.shuffle(p)
            self.emit("permute", new([shape[q] for q in p], g, leafview=lv), i, tuple(p))
        elif kind == "transpose":
            if nd < 2:
                return
            a, b = r.sample(range(nd), 2)
            s = list(shape)
            s[a], s[b] = s[b], s[a]
            self.emit("transpose", new(s, g, leafview=lv), i, a, b)
        elif kind == "reshape":
            n = int(np.prod(shape))
            opts = [(n,), (1, n), (n, 1)] + [(a, n // a) for a in range(2, n) if n % a == 0]
            opts += [(2, -1)] if n % 2 == 0 else []
            s = r.choice(opts)
            out = np.empty(shape).reshape(s).shape
            # whether torch's reshape views is decided at run time; track the group as a
            # view (a copy that the generator thinks aliases only makes programs stricter)
            self.emit("reshape", new(out, g, leafview=lv), i, s)
        elif kind == "unsqueeze":
            d = r.randrange(-nd - 1, nd + 1)
            self.emit("unsqueeze", new(np.expand_dims(np.empty(shape), d).shape, g,
                                             leafview=lv), i, d)
        elif kind == "squeeze":
            ones = [d for d in range(nd) if shape[d] == 1]
            if not ones:
                return
            d = r.choice(ones)
            self.emit("squeeze", new(shape[:d] + shape[d + 1:], g, leafview=lv), i, d)
        elif kind == "narrow":
            d = r.randrange(nd)
            n = shape[d]
            if n == 0:
                return
            a = r.randrange(n)
            ln = r.randint(1, n - a)
            s = list(shape)
            s[d] = ln
            self.emit("narrow", new(s, g, leafview=lv), i, d, a, ln)
        elif kind == "split":
            d = r.randrange(nd)
            n = shape[d]
            if n < 2:
                return
            k = r.randint(1, n - 1)
            s = list(shape)
            s[d] = k
            self.emit("split", new(s, g, leafview=lv), i, d, k)
        elif kind == "flip":
            if nd == 0:
                return
            dims = tuple(sorted(r.sample(range(nd), r.randint(1, nd))))
            self.frozen.add(g)
            self.emit("flip", new(shape, g, leafview=lv), i, dims)
        elif kind == "expand":
            s = (2,) + shape
            self.emit("expand", new(s, g, leafview=lv, expanded=1), i, s)
        elif kind == "detach":
            self.emit("detach", new(shape, g), i)

    # -- in-place
    def inplace(self):
        r = self.r
        i = self.pick(lambda v: v.group not in self.frozen and v.expanded != 2)
        if i is None:
            return
        v = self.vars[i]
        c = r.random()
        if c < 0.3:
            op = r.choice(INPLACE_UNARY + ["fill_", "clamp_", "pow_"])
            if v.expanded and op in ("fill_", "zero_"):
                return            # torch fills an expand (one value); sampan refuses
            arg = {"fill_": r.choice([0.0, 2.5]), "clamp_": (-0.5, 0.7), "pow_": 2.0}.get(op)
            self.emit("iun", i, op, arg)
        elif c < 0.75:
            op = r.choice(INPLACE_BIN + ["copy_"])
            if r.random() < 0.3 and op != "copy_":
                self.emit("ibin_c", i, op, r.choice([2.0, 0.5, -1.0, 3.0]))
                return
            j = self._arg_for(v.shape)
            if j is None:
                return
            self.emit("ibin", i, op, j, self.vars[j].group == v.group)
        elif not v.expanded:      # torch writes e[0] = .. of an expand e (no overlap)
            self.setitem(i)

    def _arg_for(self, shape):
        """A tensor whose shape broadcasts to `shape` (rarely one that does not)."""
        r = self.r
        ok = lambda v: _bcast_to(v.shape, shape)   # noqa: E731
        if r.random() < 0.04:
            ok = lambda v: True   # noqa: E731
        return self.pick(ok, prefer_nonleaf=r.random() < 0.5)

    def setitem(self, i):
        r = self.r
        v = self.vars[i]
        shape, nd = v.shape, len(v.shape)
        if nd == 0:
            idx = (Ellipsis,)
        elif r.random() < 0.2:
            d = r.randrange(nd)
            if shape[d] == 0:
                return
            ids = tuple(r.randrange(shape[d]) for _ in range(r.randint(1, 2)))
            self.emit("tsetitem", i, d, ids, r.choice([0.0, 1.5]))
            return
        else:
            d = r.randrange(nd)
            if r.random() < 0.5:
                idx = (slice(None),) * d + (r.randrange(shape[d]),) if shape[d] else (Ellipsis,)
            else:
                n = shape[d]
                a = r.randrange(max(n, 1))
                idx = (slice(None),) * d + (slice(a, None),)
        sub = _shape_of(shape, idx)
        if r.random() < 0.3:
            self.emit("setitem_c", i, idx, r.choice([0.0, -2.0, 4.0]))
            return
        j = self._arg_for(sub)
        if j is None:
            return
        self.emit("setitem", i, idx, j, self.vars[j].group == v.group)

    # -- ordinary ops
    def binary(self):
        r = self.r
        i = self.pick()
        v = self.vars[i]
        j = self.pick(lambda w: _bcastable(w.shape, v.shape), prefer_nonleaf=False)
        op = r.choice(["+", "-", "*", "div", "max"])
        s = np.broadcast_shapes(v.shape, self.vars[j].shape)
        self.emit("bin", self._new(s), i, j, op)

    def unary(self):
        r = self.r
        i = self.pick()
        c = r.random()
        if c < 0.7:
            self.emit("un", self._new(self.vars[i].shape), i, r.choice(UNARY))
        else:
            op = r.choice(["*", "+", "/", "**"])
            # integer powers only: a negative base to -1.5 is NaN, and NaN hides everything
            c = r.choice([2.0, 3.0] if op == "**" else [2.0, 0.5, -1.5, 3.0])
            self.emit("scal", self._new(self.vars[i].shape), i, op, c)

    def other(self):
        r = self.r
        i = self.pick()
        v = self.vars[i]
        c = r.random()
        nd = len(v.shape)
        if c < 0.3 and nd > 0:
            d = r.randrange(nd)
            kd = r.random() < 0.3
            s = list(v.shape)
            if kd:
                s[d] = 1
            else:
                del s[d]
            self.emit("sum", self._new(s), i, d, kd, r.choice(["sum", "mean"]))
        elif c < 0.4:
            self.emit("sumall", self._new(()), i)
        elif c < 0.6 and nd == 2:
            j = self.pick(lambda w: len(w.shape) == 2 and w.shape[0] == v.shape[1])
            if j is not None:
                self.emit("matmul", self._new((v.shape[0], self.vars[j].shape[1])), i, j)
        elif c < 0.8 and nd > 0:
            d = r.randrange(nd)
            j = self.pick(lambda w: len(w.shape) == nd and all(
                a == b for k, (a, b) in enumerate(zip(w.shape, v.shape)) if k != d))
            s = list(v.shape)
            s[d] += self.vars[j].shape[d]
            self.emit("cat", self._new(s), i, j, d)
        else:
            self.emit("clone", self._new(v.shape), i)


def _shape_of(shape, idx):
    return np.empty(shape)[idx].shape if idx != (Ellipsis,) else tuple(shape)


def _bcast_to(src, dst):
    try:
        return np.broadcast_shapes(src, dst) == tuple(dst)
    except ValueError:
        return False


def _bcastable(a, b):
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def generate(seed, n_ops=None):
    r = random.Random(seed * 7919 + 1)
    return _Gen(seed, n_ops if n_ops is not None else r.randint(3, 9)).run()


# ---------------------------------------------------------------------- interpreter
class _Lib:
    def __init__(self, lib, clone_alias=None):
        self.lib = lib
        self.torch = lib is torch
        # torch refuses (or breaks saved values with) an in-place op whose argument
        # overlaps the target; sampan computes out of place first, as with a clone
        self.clone_alias = self.torch if clone_alias is None else clone_alias

    def tensor(self, a, dtype=None):
        if self.torch:
            return torch.tensor(a, dtype=dtype)
        return sampan.tensor(a) if dtype is None else sampan.tensor(np.asarray(a, dtype))

    def cat(self, xs, d):
        return self.lib.cat(xs, d)

    def maximum(self, a, b):
        return self.lib.maximum(a, b)


def _scal(a, op, c):
    return {"*": lambda: a * c, "+": lambda: a + c, "-": lambda: a - c,
            "/": lambda: a / c,
            "**": lambda: a ** c}[op]()


def execute(prog, L, inputs, env=None):
    """Run `prog` on library adapter `L` with the input tensors; returns the pool."""
    return list(execute_env(prog, L, inputs, env).values())


def execute_env(prog, L, inputs, env=None):
    """execute(), continuing from `env` if given; returns the pool by output number."""
    env = dict(env or {})
    env.update(enumerate(inputs))   # keyed by the creating instruction's output number
    for ins in prog:
        k = ins[0]
        if k == "scal":
            _, o, i, op, c = ins
            env[ins[1]] = (_scal(env[i], op, c))
        elif k == "un":
            _, o, i, fn = ins
            env[ins[1]] = (getattr(env[i], fn)())
        elif k == "bin":
            _, o, i, j, op = ins
            a, b = env[i], env[j]
            if op == "div":
                env[ins[1]] = (a / (b.sigmoid() + 0.5))
            elif op == "max":
                env[ins[1]] = (L.maximum(a, b))
            else:
                env[ins[1]] = (_scal(a, op, b))
        elif k == "index":
            env[ins[1]] = (env[ins[2]][ins[3]])
        elif k == "tindex":
            _, o, i, d, ids = ins
            env[ins[1]] = (env[i][(slice(None),) * d + (L.tensor(list(ids)),)])
        elif k == "T":
            env[ins[1]] = (env[ins[2]].T)
        elif k == "permute":
            env[ins[1]] = (env[ins[2]].permute(*ins[3]))
        elif k == "transpose":
            env[ins[1]] = (env[ins[2]].transpose(ins[3], ins[4]))
        elif k == "reshape":
            env[ins[1]] = (env[ins[2]].reshape(*ins[3]))
        elif k == "unsqueeze":
            env[ins[1]] = (env[ins[2]].unsqueeze(ins[3]))
        elif k == "squeeze":
            env[ins[1]] = (env[ins[2]].squeeze(ins[3]))
        elif k == "narrow":
            env[ins[1]] = (env[ins[2]].narrow(ins[3], ins[4], ins[5]))
        elif k == "split":
            # torch refuses in-place ops on outputs of split (a multi-view function); its
            # first part is narrow's view, which torch records like sampan's split
            t = env[ins[2]]
            env[ins[1]] = (t.narrow(ins[3], 0, ins[4]) if L.torch else t.split(ins[4], ins[3])[0])
        elif k == "flip":
            env[ins[1]] = (env[ins[2]].flip(ins[3]))
        elif k == "expand":
            env[ins[1]] = (env[ins[2]].expand(*ins[3]))
        elif k == "detach":
            env[ins[1]] = (env[ins[2]].detach())
        elif k == "iun":
            _, i, op, arg = ins
            t = env[i]
            if arg is None:
                getattr(t, op)()
            elif isinstance(arg, tuple):
                getattr(t, op)(*arg)
            else:
                getattr(t, op)(arg)
        elif k in ("ibin", "ibin_c"):
            _, i, op, j = ins[:4]
            if k == "ibin":
                a = env[j]
                if ins[4] and L.clone_alias:
                    a = a.clone()       # sampan computes out of place, then writes
                if op == "div_" or op == "/=":
                    a = a.sigmoid() + 0.5
            else:
                a = j
            t = env[i]
            if op in ("+=", "-=", "*=", "/="):
                t2 = _iop(t, op, a)
                if t2 is not t:
                    raise AssertionError("augmented op returned a new tensor")
            else:
                getattr(t, op)(a)
        elif k == "setitem":
            _, i, idx, j, alias = ins
            a = env[j]
            if alias and L.clone_alias:
                a = a.clone()
            env[i][idx] = a
        elif k == "setitem_c":
            _, i, idx, c = ins
            env[i][idx] = c
        elif k == "tsetitem":
            _, i, d, ids, c = ins
            env[i][(slice(None),) * d + (L.tensor(list(ids)),)] = c
        elif k == "sum":
            _, o, i, d, kd, fn = ins
            env[ins[1]] = (getattr(env[i], fn)(d, keepdims=kd) if not L.torch else
                       getattr(env[i], fn)(d, keepdim=kd))
        elif k == "sumall":
            env[ins[1]] = (env[ins[2]].sum())
        elif k == "matmul":
            env[ins[1]] = (env[ins[2]] @ env[ins[3]])
        elif k == "cat":
            _, o, i, j, d = ins
            env[ins[1]] = (L.cat([env[i], env[j]], d))
        elif k == "clone":
            env[ins[1]] = (env[ins[2]].clone())
        else:
            raise AssertionError(k)
    return env


def _iop(t, op, a):
    if op == "+=":
        t += a
    elif op == "-=":
        t -= a
    elif op == "*=":
        t *= a
    else:
        t /= a
    return t


def _weights(prog_seed, shapes):
    r = np.random.default_rng(prog_seed)
    return [r.standard_normal(s) for s in shapes]


def _loss(env, ws, L):
    tot = None
    for t, w in zip(env, ws):
        if not t.requires_grad:
            continue
        term = (t * L.tensor(w)).sum()
        tot = term if tot is None else tot + term
    return tot


def input_arrays(seed, shift=0.0):
    r = np.random.default_rng(seed + 100003)
    return [r.uniform(-1.5, 1.5, SHAPES[n]) + shift for n in SHAPES]


# ---------------------------------------------------------------------- runners
class Outcome:
    """What one run gave: the pool's values and the input gradients, or the error and
    the stage it was raised at ("forward" or "backward")."""

    def __init__(self, values=None, grads=None, error=None, stage=None):
        self.values, self.grads, self.error, self.stage = values, grads, error, stage

    def __repr__(self):
        if self.error is not None:
            return f"<{self.stage} error {type(self.error).__name__}: {self.error}>"
        return "<ok>"


def _np(t):
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return t.detach().numpy().copy()
    return np.array(t.detach().numpy(), copy=True)


def run_torch(prog, arrays, seed, clone_alias=True):
    L = _Lib(torch, clone_alias)
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    try:
        env = execute(prog, L, xs)
    except RuntimeError as e:
        return Outcome(error=e, stage="forward")
    ws = _weights(seed, [tuple(t.shape) for t in env])
    try:
        loss = _loss(env, ws, L)
        gs = torch.autograd.grad(loss, xs, allow_unused=True)
    except RuntimeError as e:
        return Outcome(error=e, stage="backward")
    return Outcome([_np(t) for t in env], [_np(g) for g in gs])


def _sampan_body(prog, seed, xs):
    L = _Lib(sampan)
    env = execute(prog, L, xs)
    ws = _weights(seed, [tuple(t.shape) for t in env])
    return env, _loss(env, ws, L)


def run_sampan(prog, arrays, seed, mode="eager"):
    """mode: "eager"; "jit_in" (sampan.grad inside the jitted function); "jit_out"
    (the jitted function returns the pool and the loss, differentiated outside)."""
    xs = [sampan.tensor(a, requires_grad=True) for a in arrays]
    stage = "forward"
    try:
        if mode == "eager":
            env, loss = _sampan_body(prog, seed, xs)
            stage = "backward"
            gs = sampan.grad(loss, xs, allow_unused=True)
        elif mode == "jit_in":
            def f(*xs):
                env, loss = _sampan_body(prog, seed, xs)
                return env, sampan.grad(loss, list(xs), allow_unused=True)
            env, gs = sampan.jit(f, pipeline=JIT_PIPELINE)(*xs)
        elif mode == "jit_out":
            def f(*xs):
                return _sampan_body(prog, seed, xs)
            env, loss = sampan.jit(f, pipeline=JIT_PIPELINE)(*xs)
            stage = "backward"
            gs = sampan.grad(loss, xs, allow_unused=True)
        else:
            # the first half eager, the rest jitted: tensors and views made before the
            # trace, written by it; differentiated from outside (through the eager part)
            k = len(prog) // 2
            L = _Lib(sampan)
            env0 = execute_env(prog[:k], L, xs)

            def f(*xs):
                env = list(execute_env(prog[k:], L, xs, env0).values())
                ws = _weights(seed, [tuple(t.shape) for t in env])
                return env, _loss(env, ws, L)
            env, loss = sampan.jit(f, pipeline=JIT_PIPELINE)(*xs)
            stage = "backward"
            gs = sampan.grad(loss, xs, allow_unused=True)
    except SampanError as e:
        return Outcome(error=e, stage=stage)
    except Exception as e:  # not a sampan error: always a finding
        return Outcome(error=e, stage="crash")
    return Outcome([_np(t) for t in env], [_np(g) for g in gs])


JIT_PIPELINE = "none"


def _close(a, b):
    if a is None or b is None:
        return (a is None or not np.any(a)) and (b is None or not np.any(b))
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-9, atol=1e-10, equal_nan=True)


def compare(ref, got):
    """None when `got` agrees with torch's `ref`, else a description."""
    if got.stage == "crash":
        return f"non-sampan error {type(got.error).__name__}: {got.error}"
    if ref.error is not None and got.error is not None:
        return None
    if ref.error is not None:
        if ref.stage == "backward":
            return "permissive"       # sampan may save less than torch: checked by FD
        return f"torch raised ({ref.error}) but sampan did not"
    if got.error is not None:
        return f"sampan raised at {got.stage}: {got.error}"
    for k, (a, b) in enumerate(zip(ref.values, got.values)):
        if not _close(a, b):
            return f"forward value of %{k} differs:\n torch {a}\n sampan {b}"
    for k, (a, b) in enumerate(zip(ref.grads, got.grads)):
        if not _close(a, b):
            return f"gradient of input {k} differs:\n torch {a}\n sampan {b}"
    return None


def fd_grads(prog, arrays, seed, eps=1e-6):
    """Float64 central differences of the program's loss (run on torch, no grad)."""
    def loss_of(arrs):
        with torch.no_grad():
            env = execute(prog, _Lib(torch), [torch.tensor(a) for a in arrs])
            ws = _weights(seed, [tuple(t.shape) for t in env])
            # the same terms as the differentiated loss: tensors that require grad there
            return env, ws
    ref = _loss_mask(prog, arrays, seed)
    out = []
    for n in range(len(arrays)):
        g = np.zeros_like(arrays[n])
        for idx in np.ndindex(arrays[n].shape):
            vals = []
            for s in (1, -1):
                arrs = [a.copy() for a in arrays]
                arrs[n][idx] += s * eps
                env, ws = loss_of(arrs)
                vals.append(sum(float((t.numpy() * w).sum()) for t, w, m in
                                zip(env, ws, ref) if m))
            g[idx] = (vals[0] - vals[1]) / (2 * eps)
        out.append(g)
    return out


def _loss_mask(prog, arrays, seed):
    """Which pool entries require grad (the terms of the loss), by a sampan eager run."""
    xs = [sampan.tensor(a, requires_grad=True) for a in arrays]
    env = execute(prog, _Lib(sampan), xs)
    return [t.requires_grad for t in env]


MODES = ("eager", "jit_in", "jit_out", "jit_split")


def check(seed, modes=MODES, fd=True):
    """Run program `seed` everywhere; returns a list of (mode, problem)."""
    prog = generate(seed)
    arrays = input_arrays(seed)
    ref = run_torch(prog, arrays, seed)
    problems = []
    for mode in modes:
        got = run_sampan(prog, arrays, seed, mode)
        p = compare(ref, got)
        if p == "permissive":
            if got.error is None and fd and all(
                    v is None or np.all(np.isfinite(v)) for v in got.values):
                want = fd_grads(prog, arrays, seed)
                for k, (a, b) in enumerate(zip(want, got.grads)):
                    if not _close_fd(a, b):
                        problems.append((mode, f"torch raised at backward ({ref.error}); "
                                         f"sampan's gradient of input {k} is not the finite "
                                         f"difference:\n fd {a}\n sampan {b}"))
                        break
            continue
        if p is not None and got.error is not None and ref.error is None and any(
                i[0] in ("ibin", "setitem") and i[-1] for i in prog):
            # an argument overlapping the target: where torch without the clone raises
            # too, sampan may (y.mul_(y.T) modifies what mul saved)
            if run_torch(prog, arrays, seed, clone_alias=False).error is not None:
                p = None
        if p is not None:
            problems.append((mode, p))
        if mode in ("jit_in", "jit_out") and got.error is None and ref.error is None:
            # a second call with other values runs the compiled graph again
            arrays2 = input_arrays(seed, shift=0.25)
            ref2 = run_torch(prog, arrays2, seed)
            got2 = _second_call(prog, arrays, arrays2, seed, mode)
            p2 = compare(ref2, got2) if ref2.error is None else None
            if p2 is not None and p2 != "permissive":
                problems.append((mode + "/2nd call", p2))
    return problems


def _close_fd(a, b):
    b = np.zeros_like(a) if b is None else b
    return np.allclose(a, b, rtol=1e-5, atol=1e-5)


def _second_call(prog, arrays, arrays2, seed, mode):
    def f(*xs):
        env, loss = _sampan_body(prog, seed, xs)
        if mode == "jit_in":
            return env, sampan.grad(loss, list(xs), allow_unused=True)
        return env, loss
    jf = sampan.jit(f, pipeline=JIT_PIPELINE)
    try:
        jf(*[sampan.tensor(a, requires_grad=True) for a in arrays])
        xs = [sampan.tensor(a, requires_grad=True) for a in arrays2]
        env, r = jf(*xs)
        gs = r if mode == "jit_in" else sampan.grad(r, xs, allow_unused=True)
    except SampanError as e:
        return Outcome(error=e, stage="forward")
    except Exception as e:
        return Outcome(error=e, stage="crash")
    return Outcome([_np(t) for t in env], [_np(g) for g in gs])


def minimise(prog, still_bad):
    """Drop instructions while `still_bad(prog)` holds (one at a time, to a fixpoint)."""
    changed = True
    while changed:
        changed = False
        for i in range(len(prog)):
            cand = prog[:i] + prog[i + 1:]
            try:
                bad = still_bad(cand)
            except KeyError:          # a later instruction reads what it made
                continue
            if bad:
                prog, changed = cand, True
                break
    return prog


def problems_of(prog, seed, modes=MODES):
    """check() for a given program (as minimise needs)."""
    arrays = input_arrays(seed)
    ref = run_torch(prog, arrays, seed)
    out = []
    for mode in modes:
        got = run_sampan(prog, arrays, seed, mode)
        p = compare(ref, got)
        if p is not None and p != "permissive":
            out.append((mode, p))
    return out


def show(seed):
    """The program of `seed` as readable lines (for minimising by hand)."""
    return "\n".join(repr(i) for i in generate(seed))


def main(argv=None):
    import argparse
    import warnings
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=240.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--pipeline", default="none")
    ap.add_argument("--no-fd", action="store_true")
    ap.add_argument("--skip", default="", help="view kinds to leave out, comma-separated")
    a = ap.parse_args(argv)
    global JIT_PIPELINE
    JIT_PIPELINE = a.pipeline
    SKIP_VIEWS.update(k for k in a.skip.split(",") if k)
    warnings.simplefilter("ignore")
    t0 = time.time()
    bad = {}
    n = 0
    for s in range(a.seed, a.seed + a.n):
        if time.time() - t0 > a.seconds:
            break
        n += 1
        for mode, p in check(s, a.modes.split(","), fd=not a.no_fd):
            first = p.splitlines()[0][:150]
            bad.setdefault((mode, first), []).append(s)
        if n % 100 == 0:
            print(f"{n} programs, {time.time() - t0:.0f}s, {len(bad)} kinds of mismatch",
                  flush=True)
    print(f"{n} programs in {time.time() - t0:.0f}s")
    for (mode, p), seeds in sorted(bad.items(), key=lambda kv: -len(kv[1])):
        print(f"[{mode}] x{len(seeds)} seeds {seeds[:8]}: {p}")
    return bad


if __name__ == "__main__":
    main()
