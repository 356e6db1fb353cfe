"""Graph pictures: Graphviz DOT text, and SVG through the `dot` binary when present.

Edges carry the type of the value they transport; nodes that a pass grouped
(`node.meta["group"]`, e.g. a fused kernel) are drawn inside one cluster."""
from __future__ import annotations

import os
import shutil
import subprocess

from .printer import fmt_lit


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(g, max_attr_chars: int = 40) -> str:
    """DOT text of `g`. Example: ``open("g.dot", "w").write(fn.graph.to_dot())``"""
    out = [f"digraph {_q(g.name)} {{", "  rankdir=TB;",
           '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica"];',
           '  edge [fontname="Helvetica", fontsize=9];']
    src = {}
    for v in g.inputs:
        nid = f"in{v.id}"
        out.append(f"  {nid} [shape=ellipse, fillcolor=\"#dff0d8\", "
                   f"label={_q((v.name or f'%{v.id}') + chr(10) + v.type_str())}];")
        src[v.id] = nid
    for v in g.consts:
        nid = f"c{v.id}"
        out.append(f"  {nid} [shape=note, fillcolor=\"#f5f5f5\", "
                   f"label={_q('const ' + v.type_str())}];")
        src[v.id] = nid
    groups = {}
    for i, n in enumerate(g.nodes):
        nid = f"n{i}"
        attrs = ", ".join(f"{k}={fmt_lit(a)}" for k, a in n.attrs.items())
        if len(attrs) > max_attr_chars:
            attrs = attrs[:max_attr_chars - 3] + "..."
        label = n.op + (("\\n" + attrs) if attrs else "") + (f"\\n{n.loc}" if n.loc else "")
        line = f"  {nid} [label=\"{label.replace(chr(34), chr(39))}\"];"
        grp = n.meta.get("group")
        (groups.setdefault(grp, []) if grp is not None else out).append(line)
        for v in n.outputs:
            src[v.id] = nid
    for k, (grp, lines) in enumerate(groups.items()):
        out.append(f"  subgraph cluster_{k} {{ label={_q(str(grp))}; style=dashed;")
        out.extend("  " + ln for ln in lines)
        out.append("  }")
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if v.id in src:
                out.append(f"  {src[v.id]} -> n{i} [label={_q(v.type_str())}];")
    for j, v in enumerate(g.outputs):
        out.append(f"  out{j} [shape=ellipse, fillcolor=\"#fcf8e3\", label=\"output {j}\"];")
        if v.id in src:
            out.append(f"  {src[v.id]} -> out{j} [label={_q(v.type_str())}];")
    out.append("}")
    return "\n".join(out) + "\n"


def render(g, path: str) -> str:
    """Write `path` as SVG (needs Graphviz `dot`) or, without it, DOT beside it.

    Returns a message saying what was written."""
    dot = to_dot(g)
    exe = shutil.which("dot")
    if path.endswith(".dot") or exe is None:
        dpath = path if path.endswith(".dot") else os.path.splitext(path)[0] + ".dot"
        with open(dpath, "w") as f:
            f.write(dot)
        if exe is None and not path.endswith(".dot"):
            return (f"Graphviz 'dot' was not found, so wrote DOT text to {dpath} instead of "
                    f"{path} (install graphviz, then: dot -Tsvg {dpath} -o {path})")
        return f"wrote {dpath}"
    fmt = os.path.splitext(path)[1].lstrip(".") or "svg"
    r = subprocess.run([exe, f"-T{fmt}", "-o", path], input=dot.encode(), capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"dot failed: {r.stderr.decode(errors='replace')}")
    return f"wrote {path}"
