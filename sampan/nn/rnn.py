"""RNN, LSTM and GRU (multi-layer, bidirectional, batch-first or time-first, with
optional sequence lengths or PackedSequence input) and their one-step cells.

Parameters are named like PyTorch's (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
``bias_hh_l0``, ``..._reverse`` for the backward direction) and gates are stacked in
PyTorch's order (LSTM: i, f, g, o; GRU: r, z, n), but weights use sampan's Linear layout
``(in, gates * hidden)``: copy a PyTorch weight with a transpose. With `lengths` (or a
PackedSequence), steps past a sequence's length leave its state untouched and give zero
outputs, and the backward direction starts at each sequence's own last step, so padding
never leaks into outputs or final states (what PyTorch's packed sequences give).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import SampanValueError, ShapeError, op_error
from ..ops.composite import dropout
from ..ops.creation import arange, empty, zeros
from ..ops.elementwise import add, lt, mul, relu, sigmoid, sub, tanh, where
from ..ops.linalg import matmul
from ..ops.shape import cat, split, stack, transpose, unsqueeze
from ..tensor import Tensor
from . import init
from .layer import Layer, Parameter


class _RNNBase(Layer):
    _gates = 1
    _name = "RNN"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, dtype=None):
        super().__init__()
        for k, v in (("input_size", input_size), ("hidden_size", hidden_size),
                     ("num_layers", num_layers)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise op_error(SampanValueError, self._name, f"{k}={v!r}", "a positive int")
        if not 0 <= dropout <= 1:
            raise op_error(SampanValueError, self._name, f"dropout={dropout!r}",
                           "a probability in [0, 1]")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, dropout
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if bidirectional else 1
        g = self._gates * hidden_size
        for layer in range(num_layers):
            n_in = input_size if layer == 0 else hidden_size * self.num_directions
            for sfx in self._suffixes():
                setattr(self, f"weight_ih_l{layer}{sfx}", Parameter(empty(n_in, g, dtype=dtype)))
                setattr(self, f"weight_hh_l{layer}{sfx}",
                        Parameter(empty(hidden_size, g, dtype=dtype)))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{sfx}", Parameter(empty(g, dtype=dtype)))
                    setattr(self, f"bias_hh_l{layer}{sfx}", Parameter(empty(g, dtype=dtype)))
        self.reset_parameters()

    def _suffixes(self):
        return ("", "_reverse") if self.bidirectional else ("",)

    def reset_parameters(self):
        """U(-1/sqrt(hidden), 1/sqrt(hidden)) for every weight and bias (PyTorch's)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _weights(self, layer, sfx=""):
        get = self._parameters.get
        return (get(f"weight_ih_l{layer}{sfx}"), get(f"weight_hh_l{layer}{sfx}"),
                get(f"bias_ih_l{layer}{sfx}"), get(f"bias_hh_l{layer}{sfx}"))

    def _prepare(self, x, lengths):
        if x.ndim != 3 or x.shape[-1] != self.input_size:
            layout = "(B, T, F)" if self.batch_first else "(T, B, F)"
            raise op_error(ShapeError, self._name, f"input of shape {tuple(x.shape)}",
                           f"{layout} with F={self.input_size}")
        xs = transpose(x, 0, 1) if self.batch_first else x  # time-major inside
        T, B = xs.shape[0], xs.shape[1]
        mask = None
        if isinstance(lengths, Tensor) and not isinstance(lengths._data, np.ndarray):
            # traced (inside sampan.jit): the values are unknown, so the mask is built with
            # ops and applied at every step
            if tuple(lengths.shape) != (B,) or lengths.dtype.kind not in "iu":
                raise op_error(ShapeError, self._name, f"lengths of shape "
                               f"{tuple(lengths.shape)} and dtype {lengths.dtype}",
                               f"{B} integer lengths")
            steps = arange(T, dtype=lengths.dtype)
            mask = unsqueeze(lt(unsqueeze(steps, 1), unsqueeze(lengths, 0)), 2)
        elif lengths is not None:
            ln = np.asarray(lengths._data if isinstance(lengths, Tensor) else lengths)
            if ln.shape != (B,) or ln.dtype.kind not in "iu":
                raise op_error(ShapeError, self._name, f"lengths of shape {ln.shape} and "
                               f"dtype {ln.dtype}", f"{B} integer lengths")
            if ln.size and (ln.min() < 0 or ln.max() > T):
                raise op_error(SampanValueError, self._name, f"lengths in [{ln.min()}, "
                               f"{ln.max()}]", f"lengths in [0, {T}]")
            if ln.size and ln.min() < T:
                mask = Tensor((np.arange(T)[:, None] < ln[None, :])[:, :, None])
        return xs, T, B, mask

    def _state(self, h, B, dtype, what):
        n = self.num_layers * self.num_directions
        shape = (n, B, self.hidden_size)
        if h is None:
            return [zeros(B, self.hidden_size, dtype=dtype)] * n
        if tuple(h.shape) != shape:
            raise op_error(ShapeError, self._name, f"initial {what} of shape "
                           f"{tuple(h.shape)}", f"(num_layers * num_directions, batch, "
                           f"hidden) = {shape}")
        return [h[i] for i in range(n)]

    def _direction(self, xs, T, B, mask, st, layer, sfx):
        """One direction of one layer over time-major `xs`: (outputs in time order,
        final states). The reverse direction runs from the last step down; with a mask a
        sequence's state stays initial until its own last step."""
        w_ih, w_hh, b_ih, b_hh = self._weights(layer, sfx)
        H = self.hidden_size
        xw = matmul(xs.reshape(T * B, xs.shape[-1]), w_ih)
        if b_ih is not None:
            xw = add(xw, b_ih)
        xw = xw.reshape(T, B, self._gates * H)
        outs = [None] * T
        for t in (range(T - 1, -1, -1) if sfx else range(T)):
            new = self._cell(xw[t], st, w_hh, b_hh)
            if mask is not None:
                m = mask[t]
                outs[t] = where(m, new[0], 0.0)
                st = [where(m, n, o) for n, o in zip(new, st)]
            else:
                outs[t] = new[0]
                st = new
        return outs, st

    def _run(self, x, states, lengths):
        xs, T, B, mask = self._prepare(x, lengths)
        states = [self._state(s, B, xs.dtype, w) for s, w in states]
        finals = [[] for _ in states]
        D = self.num_directions
        for layer in range(self.num_layers):
            per_dir = []
            for d, sfx in enumerate(self._suffixes()):
                st = [s[layer * D + d] for s in states]
                outs, st = self._direction(xs, T, B, mask, st, layer, sfx)
                per_dir.append(stack(outs, 0))
                for f, s in zip(finals, st):
                    f.append(s)
            xs = per_dir[0] if D == 1 else cat(per_dir, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                xs = dropout(xs, self.dropout, True)
        out = transpose(xs, 0, 1) if self.batch_first else xs
        return out, [stack(f, 0) for f in finals]

    def _call(self, x, states, lengths):
        """Run on a tensor, or on a PackedSequence (giving a PackedSequence back)."""
        from .utils.rnn import PackedSequence, _repack, pad_packed_sequence
        if not isinstance(x, PackedSequence):
            return self._run(x, states, lengths)
        if lengths is not None:
            raise op_error(SampanValueError, self._name, "a PackedSequence and lengths",
                           "one of them (a PackedSequence carries its lengths)")
        padded, ln = pad_packed_sequence(x, batch_first=self.batch_first)
        out, finals = self._run(padded, states, ln)
        return _repack(out, ln, x, self.batch_first), finals

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


def _tanh_cell(xw_t, h, w_hh, b_hh, act):
    g = add(xw_t, matmul(h, w_hh))
    if b_hh is not None:
        g = add(g, b_hh)
    return act(g)


class RNN(_RNNBase):
    """Elman RNN, ``h_t = act(x_t W_ih + b_ih + h_{t-1} W_hh + b_hh)`` with act tanh or
    relu (`nonlinearity=`); returns ``(output, h_n)``.

    Example::

        >>> rnn = nn.RNN(8, 16, num_layers=2, bidirectional=True, batch_first=True)
        >>> out, h = rnn(sampan.randn(3, 5, 8))
        >>> out.shape, h.shape
        ((3, 5, 32), (4, 3, 16))
    """
    _gates = 1
    _name = "RNN"

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise op_error(SampanValueError, "RNN", f"nonlinearity={nonlinearity!r}",
                           "'tanh' or 'relu'")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, dtype)

    def _cell(self, xw_t, st, w_hh, b_hh):
        return [_tanh_cell(xw_t, st[0], w_hh, b_hh,
                           tanh if self.nonlinearity == "tanh" else relu)]

    def forward(self, x, hx=None, lengths=None):
        out, (h,) = self._call(x, [(hx, "h")], lengths)
        return out, h

    def extra_repr(self):
        s = super().extra_repr()
        return s + (", nonlinearity='relu'" if self.nonlinearity == "relu" else "")


class LSTM(_RNNBase):
    """Long short-term memory over a sequence; returns ``(output, (h_n, c_n))`` with
    h_n, c_n of shape (num_layers, B, H).

    Example::

        >>> lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        >>> x = sampan.randn(3, 5, 8)
        >>> out, (h, c) = lstm(x, lengths=[5, 2, 4])
        >>> out.shape, h.shape
        ((3, 5, 16), (2, 3, 16))
    """
    _gates = 4
    _name = "LSTM"

    def _cell(self, xw_t, st, w_hh, b_hh):
        h, c = st
        g = add(xw_t, matmul(h, w_hh))
        if b_hh is not None:
            g = add(g, b_hh)
        i, f, gg, o = split(g, self.hidden_size, -1)
        c2 = add(mul(sigmoid(f), c), mul(sigmoid(i), tanh(gg)))
        return [mul(sigmoid(o), tanh(c2)), c2]

    def forward(self, x, hx=None, lengths=None):
        h0, c0 = (None, None) if hx is None else hx
        out, (h, c) = self._call(x, [(h0, "h"), (c0, "c")], lengths)
        return out, (h, c)


class GRU(_RNNBase):
    """Gated recurrent unit over a sequence; returns ``(output, h_n)`` with h_n of shape
    (num_layers, B, H).

    Example::

        >>> gru = nn.GRU(8, 16, batch_first=True)
        >>> out, h = gru(sampan.randn(3, 5, 8), lengths=[5, 2, 4])
        >>> h.shape
        (1, 3, 16)
    """
    _gates = 3
    _name = "GRU"

    def _cell(self, xw_t, st, w_hh, b_hh):
        (h,) = st
        gh = matmul(h, w_hh)
        if b_hh is not None:
            gh = add(gh, b_hh)
        xr, xz, xn = split(xw_t, self.hidden_size, -1)
        hr, hz, hn = split(gh, self.hidden_size, -1)
        r = sigmoid(add(xr, hr))
        z = sigmoid(add(xz, hz))
        n = tanh(add(xn, mul(r, hn)))
        return [add(mul(sub(1.0, z), n), mul(z, h))]

    def forward(self, x, hx=None, lengths=None):
        out, (h,) = self._call(x, [(hx, "h")], lengths)
        return out, h


# the names sampan.nn exports from this module (not __all__: the module itself is not API);
# the one-step cells are in rnn_cells.py, which builds on these layers
EXPORTS = ["RNN", "LSTM", "GRU"]
