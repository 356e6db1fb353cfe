"""Issue 29 item 1: no text from a saved program reaches generated source as code.

A saved program's folder name, graph.ir and meta.json are anyone's files (the checksums
are recomputed here: a checksum is not a signature). Hostile folder names, attribute keys
and values, op names, symbolic size names, source locations and output trees go through
every generator (`sampan deploy`'s module, the jit executor's codegen, the numpy
runtime's unfused executor); each gives a clear sampan error, or source that imports and
runs without running the payload (no marker file appears) and gives the numbers
`sampan.jit.load` gives."""
import hashlib
import importlib.util
import json
import math
import os
import re
import pathlib
import shutil

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.deploy import DeployError, generate
from sampan.errors import SampanError
from sampan.jit import serialize as S
from sampan.runtime import compile_graph

MARK = "PWNED"
# each payload creates MARK in the working directory when it runs as code
RUN = '__import__("os").mkdir("PWNED")'
FOLDER_NAMES = [
    f'prog"""+__import__("os").system("touch {MARK}")+"""',
    f"prog'''+{RUN}+'''",
    f'prog\\"""+{RUN}#',
    f'prog\n"""\n{RUN}\n"""',
    f"prog\r{RUN}\u2028\u202e\x0c",
    'ends with a quote"',
    "ends with a backslash\\",
]


def _recompute(p):
    p = pathlib.Path(p)
    lines = []
    for ln in (p / "checksums.sha256").read_text().splitlines():
        _, fname = ln.split("  ", 1)
        lines.append(f"{hashlib.sha256((p / fname).read_bytes()).hexdigest()}  {fname}")
    (p / "checksums.sha256").write_text("\n".join(lines) + "\n")


def _craft(src, dst, graph=None, meta=None):
    """A copy of program `src` at `dst` with graph.ir edited by `graph(text)` and
    meta.json by `meta(dict)`, its checksums recomputed."""
    shutil.copytree(src, dst)
    d = pathlib.Path(dst)
    if graph is not None:
        text = (d / "graph.ir").read_text()
        new = graph(text)
        assert new != text
        (d / "graph.ir").write_text(new)
    if meta is not None:
        m = json.loads((d / "meta.json").read_text())
        meta(m)
        (d / "meta.json").write_text(json.dumps(m))
    _recompute(d)
    return str(d)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A saved MLP whose LeakyReLU is a fused node (its body is attribute data)."""
    d = tmp_path_factory.mktemp("prog29")
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.LeakyReLU(0.1), nn.Linear(6, 3))
    m.eval()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    path = sampan.jit.save(m, str(d / "p.sampan"), (sampan.from_numpy(x),))
    text = pathlib.Path(path, "graph.ir").read_text()
    assert "fused(" in text and "('add', (0, 1))" in text, text
    return path, x


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _import(path, label):
    spec = importlib.util.spec_from_file_location(f"gen29_{label}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _jit(path, x):
    return sampan.jit.load(path)(sampan.from_numpy(x))


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def _deployed(path, out, x, label):
    r = generate(path, str(out))
    return _import(r.module, label), r


# ---------------------------------------------------------------------- folder names
@pytest.mark.parametrize("k", range(len(FOLDER_NAMES)))
def test_hostile_folder_name_stays_text_in_the_docstring(program, cwd, k):
    src, x = program
    folder = FOLDER_NAMES[k]
    path = str(cwd / folder)
    shutil.copytree(src, path)
    mod, r = _deployed(path, cwd / "out", x, f"folder{k}")
    assert not (cwd / MARK).exists(), "the folder name ran as code"
    assert repr(folder) in mod.__doc__           # the name, as text, is what it reads
    y = mod.load()(x)
    assert not (cwd / MARK).exists()
    _same(y, _jit(path, x).numpy())


# ---------------------------------------------------------------------- attribute keys
_KEYS = ['x=__import__("os").mkdir("PWNED"),y', "a b", "1x", "if", "__class__",
         "k)+__import__('os').mkdir('PWNED')#", "x\n" + RUN]


@pytest.mark.parametrize("k", range(len(_KEYS)))
def test_hostile_key_in_a_fused_body_is_a_sampan_error(program, cwd, k):
    src, x = program
    key = _KEYS[k]
    path = _craft(src, str(cwd / "q.sampan"), graph=lambda t: t.replace(
        "('add', (0, 1))", f"('add', (0, 1), (({key!r}, 1),))"))
    _same(_jit(path, x).numpy(), _jit(src, x).numpy())   # jit.load runs it as data
    with pytest.raises(DeployError, match="attribute key"):
        generate(path, str(cwd / "out"))
    assert not os.path.exists(cwd / "out" / "model.py")
    # the numpy runtime's executor (fused nodes expanded, as the Predictor does without
    # numba) makes kernel calls of those attributes: the same refusal
    from sampan.inference._build import unfuse
    g, _, _ = S.read(path)
    with pytest.raises(SampanError, match="attribute key"):
        compile_graph(unfuse(g))
    assert not (cwd / MARK).exists()


def test_hostile_op_name_in_a_fused_body_is_refused(program, cwd):
    src, x = program
    path = _craft(src, str(cwd / "q.sampan"), graph=lambda t: t.replace(
        "('add', (0, 1))", f"('add(0)+{RUN}#', (0, 1))"))
    with pytest.raises(SampanError):
        generate(path, str(cwd / "out"))
    with pytest.raises(SampanError):
        sampan.jit.load(path)
    assert not (cwd / MARK).exists()


@pytest.mark.parametrize("index", ["-3", "True"])
def test_a_fused_body_index_that_is_not_a_value_is_refused(program, cwd, index):
    """Body indices are written as names (`t{i}`) by the kernel generators: -3 and True
    satisfy the shape rule through Python's list indexing, and reached numba's kernel
    source as `t-3` and `tTrue`."""
    src, x = program
    path = _craft(src, str(cwd / "q.sampan"), graph=lambda t: t.replace(
        "('mul', (4, 3))", f"('mul', ({index}, 3))"))
    with pytest.raises(SampanError, match="index"):
        sampan.jit.load(path)
    with pytest.raises(SampanError, match="index"):
        generate(path, str(cwd / "out"))


# ---------------------------------------------------------------------- attribute values
def _ret(text):
    """The graph's one-value return line and the number of the value it returns."""
    m = re.search(r"^  return \(%(\d+)\)$", text, re.M)
    assert m, text
    return m.group(0), m.group(1)


def test_nan_sign_in_an_attribute_survives_every_generator(program, cwd):
    """`full(value=-nan)` read by signbit: the sign of the NaN is the answer (the deploy
    module wrote every NaN as +nan)."""
    src, x = program

    def edit(t):
        ret, r = _ret(t)
        return t.replace(ret, "  %915: f32[3,3] = full(shape=(3, 3), value=-nan, "
                              "dtype='float32')\n  %916: b1[3,3] = signbit(%915)\n"
                              f"  return (%{r}, %916)")
    def two(m):
        m["outputs"] = ["out", "out"]
        m["out_tree"] = {"tuple": [{"t": 0}, {"t": 1}]}
    path = _craft(src, str(cwd / "q.sampan"), graph=edit, meta=two)
    want = [w.numpy() for w in _jit(path, x)]
    assert want[1].all()
    mod, _ = _deployed(path, cwd / "out", x, "nansign")
    got = mod.load()(x)
    _same(got[0], want[0])
    _same(got[1], want[1])


_SYM_BAD = ['$__import__("os").mkdir("PWNED")', "$batch+1", "$2**99", "$nan", "$1_000"]


@pytest.mark.parametrize("k", range(len(_SYM_BAD)))
def test_hostile_symbolic_size_in_an_attribute_is_a_deploy_error(program, cwd, k):
    """'$'-strings are symbolic sizes written as Python over the call's sizes: a term
    that is neither a number nor a name is refused (it was pasted, or crashed)."""
    src, x = program

    def edit(t):
        ret, _ = _ret(t)
        return t.replace(ret, f"  %915: f32[3,3] = full(shape=(3, 3), value={_SYM_BAD[k]!r}, "
                              "dtype='float32')\n" + ret)
    path = _craft(src, str(cwd / "q.sampan"), graph=edit)
    try:
        generate(path, str(cwd / "out"))
    except SampanError:
        pass
    else:                       # written: then it must import and run without the payload
        mod = _import(str(cwd / "out" / "model.py"), f"sym{k}")
        try:
            mod.load()(x)
        except Exception:  # noqa: BLE001 - a bad value may fail at run time, as data
            pass
    assert not (cwd / MARK).exists()
    if k == 0:
        with pytest.raises(DeployError, match="size expression|neither a number nor a name"):
            generate(path, str(cwd / "out2"))


_STATICS = [f'\'\'\'"""\n{RUN}#', "x\\", "\u202e\x00", float("nan"), float("-inf"), -0.0,
            None, True, 12345678901234567890]


def test_hostile_static_outputs_in_meta_run_as_data(program, cwd):
    """out_tree's static leaves come from meta.json: strings with quotes and line
    breaks, NaN and infinities (the module could not import a NaN: `nan` is no name)."""
    src, x = program

    def edit(m):
        m["out_tree"] = {"tuple": [{"t": 0}] + [{"static": s} for s in _STATICS]
                         + [{"dict": [[RUN, {"static": 1}], [["k", 2], {"t": 0}]]}]}
    path = _craft(src, str(cwd / "q.sampan"), meta=edit)
    want = _jit(path, x)
    mod, _ = _deployed(path, cwd / "out", x, "statics")
    got = mod.load()(x)
    assert not (cwd / MARK).exists()
    assert len(got) == len(want) == len(_STATICS) + 2
    _same(got[0], want[0].numpy())
    for g_, w in zip(got[1:-1], want[1:-1]):
        if isinstance(w, float) and math.isnan(w):
            assert math.isnan(g_)
        else:
            assert g_ == w and type(g_) is type(w) and str(g_) == str(w)
    assert set(got[-1]) == set(want[-1]) == {RUN, ("k", 2)}
    _same(got[-1][("k", 2)], want[-1][("k", 2)].numpy())


# ---------------------------------------------------------------------- comments
@pytest.mark.parametrize("loc", ["mk.py:7\x00", "mk.py:7 \u202e x", "\x1b[31mmk.py:7\x7f"])
def test_source_locations_are_inert_comments(program, cwd, loc):
    """A node's source location is written as a comment: control characters (NUL,
    bidi, escapes) are escaped, so every generator still compiles and runs."""
    src, x = program
    path = _craft(src, str(cwd / "q.sampan"), graph=lambda t: re.sub(
        r"(= add\(%\d+, %\d+\))  # test_issue29_emitter\.py:",
        lambda m: m.group(1) + "  # " + loc + "|", t, count=1))
    g, _, _ = S.read(path)
    assert any(n.loc.startswith(loc + "|") for n in g.nodes if n.loc)
    want = _jit(src, x).numpy()
    loaded = sampan.jit.load(path)
    for code in (loaded.code, open(generate(path, str(cwd / "out")).module,
                                   encoding="utf-8").read()):
        assert not any(c in code for c in "\x00\u202e\x1b\x7f")
    _same(loaded(sampan.from_numpy(x)).numpy(), want)
    _same(_import(str(cwd / "out" / "model.py"), "loc").load()(x), want)


def test_graph_name_and_symbolic_dim_names_do_not_reach_code(program, cwd):
    """Names a file gives (the graph's, symbolic dims') are data: literals, never code."""
    src, x = program
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.LeakyReLU(0.1), nn.Linear(6, 3))
    m.eval()
    dyn = sampan.jit.save(m, str(cwd / "d.sampan"), (sampan.from_numpy(x),), dynamic="batch")
    bad = 'b"+__import__("os").mkdir("PWNED")+"'
    path = _craft(dyn, str(cwd / "q.sampan"),
                  graph=lambda t: t.replace("batch", bad).replace("graph main(", "graph m.x-1("))
    try:
        want = _jit(path, x).numpy()
    except SampanError:
        want = None
    try:
        mod, _ = _deployed(path, cwd / "out", x, "dims")
    except SampanError:
        mod = None
    assert not (cwd / MARK).exists()
    if mod is not None and want is not None:
        _same(mod.load()(x), want)
    assert not (cwd / MARK).exists()
