"""The `Optimizer` base: parameter groups, per-parameter state, `state_dict`.

Subclasses implement `_update_group(group)`, which walks the group's parameters,
changes each one's numpy storage in place and bumps its version (so autograd notices
that values saved for a backward pass went stale). The base class runs it under
`no_grad` and owns everything that is not arithmetic.

State layout (PyTorch's, so checkpoints read the same way)::

    {"state": {0: {"step": 3, "exp_avg": Tensor, ...}, 1: {...}},
     "param_groups": [{"lr": 0.001, ..., "params": [0, 1]}, ...]}

Parameters are numbered in group order, first group first. Inside the optimizer the
state is a dict keyed by the parameter tensor itself, values being numpy arrays (and
a Python int `step`), so the update loop touches no wrapper objects.

Under `sampan.jit` (a tracer is active) `step()` cannot touch numpy storage: it runs
the pure rules of `sampan.optim.functional` on Tensors instead and writes the results
back with `copy_`, which the tracer turns into graph outputs written back after each
call. Those Tensors (`_jit`, one dict per parameter) wrap the very arrays of the eager
state, so eager and jitted steps interleave; their step counters are 0-d float64
tensors (bias corrections advance per call) synced with the eager ints whenever the
eager side looks. State that does not exist yet is created as the eager first step
would (zeros) at trace time, so no eager warm-up step is needed. The learning rate is
a graph input read from the group at every call (schedulers need no retrace); other
hyperparameters are constants, guarded: changing one traces again.
"""
from __future__ import annotations

import copy
import functools

import numpy as np

from sampan.autograd import no_grad
from sampan.errors import DTypeError, SampanValueError, ShapeError, op_error
from sampan.ops.registry import STATE
from sampan import _recorder as _rec
from sampan.tensor import Tensor, wrap

__all__ = ["Optimizer", "decayed_grad", "required"]


class _Required:
    """Marks a hyperparameter that has no default (e.g. SGD's `lr`)."""

    def __repr__(self):
        return "<required>"


required = _Required()


class Optimizer:
    """Base class of every optimiser.

    `params` is an iterable of tensors, or of dicts each holding ``"params"`` plus
    hyperparameters that override `defaults` for that group.

    Example::

        >>> w = sampan.randn(3, requires_grad=True)
        >>> opt = sampan.optim.SGD([{"params": [w], "lr": 0.1}], lr=0.01)
        >>> (w * w).sum().backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.state: dict = {}
        self.param_groups: list[dict] = []
        self._scratch: dict = {}  # dtype -> flat work buffer shared by all parameters
        self._jit: dict = {}  # parameter -> {name: Tensor} state seen by traced steps
        # parameters standing for tables kept outside numpy storage (sampan.rec's
        # HashEmbedding.sparse_table): step() calls their `_table_step`
        self._tables: list = []
        if isinstance(params, Tensor):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of tensors "
                            "or of dicts, got a single Tensor")
        groups = list(params)
        if not groups:
            raise SampanValueError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    # ----------------------------------------------------------------- groups
    def add_param_group(self, group: dict) -> None:
        """Add a group of parameters with its own hyperparameters.

        Example::

            >>> opt.add_param_group({"params": [head.weight], "lr": 1e-2})
        """
        if not isinstance(group, dict):
            raise TypeError(f"add_param_group: expected a dict, got {type(group).__name__}")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: can only optimise Tensors, got "
                                f"{type(p).__name__}")
            if not p.is_leaf:
                raise SampanValueError(f"{type(self).__name__}: can't optimise a non-leaf "
                                       "tensor (it is computed from others)")
        g = {"params": params}
        for k, v in self.defaults.items():
            if k not in group and v is required:
                raise SampanValueError(f"{type(self).__name__}: parameter group has no "
                                       f"'{k}' and there is no default")
            g[k] = group.get(k, v)
        for k, v in group.items():
            if k not in g:
                g[k] = v
        seen = {id(p) for grp in self.param_groups for p in grp["params"]}
        if len({id(p) for p in params}) != len(params) or seen & {id(p) for p in params}:
            raise SampanValueError(f"{type(self).__name__}: a parameter appears in more than "
                                   "one group (or twice in one)")
        self._check_group(g)
        self.param_groups.append(g)
        self._tables.extend(p for p in params if hasattr(p, "_table_step"))

    def _check_group(self, group: dict) -> None:
        """Subclasses validate hyperparameters here, naming the bad one."""

    # ----------------------------------------------------------------- stepping
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient (drop it, or fill it with zeros).

        Example::

            >>> opt.zero_grad()
        """
        tracer = STATE.tracer
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none and tracer is not None:
                    tracer.clear_grad(p)  # the graph then ignores grads present at a call
                    continue
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                elif tracer is not None:
                    tracer.value_of(p)  # makes p (and its grad) graph state
                    p.grad.zero_()
                else:
                    p.grad._data.fill(0)

    def step(self, closure=None):
        """Update every parameter that has a gradient; returns `closure()` if given.

        Example::

            >>> loss = opt.step(lambda: compute_loss())  # closure re-evaluates the loss
        """
        loss = None
        if closure is not None:
            from sampan.autograd import enable_grad
            with enable_grad():
                loss = closure()
        if STATE.tracer is not None:
            with no_grad():
                self._traced_step(STATE.tracer)
            return loss
        if _rec.ACTIVE:     # one "optim" span per step (sampan.profiler)
            t0 = _rec.now()
            try:
                self._eager_step()
            finally:
                _rec.emit(f"{type(self).__name__}.step", "optim", t0, _rec.now() - t0,
                          params=sum(len(g["params"]) for g in self.param_groups))
            return loss
        self._eager_step()
        return loss

    def _eager_step(self) -> None:
        jit = self._jit
        if jit:
            self._sync_from_jit()
        for g in self.param_groups:  # refuse before anything changes
            self._check_sparse(g)
        for p in self._tables:  # sparse tables (sampan.rec) apply their pending gradients
            p._table_step()
        with no_grad():
            for g in self.param_groups:
                self._update_group(g)
        if jit:
            self._sync_to_jit()

    # whether `_update_group` is right for the row-sparse gradient of an
    # `nn.Embedding(sparse=True)` (a dense grad whose untouched rows are zero): true for
    # the rules where zero rows change nothing, as in torch
    _sparse_grads = False

    def _check_sparse(self, group: dict) -> None:
        for p in group["params"]:
            if p.grad is None or getattr(p, "_sparse_grad_rows", None) is None:
                continue
            where = f"{type(self).__name__}.step"
            if not self._sparse_grads:
                raise op_error(SampanValueError, where, "a sparse gradient (from "
                               f"nn.Embedding(sparse=True)), shape {tuple(p.shape)}",
                               "dense gradients", "Use optim.SparseAdam (or SGD, Adagrad) "
                               "for the sparse table, or Embedding(sparse=False)")
            if group.get("weight_decay"):
                raise op_error(SampanValueError, where, f"weight_decay="
                               f"{group['weight_decay']} with a sparse gradient",
                               "weight_decay=0 for parameters with sparse gradients",
                               "Put the sparse table in its own group without decay")

    def _update_group(self, group: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ----------------------------------------------------------------- traced steps
    def _init_state(self, shape, dtype, group: dict) -> dict:  # pragma: no cover
        """The state the first eager step creates (arrays, and ``"step": 0`` if counted)."""
        raise NotImplementedError

    def _traced_update(self, p, grad, st: dict, group: dict, lr) -> None:  # pragma: no cover
        """One parameter's update with sampan ops; `st` holds its state as Tensors,
        `lr` is a float64 0-d tensor (a graph input)."""
        raise NotImplementedError

    def _needs_started(self, group: dict) -> bool:
        """Whether the first step differs from a step on zero state (SGD dampening)."""
        return False

    def _traced_step(self, tracer) -> None:
        tracer.guard(self._hyper_key)
        for gi, group in enumerate(self.param_groups):
            lr = tracer.feed((id(self), gi, "lr"), functools.partial(_lr_of, group), f"lr{gi}")
            for p in group["params"]:
                grad = p.grad
                if grad is not None:
                    self._traced_update(p, grad, self._jit_state(p, group), group, lr)

    def _hyper_key(self):
        return tuple(tuple((k, v) for k, v in g.items() if k not in ("params", "lr"))
                     for g in self.param_groups)

    def _jit_state(self, p, group: dict) -> dict:
        """The Tensors a traced step reads and `copy_`s into (created on first use)."""
        js = self._jit.get(p)
        if js is not None:
            return js
        init = self._init_state(tuple(p.shape), p.dtype, group)
        started = self._needs_started(group)
        s = self.state.get(p)
        fresh = s is None
        if fresh:
            s = init
            if not started:  # zeros are what the first eager step starts from
                self.state[p] = s
        else:
            for k, v in init.items():
                s.setdefault(k, v)
        js = {k: wrap(v) for k, v in s.items() if isinstance(v, np.ndarray)}
        if "step" in s:
            js["step"] = wrap(np.array(float(s["step"])))
        if started:
            js["_started"] = wrap(np.array(0.0 if fresh else 1.0))
        self._jit[p] = js
        return js

    def _sync_from_jit(self) -> None:
        """Make the eager state show what jitted steps did (counters, new entries)."""
        state = self.state
        for p, js in self._jit.items():
            s = state.get(p)
            if s is None:
                st = js.get("_started")
                if st is None or not st._data:
                    continue
                s = state[p] = {k: t._data for k, t in js.items()
                                if k[0] != "_" and k != "step"}
            t = js.get("step")
            if t is not None:
                s["step"] = int(t._data)

    def _sync_to_jit(self, reset: bool = False) -> None:
        """Point the jit's Tensors at the eager arrays and counters (after an eager step;
        with `reset`, after `load_state_dict`, also restart parameters without state)."""
        groups = {id(p): g for g in self.param_groups for p in g["params"]} if reset else {}
        for p, js in self._jit.items():
            s = self.state.get(p)
            if s is None:
                if not reset:
                    continue
                s = self._init_state(tuple(p.shape), p.dtype, groups[id(p)])
                if not self._needs_started(groups[id(p)]):
                    self.state[p] = s
            for k, t in js.items():
                if k == "step":
                    t._data[...] = s.get("step", 0)
                elif k == "_started":
                    t._data[...] = 1.0 if p in self.state else 0.0
                else:
                    a = s.get(k)
                    if a is not None and a is not t._data:
                        t._data = a

    def _buffer(self, like: np.ndarray, slot: int = 0) -> np.ndarray:
        """A scratch array shaped like `like`, a view into a shared flat buffer.

        One buffer per (dtype, slot) serves all parameters in turn, so an update needs
        no fresh allocation yet holds only as much extra memory as the largest tensor.
        """
        key = (like.dtype, slot)
        buf = self._scratch.get(key)
        n = like.size
        if buf is None or buf.size < n:
            buf = np.empty(n, dtype=like.dtype)
            self._scratch[key] = buf
        return buf[:n].reshape(like.shape)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """A copy of the optimiser's state, parameters numbered in group order.

        Example::

            >>> sd = opt.state_dict(); sd["param_groups"][0]["lr"]
            0.01
        """
        if self._jit:
            self._sync_from_jit()
        index = {}
        groups = []
        for g in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {}
        for g in self.param_groups:
            for p in g["params"]:
                s = self.state.get(p)
                if s:
                    state[index[id(p)]] = {k: _export(v) for k, v in s.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore state from `state_dict()`, checked whole before anything changes.

        The groups must match in number and size, and each parameter's state must hold
        exactly the slots this optimiser keeps for it, each with the parameter's shape
        and dtype. A state that does not fit raises an error naming the parameter (its
        index in `state_dict()` numbering), what it got and what was expected, and
        leaves the optimiser as it was.

        Example::

            >>> opt.load_state_dict(saved)
        """
        where = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise op_error(SampanValueError, where, f"{got}",
                           "a dict with 'state' and 'param_groups' (from state_dict())")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise op_error(SampanValueError, where,
                           f"a state with {len(groups)} parameter groups",
                           f"{len(self.param_groups)}, as the optimiser has")
        mapping = {}  # saved index -> (parameter, its group's hyperparameters as loaded)
        loaded_groups = []
        for i, (mine, saved) in enumerate(zip(self.param_groups, groups)):
            if len(mine["params"]) != len(saved["params"]):
                raise op_error(SampanValueError, where,
                               f"a state whose group {i} has {len(saved['params'])} parameters",
                               f"{len(mine['params'])}, as the optimiser's group {i} has")
            hyper = {k: copy.deepcopy(v) for k, v in saved.items() if k != "params"}
            merged = {**mine, **hyper}
            try:
                self._check_group(merged)
            except SampanValueError as e:
                raise op_error(SampanValueError, where, f"hyperparameters in group {i} of the "
                               f"state that {type(self).__name__} refuses ({e})",
                               "valid ones") from None
            loaded_groups.append(hyper)
            for idx, p in zip(saved["params"], mine["params"]):
                if int(idx) in mapping:
                    raise op_error(SampanValueError, where, f"parameter {idx} twice in the "
                                   "state's param_groups", "each parameter once")
                mapping[int(idx)] = (p, merged)
        state = {}
        for idx, saved in state_dict["state"].items():
            entry = mapping.get(int(idx))
            if entry is None:
                raise op_error(SampanValueError, where, f"a state for parameter {idx}, which "
                               "no group holds", f"parameters numbered {sorted(mapping)}")
            state[entry[0]] = self._load_slots(where, int(idx), *entry, saved)
        # every check passed: only now does anything change
        self.state = state
        for mine, hyper in zip(self.param_groups, loaded_groups):
            mine.update(hyper)
        if self._jit:
            self._sync_to_jit(reset=True)

    def _load_slots(self, where: str, idx: int, p: Tensor, group: dict, saved) -> dict:
        """One parameter's saved state, checked against the slots a first step creates."""
        shape, dtype = tuple(p.shape), p.dtype
        param = f"parameter {idx} (shape {shape}, {dtype})"
        if not isinstance(saved, dict):
            raise op_error(SampanValueError, where, f"{type(saved).__name__} as the state of "
                           f"{param}", "a dict of slots")
        try:
            expected = self._init_state(shape, dtype, group)
        except NotImplementedError:  # an optimiser that only writes _update_group
            expected = None
        if expected is not None:
            missing = sorted(set(expected) - set(saved))
            extra = sorted(set(saved) - set(expected))
            if missing or extra:
                raise op_error(
                    SampanValueError, where, f"slots {sorted(saved)} for {param}",
                    f"{sorted(expected)} (what {type(self).__name__} keeps with these "
                    "hyperparameters)", "Is the state from another optimiser or setting?")
        out = {}
        for k, v in saved.items():
            if k == "step":
                out[k] = _load_step(where, param, v)
                continue
            want = None if expected is None else expected[k]
            if not isinstance(want, np.ndarray):
                out[k] = np.array(v.numpy()) if isinstance(v, Tensor) else copy.deepcopy(v)
                continue
            a = v.numpy() if isinstance(v, Tensor) else v
            if not isinstance(a, np.ndarray):
                raise op_error(DTypeError, where, f"slot '{k}' of {param} as a "
                               f"{type(v).__name__}", f"an array of shape {shape}, {dtype}")
            if a.shape != want.shape:
                raise op_error(ShapeError, where, f"slot '{k}' of shape {a.shape} for {param}",
                               f"shape {want.shape}",
                               "Is the state from a model of another size or layout?")
            if a.dtype != want.dtype:
                raise op_error(DTypeError, where, f"slot '{k}' of dtype {a.dtype} for {param}",
                               f"{want.dtype}, the parameter's dtype",
                               "Cast the saved state (or the parameters) first")
            out[k] = np.array(a, copy=True)
        return out

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(g):
                if k != "params":
                    lines.append(f"    {k}: {g[k]}")
        return "\n".join(lines) + "\n)"


def grads_of(opt: Optimizer, group: dict, wd: float = 0.0, maximize: bool = False):
    """``(param, weights, gradient)`` arrays for each parameter of `group` that has a
    gradient, the gradient with L2 weight decay / maximisation applied (`decayed_grad`).

    Example::

        >>> for p, w, g in grads_of(opt, group, wd, maximize): ...
    """
    for p in group["params"]:
        grad = p.grad
        if grad is None:
            continue
        w = p._data
        g = grad._data
        if wd or maximize:
            g = decayed_grad(opt, w, g, wd, maximize)
        yield p, w, g


def decayed_grad(opt: Optimizer, w: np.ndarray, g: np.ndarray, wd: float,
                 maximize: bool) -> np.ndarray:
    """``g + wd*w`` (``-g + wd*w`` when maximising) in scratch slot 0; `g` is left alone.

    Example::

        >>> g = decayed_grad(opt, p._data, p.grad._data, 0.01, False)
    """
    t = opt._buffer(g, 0)
    if wd:
        np.multiply(w, wd, out=t)
        if maximize:
            np.subtract(t, g, out=t)
        else:
            np.add(g, t, out=t)
    else:
        np.negative(g, out=t)
    return t


def _lr_of(group):
    return np.array(float(group["lr"]))


def _export(v):
    if isinstance(v, np.ndarray):
        return Tensor(v.copy())
    return copy.deepcopy(v)


def _load_step(where: str, param: str, v) -> int:
    """A saved step counter: a non-negative whole number (int, numpy or 0-d array)."""
    a = np.asarray(v.numpy() if isinstance(v, Tensor) else v)
    whole = a.dtype.kind in "iu" or (a.dtype.kind == "f" and bool(np.isfinite(a))
                                      and float(a).is_integer())
    if a.shape != () or not whole or a < 0:
        raise op_error(SampanValueError, where, f"step {v!r} for {param}",
                       "a whole number >= 0")
    return int(a)
