"""The one emitter of generated Python source: the jit executor (`runtime/codegen.py`,
`runtime/profiled.py`), `sampan deploy`'s numpy module, and the C/wasm targets to come.

A graph, a saved program and a folder name are data, and some of that data comes from
files anyone can write (a checksum is not a signature). Generated source is therefore
built only from `Code`: text this module made. There are five ways to get `Code`:

- `name(text)`: an identifier that passes this module's own check (ASCII letters, digits
  and `_`, not starting with a digit, not a keyword, not a dunder, at most 200 chars). A
  generator makes its names (`x0`, `v12`, `k3_add`) and checks the keys a graph hands it
  (keyword arguments of a kernel call) with it; anything else is an `EmitError`.
- `lit(x)`: a literal this module formats itself from plain data: None, bools, ints,
  floats (NaN with its sign and the infinities spelled through names the generated
  namespace binds: `_nan`, `-_nan`, `_inf`, `-_inf`), strings (`ascii()` of the exact
  characters: one line, ASCII only), tuples, lists, dicts and numpy dtypes
  (`np.dtype('float32')`). numpy scalars are written as the Python number they equal.
  Anything else (bytes, objects, types that merely look like plain data) is refused.
- `comment(text)` and `docstring(text)`: text made inert. A comment is one line whose
  non-printable characters (line breaks, NUL, bidi controls) are written as escapes; a
  docstring is a triple-quoted literal in which every backslash and double quote is
  escaped (so no `\"\"\"` inside can close it) and non-printable characters other than
  newlines are escapes: it reads back as exactly the text given, and it cannot run.
- `call`, `tuple_of`, `dotted`, `fill`, `block`: combinations of `Code` (`fill` puts
  `Code` into a template the generator itself wrote, `{hole}` fields only).
- `own(text)`: source the generator itself wrote (template lines, sampan's own kernel
  functions copied with `inspect.getsource`), never text from a graph, file or user.

Everything else a generator holds is a plain `str`, and `call`/`fill`/`block` refuse a
plain `str`; so pasting a value into source by accident is an error, not a hole.

The identifiers it allows are C identifiers too; a C or wasm target adds its keywords and
its own literal formatter here beside `lit`: one place decides what any target may write.
The module imports only `errors` and numpy, so any generator above `runtime/` can use it
(`ir/` and `passes/` generate no source).

Example::

    >>> from sampan.runtime import emit
    >>> emit.call(emit.name("k_sum"), [emit.name("x0")], [("axis", emit.lit((1,)))])
    'k_sum(x0, axis=(1,))'
"""
from __future__ import annotations

import keyword
import math
import re
import string

import numpy as np

from ..errors import SampanError

MAX_NAME = 200
MAX_DEPTH = 64
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class EmitError(SampanError, ValueError):
    """Text or a value that cannot be written into generated source."""


class Code(str):
    """Source text this module made (see the module doc). Slicing or adding to it gives
    a plain `str`: only this module's functions make `Code`."""
    __slots__ = ()


def _plain(s) -> str:
    """The exact characters of a str (or str subclass) as a plain str."""
    return str.__add__("", s)


def _short(x) -> str:
    try:
        r = repr(x)
    except Exception:  # noqa: BLE001 - a hostile __repr__: describe it by type alone
        r = f"<{type(x).__name__}>"
    return r if len(r) <= 80 else r[:77] + "..."


def _need_code(x, what):
    if not isinstance(x, Code):
        raise EmitError(f"emit: {what} must be Code made by sampan.runtime.emit, got "
                        f"{type(x).__name__} {_short(x)}")
    return x


# ---------------------------------------------------------------------- identifiers
def is_name(text) -> bool:
    """Whether `text` passes the emitter's identifier check (see `name`)."""
    if not isinstance(text, str):
        return False
    s = _plain(text)
    return (len(s) <= MAX_NAME and _IDENT.match(s) is not None and not keyword.iskeyword(s)
            and not (s.startswith("__") and s.endswith("__")))


def name(text, what: str = "name") -> Code:
    """`text` as an identifier, or an EmitError naming `what` it was for.

    Example: ``name("v3") == "v3"``; ``name("x=1")`` raises EmitError."""
    if not is_name(text):
        raise EmitError(f"{what} {_short(text)} is not an identifier that generated source "
                        f"may hold (ASCII letters, digits and '_', not starting with a digit, "
                        f"not a Python keyword, not a dunder, at most {MAX_NAME} characters)")
    return Code(_plain(text))


def fresh(*parts) -> Code:
    """A name the generator makes from its own parts: strings and non-negative ints,
    joined (``fresh("t", 12, "_", 0) == "t12_0"``); the result is checked by `name`."""
    out = []
    for p in parts:
        if type(p) is int and p >= 0:
            out.append(str(p))
        elif isinstance(p, str):
            out.append(_plain(p))
        else:
            raise EmitError(f"emit: a name part must be a str or an int >= 0, got "
                            f"{type(p).__name__} {_short(p)}")
    return name("".join(out), "generated name")


def dotted(*names) -> Code:
    """`a.b.c` from identifiers (``dotted("np", "add") == "np.add"``)."""
    return Code(".".join(name(n, "dotted name part") for n in names))


# ---------------------------------------------------------------------- literals
def lit(x, *, nan: str = "_nan", inf: str = "_inf", numpy: str = "np",
        what: str = "value") -> Code:
    """Python source for plain data `x` (see the module doc), or an EmitError naming `what`.

    `nan`, `inf`: the names the generated namespace binds to float('nan') and
    float('inf'); `numpy`: the name it binds numpy to (dtypes are written through it).

    Example: ``lit((1, -0.0, float("-inf"))) == "(1, -0.0, -_inf)"``"""
    nan, inf, numpy = name(nan), name(inf), name(numpy)
    return Code(_lit(x, nan, inf, numpy, what, 0))


def _lit(x, nan, inf, numpy, what, depth):
    if depth > MAX_DEPTH:
        raise EmitError(f"{what} nests deeper than {MAX_DEPTH} levels; generated source "
                        "does not hold it")
    if x is None:
        return "None"
    if isinstance(x, (bool, np.bool_)):
        return "True" if x else "False"
    if isinstance(x, (int, np.integer)):
        try:
            return str(int.__index__(x) if isinstance(x, int) else int(x))
        except ValueError as e:     # more digits than int -> str allows
            raise EmitError(f"{what}: an integer too long for generated source ({e})") from None
    if isinstance(x, (float, np.floating)):
        f = float.__float__(x) if isinstance(x, float) else float(x)
        if math.isnan(f):
            return f"-{nan}" if math.copysign(1.0, f) < 0 else nan
        if math.isinf(f):
            return inf if f > 0 else f"-{inf}"
        return float.__repr__(f)
    if isinstance(x, str):
        return ascii(_plain(x))
    if isinstance(x, tuple):
        items = [_lit(v, nan, inf, numpy, what, depth + 1) for v in tuple.__iter__(x)]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(x, list):
        return "[" + ", ".join(_lit(v, nan, inf, numpy, what, depth + 1)
                               for v in list.__iter__(x)) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{_lit(k, nan, inf, numpy, what, depth + 1)}: "
                               f"{_lit(v, nan, inf, numpy, what, depth + 1)}"
                               for k, v in dict.items(x)) + "}"
    if isinstance(x, np.dtype):
        return f"{numpy}.dtype({ascii(_plain(x.name))})"
    raise EmitError(f"{what} {_short(x)} ({type(x).__name__}) has no source form: generated "
                    "source holds None, bools, ints, floats, strings, tuples, lists, dicts "
                    "and numpy dtypes")


def is_lit(x) -> bool:
    """Whether `lit` can write `x`."""
    try:
        lit(x)
    except EmitError:
        return False
    return True


# ---------------------------------------------------------------------- inert text
def _escape(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def inert(text) -> str:
    """`text` on one line: every non-printable character (line breaks, NUL, bidi and
    other format controls) written as its escape. Not Code: for comments and messages."""
    s = _plain(text) if isinstance(text, str) else _short(text)
    return "".join(c if c.isprintable() else _escape(c) for c in s)


def comment(text) -> Code:
    """`# text` made inert (one line; see `inert`): a comment cannot end early."""
    return Code("# " + inert(text))


def docstring(text) -> Code:
    """A triple-quoted literal that reads back as exactly `text` and cannot end early:
    backslashes and double quotes are escaped, non-printable characters other than
    newlines are written as escapes.

    Example: ``ast.literal_eval(docstring(s)) == s`` for every str `s`, quotes and all"""
    s = _plain(text)
    out = []
    for c in s:
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n" or c.isprintable():
            out.append(c)
        else:
            out.append(_escape(c))
    return Code('"""' + "".join(out) + '"""')


# ---------------------------------------------------------------------- combinations
def own(text: str) -> Code:
    """Source the generator itself wrote: its templates' fixed lines, sampan's own
    functions copied by `inspect.getsource`. Never text from a graph, a file or a user."""
    return Code(_plain(text))


def call(fn, args=(), kwargs=()) -> Code:
    """`fn(a, b, k=v)` from Code: `fn` and `args` Code, `kwargs` (key, Code) pairs whose
    keys pass `name` and appear once each."""
    _need_code(fn, "the called function")
    parts = [_need_code(a, "an argument") for a in args]
    seen = set()
    for k, v in kwargs:
        k = name(k, "keyword argument")
        if k in seen:
            raise EmitError(f"keyword argument {k!r} given twice in a call of {fn}")
        seen.add(k)
        parts.append(Code(f"{k}={_need_code(v, f'the value of keyword argument {k}')}"))
    return Code(f"{fn}({', '.join(parts)})")


def tuple_of(items) -> Code:
    """`(a, b)`, `(a,)` or `()` from Code items."""
    items = [_need_code(x, "a tuple item") for x in items]
    return Code(f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})")


def join(items, sep: str = ", ") -> Code:
    """Code items joined by `sep` (one of ', ', ' * ', ' / ', ' + ', ' ')."""
    if sep not in (", ", " * ", " / ", " + ", " "):
        raise EmitError(f"emit.join: separator {sep!r} is not one the emitter writes")
    return Code(sep.join(_need_code(x, "an item") for x in items))


_FMT = string.Formatter()


def fill(template: str, **holes) -> Code:
    """`template` (the generator's own text) with each `{hole}` replaced by Code.

    Only plain `{name}` fields: no conversions, format specs, attribute or index
    access (`{{`/`}}` are literal braces)."""
    out = []
    for text, field, spec, conv in _FMT.parse(template):
        out.append(text)
        if field is None:
            continue
        if spec or conv or not field.isidentifier():
            raise EmitError(f"emit.fill: template field {{{field}}} must be a plain name")
        if field not in holes:
            raise EmitError(f"emit.fill: no value for template field {{{field}}}")
        out.append(_need_code(holes[field], f"template field {{{field}}}"))
    return Code("".join(out))


def block(lines, sep: str = "\n") -> Code:
    """Code lines joined by newlines (or by blank lines: sep="\\n\\n")."""
    if sep not in ("\n", "\n\n"):
        raise EmitError(f"emit.block: separator {sep!r} is not one the emitter writes")
    return Code(sep.join(_need_code(x, "a line") for x in lines))
