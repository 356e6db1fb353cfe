"""`sampan deploy`: a saved program as ONE generated Python file that needs numpy alone.

The file holds the kernels of exactly the ops the program uses (the op table's own numpy
kernels, copied as source with the helpers they call, `sampan.deploy.kernelsource`; ufunc
ops bind numpy's ufunc), the program as
straight-line code, one line per IR node with the IR line as a comment (a control-flow
node, `cond` / `while_loop` / `scan`, as a real `if`/`else`, `while` or `for` around its
blocks' lines), and a loader for
its weights: `weights.npz`, read with `np.load(allow_pickle=False)` after its sha256 is
checked against the one recorded in the file. Symbolic dims of `sampan.jit.save(...,
dynamic=...)` are bound per call from the inputs' shapes and substituted into the shape
attributes (as `sampan.jit.dynamic.concrete` does), so one module serves every batch size.

It reproduces sampan's numpy runtime bit for bit: the program compiled by
`sampan.runtime` with the op table's numpy kernels (numba absent, so fused nodes run their
bodies op by op and no kernel takes a numba path), memory plan included (a planned matmul
of a non-contiguous batch is a batched product, as there).

Nothing read from the program (its folder name, graph.ir, meta.json) is pasted into the
file: every name, keyword, literal, comment and docstring is made by
`sampan.runtime.emit`, which writes only identifiers it checked or made and literals it
formatted, and refuses anything else with a `DeployError`; the folder name appears in the
module docstring as escaped text that reads back as itself.

`generate(..., target="c")` writes a C library instead (`sampan.deploy.c`: model.h,
model.c with only the kernels the program uses, weights.bin, a Makefile and a driver);
`report(dir)` summarises such a folder.

Example::

    >>> sampan.jit.save(model, "m.sampan", (x,), dynamic="batch")
    >>> sampan.deploy.generate("m.sampan", "out")      # or: sampan deploy m.sampan -o out
    >>> # elsewhere, numpy only: import model; y = model.load()(x_array)
"""
from .generate import DeployError, Generated, generate, package_bytes, supported_ops
from .c.report import Report, report

__all__ = ["generate", "Generated", "DeployError", "supported_ops", "package_bytes", "report",
           "Report"]
