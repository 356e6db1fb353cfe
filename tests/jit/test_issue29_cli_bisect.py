"""Issue 29 item 15: `sampan bisect` on a program saved with `dynamic=` (bisected at its
example sizes) and `--passes` given a pipeline name (expanded) or an unknown name (a
clear error naming the passes and pipelines)."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
import sampan.nn as nn
from sampan.cli import main
from sampan.passes import PassError, bisect_graph


@pytest.fixture(scope="module")
def dyn_mlp(tmp_path_factory):
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    m.eval()
    path = str(tmp_path_factory.mktemp("b") / "mlp.sampan")
    sampan.jit.save(m, path, (sampan.randn(2, 6),), dynamic="batch")
    return path


def test_bisect_a_dynamic_program_at_its_example_sizes(dyn_mlp, capsys):
    assert main(["bisect", dyn_mlp]) == 0
    assert "no pass changes the outputs" in capsys.readouterr().out


def test_bisect_passes_accepts_a_pipeline_name(dyn_mlp, capsys):
    from sampan.passes import pipeline
    assert main(["bisect", dyn_mlp, "--passes", "inference"]) == 0
    out = capsys.readouterr().out
    assert "no pass changes the outputs" in out
    assert ", ".join(pipeline("inference")) in out          # expanded to its passes
    assert main(["bisect", dyn_mlp, "--passes", "cse,none,dce"]) == 0
    assert "(checked cse, dce)" in capsys.readouterr().out


def test_bisect_unknown_pass_is_a_clear_error(dyn_mlp, capsys):
    assert main(["bisect", dyn_mlp, "--passes", "cse,nosuchpass"]) == 2
    msg = capsys.readouterr().err
    assert msg.startswith("sampan bisect: ") and "Traceback" not in msg
    assert "'nosuchpass'" in msg and "inference" in msg and "fold_constants" in msg
    assert main(["bisect", dyn_mlp + "-missing"]) == 2
    assert "not a saved program directory" in capsys.readouterr().err


def test_bisect_help_tells_pipelines_from_passes(capsys):
    with pytest.raises(SystemExit):
        main(["bisect", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "pipelines:" in out and "inference" in out and "passes:" in out


def test_bisect_graph_with_symbolic_dims_says_so(dyn_mlp):
    g, meta, arrays = sampan.jit.serialize.read(dyn_mlp)
    ins = [np.asarray(arrays[f"example.{s['index']}"] if s["kind"] == "arg" else arrays[s["key"]])
           for s in meta["inputs"]]
    with pytest.raises(PassError, match="symbolic"):
        bisect_graph(g, ins, "train")


def test_sampan_bisect_command_in_a_process(dyn_mlp):
    import os
    import pathlib
    import subprocess
    import sys
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "sampan.cli", "bisect", dyn_mlp, "--passes",
                        "inference"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no pass changes the outputs" in r.stdout and "Traceback" not in r.stderr
