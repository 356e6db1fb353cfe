"""The one reader of saved programs: `SavedProgram.read(path)` is a program folder
written by `sampan.jit.save` (or `sampan.quant.quantize_program`), read and verified
(`serialize.read`: checksums, format version, meta.json against the graph, the IR),
with what every consumer asks of it answered in one place: the call's arguments and
their names, the fixed inputs (weights, frozen feeds), the example inputs, the outputs
and their names, the output tree of a call, the size guards. The Predictor, `sampan
deploy`, `sampan.quant`, ONNX export of a saved program and the CLI read through it;
`load(path)` makes a callable `Loaded` of it.

Example::

    >>> p = SavedProgram.read("m.sampan")
    >>> p.input_names, p.output_names, p.guards
    (['x'], ['output_0'], [])
    >>> y = sampan.jit.load("m.sampan")(x)
"""
from __future__ import annotations

import os

from ..errors import SampanError
from ..tensor import Tensor, wrap
from . import dynamic as _dyn
from . import pytree
from .serialize import read


class SavedProgram:
    """A verified saved program (see the module doc). Unpacks as (graph, meta, arrays),
    what `serialize.read` returns."""

    def __init__(self, path, graph, meta, arrays):
        self.path = os.fspath(path)
        self.graph, self.meta, self.arrays = graph, meta, arrays

    @classmethod
    def read(cls, path) -> "SavedProgram":
        """Read and verify `path`; `LoadError` for a missing, damaged or foreign one."""
        return cls(path, *read(path))

    def __iter__(self):
        return iter((self.graph, self.meta, self.arrays))

    # ------------------------------------------------------------------ inputs
    @property
    def n_args(self) -> int:
        """How many tensors a call takes (the leaves of its arguments)."""
        return self.meta["n_args"]

    @property
    def arg_positions(self) -> list:
        """The graph input positions that are the call's arguments."""
        return [p for p, s in enumerate(self.meta["inputs"]) if s["kind"] == "arg"]

    @property
    def arg_names(self) -> list:
        """A name per tensor of the call, in call order (`input_k` for programs saved
        before names were kept)."""
        n, names = self.n_args, self.meta.get("arg_names")
        if (isinstance(names, list) and len(names) == n
                and all(isinstance(s, str) for s in names) and len(set(names)) == n):
            return names
        return [f"input_{i}" for i in range(n)]

    @property
    def input_names(self) -> list:
        """The names of `arg_positions`, in graph order."""
        names, ins = self.arg_names, self.meta["inputs"]
        return [names[ins[p]["index"]] for p in self.arg_positions]

    def fixed_inputs(self) -> list:
        """Per graph input, its stored array (weights, frozen feeds, generator states);
        None for the call's arguments."""
        return [None if s["kind"] == "arg" else self.arrays[s["key"]]
                for s in self.meta["inputs"]]

    @property
    def example_arrays(self) -> tuple:
        """The arrays the program was traced with, in call order."""
        return tuple(self.arrays[f"example.{i}"] for i in range(self.n_args))

    def example_feed(self) -> list:
        """Per graph input, the array of the traced call (examples for the arguments)."""
        return [self.arrays[f"example.{s['index']}"] if s["kind"] == "arg"
                else self.arrays[s["key"]] for s in self.meta["inputs"]]

    # ------------------------------------------------------------------ outputs
    @property
    def out_positions(self) -> list:
        """The graph output positions a call returns (its "out" leaves, in leaf order)."""
        return [p for p, k in enumerate(self.meta["outputs"]) if k == "out"]

    @property
    def out_consts(self) -> list:
        """Outputs the trace returned as concrete arrays (copied into each result)."""
        return [self.arrays[f"outconst.{i}"] for i in range(self.meta.get("n_outconst", 0))]

    def output_leaves(self) -> list:
        """[(graph output position, name)] of the call's outputs, named by where they sit
        in the returned structure ("output_0", "logits", "output_1.0")."""
        outs = self.out_positions
        return [(outs[leaf], name) for leaf, name in pytree.leaf_names(self.meta["out_tree"])]

    @property
    def output_names(self) -> list:
        return [name for _, name in self.output_leaves()]

    def unflatten(self, out_leaves, out_consts=None):
        """The structure the traced function returned, from the call's "out" leaves."""
        consts = self.out_consts if out_consts is None else out_consts
        return pytree.from_json(self.meta["out_tree"], list(out_leaves), consts)

    # ------------------------------------------------------------------ sizes
    @property
    def symbolic(self) -> bool:
        """Whether the graph has symbolic dims (saved with `dynamic=`)."""
        return bool(_dyn.symbols_of(self.graph))

    @property
    def guards(self) -> list:
        """The size conditions the program was traced under (`ir.symbolic.Guard`s)."""
        return _dyn.guards_from_json(self.meta.get("guards", []), f"saved program {self.path}")

    @property
    def example_sizes(self) -> dict:
        """{symbol: size} at the example inputs (sizes the program is known to run at)."""
        from .serialize import _example_sizes
        return _example_sizes(self.graph, self.meta, self.arrays) if self.symbolic else {}

    def at_example_sizes(self):
        """The graph, concrete at the example inputs' sizes where it is symbolic."""
        from .serialize import _at_example_sizes
        return _at_example_sizes(self.graph, self.meta, self.arrays)


class Loaded(SavedProgram):
    """A loaded program: call it like the original function (tensors in, tensors out)."""

    def __init__(self, path, graph, meta, arrays, debug=False):
        from ..passes import PassManager
        from ..runtime import compile_graph
        super().__init__(path, graph, meta, arrays)
        path = self.path
        self.symbolic = bool(_dyn.symbols_of(graph))
        if self.symbolic:   # symbolic dims: compiled per concrete size (jit/dynamic.py)
            self.compiled = _dyn.SymbolicProgram(graph, self.arg_positions, debug=debug,
                                                 label=f"saved program {path}",
                                                 guards=self.guards)
        else:
            g = PassManager(["plan_memory"]).run(graph)
            self.compiled = compile_graph(g, debug=debug)
        self.out_consts = SavedProgram.out_consts.fget(self)

    symbolic = False      # set per instance (a plain attribute over the property)
    out_consts = ()

    @property
    def code(self) -> str:
        """The generated source (of the most recent concrete size, for symbolic dims)."""
        return self.compiled.code

    @property
    def example_inputs(self):
        return tuple(wrap(a) for a in self.example_arrays)

    def input_arrays(self, args):
        leaves = pytree.leaves_of((tuple(args), {}))
        if len(leaves) != self.meta["n_args"]:
            raise SampanError(f"saved program {self.path}: got {len(leaves)} tensor inputs; "
                              f"expected {self.meta['n_args']}")
        sizes = {}
        if self.symbolic:
            by_pos = {i: leaves[spec["index"]]._data
                      for i, spec in enumerate(self.meta["inputs"]) if spec["kind"] == "arg"}
            sizes = self.compiled.sizes_of(by_pos)
        out = []
        for spec, v in zip(self.meta["inputs"], self.graph.inputs):
            if spec["kind"] == "arg":
                a = leaves[spec["index"]]._data
                if not _dyn.fits(a.shape, v.shape, sizes) or a.dtype != v.dtype:
                    raise SampanError(
                        f"saved program {self.path}: input {spec['index']} is "
                        f"{a.dtype}{list(a.shape)}; expected {v.type_str()}")
                out.append(a)
            else:
                out.append(self.arrays[spec["key"]])
        return out

    def __call__(self, *args):
        args = tuple(a if isinstance(a, Tensor) else Tensor(a) for a in args)
        outs = self.compiled(*self.input_arrays(args))
        leaves = [wrap(a) for kind, a in zip(self.meta["outputs"], outs) if kind == "out"]
        return self.unflatten(leaves)


def load(path, debug: bool = False) -> Loaded:
    """Load a program written by `sampan.jit.save`; verifies checksums, format version
    and the IR. Example: ``m = sampan.jit.load("m.sampan"); y = m(x)``"""
    g, meta, arrays = read(path)
    return Loaded(os.fspath(path), g, meta, arrays, debug=debug)
