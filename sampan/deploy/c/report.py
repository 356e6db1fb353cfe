"""`sampan.deploy.report(dir)` / `sampan deploy --report DIR`: what a generated C folder
holds: the ops of its program and the kernels included for them, set against the whole op
table and the ops the C target covers, and the sizes of its code, built library and
weights. It reads `manifest.json` (plain JSON the generator wrote, its fields checked;
nothing in it is executed) and checks every listed file's sha256 against the manifest."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from ..kernelsource import DeployError

MANIFEST = "manifest.json"
FORMAT, VERSION = "sampan.deploy.c", 1


@dataclass
class Report:
    """A generated C folder, summarised (`str(report)` prints it)."""
    folder: str
    prefix: str
    ops: tuple              # the program's ops
    kernels: tuple          # the C templates included
    covered: int            # ops the C target covers
    table: int              # ops in the op table
    code_bytes: int         # model.c + model.h
    library_bytes: int      # libmodel.so (0: not built)
    weights_bytes: int
    max_batch: int
    threads: int
    damaged: tuple          # files whose sha256 is not the manifest's

    def __str__(self):
        kb = 1024
        lib = (f"libmodel.so {self.library_bytes / kb:.1f} KiB" if self.library_bytes
               else "libmodel.so not built (run make)")
        lines = [
            f"{self.folder} (prefix {self.prefix}, max batch {self.max_batch}, "
            f"{self.threads} thread{'s' if self.threads > 1 else ''})",
            f"  ops: {len(self.ops)} of the op table's {self.table} ({self.covered} covered "
            f"by the C target): {', '.join(self.ops)}",
            f"  kernels: {len(self.kernels)}: {', '.join(self.kernels) or '-'}",
            f"  code: model.c + model.h {self.code_bytes / kb:.1f} KiB; {lib}",
            f"  weights.bin: {self.weights_bytes / kb:.1f} KiB"]
        if self.damaged:
            lines.append(f"  changed since generation: {', '.join(self.damaged)}")
        return "\n".join(lines)


def write_manifest(outdir, prefix, ops, kernels, covered, max_batch, threads, files):
    """The manifest of a generated folder (`files`: names written, weights.bin too)."""
    from ...io import _atomic
    from ...ops.registry import OPS
    sums = {}
    for f in files:
        with open(os.path.join(outdir, f), "rb") as fh:
            sums[f] = hashlib.sha256(fh.read()).hexdigest()
    doc = {"format": FORMAT, "version": VERSION, "prefix": prefix, "ops": list(ops),
           "kernels": list(kernels), "covered": int(covered), "table": len(OPS),
           "max_batch": int(max_batch), "threads": int(threads), "sha256": sums}
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    _atomic.write_file(os.path.join(outdir, MANIFEST), lambda f: f.write(data))


def _field(doc, key, kind, where):
    v = doc.get(key)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise DeployError(f"sampan deploy --report: {where}: field {key!r} is "
                          f"{type(v).__name__}; expected {kind.__name__}")
    return v


def report(folder) -> Report:
    """Summarise the C folder `folder` written by ``sampan deploy --target c``.

    Example: ``print(sampan.deploy.report("out"))``"""
    folder = os.fspath(folder)
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise DeployError(f"sampan deploy --report: {folder} holds no {MANIFEST}: not a "
                          "folder written by `sampan deploy --target c`") from None
    except ValueError as e:
        raise DeployError(f"sampan deploy --report: {path} is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise DeployError(f"sampan deploy --report: {path} is not a version {VERSION} "
                          f"{FORMAT} manifest")
    sums = _field(doc, "sha256", dict, path)
    damaged = []
    for name, want in sorted(sums.items()):
        p = os.path.join(folder, os.path.basename(str(name)))
        try:
            with open(p, "rb") as f:
                ok = hashlib.sha256(f.read()).hexdigest() == want
        except OSError:
            ok = False
        if not ok:
            damaged.append(os.path.basename(str(name)))

    def size(n):
        p = os.path.join(folder, n)
        return os.path.getsize(p) if os.path.exists(p) else 0
    strs = lambda k: tuple(str(x) for x in _field(doc, k, list, path))  # noqa: E731
    return Report(folder, str(_field(doc, "prefix", str, path)), strs("ops"), strs("kernels"),
                  _field(doc, "covered", int, path), _field(doc, "table", int, path),
                  size("model.c") + size("model.h"), size("libmodel.so"),
                  size("weights.bin"), _field(doc, "max_batch", int, path),
                  _field(doc, "threads", int, path), tuple(damaged))
