"""Slots: what each input and output of a traced graph is in the call.

An input slot is ("arg", leaf index), ("state", tensor), ("grad", ref), ("feed", getter)
or ("rng", generator); a `ref` names a tensor as ("arg", leaf index) or as the tensor
itself. Output slots are ("out", None), ("res", None) and the same state kinds."""
from __future__ import annotations

import numpy as np


def target(ref, args):
    """The tensor `ref` names in a call whose tensor leaves are `args`."""
    return args[ref[1]] if isinstance(ref, tuple) else ref


def ref_of(tr, t):
    """How the slots name lifted tensor `t` of Tracer `tr`."""
    L = tr.lifted[id(t)]
    slot = tr.slots[tr.g.inputs.index(L.value)]
    return ("arg", slot[1]) if slot[0] == "arg" else t


def fix(slots):
    """Slots with every grad ref in one form (("arg", i) or the tensor)."""
    # grad slots point at ("arg", i) or at a tensor, like state slots
    out = []
    for kind, ref in slots:
        if kind == "grad" and isinstance(ref, tuple) and ref[0] == "arg":
            ref = ("arg", ref[1])
        out.append((kind, ref))
    return out


def input_arrays(slots, args) -> list:
    """The arrays to call a traced graph with: one per input slot, for a call whose
    tensor leaves are `args`."""
    arrays = []
    for kind, ref in slots:
        if kind == "arg":
            arrays.append(args[ref]._data)
        elif kind == "state":
            arrays.append(ref._data)
        elif kind == "grad":
            arrays.append(target(ref, args).grad._data)
        elif kind == "feed":
            arrays.append(ref())
        else:
            arrays.append(np.array([ref.seed, ref.counter], np.int64))
    return arrays
