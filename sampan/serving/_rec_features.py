"""The feature spec a served DLRM carries (``sampan.rec.features``): loading it from the
model directory and the raw-field inputs it gives the model."""
from __future__ import annotations

import os

from sampan.serving.model import ServingError, TensorSpec


def load_features(config: dict, directory: str, where: str, n_fields: int, n_dense: int):
    """The feature spec a model directory carries (config key ``features``), or None."""
    rel = config.get("features")
    if rel is None:
        return None
    from sampan.rec.features import load_spec
    if not isinstance(rel, str):
        raise ServingError(f"serving: {where}: 'features' must be a path, got {rel!r}")
    try:
        spec = load_spec(os.path.join(directory, rel))
    except (OSError, ValueError) as e:
        raise ServingError(f"serving: {where}: cannot load the feature spec: {e}") from None
    strings = [k for k, t in spec.inputs.items() if "string" in t]
    if strings:  # the KServe v2 codecs carry numbers only (no BYTES tensors yet)
        raise ServingError(f"serving: {where}: the feature spec takes string field(s) "
                           f"{strings}, and the serving protocol carries no BYTES tensors "
                           f"yet; hash them to int fields in the spec's input instead")
    width = sum(spec.widths[n] or 0 for n in spec.sparse_names)
    if None in [spec.widths[n] for n in spec.sparse_names] or width != n_fields \
            or spec.dense_width != n_dense:
        raise ServingError(f"serving: {where}: the feature spec gives {width} ids and "
                           f"{spec.dense_width} dense values a row; the model takes "
                           f"{n_fields} and {n_dense}")
    return spec


def feature_inputs(spec) -> list:
    """One input a raw field: ``[-1]`` for one value a row, ``[-1, -1]`` for lists."""
    from sampan.rec.features import SERVING_TYPES
    out = []  # strings are refused by load_features until the protocol carries BYTES
    for k, t in spec.inputs.items():
        kind = t[5:-1] if t.startswith("list<") else t
        out.append(TensorSpec(k, SERVING_TYPES[kind], (-1,) if kind == t else (-1, -1)))
    return out
