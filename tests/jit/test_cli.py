"""`sampan viz` and `sampan bisect` on a saved program."""

import sampan
from sampan.cli import main


def test_cli_viz_and_bisect(tmp_path, capsys):
    w = sampan.randn(3, 4)
    path = str(tmp_path / "m")
    sampan.jit.save(lambda x: (x @ w * 1.0).tanh().sum(-1), path, (sampan.randn(2, 3),))
    out = str(tmp_path / "graph.svg")
    assert main(["viz", path, "-o", out]) == 0
    said = capsys.readouterr().out
    assert "graph" in said
    assert main(["bisect", path]) == 0
    assert "no pass changes" in capsys.readouterr().out
    assert main(["passes"]) == 0
    assert "plan_memory" in capsys.readouterr().out
