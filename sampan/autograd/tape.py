"""Tape nodes: one per recorded op call.

A node keeps the op, its input tensors and their graph edges, its attributes, and
(weakly) its outputs.
It holds the versions of the tensors its gradient rule reads, so that changing one
of them in place before backward raises instead of giving a wrong gradient. Which
inputs those are is the op's `saves`: all of them, a fixed list, or (per input) the
inputs the gradient of each input reads, counted only for inputs that need one, so
that ``q = a * 2; q *= 0.5`` saves the constant and not `q`.
"""
from __future__ import annotations

import weakref

import numpy as np


class Node:
    __slots__ = ("op", "inputs", "edges", "attrs", "outs", "out_versions", "out_data", "saved",
                 "out_specs", "hooks", "freed", "__weakref__")

    def __init__(self, op, inputs, attrs, outs):
        # the hot path of recording: plain loops and tuples, no generators
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        # where each input's gradient goes, fixed now: an in-place op may later give the
        # same Tensor object a new history, which must not redirect this node's gradients
        # Flat (node_0, slot_0, node_1, slot_1, ...): slot is the output index for an input
        # made by a node, the tensor itself for a leaf that requires grad, else None. One
        # tuple per node keeps allocations (and so cyclic-GC work) per recorded op low.
        if len(inputs) == 2:
            a, b = inputs
            ma, mb = a._node, b._node
            self.edges = (ma, a._idx if ma is not None else (a if a.requires_grad else None),
                          mb, b._idx if mb is not None else (b if b.requires_grad else None))
        else:
            edges = []
            for t in inputs:
                m = t._node
                edges.append(m)
                edges.append(t._idx if m is not None else (t if t.requires_grad else None))
            self.edges = tuple(edges)
        # versions of the inputs the gradient rule reads (all of them when saves is None)
        saves = op.saves
        if saves is None:  # a tuple of ints: the cyclic GC stops tracking it
            if len(inputs) == 2:
                a, b = inputs
                self.saved = (a._version if a._base is None else a._base._version,
                              b._version if b._base is None else b._base._version)
            else:
                self.saved = tuple([t._version if t._base is None else t._base._version
                                    for t in inputs])
        elif op.saves_per_input:
            # ((i, version), ...) for the inputs read by the gradients that will be computed;
            # which inputs those are depends only on which inputs require grad (cached per op)
            if len(inputs) == 2:
                key = (inputs[0].requires_grad, inputs[1].requires_grad)
            else:
                key = tuple([t.requires_grad for t in inputs])
            read = op.saves_read.get(key)
            if read is None:
                read = op.saves_read[key] = tuple(sorted(
                    {i for need, reads in zip(key, saves) if need for i in reads}))
            if len(read) == 1:
                i = read[0]
                t = inputs[i]
                self.saved = ((i, t._version if t._base is None else t._base._version),)
            else:
                self.saved = tuple([(i, _ver(inputs[i])) for i in read]) or None
        elif saves:
            self.saved = tuple([_ver(inputs[i]) for i in saves])
        else:
            self.saved = None
        if op.save_output:
            # outputs are held weakly (a strong reference would make a cycle with y._node);
            # their arrays stay alive, so an output the user dropped can be re-wrapped
            if len(outs) == 1:
                y = outs[0]
                self.outs = (weakref.ref(y),)
                self.out_versions = (y._version,)
                self.out_data = (y._data,)
            else:
                self.outs = tuple([weakref.ref(y) for y in outs])
                self.out_versions = tuple([y._version for y in outs])
                self.out_data = tuple([y._data for y in outs])
        else:
            self.outs = None
        self.out_specs = None if len(outs) == 1 else [(y._data.shape, y._data.dtype)
                                                      for y in outs]
        self.hooks = None
        self.freed = False

    def saved_pairs(self):
        """(tensor, version recorded) for everything the gradient rule reads."""
        pairs = []
        if self.saved is not None:
            if self.op.saves_per_input:
                pairs += [(self.inputs[i], v) for i, v in self.saved]
            else:
                idx = self.op.saves if self.op.saves is not None else range(len(self.inputs))
                pairs += [(self.inputs[i], v) for i, v in zip(idx, self.saved)]
        if self.outs is not None:
            pairs += [(r(), v) for r, v in zip(self.outs, self.out_versions) if r() is not None]
        return pairs

    def output(self, i):
        """Output i as a Tensor: the live one, or its saved array re-wrapped.

        A re-wrapped output keeps its place in the graph (output i of this node), so a
        gradient rule that reads it stays differentiable: double backward of
        ``eigh(A).eigenvectors`` reaches A through the eigenvalues the user dropped too
        (a detached copy silently lost that term). It is held weakly, as the live one."""
        y = self.outs[i]()
        if y is None:
            from ..ops.registry import STATE
            from ..tensor import _FLOATS, wrap
            y = wrap(self.out_data[i])
            if STATE.grad_enabled and y._data.dtype in _FLOATS:   # create_graph=True
                y._node, y._idx, y.requires_grad = self, i, True
                self.outs = self.outs[:i] + (weakref.ref(y),) + self.outs[i + 1:]
                self.out_versions = (self.out_versions[:i] + (y._version,)
                                     + self.out_versions[i + 1:])
        return y

    def rebind_output(self, i, t):
        """An in-place op made `t` the tensor holding output i (the rule reads it now)."""
        if self.outs is None:
            return
        b = t._base if t._base is not None else t
        self.outs = self.outs[:i] + (weakref.ref(t),) + self.outs[i + 1:]
        self.out_versions = self.out_versions[:i] + (b._version,) + self.out_versions[i + 1:]
        self.out_data = self.out_data[:i] + (t._data,) + self.out_data[i + 1:]

    def preserve_input(self, t):
        """An in-place op is about to overwrite `t`, which this node's gradient rule reads
        (``y.mul_(u)`` reads the old `y` for u's gradient): read a copy of its old value
        instead, at `t`'s old place in the graph (so double backward still reaches it)."""
        if self.saved is None or self.freed:
            return
        if self.op.saves_per_input:
            idx = [i for i, _ in self.saved]
        else:
            idx = self.op.saves if self.op.saves is not None else range(len(self.inputs))
        hit = [i for i in idx if self.inputs[i] is t]
        if not hit:
            return
        from ..tensor import Tensor
        d = t._data
        snap = object.__new__(Tensor)
        # traced: the old Value stays valid (SSA), only eager arrays need a copy
        snap._data = d.copy() if type(d) is np.ndarray else d
        snap._node, snap._idx, snap.requires_grad = t._node, t._idx, t.requires_grad
        inputs = list(self.inputs)
        for i in hit:
            inputs[i] = snap
        self.inputs = tuple(inputs)
        if self.op.saves_per_input:
            self.saved = tuple([(i, 0 if i in hit else v) for i, v in self.saved])
        else:
            self.saved = tuple([0 if i in hit else v for i, v in zip(idx, self.saved)])

    def add_hook(self, idx, fn):
        """Call fn on output idx's gradient; returns its RemovableHandle."""
        from .hooks import RemovableHandle
        if self.hooks is None:
            self.hooks = {}
        hooks = self.hooks.setdefault(idx, {})
        h = RemovableHandle(hooks)
        hooks[h.id] = fn
        return h

    def name(self):
        return self.op.name

    def __repr__(self):
        return f"<{self.op.name}Backward>"


def _ver(t):
    b = t._base
    return (b if b is not None else t)._version


def bump_version(t):
    """Record that `t`'s storage was modified in place."""
    b = t._base
    if b is not None:
        b._version += 1
    else:
        t._version += 1
