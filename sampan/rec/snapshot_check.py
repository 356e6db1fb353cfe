"""What a table snapshot file must hold before any of it is used (`snapshot.restore`,
`ServingTable`, `verify_snapshot`): header fields in range, every array with the dtype and
shape the header implies (compressed rows, per-row widths, slots, metadata), ids unique."""
from __future__ import annotations

import numpy as np

from sampan.rec.dynwidth import check_width_array
from sampan.rec.hashtable import META_FIELDS
from sampan.rec.kernels import unique_inverse
from sampan.rec.rowstore import ROW_DTYPES, raw_specs
from sampan.rec.snapshot_file import SnapshotError


def _want(path: str, arrays: dict, name: str, dtype, shape: tuple) -> np.ndarray:
    a = arrays.get(name)
    if a is None:
        raise SnapshotError(f"{path}: no {name!r} array")
    if a.dtype != np.dtype(dtype) or a.shape != shape:
        raise SnapshotError(f"{path}: {name!r} is {a.dtype}{list(a.shape)}, expected "
                            f"{np.dtype(dtype)}{list(shape)}")
    return a


def _check_file(path: str, header: dict, arrays: dict) -> None:
    """Everything a table file must hold, with shapes that agree, before any is used."""
    cfg = header.get("table")
    if header.get("kind") not in ("full", "delta") or not isinstance(cfg, dict):
        raise SnapshotError(f"{path}: not a table snapshot (kind {header.get('kind')!r})")
    ints = {"seq": header.get("seq"), "step": header.get("step"), "dim": cfg.get("dim"),
            "seed": cfg.get("seed"), "chunk_shift": cfg.get("chunk_shift")}
    if header["kind"] == "delta":
        ints["base_seq"] = header.get("base_seq")
    bad = [k for k, v in ints.items() if not isinstance(v, int) or isinstance(v, bool)]
    dim, width = cfg.get("dim"), cfg.get("slot_width")
    if not bad and not (dim >= 1 and 0 <= cfg["chunk_shift"] <= 30):
        bad = ["dim", "chunk_shift"]
    if not bad and (width is not None and (not isinstance(width, int) or width < 1)):
        bad = ["slot_width"]
    if not bad and (not isinstance(cfg.get("default"), list) or len(cfg["default"]) != dim
                    or not isinstance(cfg.get("init_std"), (int, float))
                    or not isinstance(cfg.get("slot_init"), (int, float))):
        bad = ["default", "init_std", "slot_init"]
    if bad:
        raise SnapshotError(f"{path}: header fields {bad} missing or out of range")
    if "ids" not in arrays or arrays["ids"].ndim != 1:
        raise SnapshotError(f"{path}: no one-dimensional 'ids' array")
    n = arrays["ids"].size
    _want(path, arrays, "ids", np.int64, (n,))
    row_dtype = cfg.get("row_dtype", "float32")
    if row_dtype not in ROW_DTYPES:
        raise SnapshotError(f"{path}: row_dtype {row_dtype!r}, expected one of {ROW_DTYPES}")
    for name, (dt, shape) in raw_specs(row_dtype, n, dim).items():
        _want(path, arrays, "weights" if name == "values" else f"weights.{name}", dt, shape)
    check_width_array(path, cfg, arrays, n)
    if width is not None:
        _want(path, arrays, "slots", np.float32, (n, width))
    for f in META_FIELDS:
        _want(path, arrays, f"meta.{f}", np.int64, (n,))
    if header["kind"] == "delta":
        r = arrays.get("removed")
        if r is None or r.dtype != np.int64 or r.ndim != 1:
            raise SnapshotError(f"{path}: delta without a one-dimensional int64 'removed'")
    if unique_inverse(arrays["ids"])[0].size != n:
        raise SnapshotError(f"{path}: an id appears twice in 'ids'")
