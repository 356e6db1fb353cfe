"""The tracer: while `STATE.tracer` is set, every op call lands in `Tracer.apply`,
which adds a Node to the Graph and returns Tensors whose `_data` is an IR Value.

Tape nodes are recorded exactly as in eager mode, so `loss.backward()` inside a
traced function runs the gradient rules, which are ops, and they are traced too.

Tensors that exist before the trace and are read by it become graph inputs when
they carry state (parameters: leaves that require grad; tensors the trace modifies
in place, e.g. optimiser buffers; anything the caller declares) and constants
otherwise. Tensors the traced code makes from data (`sampan.tensor`, `from_numpy`) are
values of one call: constants, whose in-place updates are not written back. A lifted
tensor with a history outside the call gets a root node of its own while traced, so that
traced gradients stop at it. A lifted tensor's `_data` (and its `.grad`) is swapped for a Value
during the trace and restored afterwards; in-place updates just rebind the Value
(functionalisation). Generators become a `(seed, counter)` input threaded through.
"""
from __future__ import annotations

import linecache

import numpy as np

from ..autograd.tape import Node as _Node
from ..errors import AutogradError, TracingError, user_frame
from ..ir.graph import Graph, Value
from ..ir.symbolic import sym
from ..ir.symint import ShapeEnv, SymFloat, SymInt
from ..ops.registry import STATE, OpDef
from ..tensor import Tensor, _record, mark_view, refresh_view, wrap


def _loc():
    import os
    fn, ln = user_frame()
    return f"{os.path.basename(fn)}:{ln}"


class _Lifted:
    __slots__ = ("t", "data", "node", "idx", "rg", "grad", "version", "vsync", "value",
                 "gvalue", "gdata", "root")

    def __init__(self, t):
        self.t = t
        self.data, self.node, self.idx = t._data, t._node, t._idx
        self.rg, self.grad, self.version = t.requires_grad, t.grad, t._version
        self.vsync = t._vsync
        self.value = None
        self.gvalue = None
        self.root = None        # the tape root standing for its history outside, if any


class Tracer:
    """Builds one Graph from one run of Python code. Use as a context manager."""

    def __init__(self, name="main", lift_requires_grad=True):
        self.g = Graph(name)
        self.slots = []          # one per graph input: ("arg", i) | ("state", t) | ("grad", t)
        #                          | ("rng", generator)
        self.lifted = {}         # id(tensor) -> _Lifted
        self.consts = {}         # id(ndarray) -> (Value, ndarray, tensor)
        self.own = set()         # ids of Values made by this trace
        self.rng = {}            # id(generator) -> [generator, current Value]
        self.feeds = {}          # key -> Tensor of a ("feed", fn) input
        self.guards = []         # [(fn, value at trace time)]: retrace when fn() changes
        # {pass: {option: value}} the traced code asks of the passes (a traced DataParallel
        # its bucket size, for `distribute`): the jit's PassManager gets them as options
        self.pass_options = {}
        self.grad_cleared = {}   # id -> tensor whose grad the code drops before use
        # tensors the traced code made from data (sampan.tensor, from_numpy, Tensor(...)),
        # and the fresh arrays they own: values of one call, never state (eager makes them
        # anew at every call). Held strongly so that their ids are not reused in the trace.
        self.born_tensors = {}
        self.born_arrays = {}
        self.tape = {}           # tape node recorded by this trace -> its source line
        # id(d) -> [d, source, base version when d's Value was last synced] for
        # d = source.detach(): eager shares the memory, so the trace passes writes on
        self.aliases = {}
        self.kept = {}           # id -> (view made before the trace, its state to restore)
        self.loc = None          # the source line new nodes take, if not the caller's
        self.vjp_mode = False    # set while tracing the gradient of the whole call
        self.lift_requires_grad = lift_requires_grad
        # symbolic sizes (dynamic dims, see dynamic.py): the ShapeEnv that records the
        # guards of this trace, or None for a trace at fixed sizes
        self.env = None
        self._inc = None
        self._prev = None
        # control flow (blocks.py): the graph inputs go to (the one traced), how deep in
        # nested blocks the trace is, the constants blocks read, and per open block the
        # tensors its outer Values came from
        self.root = self.g
        self.block_depth = 0
        self.block_consts = []
        self.cf_seen = []

    # ------------------------------------------------------------------ context
    def set_pass_option(self, pass_name: str, **options) -> None:
        """Ask pass `pass_name` of the jit's pipeline for `options` (the first asked wins,
        e.g. an outer DataParallel's bucket size over an inner one's)."""
        mine = self.pass_options.setdefault(pass_name, {})
        for k, v in options.items():
            mine.setdefault(k, v)

    def __enter__(self):
        if STATE.tracer is not None:
            raise TracingError("sampan.jit: tracing inside a trace (nested jit) is not supported")
        self._prev = STATE.tracer
        STATE.tracer = self
        return self

    def __exit__(self, *exc):
        STATE.tracer = self._prev
        self.restore()

    def restore(self):
        """Give every lifted tensor back its array, grad and autograd state."""
        for L in self.lifted.values():
            t = L.t
            t._data, t._node, t._idx, t.requires_grad = L.data, L.node, L.idx, L.rg
            t.grad, t._version = L.grad, L.version
            if L.grad is not None and L.gvalue is not None:
                L.grad._data = L.gdata
            t._vsync = L.vsync
        for t, data, node, idx, rg, vsync in self.kept.values():
            t._data, t._node, t._idx, t.requires_grad, t._vsync = data, node, idx, rg, vsync
        self.lifted_restored = True

    # ------------------------------------------------------------------ values
    def _input(self, shape, dtype, slot, name=None):
        v = self.root.add_input(shape, dtype, name)
        self.own.add(id(v))
        self.slots.append(slot)
        return v

    def born(self, t: Tensor, fresh_array: bool, data=None):
        """`t` was just made from data by the traced code (called by `Tensor.__init__`)."""
        if isinstance(data, (SymInt, SymFloat)):   # sampan.tensor(x.shape[0]): a size
            t._data = self.sym_scalar(data, t._data.dtype)._data
            return
        self.born_tensors[id(t)] = t
        if fresh_array:
            self.born_arrays[id(t._data)] = t._data

    def is_born(self, t) -> bool:
        """Whether `t` (or the array it wraps, e.g. a Parameter around it) was made by
        this trace."""
        return id(t) in self.born_tensors or id(t._data) in self.born_arrays

    def lift(self, t: Tensor, slot=None, name=None) -> Value:
        """Make `t` (a concrete tensor) a graph input for the rest of the trace.

        A tensor the traced code made itself is no input: it becomes a constant of the
        graph, so that updating it in place changes this call's value only, as in eager."""
        L = self.lifted.get(id(t))
        if L is not None:
            return t._data
        arr = t._data
        if not isinstance(arr, np.ndarray):
            raise TracingError("lift: tensor is already traced")
        if slot is None and self.is_born(t):
            v = self.value_of_const(t)
            t._data = v
            return v
        L = _Lifted(t)
        self.lifted[id(t)] = L
        ent = self.consts.get(id(arr))
        if ent is not None and ent[2] is t:
            # it was read as a constant earlier in this trace: turn that constant into an input
            v = ent[0]
            (self.g if v in self.g.consts else self.root).consts.remove(v)
            v.const, v.name = None, name
            self.root.inputs.append(v)
            self.slots.append(slot or ("state", t))
            del self.consts[id(arr)]
        else:
            v = self._input(arr.shape, arr.dtype, slot or ("state", t), name)
        L.value = v
        t._data = v
        if t._node is not None:
            # a tensor with a history outside the call (an argument computed eagerly): a
            # root of this trace's tape, so that no traced gradient walks into eager nodes
            t._node, t._idx = _Node(_OUTSIDE, (), {}, (t,)), 0
            self.tape[t._node] = ""
            L.root = t._node
        if t.grad is not None and isinstance(t.grad._data, np.ndarray):
            gref = ("arg", slot[1]) if slot is not None and slot[0] == "arg" else t
            gv = self._input(t.grad._data.shape, t.grad._data.dtype, ("grad", gref),
                             (name + ".grad") if name else None)
            L.gdata = t.grad._data
            L.gvalue = gv
            t.grad._data = gv
        return v

    def detached(self, d, src):
        """`d = src.detach()` during the trace: d shares src's memory in eager, so a write
        through either must reach the other (functionalised: Values are rebound)."""
        # src's current Value (a stale view's too; a Value even for a src from outside
        # the trace, so that d, made here, never holds an array a later sync replaces)
        d._data = self.value_of(src)
        self.aliases[id(d)] = [d, src, d._base._version]

    def _adopt(self, t):
        """t, a detach() made before the trace, is read or written by it for the first
        time: like one made during the trace, its Value follows its source's (writes
        pass between them); its own state is given back after the trace."""
        ref = t._detached_from
        src = ref() if ref is not None else None
        if src is None or id(t) in self.aliases or id(t) in self.lifted:
            return
        self.kept[id(t)] = (t, t._data, t._node, t._idx, t.requires_grad, t._vsync)
        t._data = self.value_of(src)
        self.aliases[id(t)] = [t, src, t._base._version]

    def _sync_alias(self, t):
        """t (a detach made during the trace) may be stale: its source was written since."""
        A = self.aliases[id(t)]
        if A[2] != t._base._version:
            t._data = self.value_of(A[1])
            A[2] = t._base._version

    def _write_through_alias(self, root, name):
        """`root` (a detach made during the trace) was just written: write its new value
        into its source too, without recording a gradient, as eager's shared memory does
        (PyTorch: the source's values change, its history does not)."""
        A = self.aliases[id(root)]
        prev = STATE.grad_enabled
        STATE.grad_enabled = False
        mem = root._base              # d and its source share this version counter
        v0 = mem._version
        try:
            self.inplace(A[1], wrap(root._data), name)
        finally:
            STATE.grad_enabled = prev
            # one write in eager, one version bump: the write-through is not a second
            # write (it would fail the saved-value checks of what d's write recorded)
            mem._version = v0
        if A[1]._view is not None:
            A[1]._vsync = v0          # rebuilt by the write-through at the bumped version
        A[2] = v0

    def value_of(self, t) -> Value:
        if t._detached_from is not None and isinstance(t._data, np.ndarray):
            self._adopt(t)
        if self.aliases and id(t) in self.aliases:
            self._sync_alias(t)
        if t._view is not None and isinstance(t._data, np.ndarray) and id(t) not in self.lifted:
            # a view made before the trace: its Value is the view of its base's Value (so
            # that writes to the base inside the trace reach it, and writes through it
            # reach the base, as eager's shared memory does) and its history is rebuilt
            # from the base's (else a gradient through it would miss what the trace
            # wrote into the base); both are given back after the trace
            if id(t) not in self.kept:
                self.kept[id(t)] = (t, t._data, t._node, t._idx, t.requires_grad, t._vsync)
            refresh_view(t)
            return t._data
        if t._view is not None and t._vsync != t._base._version:
            # a view whose base was modified in place: its Value is the view of the base's
            # current Value (eager sees the new values through shared memory)
            refresh_view(t)
        d = t._data
        if isinstance(d, Value):
            if id(d) not in self.own:
                raise TracingError(
                    "sampan.jit: a tensor traced by an earlier trace was used again (it leaked "
                    "out of a jitted function, e.g. optimiser state created lazily inside it). "
                    "Run one eager step first so such state exists before jit traces"
                    f"\n  at {_loc()}")
            return d
        if not isinstance(d, np.ndarray):
            d = np.asarray(d)
            t._data = d
        if self.lift_requires_grad and t.requires_grad:
            return self.lift(t)
        return self.value_of_const(t)

    def value_of_const(self, t) -> Value:
        """The constant holding concrete tensor `t`'s array (one per array)."""
        d = t._data
        ent = self.consts.get(id(d))
        if ent is None:
            v = self.g.add_const(d)
            self.own.add(id(v))
            self.consts[id(d)] = ent = (v, d, t)
        return ent[0]

    def symbolic(self, v: Value, dims: dict):
        """Give graph input `v` symbolic sizes at `dims` ({dim: symbol}): its shape holds
        SymInts from now on, and what the traced code computes from them stays symbolic."""
        if self.env is None:
            self.env = ShapeEnv()
        v.shape = tuple(SymInt(d, sym(dims[i]), self.env) if i in dims else d
                        for i, d in enumerate(v.shape))

    def sym_scalar(self, x, dtype) -> Tensor:
        """A 0-d tensor holding symbolic number `x` (a size the code computed): a `full`
        node whose value is the SymInt/SymFloat, never a constant baked at one size."""
        from ..dtypes import dtype_name
        with self.env.quiet():
            node = self.g.add_node("full", [], {"shape": (), "value": x,
                                                "dtype": dtype_name(dtype)},
                                   loc=self.loc or _loc())
        v = node.output
        self.own.add(id(v))
        return wrap(v)

    def control(self, kind, *args):
        """`sampan.cond/while_loop/scan` while tracing: one node holding its blocks."""
        from .blocks import trace_control
        return trace_control(self, kind, *args)

    # ------------------------------------------------------------------ hooks from the core
    def apply(self, op, inputs, attrs):
        vals = [self.value_of(t) for t in inputs]
        kw = {"loc": self.loc or _loc()}
        na = attrs
        if "blocks" in attrs:      # a control-flow op applied with its blocks (a sample)
            na = {k: a for k, a in attrs.items() if k != "blocks"}
            kw["blocks"] = [b.copy() for b in attrs["blocks"]]
        if self.env is not None:   # a shape rule's comparisons are checks, not decisions
            with self.env.quiet():
                node = self.g.add_node(op.name, vals, na, **kw)
        else:
            node = self.g.add_node(op.name, vals, na, **kw)
        if any(isinstance(d, str) for v in node.outputs for d in v.shape) and not any(
                isinstance(d, str) for v in vals for d in v.shape):
            fn, ln = user_frame()
            raise TracingError(
                f"sampan.jit: {op.name} gives a result whose shape depends on the data "
                f"({node.outputs[0].type_str()}), which a traced graph cannot have\n"
                f"  at {fn}:{ln}: {linecache.getline(fn, ln).strip()}\n"
                "Alternatives: sampan.where(mask, x, 0) keeps the shape; or leave this part "
                "eager.")
        outs = []
        for v in node.outputs:
            self.own.add(id(v))
            outs.append(wrap(v))
        if op.view and not (op.name == "reshape" and _reshape_copies(inputs[0], attrs)):
            mark_view(outs[0], inputs[0], op, attrs)
        if STATE.grad_enabled and op.differentiable:   # as eager: no tape for sign, floor …
            for t in inputs:
                if t.requires_grad:
                    _record(op, inputs, attrs, tuple(outs))
                    for y in outs:
                        if y._node is not None:
                            self.tape[y._node] = node.loc
                            break
                    break
        return outs[0] if op.n_out == 1 else tuple(outs)

    def inplace(self, target, result, name="in-place op"):
        """Functionalise `target <- result`: the target's Value is rebound; through a view,
        the base's Value is rebound to the base with the view's part replaced (as eager
        records it on the base's history) and the view's to the view of that."""
        from .._tensor_methods import check_inplace_target, rebase_view
        from ..autograd.tape import bump_version
        grad = STATE.grad_enabled
        if self.block_depth:
            from .blocks import check_block_write
            check_block_write(self, target, name)
        if grad:
            check_inplace_target(target, name)
        if target._view is not None:
            base = target._view[0]
            if base._detached_from is not None and isinstance(base._data, np.ndarray):
                self._adopt(base)
            if base._view is None and isinstance(base._data, np.ndarray):
                self.lift(base)      # state from outside the trace: its update is an output
            self.value_of(target)    # brings a stale view up to date first
            if result._node is not None and grad:
                result._node.preserve_input(target)
            if _views_an_input(self.value_of(result)):
                # written into the base, a view of an input's array would be state that
                # changes while being written back (y.T.copy_(y)): write a copy
                from ..ops.shape import clone
                result = clone(result)
            bump_version(target)
            alias = self.aliases.get(id(base))
            if alias is not None:
                alias[2] = base._base._version   # this write is d's own: nothing to pull
            rebase_view(target, result, name)
            self.own.add(id(target._data))
            if alias is not None:
                self._write_through_alias(base, name)
            return target
        if target._detached_from is not None and isinstance(target._data, np.ndarray):
            self._adopt(target)
        if self.aliases and id(target) in self.aliases:
            self._sync_alias(target)
        if isinstance(target._data, np.ndarray):
            self.lift(target)
        if result._node is not None and grad:
            result._node.preserve_input(target)
        rv = self.value_of(result)
        tv = target._data
        if rv.dtype != tv.dtype:
            rv = self.g.add_node("cast", [rv], {"dtype": _dtname(tv.dtype)}, loc=_loc()).output
        if rv.shape != tv.shape:
            rv = self.g.add_node("expand", [rv], {"shape": tuple(tv.shape)}, loc=_loc()).output
        if id(target) in self.lifted and _views_an_input(rv):
            # the new value of state is a view of an input's array (x.copy_(x[:, 0])):
            # written back into that array, it would change while being copied
            rv = self.g.add_node("copy", [rv], {}, loc=_loc()).output
        target._data = rv
        self.own.add(id(rv))
        bump_version(target)
        alias = self.aliases.get(id(target))
        if alias is not None:
            alias[2] = target._base._version     # this write is d's own: nothing to pull
        if result._node is not None and grad:
            target._node, target._idx = result._node, result._idx
            target.requires_grad = True
            result._node.rebind_output(result._idx, target)
        elif target.requires_grad and grad:
            # overwritten by values that need no gradient: old history gets a zero gradient
            from ..ops.shape import setitem
            new = setitem(target, Ellipsis, wrap(rv))
            target._data = new._data
            target._node, target._idx = new._node, new._idx
        if alias is not None:
            self._write_through_alias(target, name)
        return target

    def bool_of(self, t):
        fn, ln = user_frame()
        src = linecache.getline(fn, ln).strip()
        raise TracingError(
            f"sampan.jit: Python control flow depends on the value of a traced tensor "
            f"({t._data.type_str()})\n  at {fn}:{ln}: {src}\n"
            "While tracing, tensors have shapes and dtypes but no values. Put the control "
            "flow in the graph: an `if` becomes sampan.cond(pred, true_fn, false_fn, "
            "*operands), a `while` sampan.while_loop(cond_fn, body_fn, init) (a loop over "
            "a tensor's rows sampan.scan(fn, init, xs)). Or compute both branches and pick "
            "with sampan.where(cond, a, b); pass the deciding value as a static "
            "(non-tensor) argument, so each value gets its own graph; or leave this part "
            "eager (call it outside the jitted function).")

    def concrete_error(self, t, what):
        fn, ln = user_frame()
        src = linecache.getline(fn, ln).strip()
        return TracingError(
            f"sampan.jit: {what} needs the value of a traced tensor ({t._data.type_str()})"
            f"\n  at {fn}:{ln}: {src}\nInside a jitted function tensors have no values yet; "
            "return the tensor and read it after the call, or leave this part eager.")

    def feed(self, key, fn, name=None) -> Tensor:
        """A graph input whose array `fn()` supplies at every call (e.g. an optimiser's
        learning rate, so schedulers need no retrace); one input per `key`."""
        t = self.feeds.get(key)
        if t is None:
            a = np.asarray(fn())
            v = self._input(a.shape, a.dtype, ("feed", fn), name)
            t = self.feeds[key] = wrap(v)
        return t

    def clear_grad(self, t):
        """`t.grad = None` by code that owns the gradient (an optimiser's zero_grad): the
        graph then does not depend on whether `t` had a grad when called."""
        if id(t) not in self.lifted:
            self.grad_cleared[id(t)] = t
        t.grad = None

    def guard(self, fn):
        """Trace again when `fn()` (hashable) differs from its value now, e.g. for
        hyperparameters baked into the graph as constants."""
        self.guards.append((fn, fn()))

    def random_key(self, gen):
        """The key of one random op drawn from `gen`: (seed, counter) threaded through."""
        if self.block_depth:
            fn, ln = user_frame()
            raise TracingError(
                "sampan.jit: a random op inside a sampan.cond/while_loop/scan function is "
                f"not supported (its key would not advance per iteration)\n  at {fn}:{ln}"
                "\nDraw the random numbers outside and pass them in (as xs of a scan).")
        ent = self.rng.get(id(gen))
        if ent is None:
            v = self._input((2,), np.int64, ("rng", gen), f"rng{len(self.rng)}")
            ent = self.rng[id(gen)] = [gen, v]
        if self._inc is None:
            self._inc = self.g.add_const(np.array([0, 1], np.int64))
            self.own.add(id(self._inc))
        key = ent[1]
        nxt = self.g.add_node("add", [key, self._inc], {}, loc=_loc()).output
        self.own.add(id(nxt))
        ent[1] = nxt
        return wrap(key)


def _views_an_input(v):
    """Whether Value `v` is (a chain of views of) a graph input: at run time, an array
    sharing that input's memory."""
    from ..ops.registry import OPS
    while v.node is not None:
        n = v.node
        if not n.inputs or not (OPS[n.op].view or (n.op == "getitem" and len(n.inputs) == 1)):
            return False
        v = n.inputs[0]
    return v.const is None


def _concrete(t):
    """The array a tensor from outside the trace holds (a lifted input's or a constant's),
    else None."""
    if isinstance(t._data, np.ndarray):
        return t._data
    tr = STATE.tracer
    L = tr.lifted.get(id(t)) if tr is not None else None
    return L.data if L is not None and isinstance(L.data, np.ndarray) else None


def _reshape_copies(x, attrs):
    """Whether eager's reshape of `x` copies (x non-contiguous), as numpy decides: the view
    chain replayed on the base's own array when it came from outside the trace, else on a
    byte array of the base's shape (eager results that are not views are C-contiguous)."""
    base, chain = x._view if x._view is not None else (x, ())
    shape = tuple(base._data.shape)
    if not all(isinstance(d, int) for d in shape + tuple(attrs["shape"])):
        return False
    a = _concrete(base)
    if a is None:       # made in the trace: C-contiguous in eager too (tensor.apply)
        if not chain:
            return False
        a = np.empty(shape, np.uint8)
    for op, at in chain:
        a = op.kernel(a, **at)
    try:
        np.reshape(a, attrs["shape"], copy=False)
    except ValueError:
        return True
    return False


def _outside_grad(g, y):
    tr = STATE.tracer
    if tr is not None and tr.vjp_mode:
        return ()         # the gradient of the call reaching its input: captured, done
    fn, ln = user_frame()
    raise TracingError(
        "sampan.jit: a backward() inside the jitted function reaches a tensor computed "
        "outside it (an argument or captured tensor with a grad_fn), whose history a traced "
        f"gradient cannot continue into\n  at {fn}:{ln}: {linecache.getline(fn, ln).strip()}"
        "\nPass a leaf instead (x.detach().requires_grad_()), or call backward() outside: "
        "jitted calls are differentiable from outside.")


_OUTSIDE = OpDef("jit_input", lambda *a, **k: None, grad=_outside_grad)


def _dtname(d):
    from ..dtypes import dtype_name
    return dtype_name(d)
