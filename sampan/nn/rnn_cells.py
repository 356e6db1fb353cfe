"""One-step recurrent cells: `RNNCell`, `LSTMCell`, `GRUCell` (PyTorch's names and
parameters ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``, in sampan's Linear
layout ``(in, gates * hidden)``). Each step is the same cell code as the sequence layers in
`rnn.py`, so a loop of cells and a sequence layer with the same weights agree."""
from __future__ import annotations

import math

from ..errors import SampanValueError, ShapeError, op_error
from ..ops.creation import empty, zeros
from ..ops.elementwise import add
from ..ops.linalg import matmul
from ..ops.shape import squeeze, unsqueeze
from . import init
from .layer import Layer, Parameter
from .rnn import GRU, LSTM, RNN


class _CellBase(Layer):
    _gates = 1
    _name = "RNNCell"
    _n_state = 1

    def __init__(self, input_size, hidden_size, bias=True, dtype=None):
        super().__init__()
        for k, v in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise op_error(SampanValueError, self._name, f"{k}={v!r}", "a positive int")
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        g = self._gates * hidden_size
        self.weight_ih = Parameter(empty(input_size, g, dtype=dtype))
        self.weight_hh = Parameter(empty(hidden_size, g, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(empty(g, dtype=dtype))
            self.bias_hh = Parameter(empty(g, dtype=dtype))
        else:
            self.bias_ih = self.bias_hh = None
        self.reset_parameters()

    def reset_parameters(self):
        """U(-1/sqrt(hidden), 1/sqrt(hidden)) for every weight and bias (PyTorch's)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _step(self, x, states):
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise op_error(ShapeError, self._name, f"input of shape {tuple(x.shape)}",
                           f"(batch, {self.input_size}) or ({self.input_size},)")
        single = x.ndim == 1
        if single:
            x = unsqueeze(x, 0)
        B = x.shape[0]
        st = []
        for h in states:
            if h is None:
                h = zeros(B, self.hidden_size, dtype=x.dtype)
            else:
                want = (self.hidden_size,) if single else (B, self.hidden_size)
                if tuple(h.shape) != want:
                    raise op_error(ShapeError, self._name, f"state of shape "
                                   f"{tuple(h.shape)} for input {tuple(x.shape)}", f"{want}")
                h = unsqueeze(h, 0) if single else h
            st.append(h)
        xw = matmul(x, self.weight_ih)
        if self.bias_ih is not None:
            xw = add(xw, self.bias_ih)
        new = self._cell(xw, st, self.weight_hh, self.bias_hh)
        return [squeeze(n, 0) for n in new] if single else new

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_CellBase):
    """``h' = act(x W_ih + b_ih + h W_hh + b_hh)``, act tanh or relu.

    Example::

        >>> cell = nn.RNNCell(4, 8)
        >>> h = cell(sampan.randn(3, 4))          # h0 = zeros
        >>> h = cell(sampan.randn(3, 4), h)
    """

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise op_error(SampanValueError, "RNNCell", f"nonlinearity={nonlinearity!r}",
                           "'tanh' or 'relu'")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, dtype)

    _cell = RNN._cell

    def forward(self, input, hx=None):
        return self._step(input, [hx])[0]


class LSTMCell(_CellBase):
    """One LSTM step; returns ``(h', c')``.

    Example::

        >>> cell = nn.LSTMCell(4, 8)
        >>> h, c = cell(sampan.randn(3, 4))
        >>> h, c = cell(sampan.randn(3, 4), (h, c))
    """
    _gates = 4
    _name = "LSTMCell"
    _cell = LSTM._cell

    def forward(self, input, hx=None):
        h, c = (None, None) if hx is None else hx
        h2, c2 = self._step(input, [h, c])
        return h2, c2


class GRUCell(_CellBase):
    """One GRU step; returns h'.

    Example::

        >>> cell = nn.GRUCell(4, 8)
        >>> h = cell(sampan.randn(3, 4))
    """
    _gates = 3
    _name = "GRUCell"
    _cell = GRU._cell

    def forward(self, input, hx=None):
        return self._step(input, [hx])[0]


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["RNNCell", "LSTMCell", "GRUCell"]
