import os

import pytest


@pytest.fixture(scope="package")
def served(tmp_path_factory):
    """One server for the package's tests: mlp (batching on), mlp_single (off), slow (queue of 2,
    one worker), mixed (two datatypes, no batch dim),
    served over HTTP and gRPC (`served.grpc_address`),
    mlp_ort (the MLP's ONNX export behind onnxruntime); bodies above 1 MiB refused."""
    from sampan.serving import Server

    from ._models import Mixed, Slow, model_dir, save_mlp
    folder = str(tmp_path_factory.mktemp("serving"))
    prog, w = save_mlp(folder)
    models = {
        "mlp": model_dir(folder, "mlp", prog, max_batch_size=16, instance_count=2,
                         dynamic_batching={"max_queue_delay_us": 20000, "delay_policy": "fixed",
                                           "preferred_batch_sizes": [16]}),
        "mlp_single": model_dir(folder, "mlp_single", prog, instance_count=1),
        "slow": Slow("slow", 0.25, instance_count=1, max_queue_size=2),
        "mixed": Mixed(),
        "mlp_ort": os.path.join(folder, "mlp_ort"),
    }
    import importlib.util
    grpc = 0 if importlib.util.find_spec("grpc") is not None else None   # gRPC too
    s = Server(models, max_body_bytes=1 << 20, grpc_port=grpc).start()
    s.weights = w
    try:
        yield s
    finally:
        s.stop()
