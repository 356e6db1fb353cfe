"""The op table: `registry.py` holds it, one module per op family fills it.

`sampan/__init__.py` imports `load_all()` after Tensor exists; every op module is
listed once in `FAMILIES`."""

FAMILIES = ["creation", "elementwise", "unary", "index", "linalg", "random", "reduce", "shape",
            "getitem", "rowwise", "layernorm", "composite", "conv", "conv_transpose", "pool",
            "sort", "sparse", "fused", "mathops", "layout", "scatter", "scan", "decomp", "nn_ops",
            # issue 17, spatial area
            "pool_index", "padding", "pool3d", "resample", "grid", "bagnorm", "spatial1d",
            # issue 19: int8 quantisation; subgraphs run by onnxruntime (the offload pass)
            "quant", "engine",
            # issue 31: the requantising int8 layers fuse_quant emits
            "quant_fused",
            # issue 31: a float layer with its epilogue (the Predictor's fuse_dense)
            "dense",
            # issue 31: masked self-attention in one node (the Predictor's fuse_attention)
            "attention",
            # issue 23: collectives (run through the current sampan.distributed group)
            "collective",
            # issue 34: control flow (nodes holding nested Graphs)
            "control"]


def load_all():
    """Import every op family so the table is complete."""
    import importlib
    for name in FAMILIES:
        importlib.import_module(f"{__name__}.{name}")
