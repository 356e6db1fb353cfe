"""Compiled feature transforms: a declared :class:`FeatureSpec` turns raw fields into the
named sparse and dense features a CTR model trains on, the same way in training (the
Parquet reader applies it in its background thread: ``ParquetCTRReader(...,
features=spec)``) and in serving (a ``dlrm`` model directory carries it and ``sampan
serve`` applies it to the raw request fields).

Every field and feature is CSR inside: ``offsets`` (rows + 1, from 0, non-decreasing) and
``values`` (ints, floats, or strings held as UTF-8 bytes with per-value spans). The ops:

``hash``       ints or strings -> ids in ``[0, buckets)`` (or the full 64-bit hash when
               ``buckets`` is null), the seeded ``sampan-hash64`` of ``_feature_kernels``
               (``hash64`` computes it on its own)
``bucketize``  numbers -> bucket ``i`` = how many ``boundaries`` are <= the value (the
               boundaries strictly increasing); NaN (and null) -> ``len(boundaries) + 1``
``cross``      two or more int/string fields -> per row the cartesian product of their
               values (the first field outermost), each combination hashed (as TF's
               crossed columns); a row where one field is empty has no crosses
``sequence``   ints or floats -> exactly ``length`` values a row, the ``keep`` ``"first"``
               or ``"last"`` ones, padded with ``pad``; ints stay sparse, floats dense
``dense``      one number a row -> a dense float32 feature, NaN and null -> ``fill``

A feature's ``input`` (``inputs`` for cross) names a declared raw field or an earlier
feature; ``"output": false`` keeps a feature internal. The spec is plain JSON data, never
code, with a format version; an unknown version, op or parameter is refused.

>>> spec = FeatureSpec({"city": "string", "age": "float"}, [
...     {"name": "city_id", "op": "hash", "input": "city", "buckets": 100},
...     {"name": "age_b", "op": "bucketize", "input": "age", "boundaries": [18, 65]}])
>>> spec.apply({"city": ["Oslo", "Lima"], "age": [30.0, 70.0]}).sparse["age_b"][1].tolist()
[1, 2]
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import numpy as np

from sampan.errors import DTypeError, SampanValueError
from sampan.rec import _feature_kernels as K

__all__ = ["FORMAT", "VERSION", "FeatureSpec", "Features", "hash64", "load_spec"]

FORMAT = "sampan.feature_spec"
VERSION = 1
INPUT_TYPES = ("int", "float", "string", "list<int>", "list<float>", "list<string>")
SERVING_TYPES = {"int": "INT64", "float": "FP32", "string": "BYTES"}


@dataclass
class _Col:
    """A field or feature inside the spec: CSR offsets and values of one element kind.
    ``checked`` once its offsets (and string spans) are known valid; ``content`` the
    values' 64-bit contents, computed once (see ``_feature_kernels``)."""
    offsets: np.ndarray
    values: object  # int64 / float64 array, or (data, starts, ends) for strings
    kind: str       # "int", "float" or "string"
    checked: bool = False
    content: np.ndarray | None = None


def _spec_error(got: str, expected: str) -> SampanValueError:
    return SampanValueError(f"FeatureSpec: got {got}; expected {expected}")


# ------------------------------------------------------------------ raw columns -> _Col
_IDENT: dict = {}


def _ident(n: int) -> np.ndarray:
    """``arange(n + 1)``, read-only and shared: the offsets of one value a row (the ops
    recognise it by identity and take their one-a-row paths)."""
    a = _IDENT.get(n)
    if a is None:
        a = np.arange(n + 1, dtype=np.int64)
        a.flags.writeable = False
        if len(_IDENT) >= 8:  # the latest few sizes (rows, flattened list values) only
            _IDENT.clear()
        _IDENT[n] = a
    return a


def _arrow(col, name: str, n_rows):
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if not isinstance(col, pa.Array):
        a = np.asarray(col) if not isinstance(col, list) else None
        if a is not None and a.ndim == 2:  # a fixed number of values a row
            flat = pa.array(a.reshape(-1))
            col = pa.FixedSizeListArray.from_arrays(flat, a.shape[1]).cast(pa.list_(flat.type))
        else:
            try:
                col = pa.array(col if a is None else a)
            except (pa.ArrowException, TypeError, ValueError) as e:
                raise SampanValueError(f"feature input {name!r}: got values Arrow cannot "
                                       f"read ({e}); expected a column of one type") from None
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if n_rows is not None and len(col) != n_rows:
        raise SampanValueError(f"feature input {name!r}: got {len(col)} rows; expected "
                               f"{n_rows} (as the other inputs)")
    return col


def _scalar(col, name: str, kind: str, pa, pc) -> _Col:
    """One value a row (or the flattened values of a list column): nulls of ints and
    strings make empty rows, null floats NaN."""
    t = col.type
    if kind == "float":
        if not (pa.types.is_floating(t) or pa.types.is_integer(t)):
            raise DTypeError(f"feature input {name!r}: got Arrow type {t}; expected numbers")
        if col.null_count:
            col = pc.fill_null(col.cast(pa.float64()), math.nan)
        v = col.to_numpy(zero_copy_only=False)
        return _Col(_ident(v.size), np.asarray(v, np.float64), kind, True)
    valid = None
    if col.null_count:
        valid = col.is_valid().to_numpy(zero_copy_only=False)
    if kind == "int":
        if not pa.types.is_integer(t):
            raise DTypeError(f"feature input {name!r}: got Arrow type {t}; expected integers")
        if valid is not None:
            col = col.fill_null(0)
        v = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    else:
        if getattr(pa.types, "is_string_view", lambda _: False)(t):
            col, t = col.cast(pa.large_string()), pa.large_string()
        if pa.types.is_string(t) or pa.types.is_binary(t):
            odt = np.int32
        elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
            odt = np.int64
        else:
            raise DTypeError(f"feature input {name!r}: got Arrow type {t}; expected strings")
        bufs = col.buffers()
        n = len(col)
        offs = np.frombuffer(bufs[1], odt, count=col.offset + n + 1)[col.offset:]
        data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and n else \
            np.zeros(0, np.uint8)
        starts, ends = offs[:-1].astype(np.int64), offs[1:].astype(np.int64)
        v = (data, starts, ends)
    if valid is None:
        n = len(col)
        return _Col(_ident(n), v, kind, kind == "int")
    offsets = np.zeros(valid.size + 1, np.int64)
    np.cumsum(valid, out=offsets[1:])
    v = v[valid] if kind == "int" else (v[0], v[1][valid], v[2][valid])
    return _Col(offsets, v, kind, kind == "int")


def column(col, name: str, typ: str, n_rows: int | None = None) -> _Col:
    """A raw field (pyarrow array, numpy array or list) as the spec's CSR column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = _arrow(col, name, n_rows)
    kind = typ[5:-1] if typ.startswith("list<") else typ
    if typ == kind:
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            raise DTypeError(f"feature input {name!r}: got Arrow type {col.type}; expected "
                             f"one {kind} a row (declare it 'list<{kind}>')")
        return _scalar(col, name, kind, pa, pc)
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise DTypeError(f"feature input {name!r}: got Arrow type {col.type}; expected a "
                         f"list column ({typ})")
    if col.null_count:
        raise SampanValueError(f"feature input {name!r}: got {col.null_count} null lists; "
                               f"expected no null lists (write an empty list)")
    offs = col.offsets.to_numpy().astype(np.int64)
    inner = _scalar(col.flatten(), name, kind, pa, pc)
    if inner.offsets.size - 1 != inner.offsets[-1]:
        raise SampanValueError(f"feature input {name!r}: got null values inside lists; "
                               f"expected none")
    return _Col(offs - offs[0], inner.values, kind)


# ---------------------------------------------------------------------------- the ops
def _n_values(c: _Col) -> int:
    return c.values[1].size if c.kind == "string" else c.values.size


def _checked(f: dict, c: _Col, n_rows: int) -> np.ndarray:
    if not c.checked:  # once a column: what the kernels made is valid by construction
        if c.offsets is not _ident(n_rows) or _n_values(c) != n_rows:
            c.offsets = K.check_csr(f["name"], c.offsets, _n_values(c), n_rows)
        if c.kind == "string":
            c.values = K.check_spans(f["name"], *c.values)
        c.checked = True
    return c.offsets


def _content(c: _Col) -> np.ndarray:
    if c.content is None:
        if c.kind == "string":
            data, starts, ends = c.values
            c.content = np.empty(starts.size, np.int64)
            K.content_strings(K.padded_words(data), starts, ends, c.content)
        else:
            c.content = np.ascontiguousarray(c.values, np.int64)
    return c.content


def _hash_values(name: str, c: _Col, seed: int, buckets) -> np.ndarray:
    out = np.empty(_n_values(c), np.int64)
    K.hash_ints(_content(c), K.seed_key(seed), np.int64(buckets or 0), out)
    return out


def _op_hash(f, cols, n):
    (c,) = cols
    offs = _checked(f, c, n)
    return _Col(offs, _hash_values(f["name"], c, f["seed"], f["buckets"]), "int", True)


def _op_bucketize(f, cols, n):
    (c,) = cols
    v = np.ascontiguousarray(c.values, np.float64)
    out = np.empty(v.size, np.int64)
    K.bucketize(v, np.asarray(f["boundaries"], np.float64), out)
    return _Col(_checked(f, c, n), out, "int", True)


def _op_cross(f, cols, n):
    key, nb = K.seed_key(f["seed"]), np.int64(f["buckets"] or 0)
    if all(_checked(f, c, n) is _ident(n) for c in cols):  # one value a row in each
        out = np.empty(n, np.int64)
        K.cross_rows(np.stack([_content(c) for c in cols]), key, nb, out)
        return _Col(_ident(n), out, "int", True)
    offs = np.empty((len(cols), n + 1), np.int64)
    parts, base = [], 0
    for i, c in enumerate(cols):
        offs[i] = _checked(f, c, n) + base
        h = _content(c)
        parts.append(h)
        base += h.size
    out_offs = np.empty(n + 1, np.int64)
    K.cross_count(offs, out_offs)
    out = np.empty(int(out_offs[-1]), np.int64)
    K.cross_fill(offs, np.concatenate(parts) if parts else np.zeros(0, np.int64), key, nb,
                 out_offs, out)
    return _Col(out_offs, out, "int", True)


def _op_sequence(f, cols, n):
    (c,) = cols
    offs = _checked(f, c, n)
    length = f["length"]
    dt = np.int64 if c.kind == "int" else np.float64
    out = np.full((n, length), f["pad"], dt)
    K.sequence(offs, np.ascontiguousarray(c.values, dt), length, f["keep"] == "last", out)
    return _Col(np.arange(0, n * length + 1, length, dtype=np.int64), out.reshape(-1), c.kind,
                True)


def _op_dense(f, cols, n):
    (c,) = cols
    offs = _checked(f, c, n)
    if offs is not _ident(n) and not np.array_equal(offs, np.arange(n + 1)):
        lens = np.diff(offs)
        i = int(np.flatnonzero(lens != 1)[0])
        raise SampanValueError(f"feature {f['name']!r}: got {int(lens[i])} values in row "
                               f"{i}; expected one a row (use 'sequence' for lists)")
    v = np.asarray(c.values, np.float64).copy()
    v[np.isnan(v)] = f["fill"]
    return _Col(offs, v, "float", True)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _buckets_ok(x) -> bool:
    return x is None or (_is_int(x) and 1 <= x < 1 << 63)


def _seed_ok(x) -> bool:
    return _is_int(x) and 0 <= x < 1 << 64


def _bounds_ok(x) -> bool:
    return (isinstance(x, list) and all(_is_num(v) and math.isfinite(v) for v in x)
            and all(a < b for a, b in zip(x, x[1:])))


# op -> (run, input kinds it takes, min inputs, {param: (default or REQUIRED, check, says)},
#        output kind given the input kind)
REQUIRED = object()
_OPS = {
    "hash": (_op_hash, ("int", "string"), 1, {
        "buckets": (None, _buckets_ok, "an integer >= 1 or null"),
        "seed": (0, _seed_ok, "an integer in [0, 2^64)")}, lambda k: "int"),
    "bucketize": (_op_bucketize, ("int", "float"), 1, {
        "boundaries": (REQUIRED, _bounds_ok, "a list of finite, strictly increasing numbers")},
        lambda k: "int"),
    "cross": (_op_cross, ("int", "string"), 2, {
        "buckets": (None, _buckets_ok, "an integer >= 1 or null"),
        "seed": (0, _seed_ok, "an integer in [0, 2^64)")}, lambda k: "int"),
    "sequence": (_op_sequence, ("int", "float"), 1, {
        "length": (REQUIRED, lambda x: _is_int(x) and x >= 1, "an integer >= 1"),
        "keep": ("first", lambda x: x in ("first", "last"), "'first' or 'last'"),
        "pad": (0, _is_num, "a number")}, lambda k: k),
    "dense": (_op_dense, ("int", "float"), 1, {
        "fill": (0.0, _is_num, "a number")}, lambda k: "float"),
}


def hash64(values, seed: int = 0, buckets: int | None = None) -> np.ndarray:
    """``sampan-hash64`` of ints or strings (see ``_feature_kernels``), as int64.

    >>> int(hash64([0])[0]) == int(hash64(np.array([0]))[0])
    True
    """
    import pyarrow as pa

    col = _arrow(values, "hash64", None)
    kind = "string" if (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                        or pa.types.is_binary(col.type)) else "int"
    c = column(col, "hash64", kind)
    return _hash_values("hash64", c, seed, buckets)


# ---------------------------------------------------------------------------- the spec
@dataclass
class Features:
    """The spec's output for ``n_rows`` rows: ``sparse[name] = (offsets, ids int64)`` and
    ``dense[name]`` float32 ``(n_rows, width)``."""
    n_rows: int
    sparse: dict
    dense: dict

    def ids_matrix(self) -> np.ndarray:
        """``(n_rows, F)`` int64 ids, each sparse feature giving a fixed number a row."""
        cols = []
        for name, (offs, ids) in self.sparse.items():
            lens = np.diff(offs)
            if lens.size and (lens != lens[0]).any():
                raise SampanValueError(f"feature {name!r}: got rows of {int(lens.min())} to "
                                       f"{int(lens.max())} ids; expected the same number a "
                                       f"row for an ids matrix")
            cols.append(ids.reshape(self.n_rows, -1))
        return np.concatenate(cols, axis=1) if cols else np.zeros((self.n_rows, 0), np.int64)

    def dense_matrix(self) -> np.ndarray:
        """``(n_rows, D)`` float32: the dense features side by side, in spec order."""
        if not self.dense:
            return np.zeros((self.n_rows, 0), np.float32)
        return np.concatenate(list(self.dense.values()), axis=1)


class FeatureSpec:
    """Raw fields (``inputs``: name -> one of ``INPUT_TYPES``) -> features (a list of op
    records, see the module docstring), checked completely when made.

    >>> FeatureSpec({"x": "int"}, [{"name": "x_id", "op": "hash", "input": "x"}]).sparse_names
    ['x_id']
    """

    def __init__(self, inputs: dict, features: list):
        if not isinstance(inputs, dict) or not inputs:
            raise _spec_error(f"inputs {inputs!r:.80}", "a non-empty object of field -> type")
        for k, t in inputs.items():
            if not isinstance(k, str) or t not in INPUT_TYPES:
                raise _spec_error(f"input {k!r} of type {t!r}", f"a type in {INPUT_TYPES}")
        if not isinstance(features, list) or not features:
            raise _spec_error(f"features {features!r:.80}", "a non-empty list of records")
        self.inputs = dict(inputs)
        kinds = {k: (t[5:-1] if t.startswith("list<") else t) for k, t in inputs.items()}
        self.features, self.sparse_names, self.dense_names = [], [], []
        self.widths: dict = {}
        fixed = {k: (1 if not t.startswith("list<") else None) for k, t in inputs.items()}
        for rec in features:
            f, kind, width = self._check(rec, kinds, fixed)
            kinds[f["name"]], fixed[f["name"]] = kind, width
            self.features.append(f)
            if f["output"]:
                if f["op"] == "dense" or (f["op"] == "sequence" and kind == "float"):
                    self.dense_names.append(f["name"])
                else:
                    self.sparse_names.append(f["name"])
                self.widths[f["name"]] = width
        self.dense_width = sum(self.widths[n] for n in self.dense_names)

    @staticmethod
    def _check(rec, kinds: dict, fixed: dict):
        if not isinstance(rec, dict):
            raise _spec_error(f"feature record {rec!r:.80}", "an object")
        name, op = rec.get("name"), rec.get("op")
        if not isinstance(name, str) or not name or name in kinds:
            raise _spec_error(f"feature name {name!r}", "a new, non-empty name (not a field "
                              "or an earlier feature)")
        if op not in _OPS:
            raise _spec_error(f"op {op!r} in feature {name!r}", f"one of {sorted(_OPS)}")
        _run, takes, min_in, params, out_kind = _OPS[op]
        many = op == "cross"
        srcs = rec.get("inputs") if many else [rec.get("input")]
        allowed = {"name", "op", "output", "inputs" if many else "input", *params}
        extra = sorted(set(rec) - allowed)
        if extra:
            raise _spec_error(f"unknown key(s) {extra} in feature {name!r} ({op})",
                              f"keys among {sorted(allowed)}")
        if not isinstance(srcs, list) or len(srcs) < min_in:
            raise _spec_error(f"inputs {srcs!r} of feature {name!r}",
                              f"a list of at least {min_in} names")
        for s in srcs:
            if s not in kinds:
                raise _spec_error(f"input {s!r} of feature {name!r}", "a declared field or "
                                  "an earlier feature")
            if kinds[s] not in takes:
                raise _spec_error(f"input {s!r} of kind {kinds[s]} for {op} feature "
                                  f"{name!r}", f"one of {list(takes)}")
        f = {"name": name, "op": op, "output": rec.get("output", True)}
        if not isinstance(f["output"], bool):
            raise _spec_error(f"output {f['output']!r} in feature {name!r}", "true or false")
        f["inputs" if many else "input"] = list(srcs) if many else srcs[0]
        for p, (default, ok, says) in params.items():
            v = rec.get(p, default)
            if v is REQUIRED or not ok(v):
                raise _spec_error(f"{p}={v if v is not REQUIRED else 'missing'!r} in {op} "
                                  f"feature {name!r}", says)
            f[p] = v
        if op == "sequence" and kinds[srcs[0]] == "int" and not _is_int(f["pad"]):
            raise _spec_error(f"pad={f['pad']!r} for int feature {name!r}", "an integer pad")
        width = {"sequence": f.get("length"), "dense": 1}.get(
            op, fixed[srcs[0]] if op != "cross" else None)
        if op == "cross" and all(fixed[s] == 1 for s in srcs):
            width = 1
        return f, out_kind(kinds[srcs[0]]), width

    # ------------------------------------------------------------------ plain data
    def to_dict(self) -> dict:
        """The spec as plain data (what ``to_json`` writes)."""
        return {"format": FORMAT, "version": VERSION, "inputs": dict(self.inputs),
                "features": [dict(f) for f in self.features]}

    @classmethod
    def from_dict(cls, d) -> FeatureSpec:
        """A spec from plain data, refusing another format or an unknown version."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise _spec_error(f"format {d.get('format') if isinstance(d, dict) else d!r:.80}",
                              f"{FORMAT!r}")
        if d.get("version") != VERSION:
            raise _spec_error(f"version {d.get('version')!r}", f"version {VERSION} (this "
                              f"sampan reads feature specs of version {VERSION})")
        extra = sorted(set(d) - {"format", "version", "inputs", "features"})
        if extra:
            raise _spec_error(f"unknown key(s) {extra}", "format, version, inputs, features")
        return cls(d.get("inputs"), d.get("features"))

    def to_json(self) -> str:
        """Canonical JSON text (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FeatureSpec:
        """Parse :meth:`to_json`'s text (JSON only: nothing in it is run)."""
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as e:
            raise _spec_error(f"text that is not JSON ({e})", "a feature spec's JSON") from None
        return cls.from_dict(d)

    def save(self, path: str) -> None:
        """Write the spec atomically with the sha256 of its canonical JSON."""
        from sampan.io._atomic import write_file

        body = self.to_json()
        doc = {"sha256": hashlib.sha256(body.encode()).hexdigest(), "spec": json.loads(body)}
        data = json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"
        write_file(path, lambda f: f.write(data))

    def __eq__(self, other) -> bool:
        return isinstance(other, FeatureSpec) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"FeatureSpec(sparse={self.sparse_names}, dense={self.dense_names})"

    # ------------------------------------------------------------------ applying
    def apply(self, columns, n_rows: int | None = None) -> Features:
        """Transform raw fields (a pyarrow RecordBatch/Table or a dict of name -> pyarrow
        array, numpy array or list) into :class:`Features`."""
        get = columns.column if hasattr(columns, "schema") else columns.__getitem__
        names = columns.schema.names if hasattr(columns, "schema") else list(columns)
        missing = [k for k in self.inputs if k not in names]
        if missing:
            raise SampanValueError(f"FeatureSpec.apply: got fields {sorted(names)}; expected "
                                   f"also {missing}")
        cols: dict = {}
        for k, t in self.inputs.items():
            cols[k] = column(get(k), k, t, n_rows)
            n_rows = cols[k].offsets.size - 1
        for f in self.features:
            srcs = f["inputs"] if f["op"] == "cross" else [f["input"]]
            cols[f["name"]] = _OPS[f["op"]][0](f, [cols[s] for s in srcs], n_rows)
        sparse = {n: (cols[n].offsets, cols[n].values) for n in self.sparse_names}
        dense = {n: np.asarray(cols[n].values, np.float32).reshape(n_rows, -1)
                 for n in self.dense_names}
        return Features(n_rows, sparse, dense)

    def ctr_batch(self, columns, labels: np.ndarray):
        """A :class:`sampan.rec.data.CTRBatch`: sparse feature ``f`` is field ``f``."""
        from sampan.rec.data import CTRBatch, _interleave

        out = self.apply(columns)
        n = out.n_rows
        offs = tuple(o for o, _ in out.sparse.values())
        vals = tuple(v for _, v in out.sparse.values())
        f = len(offs)
        if not f:
            return CTRBatch(np.zeros(n + 1, np.int64), np.zeros(0, np.int64),
                            np.zeros(0, np.int32), out.dense_matrix(), labels, 0)
        if all(o is _ident(n) for o in offs):  # one id a feature a row: stack them
            return CTRBatch(np.arange(0, n * f + 1, f, dtype=np.int64),
                            np.stack(vals, axis=1).ravel(),
                            np.tile(np.arange(f, dtype=np.int32), n), out.dense_matrix(),
                            labels, f)
        offs = tuple(o if o.flags.writeable else o.copy() for o in offs)  # one numba type
        nnz = sum(v.size for v in vals)
        indptr, indices = np.empty(n + 1, np.int64), np.empty(nnz, np.int64)
        fields = np.empty(nnz, np.int32)
        _interleave(offs, vals, indptr, indices, fields)
        return CTRBatch(indptr, indices, fields, out.dense_matrix(), labels, f)


def load_spec(path: str) -> FeatureSpec:
    """Read :meth:`FeatureSpec.save`'s file, verifying its checksum and version."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        doc = json.loads(raw)
        body = json.dumps(doc["spec"], sort_keys=True)
        ok = hashlib.sha256(body.encode()).hexdigest() == doc["sha256"]
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise SampanValueError(f"load_spec: got {path} that is corrupt or not a saved "
                               f"feature spec (checksum mismatch); expected an intact file "
                               f"written by FeatureSpec.save")
    return FeatureSpec.from_dict(doc["spec"])
