"""Input and output trees: the nested tuples, lists, dicts and named tuples a traced
function takes and returns, with its tensors as numbered leaves.

`flatten(obj, leaves)` appends the tensors of `obj` to `leaves` and returns the hashable
structure (part of a jit cache key); `unflatten(tree, leaves)` builds it back.
`to_json`/`from_json` are the form a saved program's meta.json keeps ("out_tree"), and
`check_json` is what a load checks of it.

Example::

    >>> leaves = []
    >>> tree = flatten((x, {"b": [y, 3]}), leaves)
    >>> unflatten(tree, leaves)[1]["b"][1]
    3
"""
from __future__ import annotations

import numpy as np

from ..errors import SampanError
from ..tensor import Tensor, wrap


def flatten(obj, leaves: list):
    """Structure of `obj` with tensors replaced by leaf numbers (hashable)."""
    if isinstance(obj, Tensor):
        leaves.append(obj)
        return ("T", len(leaves) - 1)
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):   # x.max(dim=1)'s result
        return ("ntuple", tuple(flatten(x, leaves) for x in obj), type(obj))
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, flatten(obj[k], leaves)) for k in obj))
    if isinstance(obj, np.ndarray):
        raise SampanError("sampan.jit: pass tensors, not numpy arrays (sampan.from_numpy(a))")
    try:
        hash(obj)
        return ("S", obj)
    except TypeError:
        return ("S", repr(obj))


def leaves_of(obj) -> list:
    """The tensors of `obj`, in `flatten`'s order."""
    out: list = []
    flatten(obj, out)
    return out


def unflatten(tree, leaves):
    """`flatten`'s structure `tree` with leaf k as `leaves[k]`."""
    kind = tree[0]
    if kind == "T":
        return leaves[tree[1]]
    if kind in ("tuple", "list"):
        xs = [unflatten(t, leaves) for t in tree[1]]
        return tuple(xs) if kind == "tuple" else xs
    if kind == "ntuple":
        return tree[2](*[unflatten(t, leaves) for t in tree[1]])
    if kind == "dict":
        return {k: unflatten(t, leaves) for k, t in tree[1]}
    return tree[1]        # "S" a static value, "C" a concrete tensor returned as it is


def renumber(tree, leaves, final):
    """`tree` with leaf k renumbered `final[k]`, or kept as the concrete tensor
    `leaves[k]` ("C") where `final[k]` is None (returned from outside the trace)."""
    kind = tree[0]
    if kind == "T":
        i = final[tree[1]]
        return ("C", leaves[tree[1]]) if i is None else ("T", i)
    if kind in ("tuple", "list"):
        return (kind, tuple(renumber(t, leaves, final) for t in tree[1]))
    if kind == "ntuple":
        return (kind, tuple(renumber(t, leaves, final) for t in tree[1]), tree[2])
    if kind == "dict":
        return (kind, tuple((k, renumber(t, leaves, final)) for k, t in tree[1]))
    return tree


# ---------------------------------------------------------------------- saved form
def to_json(tree, consts: list):
    """`tree` as JSON data; concrete tensors are appended to `consts` (saved as arrays)."""
    kind = tree[0]
    if kind == "T":
        return {"t": tree[1]}
    if kind in ("tuple", "list", "ntuple"):   # a named tuple is saved as a plain tuple
        name = "tuple" if kind == "ntuple" else kind
        return {name: [to_json(t, consts) for t in tree[1]]}
    if kind == "dict":
        return {"dict": [[k, to_json(t, consts)] for k, t in tree[1]]}
    if kind == "C":
        consts.append(tree[1]._data)
        return {"const": len(consts) - 1}
    v = tree[1]
    return {"static": v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)}


def from_json(j, leaves, consts):
    """The output of one call: `to_json`'s data with leaf k as `leaves[k]` and each saved
    constant a new tensor (a copy: changing a result cannot change the next one)."""
    return decode_tree(j, leaves, lambda i: wrap(consts[i].copy()))


# `decode_tree` and `tree_key` use nothing but Python: `sampan deploy` copies them into the
# standalone module it writes, so that it decodes outputs exactly as sampan does.
def decode_tree(j, leaves, const):
    """`to_json` data with leaf k as `leaves[k]` and saved constant i as `const(i)`."""
    if "t" in j:
        return leaves[j["t"]]
    if "tuple" in j:
        return tuple(decode_tree(x, leaves, const) for x in j["tuple"])
    if "list" in j:
        return [decode_tree(x, leaves, const) for x in j["list"]]
    if "dict" in j:
        return {tree_key(k): decode_tree(x, leaves, const) for k, x in j["dict"]}
    if "const" in j:
        return const(j["const"])
    return j["static"]


def tree_key(k):
    """A dict key as JSON gave it back (a tuple key comes back as a list)."""
    return tuple(tree_key(x) for x in k) if isinstance(k, list) else k


def leaf_names(j) -> list:
    """[(leaf, name)] of `to_json` data: "output_0", "output_1.2", a dict's keys; all
    "output_k" when the names would repeat (the Predictor's output names)."""
    found = []

    def walk(j, prefix):
        if "t" in j:
            found.append((j["t"], prefix or "output_0"))
        elif "tuple" in j or "list" in j:
            for i, x in enumerate(j.get("tuple", j.get("list"))):
                walk(x, f"{prefix}.{i}" if prefix else f"output_{i}")
        elif "dict" in j:
            for k, x in j["dict"]:
                walk(x, f"{prefix}.{k}" if prefix else str(k))
    walk(j, "")
    if len({n for _, n in found}) != len(found):
        found = [(t, f"output_{i}") for i, (t, _) in enumerate(found)]
    return found


def check_json(j, n_out, n_const, need, depth=0):
    """Check `to_json` data read from a file: `need(ok, what)` raises where not ok."""
    need(depth < 200 and isinstance(j, dict) and len(j) == 1,
         f"'out_tree' node {j!r} must be an object of one field")
    (kind, x), = j.items()
    if kind == "t":
        need(type(x) is int and 0 <= x < n_out, f"'out_tree' leaf {x!r} must be below {n_out}")
    elif kind == "const":
        need(type(x) is int and 0 <= x < n_const,
             f"'out_tree' constant {x!r} must be below {n_const}")
    elif kind in ("tuple", "list"):
        need(isinstance(x, list), f"'out_tree' {kind} must be a list")
        for y in x:
            check_json(y, n_out, n_const, need, depth + 1)
    elif kind == "dict":
        need(isinstance(x, list) and all(isinstance(p, list) and len(p) == 2 for p in x),
             "'out_tree' dict must be a list of [key, tree] pairs")
        for k, y in x:
            need(not isinstance(k, dict), f"'out_tree' dict key {k!r} must be a plain value")
            check_json(y, n_out, n_const, need, depth + 1)
    else:
        need(kind == "static" and not isinstance(x, (list, dict)),
             f"'out_tree' node kind {kind!r} is unknown")
