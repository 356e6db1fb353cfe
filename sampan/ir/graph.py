"""Graph, Node and Value: the SSA program that jit traces, passes rewrite and the
runtime compiles.

A Value is defined exactly once: as a graph input, as a constant, or as an output
of one Node. It carries shape (ints, or str for symbolic dims) and dtype, so a
Value can stand in for an array while tracing (`Tensor._data` may be a Value).
A Node names an op of the table (`sampan.ops.registry.OPS`), its input Values,
plain-data attributes and the user source line that created it; a control-flow node
(`cond`, `while_loop`, `scan`: sampan/ops/control.py) also holds `blocks`, nested Graphs
that read nothing from the enclosing graph (`Graph.walk()` visits a graph and all of
them).

Example::

    >>> g = Graph()
    >>> x = g.add_input((2, 3), "float32")
    >>> (y,) = g.add_node("relu", [x], {}).outputs
    >>> g.outputs = [y]
    >>> print(g)
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import TracingError
from .printer import fmt_lit, print_graph


class Value:
    """One SSA value: shape, dtype and where it comes from (input, const, or node)."""

    __slots__ = ("id", "shape", "dtype", "node", "index", "const", "name", "__weakref__")

    def __init__(self, vid, shape, dtype, node=None, index=0, const=None, name=None):
        self.id = vid
        self.shape = tuple(shape)
        self.dtype = _dt.as_dtype(dtype)
        self.node = node          # producing Node, or None for inputs and constants
        self.index = index        # which output of `node`
        self.const = const        # ndarray for constants
        self.name = name          # input names / constant names (optional)

    # array-like facade used while tracing (Tensor code reads these)
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d if isinstance(d, int) else 1
        return n

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __array__(self, *a, **k):
        raise TracingError(
            f"sampan.jit: numpy was called on a traced value ({self.type_str()}); code that "
            "works on `tensor._data` with numpy directly (e.g. an eager optimiser updating "
            "p._data in place) cannot be traced: use sampan ops (p.sub_(...), "
            "sampan.optim.functional) inside jitted functions")

    def __len__(self):
        return self.shape[0]

    @property
    def is_const(self):
        return self.const is not None

    def type_str(self):
        return f"{_dt.short_name(self.dtype)}[{','.join(map(str, self.shape))}]"

    def __repr__(self):
        return f"%{self.id}: {self.type_str()}"


class Node:
    """One op application: `outputs = op(*inputs, **attrs)`, created at `loc`."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "loc", "meta", "blocks")

    def __init__(self, op, inputs, attrs, loc="", blocks=()):
        self.op = op              # op name in the table
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.outputs = []
        self.loc = loc
        self.meta = {}
        # nested Graphs of a control-flow node (cond: [then, else]; while_loop: [cond,
        # body]; scan: [body]); empty for every other op. A block reads nothing from the
        # enclosing graph: what it needs is an input of the node (sampan/ops/control.py)
        self.blocks = list(blocks)

    @property
    def output(self):
        return self.outputs[0]

    def __repr__(self):
        return f"<Node {self.op} -> {', '.join(repr(v) for v in self.outputs)}>"


class Graph:
    """An SSA program: inputs, constants, nodes in execution order, outputs."""

    def __init__(self, name="main"):
        self.name = name
        self.inputs: list[Value] = []
        self.consts: list[Value] = []
        self.nodes: list[Node] = []
        self.outputs: list[Value] = []
        self.meta: dict = {}      # pass results, e.g. the memory plan
        self._next = 0

    # ------------------------------------------------------------------ building
    def _new_id(self):
        self._next += 1
        return self._next - 1

    def add_input(self, shape, dtype, name=None) -> Value:
        v = Value(self._new_id(), shape, dtype, name=name)
        self.inputs.append(v)
        return v

    def add_const(self, array, name=None) -> Value:
        """A new constant; a `name` another constant of the graph has is made unique
        (`const_name`), since a saved program stores named constants by name."""
        a = np.asarray(array)
        if name is not None:
            name = self.const_name(name)
        v = Value(self._new_id(), a.shape, a.dtype, const=a, name=name)
        self.consts.append(v)
        return v

    def const_name(self, base: str, taken=None) -> str:
        """`base`, or `base.1`, `base.2` ... : the first name no constant of the graph (nor
        `taken`, a set of names) has. Names are allocated here, by the graph, not from
        value ids: a parsed graph keeps the names of the graph it was printed from, which
        ids of new constants would repeat."""
        if taken is None:
            taken = {c.name for c in self.consts if c.name is not None}
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}.{k}"
        return name

    def add_node(self, op, inputs, attrs, out_specs=None, loc="", blocks=None) -> Node:
        """Append a node; output types come from the op's shape rule unless given.
        `blocks`: the nested Graphs of a control-flow node (its shape rule reads them)."""
        n = Node(op, inputs, attrs, loc, blocks or ())
        if out_specs is None:
            out_specs = infer(op, inputs, attrs, n.blocks)
        for i, s in enumerate(out_specs):
            n.outputs.append(Value(self._new_id(), s.shape, s.dtype, node=n, index=i))
        self.nodes.append(n)
        return n

    # ------------------------------------------------------------------ queries
    def values(self):
        yield from self.inputs
        yield from self.consts
        for n in self.nodes:
            yield from n.outputs

    def walk(self):
        """This graph, then every nested block (depth first), each once."""
        yield self
        for n in self.nodes:
            for b in n.blocks:
                yield from b.walk()

    def users(self) -> dict:
        """Map value id -> list of nodes that read it."""
        u = {}
        for n in self.nodes:
            for v in n.inputs:
                u.setdefault(v.id, []).append(n)
        return u

    def replace_all_uses_with(self, old: Value, new: Value) -> None:
        """Every node input and graph output reading `old` reads `new` instead."""
        for n in self.nodes:
            n.inputs = [new if v is old else v for v in n.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]

    def splice(self, replace: dict, rename: dict) -> None:
        """Rewrite the node list in one sweep, as the rewriting passes end: a node whose
        ``id()`` is a key of `replace` gives way, where it stood, to the nodes of
        ``replace[id(node)]`` (a list; empty drops it); every node's inputs and the graph's
        outputs read ``rename[value.id]`` where that id is a key (the replaced values'
        successors); constants that nothing reads any more are dropped. Replacement nodes
        must only read values defined before the node they take the place of."""
        nodes = []
        for n in self.nodes:
            nodes.extend(replace.get(id(n), (n,)))
        for n in nodes:
            n.inputs = [rename.get(v.id, v) for v in n.inputs]
        self.nodes = nodes
        self.outputs = [rename.get(v.id, v) for v in self.outputs]
        self.prune_consts()

    def prune_consts(self):
        """Drop constants no node or output reads."""
        used = {v.id for n in self.nodes for v in n.inputs} | {v.id for v in self.outputs}
        self.consts = [c for c in self.consts if c.id in used]

    def copy(self) -> "Graph":
        """A deep structural copy (constant arrays are shared: they are never mutated)."""
        g = Graph(self.name)
        g._next = self._next
        m = {}
        for v in self.inputs:
            m[v.id] = nv = Value(v.id, v.shape, v.dtype, name=v.name)
            g.inputs.append(nv)
        for v in self.consts:
            m[v.id] = nv = Value(v.id, v.shape, v.dtype, const=v.const, name=v.name)
            g.consts.append(nv)
        for n in self.nodes:
            nn = Node(n.op, [m[v.id] for v in n.inputs], n.attrs, n.loc,
                      [b.copy() for b in n.blocks])
            nn.meta = dict(n.meta)
            for v in n.outputs:
                m[v.id] = nv = Value(v.id, v.shape, v.dtype, node=nn, index=v.index)
                nn.outputs.append(nv)
            g.nodes.append(nn)
        g.outputs = [m[v.id] for v in self.outputs]
        g.meta = dict(self.meta)
        return g

    # ------------------------------------------------------------------ text, equality
    def __str__(self):
        return print_graph(self)

    def __repr__(self):
        return f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes>"

    def _canon(self):
        ren = {}

        def r(v):
            return ren[v.id]
        for v in self.inputs:
            ren[v.id] = len(ren)
        for v in self.consts:
            ren[v.id] = len(ren)
        ins = tuple((v.shape, v.dtype, v.name) for v in self.inputs)
        cs = tuple((v.shape, v.dtype, v.const.tobytes()) for v in self.consts)
        nodes = []
        for n in self.nodes:
            args = tuple(r(v) for v in n.inputs)
            for v in n.outputs:
                ren[v.id] = len(ren)
            nodes.append((n.op, args, _attrs_key(n.attrs), n.loc,
                          tuple((v.shape, v.dtype) for v in n.outputs),
                          tuple((b.name, b._canon()) for b in n.blocks)))
        return ins, cs, tuple(nodes), tuple(r(v) for v in self.outputs)

    def __eq__(self, other):
        return isinstance(other, Graph) and self._canon() == other._canon()

    __hash__ = None

    def to_dot(self, **kw) -> str:
        """Graphviz DOT text (see `sampan.ir.viz.to_dot`)."""
        from .viz import to_dot
        return to_dot(self, **kw)

    def nbytes_consts(self):
        return sum(v.const.nbytes for g in self.walk() for v in g.consts)


def _attrs_key(attrs):
    # as the text writes them: repr() spells every NaN "nan", so -nan would equal nan
    try:
        return tuple((k, fmt_lit(a)) for k, a in sorted(attrs.items()))
    except Exception:  # not plain data (the verifier reports it): compare its repr
        return repr(sorted(attrs.items()))


def spec_of(v):
    from ..ops.registry import Spec
    return Spec(tuple(v.shape), v.dtype)


def infer(op, inputs, attrs, blocks=()):
    """Output Specs of `op` on `inputs` by its shape rule (a control-flow op's rule also
    reads its `blocks`)."""
    from ..ops.registry import get_op
    od = get_op(op)
    if blocks:
        out = od.shape_rule(*[spec_of(v) for v in inputs], blocks=blocks, **attrs)
    else:
        out = od.shape_rule(*[spec_of(v) for v in inputs], **attrs)
    return list(out) if od.n_out != 1 else [out]
