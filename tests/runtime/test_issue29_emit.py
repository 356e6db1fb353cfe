"""Issue 29 item 1: the one emitter of generated source (`sampan.runtime.emit`) writes
only identifiers it checked or made and literals it formatted; text is made inert.
Every literal is checked by evaluating it back (Python's own reading is the reference)."""
import ast
import math

import numpy as np
import pytest

from sampan.errors import SampanError
from sampan.runtime import compile_graph
from sampan.runtime import emit
from sampan.runtime.emit import Code, EmitError

PAYLOAD = '__import__("os").mkdir("PWNED")'
HOSTILE = [f'"""+{PAYLOAD}+"""', f"'''+{PAYLOAD}+'''", f"\\'+{PAYLOAD}#", f"x\n{PAYLOAD}",
           f"x\r{PAYLOAD}", f"x\u2028{PAYLOAD}", "\x00", "\u202e\u2066bidi", "\\", '"', "'",
           "tab\there", "é ü 中文 \U0001f600", "\ud800 lone surrogate", ""]
NS = {"_nan": math.nan, "_inf": math.inf, "np": np}


def _back(code):
    return eval(compile(code, "<lit>", "eval"), {"__builtins__": {}}, dict(NS))  # noqa: S307


# ---------------------------------------------------------------------- names
@pytest.mark.parametrize("ok", ["x0", "v12", "_b3", "k3_add", "Z", "_", "match", "a" * 200])
def test_name_accepts_identifiers(ok):
    assert emit.name(ok) == ok and isinstance(emit.name(ok), Code)


@pytest.mark.parametrize("bad", ["", "1x", "x=1", "a.b", "a b", "if", "None", "True",
                                 "__import__", "__class__", "é", "x\n", "x)", "a" * 201, 3,
                                 None, b"x", "x\x00"] + HOSTILE)
def test_name_refuses_everything_else(bad):
    with pytest.raises(EmitError, match="not an identifier"):
        emit.name(bad, "attribute key")
    assert not emit.is_name(bad)


def test_fresh_joins_own_parts_only():
    assert emit.fresh("t", 12, "_", 0) == "t12_0"
    assert emit.dotted("np", "add") == "np.add"
    for bad in (True, -1, 1.0, None, b"x"):
        with pytest.raises(EmitError):
            emit.fresh("v", bad)
    with pytest.raises(EmitError):
        emit.fresh("k", 1, "_", "add);x(")
    with pytest.raises(EmitError):
        emit.dotted("np", "add(1)")


# ---------------------------------------------------------------------- literals
_VALUES = [None, True, False, 0, -7, 2 ** 70, 1.5, -0.0, 0.0, 1e-300, 5e-324,
           -1.7976931348623157e308, math.inf, -math.inf, "mean", (), (1,), (1, (2, 3)),
           [1, [2.5, "x"]], {"a": (1,), 2: None}, np.dtype("float32"), np.dtype("int64"),
           np.dtype("bool")] + HOSTILE + [tuple(HOSTILE)]


@pytest.mark.parametrize("k", range(len(_VALUES)))
def test_lit_reads_back_as_the_value(k):
    v = _VALUES[k]
    code = emit.lit(v)
    assert isinstance(code, Code) and code.isascii() and "\n" not in code and "\r" not in code
    back = _back(code)
    assert back == v and type(back) is type(v)
    if isinstance(v, float):
        assert math.copysign(1.0, back) == math.copysign(1.0, v)
    assert ast.parse(code, mode="eval")        # one expression


def test_lit_keeps_the_sign_of_nan_and_writes_numpy_scalars_as_numbers():
    for v, want in ((math.nan, 1.0), (-math.nan, -1.0), (np.float32("nan"), 1.0),
                    (-np.float64("nan"), -1.0)):
        back = _back(emit.lit(v))
        assert math.isnan(back) and math.copysign(1.0, back) == want
    assert emit.lit(-math.nan) == "-_nan" and emit.lit(math.inf) == "_inf"
    assert emit.lit(math.nan, nan="NAN") == "NAN"
    assert emit.lit(np.float32(0.1)) == repr(float(np.float32(0.1)))
    assert emit.lit(np.int64(3)) == "3" and emit.lit(np.bool_(True)) == "True"
    assert emit.lit(np.dtype("float16"), numpy="_np") == "_np.dtype('float16')"


class _Sneaky(str):
    def __repr__(self):
        return PAYLOAD

    def __str__(self):
        return PAYLOAD


class _SneakyInt(int):
    def __repr__(self):
        return PAYLOAD

    __str__ = __repr__


class _SneakyFloat(float):
    def __repr__(self):
        return PAYLOAD


def test_lit_writes_characters_not_what_a_subclass_says():
    assert emit.lit(_Sneaky("ab")) == "'ab'"
    assert emit.lit(_SneakyInt(5)) == "5"
    assert emit.lit(_SneakyFloat(2.5)) == "2.5"
    assert emit.name(_Sneaky("ab")) == "ab"
    assert emit.lit((_Sneaky("q"),)) == "('q',)"


@pytest.mark.parametrize("bad", [b"bytes", 1j, Ellipsis, object(), {1, 2}, slice(1), int,
                                 np.zeros(2), print, frozenset()])
def test_lit_refuses_other_types_with_a_sampan_error(bad):
    with pytest.raises(EmitError, match="has no source form") as e:
        emit.lit(bad, what="attribute axis of sum")
    assert isinstance(e.value, SampanError) and "attribute axis of sum" in str(e.value)
    assert not emit.is_lit(bad)


def test_lit_refuses_deep_nesting_and_huge_ints():
    x = 1
    for _ in range(100):
        x = (x,)
    with pytest.raises(EmitError, match="deeper"):
        emit.lit(x)
    with pytest.raises(EmitError, match="too long"):
        emit.lit(10 ** 5000)


# ---------------------------------------------------------------------- inert text
@pytest.mark.parametrize("k", range(len(HOSTILE)))
def test_comment_is_one_line_that_runs_nothing(k):
    c = emit.comment(HOSTILE[k])
    assert c.startswith("# ") and all(ch.isprintable() for ch in c)
    src = f"x = 1  {c}\ny = 2\n"
    ns = {}
    exec(compile(src, "<c>", "exec"), {"__builtins__": {}}, ns)  # noqa: S102
    assert ns == {"x": 1, "y": 2}


def test_comment_keeps_a_readable_location_at_its_end():
    c = emit.comment("%3: f32[8,3] = matmul(%0, %1)  # model.py:12")
    assert c == "# %3: f32[8,3] = matmul(%0, %1)  # model.py:12"


@pytest.mark.parametrize("k", range(len(HOSTILE)))
def test_docstring_reads_back_as_the_text_and_runs_nothing(k):
    text = f"Generated from {HOSTILE[k]!r}:\n  {HOSTILE[k]}\nend"
    d = emit.docstring(text)
    assert ast.literal_eval(d) == text
    src = f"{d}\nx = 1\n"
    tree = ast.parse(src)
    assert ast.get_docstring(tree, clean=False) == text and len(tree.body) == 2
    ns = {}
    exec(compile(src, "<d>", "exec"), {"__builtins__": {}}, ns)  # noqa: S102
    assert ns == {"__doc__": text, "x": 1}


def test_docstring_of_plain_text_is_unchanged():
    t = "Standalone module from 'p.sampan'.\n\n    import model\n"
    assert emit.docstring(t) == f'"""{t}"""'


# ---------------------------------------------------------------------- combinations
def test_call_fill_block_take_code_only():
    x0 = emit.name("x0")
    c = emit.call(emit.name("k_sum"), [x0], [("axis", emit.lit((1,)))])
    assert c == "k_sum(x0, axis=(1,))"
    assert emit.tuple_of([x0]) == "(x0,)" and emit.tuple_of([]) == "()"
    assert emit.fill("    {a} = {b}  {{x}}", a=x0, b=emit.lit(2)) == "    x0 = 2  {x}"
    for bad in (lambda: emit.call("k_sum", [x0]),
                lambda: emit.call(emit.name("f"), ["x0"]),
                lambda: emit.call(emit.name("f"), [], [("axis", "(1,)")]),
                lambda: emit.call(emit.name("f"), [], [("a", x0), ("a", x0)]),
                lambda: emit.call(emit.name("f"), [], [("x=1", x0)]),
                lambda: emit.fill("{a}", a="x0"),
                lambda: emit.fill("{a!r}", a=x0),
                lambda: emit.fill("{a.b}", a=x0),
                lambda: emit.fill("{a[0]}", a=x0),
                lambda: emit.fill("{a:>3}", a=x0),
                lambda: emit.fill("{b}", a=x0),
                lambda: emit.block(["x = 1"]),
                lambda: emit.join(["x0"]),
                lambda: emit.join([x0], "; ")):
        with pytest.raises(EmitError):
            bad()


# ---------------------------------------------------------------------- the jit codegen
def _graph(attrs, op="sum"):
    from sampan.ir import Graph
    from sampan.ops.registry import Spec
    g = Graph()
    x = g.add_input((2, 3), np.dtype(np.float32), "x")
    n = g.add_node(op, [x], attrs, [Spec((3,), np.dtype(np.float32))])
    g.outputs = [n.outputs[0]]
    return g


def test_jit_codegen_refuses_a_key_that_is_not_an_identifier():
    for key in ('x=__import__("os").mkdir("PWNED"),y', "a b", "if", "__class__"):
        g = _graph({"axis": (0,), "keepdims": False})
        g.nodes[0].attrs = {key: 1, **g.nodes[0].attrs}
        with pytest.raises(EmitError, match="attribute key"):
            compile_graph(g)


def test_jit_codegen_binds_values_without_a_literal_form():
    """An attribute value that is no literal (an object a pass put there) is bound in
    the executor's globals by a name the emitter makes, not pasted by its repr."""
    class Axis(tuple):
        def __repr__(self):
            return PAYLOAD
    g = _graph({"axis": Axis((0,)), "keepdims": False})
    c = compile_graph(g, use_plan=False)
    assert "axis=(0,)" in c.code and PAYLOAD not in c.code
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(c(x)[0], x.sum(0))

    class Opaque:
        pass
    g = _graph({"axis": (0,), "keepdims": False})
    g.nodes[0].attrs["note"] = Opaque()
    code = None
    try:
        code = compile_graph(g, use_plan=False).code
    except Exception:  # noqa: BLE001 - the kernel may refuse the extra keyword at call time
        pass
    if code is not None:
        assert "note=_a0" in code and "Opaque" not in code


def test_jit_codegen_is_unchanged_for_an_ordinary_graph():
    g = _graph({"axis": (0,), "keepdims": False})
    c = compile_graph(g, use_plan=False)
    assert c.code.splitlines()[:2] == [
        "def graph_fn(x0):",
        "    v1 = k_sum(x0, axis=(0,), keepdims=False)  # %1: f32[3] = sum(%0, axis=(0,), "
        "keepdims=False)"]
    with pytest.raises(EmitError):
        compile_graph(g, name="f(x); import os; def g")
