"""Layer-level shape checks name the layer, what it got, what it expected and the user's
file:line, as op errors do (they named no line), and reject what PyTorch's layers reject.
MultiHeadAttention checks its key and value too: a wrong width or batch failed inside a
reshape or matmul, naming an inner op instead of the layer."""
from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.errors import SampanValueError, ShapeError

HERE = os.path.basename(__file__)
R = np.random.default_rng(3)


def _x(*shape):
    return R.standard_normal(shape).astype(np.float32)


CASES = {
    "BatchNorm1d channels": (
        ShapeError, "BatchNorm1d", lambda: nn.BatchNorm1d(4)(sampan.tensor(_x(3, 5))),
        lambda: torch.nn.BatchNorm1d(4)(torch.tensor(_x(3, 5)))),
    "BatchNorm2d rank": (
        ShapeError, "BatchNorm2d", lambda: nn.BatchNorm2d(3)(sampan.tensor(_x(2, 3, 5))),
        lambda: torch.nn.BatchNorm2d(3)(torch.tensor(_x(2, 3, 5)))),
    "BatchNorm1d one value per channel": (
        SampanValueError, "BatchNorm1d", lambda: nn.BatchNorm1d(4)(sampan.tensor(_x(1, 4))),
        lambda: torch.nn.BatchNorm1d(4)(torch.tensor(_x(1, 4)))),
    "LayerNorm trailing dims": (
        ShapeError, "LayerNorm", lambda: nn.LayerNorm(5)(sampan.tensor(_x(2, 4))),
        lambda: torch.nn.LayerNorm(5)(torch.tensor(_x(2, 4)))),
    "RMSNorm trailing dims": (
        ShapeError, "RMSNorm", lambda: nn.RMSNorm((3, 4))(sampan.tensor(_x(2, 4, 3))),
        lambda: torch.nn.RMSNorm((3, 4))(torch.tensor(_x(2, 4, 3)))),
    "GroupNorm channels": (
        ShapeError, "GroupNorm", lambda: nn.GroupNorm(2, 6)(sampan.tensor(_x(4, 5, 3))),
        lambda: torch.nn.GroupNorm(2, 6)(torch.tensor(_x(4, 5, 3)))),
    "GroupNorm groups": (
        SampanValueError, "GroupNorm", lambda: nn.GroupNorm(4, 6),
        lambda: torch.nn.GroupNorm(4, 6)),
    "MultiHeadAttention heads": (
        SampanValueError, "MultiHeadAttention", lambda: nn.MultiHeadAttention(8, 3),
        lambda: torch.nn.MultiheadAttention(8, 3)),
    "MultiHeadAttention query width": (
        ShapeError, "MultiHeadAttention",
        lambda: nn.MultiHeadAttention(8, 2)(sampan.tensor(_x(5, 2, 7))),
        lambda: torch.nn.MultiheadAttention(8, 2)(*[torch.tensor(_x(5, 2, 7))] * 3)),
    "MultiHeadAttention key width": (
        ShapeError, "MultiHeadAttention",
        lambda: nn.MultiHeadAttention(8, 2)(sampan.tensor(_x(5, 2, 8)), sampan.tensor(
            _x(6, 2, 4)), sampan.tensor(_x(6, 2, 8))),
        lambda: torch.nn.MultiheadAttention(8, 2)(torch.tensor(_x(5, 2, 8)), torch.tensor(
            _x(6, 2, 4)), torch.tensor(_x(6, 2, 8)))),
    "MultiHeadAttention value batch": (
        ShapeError, "MultiHeadAttention",
        lambda: nn.MultiHeadAttention(8, 2, batch_first=True)(
            sampan.tensor(_x(2, 5, 8)), sampan.tensor(_x(2, 6, 8)), sampan.tensor(_x(3, 6, 8))),
        lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True)(
            torch.tensor(_x(2, 5, 8)), torch.tensor(_x(2, 6, 8)), torch.tensor(_x(3, 6, 8)))),
    "MultiHeadAttention key and value lengths": (
        ShapeError, "MultiHeadAttention",
        lambda: nn.MultiHeadAttention(8, 2)(sampan.tensor(_x(5, 2, 8)), sampan.tensor(
            _x(6, 2, 8)), sampan.tensor(_x(7, 2, 8))),
        lambda: torch.nn.MultiheadAttention(8, 2)(torch.tensor(_x(5, 2, 8)), torch.tensor(
            _x(6, 2, 8)), torch.tensor(_x(7, 2, 8)))),
    "MultiHeadAttention key_padding_mask": (
        ShapeError, "MultiHeadAttention",
        lambda: nn.MultiHeadAttention(8, 2)(sampan.tensor(_x(5, 2, 8)),
                                            key_padding_mask=sampan.zeros(2, 4, dtype="bool")),
        lambda: torch.nn.MultiheadAttention(8, 2)(
            *[torch.tensor(_x(5, 2, 8))] * 3, key_padding_mask=torch.zeros(2, 4).bool())),
    "MultiHeadAttention attn_mask": (
        ShapeError, "MultiHeadAttention",
        lambda: nn.MultiHeadAttention(8, 2)(sampan.tensor(_x(5, 2, 8)),
                                            attn_mask=sampan.zeros(5, 4)),
        lambda: torch.nn.MultiheadAttention(8, 2)(
            *[torch.tensor(_x(5, 2, 8))] * 3, attn_mask=torch.zeros(5, 4))),
    "LSTM input width": (
        ShapeError, "LSTM", lambda: nn.LSTM(4, 3)(sampan.tensor(_x(5, 2, 6))),
        lambda: torch.nn.LSTM(4, 3)(torch.tensor(_x(5, 2, 6)))),
    "LSTM initial state": (
        ShapeError, "LSTM", lambda: nn.LSTM(4, 3)(sampan.tensor(_x(5, 2, 4)),
                                                  (sampan.zeros(1, 3, 3), sampan.zeros(1, 2, 3))),
        lambda: torch.nn.LSTM(4, 3)(torch.tensor(_x(5, 2, 4)),
                                    (torch.zeros(1, 3, 3), torch.zeros(1, 2, 3)))),
    "LSTM hidden size": (
        SampanValueError, "LSTM", lambda: nn.LSTM(4, 0), lambda: torch.nn.LSTM(4, 0)),
    "GRU input rank": (
        ShapeError, "GRU", lambda: nn.GRU(4, 3, batch_first=True)(sampan.tensor(_x(2, 4))),
        lambda: torch.nn.GRU(4, 3, batch_first=True)(torch.tensor(_x(2, 3, 4, 1)))),
    "GRU lengths": (
        ShapeError, "GRU", lambda: nn.GRU(4, 3)(sampan.tensor(_x(5, 2, 4)),
                                                lengths=sampan.tensor([5, 4, 3])), None),
    "GRU lengths range": (
        SampanValueError, "GRU", lambda: nn.GRU(4, 3)(sampan.tensor(_x(5, 2, 4)),
                                                      lengths=sampan.tensor([5, 9])), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_error_names_layer_and_user_line(case):
    cls, name, call, torch_call = CASES[case]
    with pytest.raises(cls) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(f"{name}: got ") and "; expected " in msg, msg
    # the lambda in CASES is the user's code: the error names its line (a lambda spans up
    # to three lines), not one inside sampan
    where, _, line = msg.rsplit("\n", 1)[-1].rpartition(":")
    assert where.endswith(HERE) and line.isdigit(), msg
    first = call.__code__.co_firstlineno
    assert first <= int(line) <= first + 2, (msg, first)
    if torch_call is not None:
        with pytest.raises((RuntimeError, ValueError, AssertionError, IndexError)):
            torch_call()


def test_line_is_the_callers():
    layer = nn.LayerNorm(5)
    x = sampan.tensor(_x(2, 4))
    line = inspect.currentframe().f_lineno + 3
    with pytest.raises(ShapeError, match=rf"LayerNorm: got input of shape \(2, 4\); expected "
                       rf"trailing dims \(5,\)\n  at .*{HERE}:{line}$"):
        layer(x)


def test_valid_attention_still_matches_torch():
    # the new key/value checks accept what PyTorch accepts: kdim/vdim, batch_first
    q, k, v = _x(2, 5, 8), _x(2, 6, 4), _x(2, 6, 6)
    ours = nn.MultiHeadAttention(8, 2, kdim=4, vdim=6, batch_first=True)
    theirs = torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=6, batch_first=True)
    with torch.no_grad():
        for name, p in (("q", "q_proj_weight"), ("k", "k_proj_weight"), ("v", "v_proj_weight")):
            getattr(theirs, p).copy_(torch.tensor(getattr(ours, f"{name}_proj").weight.numpy().T))
        b = np.concatenate([getattr(ours, f"{n}_proj").bias.numpy() for n in "qkv"])
        theirs.in_proj_bias.copy_(torch.tensor(b))
        theirs.out_proj.weight.copy_(torch.tensor(ours.out_proj.weight.numpy().T))
        theirs.out_proj.bias.copy_(torch.tensor(ours.out_proj.bias.numpy()))
    mask = np.zeros((5, 6), np.float32)
    mask[:, -1] = -1e9
    y = ours(sampan.tensor(q), sampan.tensor(k), sampan.tensor(v), attn_mask=sampan.tensor(mask))
    y = y[0] if isinstance(y, tuple) else y
    ty = theirs(torch.tensor(q), torch.tensor(k), torch.tensor(v), attn_mask=torch.tensor(mask),
                need_weights=False)[0]
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
