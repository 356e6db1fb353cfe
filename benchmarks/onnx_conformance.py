"""ONNX node conformance: sampan and onnxruntime on the same cases, in the same run.

Every case that `onnx.backend.test.loader.load_model_tests(kind="node")` generates runs
through `sampan.onnx.backend` and through `onnxruntime.backend`, each compared by the onnx
runner's rule (output count, shapes, dtypes, the case's own rtol/atol). Prints one JSON
line per op type, then one total per system, then the op types sampan does not support
with the reason; every line records the machine and the versions. sampan builds static
graphs: a case that feeds axes or a shape as a graph input runs with the fed values bound
as constants (`SampanRep`), and the lines count those passes apart as well.

    python benchmarks/onnx_conformance.py            # all op types
    python benchmarks/onnx_conformance.py Relu Conv  # only these op types
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from common import ROOT, blas_info

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

def machine() -> dict:
    """The CPU model, its AVX-512/AMX flags, core count and the versions that ran."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags = set(line.split(":", 1)[1].split())
                if cpu and flags:
                    break
    except OSError:
        pass
    import numpy
    import onnx
    import onnxruntime
    import sampan
    return {"cpu": cpu, "avx512": "avx512f" in flags, "amx": "amx_tile" in flags,
            "cores": os.cpu_count(), "python": platform.python_version(),
            "sampan": getattr(sampan, "__version__", "?"), "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
            **blas_info()}


def _progress(system):
    t0 = time.perf_counter()

    def show(i, n):
        if i % 100 == 0 or i == n:
            print(f"# {system}: {i}/{n} cases, {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
    return show


def _dtype_names(case):
    """Element types (onnx names) of a case's graph inputs and outputs."""
    from onnx import TensorProto
    names = set()
    for v in list(case.model.graph.input) + list(case.model.graph.output):
        t = v.type
        if t.HasField("tensor_type"):
            names.add(TensorProto.DataType.Name(t.tensor_type.elem_type).lower())
        else:
            names.add(t.WhichOneof("value"))   # sequence_type, optional_type, map_type ...
    return names


SAMPAN_DTYPES = {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                 "float", "double"}


def why_unsupported(op, cases) -> str:
    """Why sampan has no handler for `op`: types it lacks, or not yet. (Control flow and
    the sequence and optional ops are imported since issue 34: sampan/onnx/ops/control.py,
    sequence.py.)"""
    kinds = set().union(*(_dtype_names(c) for c in cases)) if cases else set()
    if "map_type" in kinds:
        return "map values: sampan imports tensors, sequences and optionals only"
    lacking = sorted(k for k in kinds - SAMPAN_DTYPES if k != "undefined")
    if lacking and all(_dtype_names(c) - SAMPAN_DTYPES for c in cases):
        return f"every case needs a dtype sampan lacks ({', '.join(lacking)})"
    return "no import handler yet"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op_types", nargs="*", help="only the cases of these op types")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    a = ap.parse_args(argv)
    import onnxruntime
    onnxruntime.set_default_logger_severity(4)    # its warnings would drown the lines
    import onnxruntime.backend as ort_backend
    from sampan.onnx import backend as be
    from sampan.onnx import supported
    info = {"workload": "onnx_conformance", **machine()}
    cases = be.node_cases()
    by_name = {c.name: c for c in cases}
    if a.op_types:
        cases = [c for c in cases if be.case_op_type(c, by_name) in set(a.op_types)]
    t = time.perf_counter()
    mine = be.run_cases(cases, be.SampanBackend, _progress("sampan"))
    t_mine = time.perf_counter() - t
    t = time.perf_counter()
    theirs = [] if a.no_ort else be.run_cases(cases, ort_backend, _progress("onnxruntime"))
    t_theirs = time.perf_counter() - t
    table, ort_table = be.per_op(mine), be.per_op(theirs)
    bound: dict = {}      # passed only with graph inputs bound as constants (SampanRep)
    for r in mine:
        bound[r.op_type] = bound.get(r.op_type, 0) + int(r.passed and r.specialized)
    for op, (n, p) in table.items():
        print(json.dumps({**info, "op_type": op, "cases": n, "sampan_passed": p,
                          "onnxruntime_passed": ort_table.get(op, (n, None))[1],
                          "sampan_passed_with_inputs_bound": bound[op]}))
    for system, res, secs, tab in (("sampan", mine, t_mine, table),
                                   ("onnxruntime", theirs, t_theirs, ort_table)):
        if not res:
            continue
        print(json.dumps({**info, "system": system, "metric": "cases_passed",
                          "value": sum(r.passed for r in res), "cases": len(res),
                          "op_types": len(tab),
                          "op_types_fully_passed": sum(p == n for n, p in tab.values()),
                          "seconds": round(secs, 2),
                          **({"passed_with_inputs_bound": sum(bound.values())}
                             if system == "sampan" else {})}))
    from sampan.onnx.ops import HANDLERS
    known = set(supported()) | {t for _, t in HANDLERS}   # every domain's op types
    cases_of: dict = {}
    for c, r in zip(cases, mine):
        cases_of.setdefault(r.op_type, []).append(c)
    missing = {op: why_unsupported(op, cases_of[op]) for op in table if op not in known}
    print(json.dumps({**info, "system": "sampan", "metric": "unsupported_op_types",
                      "value": len(missing), "op_types": missing}))
    # op types sampan claims but passes under 97% of: the first reason of each
    weak = {op: next(r.error for r in mine if r.op_type == op and not r.passed)
            for op, (n, p) in table.items() if op in known and p < 0.97 * n}
    print(json.dumps({**info, "system": "sampan", "metric": "claimed_op_types_below_97pct",
                      "value": len(weak), "op_types": weak}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
