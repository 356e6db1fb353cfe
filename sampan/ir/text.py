"""The Graph text format: one node a line, typed, parsed back to an equal Graph.

    graph main(%0: f32[8,4] 'x', %1: f32[4,3] 'fc.weight') {
      %2: f32[] = const(value=2.0)
      %3: f32[8,3] = matmul(%0, %1)  # model.py:12
      %4: f32[8,3] = mul(%3, %2)  # model.py:13
      return (%4)
    }

Small constants are written inline (a NaN with a payload other than `nan`'s or `-nan`'s
as its bits: `const(bits=[2143289345])`); larger ones by reference (`const(ref='c7')`) to
arrays kept beside the text (in `Graph` objects, or a safetensors file when saved).
"""
from __future__ import annotations

import ast
import re

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanError
from .graph import Graph
# the writer, re-exported: the text format's public names stay here
from .printer import (INLINE_CONST_MAX, _eval_lit, _inline_array, fmt_lit,  # noqa: F401
                      node_str, print_graph, type_str)


class ParseError(SampanError):
    """Graph text that does not parse; names the line."""


# ---------------------------------------------------------------------- parser
_TYPE = re.compile(r"^([a-z0-9]+)\[([^\]]*)\]$")
_HEADER = re.compile(r"^graph\s+([\w.\-]+)\((.*)\)\s*\{$")
_VAR = re.compile(r"%(\d+)")


def parse_type(s: str):
    m = _TYPE.match(s.strip())
    if not m or m.group(1) not in _dt.SHORT_TO_NAME:
        raise ValueError(f"bad type {s!r}")
    dims = tuple(int(d) if re.fullmatch(r"-?\d+", d) else d
                 for d in (x.strip() for x in m.group(2).split(",")) if d)
    return dims, _dt.as_dtype(_dt.SHORT_TO_NAME[m.group(1)])


def _split_top(s: str):
    """Split on commas outside brackets and quotes."""
    out, depth, cur, q = [], 0, [], None
    for ch in s:
        if q:
            cur.append(ch)
            if ch == q:
                q = None
            continue
        if ch in "'\"":
            q = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _strip_loc(line: str):
    i = line.rfind("  # ")
    if i >= 0:
        tail = line[i + 4:].strip()
        if not any(c in tail for c in "()'\"="):
            return line[:i].rstrip(), tail
    return line, ""


def parse(text: str, consts: dict | None = None) -> Graph:
    """Parse graph text back into a Graph; `consts` supplies arrays named by `ref=`
    (those of nested blocks too).

    Example: ``assert parse(str(g), {c.name: c.const for c in g.consts}) == g``"""
    consts = consts or {}
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    if not lines:
        raise ParseError("empty graph text")
    return _Parser(lines, consts).graph(0)[0]


class _Parser:
    def __init__(self, lines, consts):
        self.lines, self.consts = lines, consts
        self.lineno = 0

    def err(self, msg):
        return ParseError(f"graph text line {self.lineno}: {msg}\n  "
                          f"{self.lines[self.lineno - 1].strip()}")

    def graph(self, start):
        """The graph whose header is line `start` (0-based); (Graph, index after it)."""
        lines, consts, err = self.lines, self.consts, self.err
        g = Graph()
        env = {}

        def ref(tok):
            m = re.fullmatch(r"%(\d+)", tok.strip())
            if not m or int(m.group(1)) not in env:
                raise err(f"{tok.strip()} is not defined before this line")
            return env[int(m.group(1))]

        self.lineno = start + 1
        m = _HEADER.match(lines[start].strip())
        if not m:
            raise err("expected 'graph NAME(inputs) {'")
        g.name = m.group(1)
        for a in _split_top(m.group(2)):
            am = re.fullmatch(r"%(\d+):\s*(\S+)(?:\s+(['\"].*['\"]))?", a)
            if not am:
                raise err(f"bad input {a!r}")
            try:
                shape, dtype = parse_type(am.group(2))
            except ValueError as e:
                raise err(str(e)) from None
            name = ast.literal_eval(am.group(3)) if am.group(3) else None
            env[int(am.group(1))] = g.add_input(shape, dtype, name)
        i = start + 1
        while i < len(lines):
            self.lineno = i + 1
            line = lines[i].strip()
            i += 1
            if line == "}":
                return g, i
            if line.startswith("return"):
                body = line[len("return"):].strip()
                if body.startswith("(") and body.endswith(")"):
                    body = body[1:-1]
                g.outputs = [ref(t) for t in _split_top(body)]
                continue
            line, loc = _strip_loc(line)
            blocks = None
            if line.endswith(" {"):           # a control-flow node: its blocks follow
                line = line[:-2].rstrip()
                here = self.lineno
                blocks = []
                while True:
                    if i >= len(lines):
                        raise ParseError("graph text ends inside a node's blocks "
                                         "(truncated?)")
                    if lines[i].strip() == "}":
                        i += 1
                        break
                    b, i = self.graph(i)
                    blocks.append(b)
                self.lineno = here
            if " = " not in line:
                raise err("expected '%N: type = op(...)'")
            lhs, rhs = line.split(" = ", 1)
            outs = []
            for part in _split_top(lhs):
                om = re.fullmatch(r"%(\d+):\s*(\S+)", part)
                if not om:
                    raise err(f"bad result {part!r}")
                try:
                    outs.append((int(om.group(1)), *parse_type(om.group(2))))
                except ValueError as e:
                    raise err(str(e)) from None
            try:
                call = ast.parse(_VAR.sub(r"_v_\1", rhs), mode="eval").body
            except SyntaxError:
                raise err("the right-hand side is not a call") from None
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                raise err("the right-hand side is not a call")
            op = call.func.id
            try:
                attrs = {k.arg: _eval_lit(k.value) for k in call.keywords}
            except ValueError as e:
                raise err(str(e)) from None
            if op == "const":
                if blocks is not None:
                    raise err("a constant has no blocks")
                env[outs[0][0]] = self.const(g, outs[0], attrs)
                continue
            ins = []
            for a in call.args:
                if not (isinstance(a, ast.Name) and a.id.startswith("_v_")):
                    raise err("positional arguments must be values (%N)")
                ins.append(ref("%" + a.id[3:]))
            from ..ops.registry import OPS
            if op not in OPS:
                raise err(f"unknown op {op!r}")
            from ..ops.registry import Spec
            node = g.add_node(op, ins, attrs, [Spec(s, d) for _, s, d in outs], loc=loc,
                              blocks=blocks)
            for (vid, _, _), v in zip(outs, node.outputs):
                if vid in env:
                    raise err(f"%{vid} is defined twice (not SSA)")
                env[vid] = v
        raise ParseError("graph text ends without '}' (truncated?)")

    def const(self, g, out, attrs):
        vid, shape, dtype = out
        err, consts = self.err, self.consts
        if "value" in attrs or "bits" in attrs:
            try:
                if "bits" in attrs:
                    arr = np.asarray(attrs["bits"], f"u{dtype.itemsize}").view(
                        dtype).reshape(shape)
                else:
                    arr = _inline_array(attrs["value"], shape, dtype)
            except (ValueError, TypeError, OverflowError) as e:
                raise err(f"constant does not fit {type_str(shape, dtype)}: {e}") from None
            return g.add_const(arr)
        name = attrs.get("ref")
        if name not in consts:
            raise err(f"constant {name!r} is not among the supplied arrays")
        arr = np.asarray(consts[name])
        if arr.shape != tuple(shape) or arr.dtype != dtype:
            raise err(f"constant {name!r} is {type_str(arr.shape, arr.dtype)}, the "
                      f"text says {type_str(shape, dtype)}")
        return g.add_const(arr, name=name)
