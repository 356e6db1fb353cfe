"""Save and load compiled programs: a directory with

    graph.ir              the optimised Graph as text
    weights.safetensors   the state inputs the graph reads, large constants, example inputs
                          (one that is a single value broadcast: that value alone)
    meta.json             format version, input/output slots, output structure, dtypes,
                          the shapes of those broadcast examples (`example_fills`)
    checksums.sha256      sha256 of each of the three files above (`sha256sum -c` reads it)

written atomically and verified on load; the loaded program needs none of the model's
Python code.

Every file is covered by a checksum, written last: version 1 kept the checksums inside
meta.json, so a flipped bit in meta.json itself could swap two inputs unnoticed or fail
with a KeyError at the first call. On top of the checksums `read` checks every field of
meta.json against the graph and the weights (kinds, indices, keys, shapes, dtypes), so a
program written wrongly also fails at load, with a `LoadError`. Version 1 programs still
load (checked field by field; their meta.json has no checksum).

Version 3 is version 2 with `example_fills`: an example input that is one value broadcast
(the zero-strided inputs `sampan onnx import` traces a declared f32[65536, 65536] on) is
stored as that value and its shape, and read back as a broadcast view. Only a program
with such an example is written as version 3, so every other one still loads in a sampan
that reads version 2, and one that does not says "upgrade sampan" rather than "damaged".
Version 4 is version 3 whose graph holds control flow (`cond`, `while_loop`, `scan`
nodes with nested blocks in the text, their large constants in the weights as every
other's): only such a program is written as version 4, and a graph with blocks in a
program of an older version is refused as damaged.

A save writes `<path>.tmp-<token>/`, fsyncs it, then swaps it with the old program in
one atomic step (Linux's renameat2 RENAME_EXCHANGE). Where that is missing it renames
twice, the old program aside and the new one into place; a crash between the two
leaves no `<path>`, and the next `load` or `save` of `<path>` puts the new program in
place (see `sampan.io._atomic`). Temporaries of killed saves are removed by the next
save.

Weights are read once, straight into their arrays, while they are hashed: a load peaks
at about the size of the weights, not three times it.

`sampan.jit.program` reads a folder for its users (`SavedProgram`, `Loaded`, `load`);
`serialize.load` and `serialize.Loaded`, their names here before, are bound to those by
the package (`jit/__init__.py`), so this module imports nothing above it.

Example::

    >>> sampan.jit.save(model, "m.sampan", (x,))
    >>> m = sampan.jit.load("m.sampan"); y = m(x)
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanError
from .. import _atomic
from .. import _tensorfile as _tf
from ..tensor import Tensor
from . import dynamic as _dyn
from . import pytree

FORMAT = "sampan.jit"
VERSION = 4         # the newest format read; written only with control flow (4) or
#                     example_fills (3), else 2
_SUMMED_VERSIONS = (2, 3, 4)   # the versions with checksums.sha256
_FILLS_VERSIONS = (3, 4)       # the versions that may have example_fills
_FILES = ("graph.ir", "weights.safetensors")          # covered by meta.json in version 1
_SUMMED = ("graph.ir", "meta.json", "weights.safetensors")
_SUMS = "checksums.sha256"
_MAX_META = 64 << 20     # larger than any meta.json: refuse before reading it
_MAX_GRAPH = 1 << 30     # graph text (large constants live in the weights)
_MAX_SUMS = 4096
_READ_ATTEMPTS = 8   # reads restarted because a save replaced the folder meanwhile
_IN_KINDS = ("arg", "state", "grad", "feed", "rng")
_OUT_KINDS = ("out", "state", "grad", "rng")


class LoadError(SampanError):
    """A saved program is missing, damaged or of an unknown format."""


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save(fn_or_layer, path, example_inputs, passes="inference", dynamic=None) -> str:
    """Trace `fn_or_layer(*example_inputs)`, optimise, and write a model directory.

    `dynamic` marks dims of the inputs whose size may differ at each call, as in
    `sampan.jit` (``{"x": {0: "batch"}}``, or ``"batch"`` for dim 0 of every input; a
    jitted function's own `dynamic` is the default): the program is traced at more than
    one size and stored with symbolic dims, so the loaded program takes any size there."""
    from .capture import capture
    example_inputs = tuple(example_inputs)
    c = capture(fn_or_layer, example_inputs, passes, dynamic, what="saved program")
    g, slots, out_slots, out_tree = c.graph, c.slots, c.out_slots, c.out_tree
    leaves, params, dyn, guards = c.leaves, c.params, c.dynamic, c.guards
    slots = _drop_unread(g, slots)

    arrays, dtypes = {}, {}

    def put(key, a):
        a = _tf.contiguous(a)   # not np.ascontiguousarray: it makes a 0-d array (1,)
        if a.dtype.name not in _tf.CODES:
            raise SampanError(f"sampan.jit.save: cannot store '{key}' of dtype {a.dtype}; "
                              f"supported: {', '.join(_tf.CODES)}")
        arrays[key] = a
        dtypes[key] = _dt.dtype_name(a.dtype)
    ins = []
    for i, ((kind, ref), v) in enumerate(zip(slots, g.inputs)):
        if kind == "arg":
            ins.append({"kind": "arg", "index": ref})
            continue
        key = f"input.{i}" + (f".{v.name}" if v.name else "")
        if kind == "state":
            a = ref._data
        elif kind == "grad":
            a = (leaves[ref[1]] if isinstance(ref, tuple) else ref).grad._data
        elif kind == "feed":  # a value supplied per call (e.g. a learning rate): frozen
            a = np.asarray(ref())
        else:
            a = np.array([ref.seed, ref.counter], np.int64)
        put(key, a)
        ins.append({"kind": kind, "key": key})
    text = str(g)  # names large constants (unique across the graph and its blocks)
    blocks = any(n.blocks for n in g.nodes)
    for c in (c for b in g.walk() for c in b.consts):
        if c.name is not None and f"ref={c.name!r}" in text:
            put(f"const.{c.name}", c.const)
    fills = {}
    for i, t in enumerate(leaves):
        a = t._data
        if _one_value(a):   # a broadcast view: its value, and its shape in meta.json
            fills[str(i)] = [int(n) for n in a.shape]
            a = a[(slice(0, 1),) * a.ndim].reshape(())
        put(f"example.{i}", a)
    out_consts = []
    meta = {
        "format": FORMAT, "version": 4 if blocks else 3 if fills else 2,
        "graph_name": g.name,
        "inputs": ins, "n_args": len(leaves),
        "outputs": [k for k, _ in out_slots],
        "out_tree": pytree.to_json(out_tree, out_consts), "dtypes": dtypes,
        "arg_names": _arg_names(example_inputs, params),   # the Predictor's input names
    }
    if fills:            # older programs have none: every example is stored whole
        meta["example_fills"] = fills
    if dyn and guards:   # checked at every call (older programs have none: no check)
        meta["guards"] = _dyn.guards_json(guards)
    for i, a in enumerate(out_consts):
        put(f"outconst.{i}", a)
    meta["n_outconst"] = len(out_consts)
    files = {"graph.ir": text.encode("utf-8"),
             "meta.json": json.dumps(meta, indent=1).encode("utf-8")}
    return write_dir(os.fspath(path), files, arrays)


def _one_value(a) -> bool:
    """Whether `a` is one element broadcast (stride 0 on every dim longer than 1), as the
    inputs `sampan onnx import` traces on: stored as that element and a shape, so a
    declared f32[65536, 65536] does not write 16 GiB."""
    return a.size > 1 and all(st == 0 or n == 1 for st, n in zip(a.strides, a.shape))


def _fill_examples(path, meta, arrays) -> None:
    """Turn each example input that meta.json's `example_fills` ({"<i>": shape}) lists
    back into its one stored value broadcast to that shape (a read-only view: no memory
    of the shape's size is taken)."""
    if "example_fills" not in meta:
        return
    where = os.path.join(path, "meta.json")
    fills = meta["example_fills"]
    if not any(_is_version(meta, v) for v in _FILLS_VERSIONS):
        raise _damaged(where, f"it has 'example_fills', which format version "
                              f"{meta.get('version')!r} does not have (versions 3 and 4 "
                              "do)")
    if not isinstance(fills, dict):
        raise _damaged(where, "'example_fills' must map example input numbers to shapes")
    for k, shape in fills.items():
        key = f"example.{k}"
        if not (re.fullmatch(r"0|[1-9][0-9]*", k) and isinstance(shape, list) and len(shape)
                <= 64 and all(type(n) is int and n >= 0 for n in shape)):
            raise _damaged(where, f"'example_fills' entry {k!r}: {shape!r} must be a list "
                                  "of sizes keyed by an example input's number")
        if key not in arrays:
            raise _damaged(where, f"example input {k} in 'example_fills' is missing from "
                                  "the weights")
        a = arrays[key]
        if a.size != 1:
            raise _damaged(where, f"example input {k} in 'example_fills' holds {a.size} "
                                  "values in the weights; a fill holds one value")
        try:
            arrays[key] = np.broadcast_to(a.reshape(()), tuple(shape))
        except ValueError as e:    # more elements than numpy can index
            raise _damaged(where, f"'example_fills' entry {k!r}: {e}") from None


def _drop_unread(g, slots) -> list:
    """Drop the inputs other than arguments that no node or output reads (state that
    `freeze_state` made constants, the `.grad` buffers the trace lifted with their
    parameters), so that an inference program stores each weight once and no gradients;
    the arguments stay, and with them the calling convention. Returns the kept slots."""
    read = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
    keep = [i for i, ((kind, _), v) in enumerate(zip(slots, g.inputs))
            if kind == "arg" or v.id in read]
    g.inputs = [g.inputs[i] for i in keep]
    return [slots[i] for i in keep]


def _arg_names(args, params) -> list:
    """A name per tensor leaf of the call: the parameter's, with `.k` for the k-th leaf of
    a nested argument (unique; `argN` where the signature has no name)."""
    names = []
    for i, a in enumerate(args):
        sub = pytree.leaves_of(a)
        base = params[i] if i < len(params) else f"arg{i}"
        names += [base] if isinstance(a, Tensor) else [f"{base}.{k}" for k in range(len(sub))]
    return names if len(set(names)) == len(names) else [f"arg{i}" for i in range(len(names))]


def write_dir(path: str, files: dict, arrays: dict) -> str:
    """Write a program folder atomically: `files` ({name: bytes}), `arrays` into the
    weights, the checksums last (see the module doc). Returns `path`."""
    folder, base = os.path.split(os.path.abspath(path))   # "m.sampan/" names m.sampan
    _atomic.recover_dir(path, _complete)   # a crash between two renames: repair first
    _atomic.remove_stale(folder, _atomic.dir_temp_pattern(base))
    fd, tmp = _atomic.create_dir(folder, lambda tok: f"{base}.tmp-{tok}")
    try:
        sums = {}
        for name, data in files.items():
            sums[name] = hashlib.sha256(data).hexdigest()
            _write_file(os.path.join(tmp, name), lambda f, d=data: f.write(d))
        h = hashlib.sha256()
        _write_file(os.path.join(tmp, "weights.safetensors"),
                    lambda f: _tf.write(f, arrays, {"format": FORMAT}, h))
        sums["weights.safetensors"] = h.hexdigest()
        # written last: a folder with this file is complete
        _write_file(os.path.join(tmp, _SUMS), lambda f: f.write(_sums_text(sums)))
        _atomic.fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _atomic.release(fd)
        raise
    try:
        _atomic.publish_dir(tmp, path)   # removes or keeps `tmp` itself on a failure
    finally:
        _atomic.release(fd)
    return path


def _write_file(p: str, write) -> None:
    with open(p, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _sums_text(sums: dict) -> bytes:
    return "".join(f"{sums[n]}  {n}\n" for n in _SUMMED).encode("ascii")


def _complete(folder: str) -> bool:
    try:
        read(folder, _recover=False)
        return True
    except (LoadError, OSError):
        return False


# ---------------------------------------------------------------------- reading
def read(path, _recover=True):
    """Read and verify a saved program: (graph, meta, arrays). Raises LoadError.

    A program a crashed save left half replaced is first put back in place (see the
    module doc); `_recover=False` reads exactly `path`.

    The folder is opened once and its files are read relative to that handle, so a save
    that swaps in a new program meanwhile cannot mix the two; a shared lock on it keeps
    a save from removing the replaced folder before its files are read (see
    `_atomic.publish_dir`). A folder swapped out between the open and the lock, or one
    whose files went anyway (no locks on this filesystem), is read again from `path`:
    old or new program, never "damaged". `recover_dir`, which holds the folders it
    checks, reads with `_recover=False` and takes no lock."""
    path = os.fspath(path)
    if _recover and not os.path.isdir(path):
        _atomic.recover_dir(path, _complete)
    attempts, wait_until = 0, None
    while True:
        try:
            dfd = _open_dir(path)
        except LoadError:
            # a save publishing in two renames (no renameat2 here) leaves no `path`
            # between them: wait a little for the new folder
            wait_until = wait_until or time.monotonic() + 1.0
            if not (_recover and time.monotonic() < wait_until
                    and (_atomic.replacing(path) or os.path.isdir(path))):
                raise
            time.sleep(0.001)
            continue
        attempts += 1
        last = attempts == _READ_ATTEMPTS
        try:
            if _recover and _atomic.lock_shared(dfd) and _swapped(path, dfd) and not last:
                continue    # replaced before the lock: read the new one
            return _read_at(path, dfd)
        except LoadError:
            if last or not _swapped(path, dfd):
                raise
        finally:
            os.close(dfd)


def _open_dir(path):
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise LoadError(f"sampan.jit.load: {path} is not a saved program directory") from None
    except OSError as e:
        raise LoadError(f"sampan.jit.load: {path} cannot be read: {e}") from None


def _swapped(path, dfd) -> bool:
    """Whether the folder open as `dfd` is no longer the one at `path` (a save replaced
    it, or removed it after the swap)."""
    try:
        st, now = os.fstat(dfd), os.stat(path)
    except OSError:
        return True
    return st.st_nlink == 0 or (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino)


def _read_at(path, dfd):
    """`read` of the folder `path`, open as `dfd`: each file opened relative to it."""
    from ..ir import parse, verify
    try:
        os.stat(_SUMS, dir_fd=dfd)
        has_sums = True
    except FileNotFoundError:
        has_sums = False
    except OSError as e:
        raise LoadError(f"sampan.jit.load: {os.path.join(path, _SUMS)} cannot be read: "
                        f"{e}") from None
    if has_sums:
        sums = _read_sums(path, dfd)
        meta = _read_meta(path, sums["meta.json"], dfd)
        if not any(_is_version(meta, v) for v in _SUMMED_VERSIONS):
            raise LoadError(f"sampan.jit.load: {path}/meta.json says format version "
                            f"{meta.get('version')!r}, but only version "
                            f"{' or '.join(map(str, _SUMMED_VERSIONS))} programs "
                            f"have {_SUMS}; the program is damaged")
    else:
        meta = _read_meta(path, None, dfd)
        if any(_is_version(meta, v) for v in _SUMMED_VERSIONS):
            raise LoadError(f"sampan.jit.load: {os.path.join(path, _SUMS)} is missing "
                            "(incomplete or damaged save)")
        if not _is_version(meta, 1):
            raise LoadError(f"sampan.jit.load: {path}/meta.json has an invalid format version "
                            f"{meta.get('version')!r}; the program is damaged")
        sums = meta.get("sha256")   # version 1: checksums of the other two files only
        if not isinstance(sums, dict) or not all(isinstance(sums.get(n), str) for n in _FILES):
            raise LoadError(f"sampan.jit.load: {path}/meta.json lacks the sha256 of "
                            f"{' and '.join(_FILES)}; the program is damaged")
    gpath = os.path.join(path, "graph.ir")
    text = _read_checked(gpath, sums["graph.ir"], _MAX_GRAPH, dfd).decode("utf-8", "replace")
    raw = _read_weights(os.path.join(path, "weights.safetensors"), sums["weights.safetensors"],
                        dfd)
    arrays = _typed_arrays(path, meta, raw)
    _fill_examples(path, meta, arrays)
    consts = {k[len("const."):]: a for k, a in arrays.items() if k.startswith("const.")}
    try:
        g = parse(text, consts)
    except Exception as e:  # noqa: BLE001 - the text is checksummed: only a writer bug
        raise LoadError(f"sampan.jit.load: graph of {path} is invalid: {e}") from None
    if any(n.blocks for n in g.nodes) and not _is_version(meta, 4):
        raise _damaged(os.path.join(path, "meta.json"), f"format version "
                       f"{meta.get('version')!r} has no control flow, but its graph holds "
                       "nested blocks (version 4 does)")
    _check_meta(path, meta, g, arrays)
    try:
        verify(_at_example_sizes(g, meta, arrays))
    except Exception as e:  # noqa: BLE001
        raise LoadError(f"sampan.jit.load: graph of {path} is invalid: {e}") from None
    return g, meta, arrays


def _is_version(meta, v) -> bool:
    return type(meta.get("version")) is int and meta["version"] == v   # not True == 1


def _at_example_sizes(g, meta, arrays):
    """`g`, or for a graph with symbolic dims its concrete form at the example inputs'
    sizes (shape rules check concrete graphs)."""
    if not _dyn.symbols_of(g):
        return g
    return _dyn.concrete(g, _example_sizes(g, meta, arrays))


def _example_sizes(g, meta, arrays) -> dict:
    """{symbol: size} of graph `g`'s symbolic input dims at the example inputs."""
    args = {i: arrays[f"example.{spec['index']}"] for i, spec in enumerate(meta["inputs"])
            if spec["kind"] == "arg"}
    dims = _dyn.input_dims(g, list(args))
    sizes = {}
    for p, ds in dims.items():
        for d, s in ds.items():
            sizes[s] = args[p].shape[d]
    return sizes


def _damaged(p, why="its sha256 checksum does not match the one recorded when it was saved"):
    return LoadError(f"sampan.jit.load: {p} is damaged: {why}")


def _open(p, dfd=None):
    """`p` opened for reading; with `dfd`, its base name in the folder open as `dfd`."""
    try:
        if dfd is None:
            return open(p, "rb")
        return open(os.path.basename(p), "rb",
                    opener=lambda name, flags: os.open(name, flags, dir_fd=dfd))
    except FileNotFoundError:
        raise LoadError(f"sampan.jit.load: {p} is missing (incomplete or damaged save)") \
            from None
    except OSError as e:
        raise LoadError(f"sampan.jit.load: {p} cannot be read: {e}") from None


def _read_checked(p, sha, limit, dfd=None):
    """The bytes of `p` (refused unread above `limit`), checked against `sha` if given."""
    with _open(p, dfd) as f:
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise _damaged(p, f"it has {size} bytes, more than the {limit} a saved program's "
                              "file of this kind can have")
        data = f.read()
    if sha is not None and hashlib.sha256(data).hexdigest() != sha:
        raise _damaged(p)
    return data


def _read_sums(path, dfd=None):
    p = os.path.join(path, _SUMS)
    data = _read_checked(p, None, _MAX_SUMS, dfd)
    rx = re.compile(r"([0-9a-f]{64})  (\S+)")
    sums = {}
    try:
        lines = data.decode("ascii").split("\n")
    except UnicodeDecodeError:
        lines = None
    if lines is not None and lines[-1] == "":
        for ln in lines[:-1]:
            m = rx.fullmatch(ln)
            if not m or m.group(2) in sums:
                break
            sums[m.group(2)] = m.group(1)
    if lines is None or sorted(sums) != sorted(_SUMMED) or _sums_text(sums) != data:
        raise _damaged(p, f"it must list the sha256 of exactly {', '.join(_SUMMED)}, "
                          "one '<hex>  <name>' line each")
    return sums


def _read_meta(path, sha, dfd=None):
    p = os.path.join(path, "meta.json")
    data = _read_checked(p, sha, _MAX_META, dfd)
    try:
        meta = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise _damaged(p, f"not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _damaged(p, "not a JSON object")
    if meta.get("format") != FORMAT:
        raise LoadError(f"sampan.jit.load: {path} is not a sampan.jit program "
                        f"(format {meta.get('format')!r})")
    v = meta.get("version")
    if type(v) is int and v > VERSION:
        raise LoadError(f"sampan.jit.load: {path} has format version {v}; this "
                        f"sampan reads up to version {VERSION}: upgrade sampan")
    return meta


def _read_weights(p, sha, dfd=None):
    with _open(p, dfd) as f:
        size = os.fstat(f.fileno()).st_size
        h = hashlib.sha256()
        try:
            raw, _ = _tf.read(f, size, LoadError, f"sampan.jit.load: {p} is damaged", h)
        except LoadError:
            raise
        except OSError as e:
            raise LoadError(f"sampan.jit.load: {p} cannot be read: {e}") from None
    if h.hexdigest() != sha:
        raise _damaged(p)
    return raw


def _typed_arrays(path, meta, raw):
    dtypes = meta.get("dtypes")
    if not isinstance(dtypes, dict) or set(dtypes) != set(raw):
        raise _damaged(os.path.join(path, "meta.json"),
                       "its 'dtypes' do not name exactly the arrays in weights.safetensors")
    out = {}
    for k, a in raw.items():
        try:
            d = _dt.as_dtype(dtypes[k])
        except Exception:  # noqa: BLE001 - any spelling numpy and sampan do not know
            d = None
        if d is not None and a.dtype != d and a.dtype == np.uint16 and d.itemsize == 2 \
                and meta["version"] == 1:
            a = a.view(d)   # version 1 stored 16-bit floats as uint16
        if d is None or a.dtype != d:
            raise _damaged(os.path.join(path, "meta.json"),
                           f"array '{k}' is {a.dtype} in weights.safetensors but "
                           f"{dtypes[k]!r} in meta.json")
        out[k] = a
    return out


def _check_meta(path, meta, g, arrays):
    """Every field `Loaded` reads, checked against the graph and the arrays."""
    where = os.path.join(path, "meta.json")

    def need(ok, what):
        if not ok:
            raise _damaged(where, what)

    def is_int(x, lo=0, hi=None):
        return type(x) is int and x >= lo and (hi is None or x < hi)

    def fits(a, v):
        return a.dtype == v.dtype and (tuple(a.shape) == tuple(v.shape)
                                       or not all(type(d) is int for d in v.shape))
    n_args, n_oc = meta.get("n_args"), meta.get("n_outconst", 0)
    need(is_int(n_args) and is_int(n_oc), "'n_args' and 'n_outconst' must be counts")
    need(isinstance(meta.get("graph_name", ""), str), "'graph_name' must be a string")
    for i in range(n_args):
        need(f"example.{i}" in arrays, f"example input {i} is missing from the weights")
    for i in range(n_oc):
        need(f"outconst.{i}" in arrays, f"output constant {i} is missing from the weights")
    ins = meta.get("inputs")
    need(isinstance(ins, list) and len(ins) == len(g.inputs),
         f"'inputs' must list the graph's {len(g.inputs)} inputs")
    for spec, v in zip(ins, g.inputs):
        need(isinstance(spec, dict) and spec.get("kind") in _IN_KINDS,
             f"input {spec!r} must be an object with a kind in {_IN_KINDS}")
        if spec["kind"] == "arg":
            idx = spec.get("index")
            need(is_int(idx, 0, n_args), f"input {spec!r}: index must be below n_args={n_args}")
            need(fits(arrays[f"example.{idx}"], v),
                 f"input {spec!r}: its example is {arrays[f'example.{idx}'].dtype}"
                 f"{list(arrays[f'example.{idx}'].shape)}, the graph wants {v.type_str()}")
        else:
            key = spec.get("key")
            need(isinstance(key, str) and key in arrays,
                 f"input {spec!r}: key must name an array of the weights")
            need(fits(arrays[key], v), f"input {spec!r} is {arrays[key].dtype}"
                                       f"{list(arrays[key].shape)}, the graph wants "
                                       f"{v.type_str()}")
    outs = meta.get("outputs")
    need(isinstance(outs, list) and len(outs) == len(g.outputs)
         and all(k in _OUT_KINDS for k in outs),
         f"'outputs' must list the graph's {len(g.outputs)} output kinds")
    pytree.check_json(meta.get("out_tree"), sum(k == "out" for k in outs), n_oc, need)
    if "guards" in meta:   # the size conditions of a program saved with dynamic= dims
        try:
            guards = _dyn.guards_from_json(meta["guards"], where)
        except SampanError as e:
            raise _damaged(where, f"'guards' is not a list of size conditions ({e})") from None
        syms = _dyn.symbols_of(g)
        need(all(_dyn.guard_symbols(x) <= syms for x in guards),
             "'guards' name sizes the graph does not have")

