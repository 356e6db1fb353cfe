"""numba is an extra: with it hidden, sampan imports, trains eagerly and runs jit."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_runs_without_numba():
    code = textwrap.dedent("""
        import sys, warnings
        sys.modules["numba"] = None          # import numba now raises ImportError
        warnings.simplefilter("ignore")
        import numpy as np
        import sampan
        from sampan import nn
        sampan.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
        opt = sampan.optim.SGD(m.parameters(), lr=0.1)
        x = sampan.randn(16, 4)
        y = sampan.randint(0, 2, (16,))
        losses = []
        for _ in range(5):
            loss = sampan.cross_entropy(m(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            losses.append(float(loss))
        assert losses[-1] < losses[0], losses
        f = sampan.jit(lambda a: sampan.softmax(a * 2.0 + 1.0, -1))
        np.testing.assert_allclose(f(x).numpy(), sampan.softmax(x * 2.0 + 1.0, -1).numpy(),
                                   rtol=1e-6)
        assert "numba" not in [k for k, v in sys.modules.items() if v is not None]
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")
