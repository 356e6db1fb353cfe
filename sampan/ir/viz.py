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
    """DOT text of `g`; the blocks of a control-flow node are drawn as nested clusters
    beside it. Example: ``open("g.dot", "w").write(fn.graph.to_dot())``"""
    out = [f"digraph {_q(g.name)} {{", "  rankdir=TB;",
           '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica"];',
           '  edge [fontname="Helvetica", fontsize=9];']
    _body(g, "", out, "  ", max_attr_chars)
    out.append("}")
    return "\n".join(out) + "\n"


def _body(g, p, out, pad, max_attr_chars):
    """Nodes and edges of `g`, every DOT id prefixed with `p` (unique per block)."""
    src = {}
    for v in g.inputs:
        nid = f"{p}in{v.id}"
        out.append(f"{pad}{nid} [shape=ellipse, fillcolor=\"#dff0d8\", "
                   f"label={_q((v.name or f'%{v.id}') + chr(10) + v.type_str())}];")
        src[v.id] = nid
    for v in g.consts:
        nid = f"{p}c{v.id}"
        out.append(f"{pad}{nid} [shape=note, fillcolor=\"#f5f5f5\", "
                   f"label={_q('const ' + v.type_str())}];")
        src[v.id] = nid
    groups = {}
    for i, n in enumerate(g.nodes):
        nid = f"{p}n{i}"
        attrs = ", ".join(f"{k}={fmt_lit(a)}" for k, a in n.attrs.items())
        if len(attrs) > max_attr_chars:
            attrs = attrs[:max_attr_chars - 3] + "..."
        label = n.op + (("\\n" + attrs) if attrs else "") + (f"\\n{n.loc}" if n.loc else "")
        line = f"{pad}{nid} [label=\"{label.replace(chr(34), chr(39))}\"];"
        grp = n.meta.get("group")
        (groups.setdefault(grp, []) if grp is not None else out).append(line)
        for v in n.outputs:
            src[v.id] = nid
        for k, b in enumerate(n.blocks):    # control flow: each block a nested cluster
            bp = f"{p}n{i}b{k}_"
            out.append(f"{pad}subgraph cluster_{bp} {{ label={_q(f'{n.op}: {b.name}')}; "
                       "style=rounded; color=\"#7a8fb3\";")
            _body(b, bp, out, pad + "  ", max_attr_chars)
            out.append(f"{pad}}}")
            out.append(f"{pad}{bp}out0 -> {nid} [style=dotted, label={_q(b.name)}];"
                       if b.outputs else f"{pad}// block {bp} returns nothing")
    for k, (grp, lines) in enumerate(groups.items()):
        out.append(f"{pad}subgraph cluster_{p}{k} {{ label={_q(str(grp))}; style=dashed;")
        out.extend("  " + ln for ln in lines)
        out.append(f"{pad}}}")
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if v.id in src:
                out.append(f"{pad}{src[v.id]} -> {p}n{i} [label={_q(v.type_str())}];")
    for j, v in enumerate(g.outputs):
        out.append(f"{pad}{p}out{j} [shape=ellipse, fillcolor=\"#fcf8e3\", "
                   f"label=\"output {j}\"];")
        if v.id in src:
            out.append(f"{pad}{src[v.id]} -> {p}out{j} [label={_q(v.type_str())}];")


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
