"""Issue 30: `Predictor.get_input_positions()` says which graph input each fed name
becomes (serving's id-range check reads it instead of the Predictor's private state)."""
import numpy as np

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor
from sampan.jit.program import SavedProgram


class _Two(nn.Layer):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.lin = nn.Linear(4, 3)

    def forward(self, ids, x):
        return self.lin(self.emb(ids)) + x


def test_input_positions_name_the_fed_graph_inputs(tmp_path):
    sampan.manual_seed(0)
    m = _Two()
    m.eval()
    ids = sampan.tensor(np.array([1, 2, 3], np.int64))
    x = sampan.from_numpy(np.zeros((3, 3), np.float32))
    path = sampan.jit.save(m, str(tmp_path / "two.sampan"), (ids, x))
    p = create_predictor(Config(path))
    names, pos = p.get_input_names(), p.get_input_positions()
    assert len(names) == len(pos) == 2 and len(set(pos)) == 2
    assert pos == SavedProgram.read(path).arg_positions
    ins = p.graph.inputs
    assert (ins[pos[0]].dtype, tuple(ins[pos[0]].shape)) == (np.dtype(np.int64), (3,))
    assert (ins[pos[1]].dtype, tuple(ins[pos[1]].shape)) == (np.dtype(np.float32), (3, 3))
    p.get_input_positions().append(99)             # a copy: the predictor is unchanged
    assert p.get_input_positions() == pos
