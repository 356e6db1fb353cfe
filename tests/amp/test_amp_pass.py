"""The `amp` pass on a saved program (through Config.set_precision("bf16")): GEMM weights
stored as bfloat16 constants, the op table's policy per node, casts folded into fused
kernels, outputs within bfloat16 tolerance of float32."""
import numpy as np

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor
from sampan.ops.registry import OPS


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x):
        h = sampan.gelu(self.ln(self.fc1(x)))
        return sampan.softmax(self.fc2(h), -1), self.fc2(h).sum(-1)


def test_bf16_program_follows_the_policy_and_stays_close(tmp_path):
    sampan.manual_seed(0)
    net = Net()
    net.eval()
    # static shapes: fuse_elementwise fuses concrete shapes only
    path = sampan.jit.save(net, str(tmp_path / "net.sampan"), (sampan.randn(5, 16),))
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    ref = create_predictor(Config(path)).run([x])
    cfg = Config(path)
    cfg.set_precision("bf16")
    p = create_predictor(cfg)
    assert "amp" in p.passes_run
    g = p.graph
    w = p.weights()
    for n in g.nodes:
        if n.op == "matmul":
            assert n.outputs[0].dtype == sampan.bfloat16
            assert all(v.dtype == sampan.bfloat16 for v in n.inputs)
            assert all(w[v.name].dtype == sampan.bfloat16 for v in n.inputs if v.is_const)
        elif n.op != "fused" and OPS[n.op].amp == "float32":
            assert all(v.dtype != sampan.bfloat16 for v in n.inputs), n.op
    # the casts next to elementwise ops are inside fused kernels
    fused_casts = [e for n in g.nodes if n.op == "fused" for e in n.attrs["body"]
                   if e[0] == "cast"]
    assert fused_casts
    got = p.run([x])
    assert all(a.dtype == np.float32 for a in got)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=3e-2, atol=3e-2 * np.abs(b).max())
    assert not np.array_equal(got[0], ref[0])
