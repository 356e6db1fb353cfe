"""`sampan.jit`: trace once per input signature, optimise with a pass pipeline, run
generated code, and write state (parameters, optimiser buffers, grads, random
generators) back after each call so that eager and jit calls interleave freely.

Example::

    >>> @sampan.jit
    ... def step(x, y):
    ...     loss = ((x @ w - y) ** 2).mean()
    ...     loss.backward()
    ...     with sampan.no_grad():
    ...         w.sub_(w.grad * 0.1)
    ...     w.grad = None
    ...     return loss
    >>> step(x, y); print(step.graph); print(step.code)

A jitted function that does not run backward itself is differentiable from outside:
with grad mode on and inputs (or a Layer's Parameters) that require grad, its gradient
is traced and compiled too, and `y = f(x); y.backward()` accumulates into `.grad` as
eager does (`autodiff.py`; `f.backward_graph` shows it).
"""
from __future__ import annotations

import functools
import inspect
import time
import warnings

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanError
from ..ir import symint as _symint
from ..ops.registry import STATE
from .. import _recorder as _rec
from ..tensor import Tensor, wrap
from . import dynamic as _dyn
from . import guards as _guards
from . import slots as _slots
from .outputs import link_outputs, output_links
from .pytree import flatten, unflatten
from .slots import target as _target
from .tracing import trace

_flatten, _unflatten = flatten, unflatten      # their names before jit/pytree.py

RETRACE_WARN_AFTER = 3
MAX_ENTRIES_PER_SIGNATURE = 8


class RetraceWarning(UserWarning):
    """A jitted function keeps being traced again for new input signatures."""


def _spec(t):
    return (tuple(t._data.shape), t._data.dtype.str, bool(t.requires_grad))


# ---------------------------------------------------------------------- one traced signature
class Entry:
    """One traced and compiled signature."""

    def __init__(self, graph, raw_graph, compiled, in_slots, out_slots, out_tree, grad_none,
                 timings, trace_s, guards=(), grad_check=None, vjp=None):
        self.graph = graph
        self.raw_graph = raw_graph
        self.compiled = compiled
        self.in_slots = in_slots
        self.out_slots = out_slots
        self.out_tree = out_tree
        self.grad_none = grad_none
        self.timings = timings
        self.trace_s = trace_s
        self.state = [s[1] for s in in_slots if s[0] == "state"]
        if grad_check is None:
            grad_check = [(t, t.grad is not None) for t in self.state]
        # (tensor or ("arg", i), had a grad when traced): a graph that reads or writes a
        # .grad accumulates into it or starts it, so it holds only while that is the same
        self.grad_check = tuple(grad_check)
        self.guards = tuple(guards)
        self.guard_names = ()     # what each guard watches, for messages
        self.vjp = vjp            # the traced gradient of the call, or None
        self.hist = ()            # refs of tensors the call's tape node is the history of
        self.leaf_outs = ()       # out leaves that are new leaves requiring grad per call
        res_pos = [i for i, (k, _) in enumerate(out_slots) if k == "res"]
        self.copy_res = tuple(res_pos[i] for i in vjp.copy_res) if vjp is not None else ()
        # outputs the graph returns as constants (folded, or made from data by the traced
        # code): copied per call, so that changing a result cannot change the next one
        self.copy_out = frozenset(i for i, v in enumerate(graph.outputs) if v.is_const)
        self.links = output_links(graph, self.in_slots, out_slots, self.copy_out,
                                  self.copy_res)

    size_check = None     # for dynamic dims: whether a call's sizes are inside the guards

    def valid(self, args=()):
        """Whether this trace still holds for a call with tensor leaves `args`."""
        if self.size_check is not None and self.size_check.failing(args) is not None:
            return False
        for fn, v in self.guards:
            if fn() != v:
                return False
        for ref, had in self.grad_check:
            if (_target(ref, args).grad is not None) is not had:
                return False
        return True

    def failing(self, args=()):
        """What no longer holds for a call with tensor leaves `args` (for messages)."""
        if self.size_check is not None:
            bad = self.size_check.failing(args)
            if bad is not None:
                return bad
        for i, (fn, v) in enumerate(self.guards):
            if fn() != v:
                name = (self.guard_names[i] if i < len(self.guard_names)
                        else getattr(fn, "__qualname__", "a guarded value"))
                return name.now() if hasattr(name, "now") else name
        for ref, had in self.grad_check:
            if (_target(ref, args).grad is not None) is not had:
                return ("whether argument %d has a .grad" % ref[1] if isinstance(ref, tuple)
                        else "whether a state tensor has a .grad")
        return None

    def inputs(self, args):
        return _slots.input_arrays(self.in_slots, args)

    def run(self, args):
        outs = self.compiled(*self.inputs(args))
        if self.copy_res:
            # residuals sharing an input that the write-back below overwrites: keep the
            # values the gradient reads
            outs = list(outs)
            for i in self.copy_res:
                outs[i] = outs[i].copy()
        leaves = []
        res = []
        copy_out = self.copy_out
        for i, ((kind, ref), a) in enumerate(zip(self.out_slots, outs)):
            if kind == "out":
                leaves.append(wrap(a.copy() if i in copy_out else a))
            elif kind == "res":
                res.append(a)
            elif kind == "state":
                t = _target(ref, args)
                if a is not t._data:  # not already computed in place (donated input)
                    np.copyto(t._data, a)
                t._version += 1
            elif kind == "grad":
                _target(ref, args).grad = wrap(a)
            else:
                ref.seed, ref.counter = int(a[0]), int(a[1])
        for ref in self.grad_none:
            _target(ref, args).grad = None
        for k in self.leaf_outs:
            leaves[k].requires_grad = True
        watch = ()
        if self.links:
            watch = link_outputs(self.links, leaves, res, args)
        if self.vjp is not None:
            ys = leaves
            if self.hist:
                ys = leaves + [_target(r, args) for r in self.hist]
            self.vjp.attach(ys, args, res, watch)
        return unflatten(self.out_tree, leaves)


class _SizeCheck:
    """Whether a call's dynamic sizes are inside what a trace assumed: the guards of a
    symbolic program, or (`exact`) the very sizes of one traced for them alone because
    its code decides on them (specialised)."""

    def __init__(self, dyn, guards, exact=None):
        self.dyn, self.guards, self.exact = dyn, guards, exact

    def failing(self, leaves):
        """A description of what the call's sizes break, or None."""
        sizes = _dyn.bind(leaves, self.dyn)
        if self.exact is not None:
            if sizes != self.exact:
                return ("the dynamic sizes (the traced code branches on them; specialised "
                        f"to {self.exact})")
            return None
        bad = _symint.failing(self.guards, sizes)
        return None if bad is None else f"the size condition {bad.describe()}"


# ---------------------------------------------------------------------- the decorator
class JitFunction:
    """A function (or Layer) compiled per input signature. See module doc."""

    jit_wrapped = True      # `guards.py` follows `.fn` of objects that say so

    def __init__(self, fn, *, layer=None, pipeline="train", debug=False, memory_plan=True,
                 dynamic=None):
        self.fn = fn
        self.dynamic = dynamic    # symbolic dims (see dynamic.py), or None
        self.layer = layer
        self.pipeline = pipeline
        self.debug = debug
        self.memory_plan = memory_plan
        self.cache = {}
        self.n_traces = 0
        self._last = None
        self._last_key = None
        target = layer.forward if layer is not None and hasattr(layer, "forward") else fn
        try:
            self._params = list(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            self._params = []
        functools.update_wrapper(self, fn if layer is None else type(layer).__call__,
                                 updated=())

    @property
    def params(self) -> list:
        """The parameter names of the traced function (a Layer's `forward`)."""
        return list(self._params)

    def state_tensors(self) -> list:
        """[(name, tensor)]: a Layer's parameters and buffers, which every trace lifts as
        graph inputs up front ([] for a function)."""
        return self._state()

    def signature_key(self, args, kwargs=None):
        """(cache key, tensor leaves) of a call: the traces of one key differ only in
        their guards."""
        return self._key(args, kwargs or {})

    def cached(self, args, kwargs=None):
        """The compiled trace (`Entry`) that would serve this call, or None."""
        key, leaves = self._key(args, kwargs or {})
        for e in self.cache.get(key, ()):
            if e.valid(leaves):
                return e
        return None

    def compile(self, *args, **kwargs):
        """Trace and compile for this call without running it (a cached trace that
        still holds serves); `graph`, `code` … then show it. Returns self.

        Example: ``sampan.jit(model).compile(x).graph``"""
        key, leaves = self._key(args, kwargs)
        entry = self.cached(args, kwargs) or self._compile(key, args, kwargs, leaves)
        self._last = entry
        return self

    # ---------------------------------------------------------------- keys
    def _key(self, args, kwargs):
        leaves = []
        tree = flatten((tuple(args), kwargs), leaves)
        specs = tuple(_spec(t) for t in leaves)
        if self.dynamic is not None:  # marked dims are part of the key by name, not size
            dyn = _dyn.leaf_dims(self.dynamic, self._params, args, kwargs)
            specs = tuple((_dyn.symbolic_shape(s[0], dyn[i]),) + s[1:] if i in dyn else s
                          for i, s in enumerate(specs))
        training = getattr(self.layer, "training", None)
        key = (tree, specs, training, STATE.grad_enabled, str(_dt.get_default_dtype()))
        return key, leaves

    def _changed(self, args, kwargs, old_args_sig):
        new = self._arg_sigs(args, kwargs)
        for name in sorted(set(new) | set(old_args_sig)):
            if new.get(name) != old_args_sig.get(name):
                return name, old_args_sig.get(name), new.get(name)
        return "the training flag or grad mode", None, None

    def _arg_sigs(self, args, kwargs):
        sig = {}
        for i, a in enumerate(args):
            name = self._params[i] if i < len(self._params) else f"arg{i}"
            sig[name] = _describe(a)
        for k, a in kwargs.items():
            sig[k] = _describe(a)
        return sig

    # ---------------------------------------------------------------- calling
    def __call__(self, *args, **kwargs):
        if STATE.tracer is not None:  # called inside another trace: inline it
            return self.fn(*args, **kwargs)
        key, leaves = self._key(args, kwargs)
        entry = None
        for e in self.cache.get(key, ()):
            if e.valid(leaves):
                entry = e
                break
        if entry is None:
            if _rec.ACTIVE:
                entry = self._compile_recorded(key, args, kwargs, leaves)
            else:
                entry = self._compile(key, args, kwargs, leaves)
        elif _rec.ACTIVE:
            _rec.instant("cache_hit", "jit", fn=self._fn_name())
        self._last = entry
        return entry.run(leaves)

    def _fn_name(self):
        return (type(self.layer).__name__ if self.layer is not None
                else getattr(self.fn, "__qualname__", str(self.fn)))

    def _compile_recorded(self, key, args, kwargs, leaves):
        """`_compile` while profiling: a "cache_miss" instant and a "compile" span."""
        fn = self._fn_name()
        sig = {k: str(v) for k, v in self._arg_sigs(args, kwargs).items()}
        reason = "guard" if key in self.cache else ("new signature" if self.cache else "first")
        _rec.instant("cache_miss", "jit", fn=fn, signature=sig, reason=reason,
                     traces=self.n_traces + 1)
        t0 = _rec.now()
        try:
            return self._compile(key, args, kwargs, leaves)
        finally:
            _rec.emit("compile", "jit", t0, _rec.now() - t0, fn=fn, signature=sig)

    def _state(self):
        if self.layer is None:
            return []
        st = []
        if hasattr(self.layer, "named_parameters"):
            st += list(self.layer.named_parameters())
        if hasattr(self.layer, "named_buffers"):
            st += [(n, b) for n, b in self.layer.named_buffers() if b is not None]
        return st

    def _compile(self, key, args, kwargs, leaves=()):
        from ..passes import PassManager
        from ..runtime import compile_graph
        stale = self.cache.get(key)
        if stale and self.n_traces >= RETRACE_WARN_AFTER:
            what = stale[0].failing(leaves) or "a guarded value"
            warnings.warn(
                f"sampan.jit: {getattr(self.fn, '__qualname__', self.fn)} has been traced "
                f"{self.n_traces + 1} times; this retrace was caused by {what} changing "
                "since it was traced (a trace bakes in the Python values it reads). Pass "
                "values that vary as tensor arguments, so one graph serves them all.",
                RetraceWarning, stacklevel=3)
        elif self.cache and key not in self.cache:
            self.n_traces_changed = self._changed(args, kwargs, self._last_sig)
            if self.n_traces >= RETRACE_WARN_AFTER:
                name, old, new = self.n_traces_changed
                warnings.warn(
                    f"sampan.jit: {getattr(self.fn, '__qualname__', self.fn)} has been traced "
                    f"{self.n_traces + 1} times; this retrace was caused by argument '{name}' "
                    f"changing from {old} to {new}. Every new signature traces and compiles "
                    "again: keep tensor shapes stable (pad batches) and pass varying Python "
                    "values as tensors.", RetraceWarning, stacklevel=3)
        t0 = time.perf_counter()
        name = (type(self.layer).__name__ if self.layer is not None
                else getattr(self.fn, "__name__", "main").replace("<", "").replace(">", ""))
        dyn = (_dyn.leaf_dims(self.dynamic, self._params, args, kwargs)
               if self.dynamic is not None else {})
        traced = self._trace_dynamic(args, kwargs, leaves, dyn, name) if dyn else None
        size_check = None
        if traced is not None:
            info, g, raw, pm, in_slots, out_slots, out_tree, grad_none, compiled = traced
            trace_s = time.perf_counter() - t0
            size_check = _SizeCheck(dyn, compiled.guards)
        else:
            if dyn:   # a branch on the sizes: a program for exactly these sizes
                size_check = _SizeCheck(dyn, None, _dyn.bind(leaves, dyn))
            info = {}
            g, in_slots, out_slots, out_tree, grad_none = trace(
                self.fn, args, kwargs, self._state(), name=name, info=info,
                differentiable=True)
            trace_s = time.perf_counter() - t0
            raw = g.copy()
            pm = PassManager(self.pipeline, debug=self.debug, options=info["pass_options"])
            if not self.memory_plan:
                pm.passes = [p for p in pm.passes if p != "plan_memory"]
            g = pm.run(g)
            compiled = compile_graph(g, debug=self.debug)
        vjp = info["vjp"]
        if vjp is not None:
            vjp.options = (self.pipeline, self.debug, self.memory_plan)
        # guards: what the traced code asked for (optimiser hyperparameters …), the Python
        # values and objects the function can reach, and the tensors the trace read
        named = [(getattr(fn, "__qualname__", "a guarded value"), fn, v)
                 for fn, v in info["guards"]]
        named += [(n, get, get()) for n, get in _guards.build(self.fn, self.layer)]
        tname, tguard = info["tensor_guard"]
        named.append((tname, tguard, True))
        entry = Entry(g, raw, compiled, _slots.fix(in_slots), out_slots, out_tree, grad_none,
                      pm.timings, trace_s, [(f, v) for _, f, v in named],
                      info["grad_check"], vjp)
        entry.guard_names = tuple(n for n, _, _ in named)
        entry.hist = info["hist"]
        entry.leaf_outs = info["leaf_outs"]
        entry.size_check = size_check
        # a signature keeps the traces of its recent guard outcomes (grads present or not,
        # hyperparameters …), so that alternating between them does not trace every call
        entries = self.cache.setdefault(key, [])
        entries.insert(0, entry)
        del entries[MAX_ENTRIES_PER_SIGNATURE:]
        self.n_traces += 1
        self._last_sig = self._arg_sigs(args, kwargs)
        return entry

    def _trace_dynamic(self, args, kwargs, leaves, dyn, name):
        """Trace at the call's sizes and once per symbol at another, unify the optimised
        graphs into one with symbolic dims (`dynamic.py`); compiled per concrete size."""
        from ..passes import PassManager
        base, probes = _dyn.probe_sizes(_dyn.bind(leaves, dyn))
        tree = flatten((tuple(args), kwargs), [])
        runs = []
        for sizes in [base] + [dict(base, **{s: n}) for s, n in probes]:
            a, k = unflatten(tree, _dyn.resized(leaves, dyn, sizes))
            info = {}
            g, in_slots, out_slots, out_tree, grad_none = trace(
                self.fn, a, k, self._state(), name=name, info=info, differentiable=True,
                dyn=dyn)
            if info["vjp"] is not None and info["vjp"].graph is not None:
                raise SampanError(
                    f"sampan.jit: {name} is differentiated from outside the call (inputs or "
                    "parameters require grad), which dynamic= does not support yet: call it "
                    "under sampan.no_grad(), or run backward inside the jitted function")
            raw = g.copy()
            pm = PassManager([p for p in PassManager(self.pipeline).passes
                              if p != "plan_memory"], debug=self.debug,
                             options=info["pass_options"])
            runs.append((info, pm.run(g), raw, pm, in_slots, out_slots, out_tree, grad_none))
        guards, conflict = _dyn.merge_guards([r[0]["sym_guards"] for r in runs], base, probes)
        actual = _dyn.bind(leaves, dyn)
        if conflict is not None or _symint.failing(guards, actual) is not None:
            return None      # the code decides on the sizes here: specialise (see _compile)
        info, g0, raw, pm, in_slots, out_slots, out_tree, grad_none = runs[0]
        g = _dyn.unify(g0, [r[1] for r in runs[1:]], base, probes, what=name)
        g.meta = dict(g0.meta)
        raw = _dyn.unify(raw, [r[2] for r in runs[1:]], base, probes, what=name)
        args_at = [i for i, (kind, _) in enumerate(in_slots) if kind == "arg"]
        compiled = _dyn.SymbolicProgram(g, args_at, debug=self.debug,
                                        label=f"sampan.jit {name}", guards=guards)
        return info, g, raw, pm, in_slots, out_slots, out_tree, grad_none, compiled

    # ---------------------------------------------------------------- inspection
    def _entry(self):
        if self._last is None:
            raise SampanError("sampan.jit: call the function once so it gets traced")
        return self._last

    @property
    def graph(self):
        """The optimised Graph of the last call (print it for the text form)."""
        return self._entry().graph

    @property
    def raw_graph(self):
        """The Graph as traced, before passes."""
        return self._entry().raw_graph

    @property
    def backward_graph(self):
        """The optimised gradient Graph of the last call (None when the call was not
        differentiable from outside: nothing required grad, or it ran backward itself)."""
        vjp = self._entry().vjp
        if vjp is None:
            return None
        vjp.compile()
        return vjp.graph

    @property
    def code(self) -> str:
        """The generated Python source of the last call."""
        return self._entry().compiled.code

    @property
    def pass_timings(self):
        """[(pass name, seconds)] of the last compilation."""
        return list(self._entry().timings)

    @property
    def memory_plan_stats(self):
        p = self._entry().graph.meta.get("memory_plan")
        return None if p is None else {k: v for k, v in p.items() if k != "assign"}


def _describe(a):
    if isinstance(a, Tensor):
        return f"{_dt.short_name(a.dtype)}{list(a.shape)}" + (" (requires_grad)"
                                                             if a.requires_grad else "")
    if isinstance(a, (tuple, list)):
        return type(a)(_describe(x) for x in a)
    return repr(a)


def jit(fn=None, *, pipeline="train", debug=False, memory_plan=True, dynamic=None):
    """Compile a function or a Layer: ``sampan.jit(f)``, ``@sampan.jit``, ``sampan.jit(model)``.

    `dynamic` marks dims whose size varies between calls, so one program serves them
    all: ``dynamic={"x": {0: "batch"}}`` (argument name or position -> {dim: symbol}) or
    ``dynamic="batch"`` (dim 0 of every tensor argument); see `sampan/jit/dynamic.py`.

    Example::

        >>> f = sampan.jit(lambda x: (x * 2).relu())
        >>> f(sampan.randn(3)); print(f.graph)
        >>> g = sampan.jit(model, dynamic={"x": {0: "batch"}})   # any batch size
    """
    kw = dict(pipeline=pipeline, debug=debug, memory_plan=memory_plan, dynamic=dynamic)
    if fn is None:
        return lambda f: jit(f, **kw)
    if isinstance(fn, JitFunction):
        return fn
    if hasattr(fn, "named_parameters") and callable(fn):
        return JitFunction(fn.__call__, layer=fn, **kw)
    return JitFunction(fn, **kw)
