"""RNN/LSTM/GRU (bidirectional, packed), the cells, nn.utils.rnn and the Transformer
family against PyTorch 2.13 with the same weights: outputs, final states, gradients."""
import numpy as np
import pytest
import torch
from torch.nn.utils import rnn as trnn

import sampan
from sampan import nn
from sampan.nn.utils import rnn as srnn

from ._ref import close, compare_layer, linear_map, rand, same, transposed
from .test_attention_rnn import mha_map


def _copy_rnn(s, t):
    tp = dict(t.named_parameters())
    for name, p in s.named_parameters():
        a = tp[name].detach().numpy()
        p._data[...] = a.T if name.startswith("weight") else a


def _grads_match(s, t, dtype):
    tp = dict(t.named_parameters())
    for name, p in s.named_parameters():
        g = tp[name].grad.numpy()
        close(p.grad.numpy(), g.T if name.startswith("weight") else g, dtype, f"grad {name}")


def _loss(outs, gs, lib):
    tot = None
    for a, g in zip(outs, gs):
        term = (a * (sampan.tensor(g) if lib == "s" else torch.tensor(g))).sum()
        tot = term if tot is None else tot + term
    return tot


@pytest.mark.parametrize("kind,kw", [
    ("RNN", dict(num_layers=2, bidirectional=True)),
    ("RNN", dict(nonlinearity="relu", batch_first=True)),
    ("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True)),
    ("GRU", dict(num_layers=1, bidirectional=True)),
])
def test_dense_layers_match_torch(kind, kw):
    r = np.random.default_rng(0)
    s = getattr(nn, kind)(3, 4, **kw).double()
    t = getattr(torch.nn, kind)(3, 4, **kw).double()
    _copy_rnn(s, t)
    B, T = 2, 5
    x = rand(r, *((B, T, 3) if kw.get("batch_first") else (T, B, 3)))
    D = 2 if kw.get("bidirectional") else 1
    h0 = rand(r, kw.get("num_layers", 1) * D, B, 4)
    sx, tx = sampan.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    sh, th = sampan.tensor(h0, requires_grad=True), torch.tensor(h0, requires_grad=True)
    if kind == "LSTM":
        c0 = rand(r, *h0.shape)
        s_out, (sh_n, sc_n) = s(sx, (sh, sampan.tensor(c0)))
        t_out, (th_n, tc_n) = t(tx, (th, torch.tensor(c0)))
        s_all, t_all = [s_out, sh_n, sc_n], [t_out, th_n, tc_n]
    else:
        s_out, sh_n = s(sx, sh)
        t_out, th_n = t(tx, th)
        s_all, t_all = [s_out, sh_n], [t_out, th_n]
    for a, b in zip(s_all, t_all):
        close(a.numpy(), b, "float64", "output/state")
    gs = [r.standard_normal(tuple(a.shape)) for a in s_all]
    _loss(s_all, gs, "s").backward()
    _loss(t_all, gs, "t").backward()
    close(sx.grad.numpy(), tx.grad, "float64", "grad x")
    close(sh.grad.numpy(), th.grad, "float64", "grad h0")
    _grads_match(s, t, "float64")


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_bidirectional_packed_sequences_match_torch(kind):
    r = np.random.default_rng(1)
    s = getattr(nn, kind)(3, 4, num_layers=2, bidirectional=True, batch_first=True).double()
    t = getattr(torch.nn, kind)(3, 4, num_layers=2, bidirectional=True,
                                batch_first=True).double()
    _copy_rnn(s, t)
    lengths = [2, 6, 4, 5]
    x = rand(r, 4, 6, 3)
    sx, tx = sampan.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    sp = srnn.pack_padded_sequence(sx, lengths, batch_first=True, enforce_sorted=False)
    tp = trnn.pack_padded_sequence(tx, torch.tensor(lengths), batch_first=True,
                                   enforce_sorted=False)
    close(sp.data.numpy(), tp.data, "float64", "packed data")
    np.testing.assert_array_equal(sp.batch_sizes.numpy(), tp.batch_sizes.numpy())
    np.testing.assert_array_equal(sp.sorted_indices.numpy(), tp.sorted_indices.numpy())
    s_out, s_state = s(sp)
    t_out, t_state = t(tp)
    assert isinstance(s_out, srnn.PackedSequence)
    close(s_out.data.numpy(), t_out.data, "float64", "packed output")
    s_states = list(s_state) if kind == "LSTM" else [s_state]
    t_states = list(t_state) if kind == "LSTM" else [t_state]
    for a, b in zip(s_states, t_states):
        close(a.numpy(), b, "float64", "final state")
    # the layer's own lengths= path gives the same padded output
    s_pad, s_len = srnn.pad_packed_sequence(s_out, batch_first=True)
    t_pad, t_len = trnn.pad_packed_sequence(t_out, batch_first=True)
    close(s_pad.numpy(), t_pad, "float64", "padded output")
    np.testing.assert_array_equal(s_len.numpy(), t_len.numpy())
    assert s_len.dtype == np.int64
    gs = [r.standard_normal(tuple(a.shape)) for a in [s_pad] + s_states]
    _loss([s_pad] + s_states, gs, "s").backward()
    _loss([t_pad] + t_states, gs, "t").backward()
    close(sx.grad.numpy(), tx.grad, "float64", "grad x")
    _grads_match(s, t, "float64")


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_match_torch_over_steps(kind):
    r = np.random.default_rng(2)
    s = getattr(nn, kind)(3, 5).double()
    t = getattr(torch.nn, kind)(3, 5).double()
    _copy_rnn(s, t)
    xs = [rand(r, 2, 3) for _ in range(3)]
    sh = th = None
    s_outs, t_outs = [], []
    for x in xs:
        sh = s(sampan.tensor(x), sh)
        th = t(torch.tensor(x), th)
        s_outs.append(sh[0] if kind == "LSTMCell" else sh)
        t_outs.append(th[0] if kind == "LSTMCell" else th)
    for a, b in zip(s_outs, t_outs):
        close(a.numpy(), b, "float64", "state")
    gs = [r.standard_normal(tuple(a.shape)) for a in s_outs]
    _loss(s_outs, gs, "s").backward()
    _loss(t_outs, gs, "t").backward()
    _grads_match(s, t, "float64")
    # unbatched input
    x1 = rand(r, 3)
    a, b = s(sampan.tensor(x1)), t(torch.tensor(x1))
    a, b = (a[1], b[1]) if kind == "LSTMCell" else (a, b)
    close(a.numpy(), b, "float64", "unbatched")
    assert tuple(a.shape) == (5,)


def test_pad_pack_utilities_match_torch():
    r = np.random.default_rng(3)
    seqs = [rand(r, n, 2) for n in (3, 5, 1)]
    for kw in (dict(), dict(batch_first=True, padding_value=-1.0),
               dict(padding_side="left")):
        a = srnn.pad_sequence([sampan.tensor(q) for q in seqs], **kw)
        b = trnn.pad_sequence([torch.tensor(q) for q in seqs], **kw)
        close(a.numpy(), b, "float64", f"pad_sequence {kw}")
    p = srnn.pack_sequence([sampan.tensor(q) for q in seqs], enforce_sorted=False)
    q = trnn.pack_sequence([torch.tensor(q) for q in seqs], enforce_sorted=False)
    close(p.data.numpy(), q.data, "float64", "pack_sequence")
    np.testing.assert_array_equal(p.unsorted_indices.numpy(), q.unsorted_indices.numpy())
    back = srnn.unpack_sequence(p)
    for x, y in zip(back, seqs):
        close(x.numpy(), y, "float64", "unpack_sequence")
    padded, ln = srnn.pad_packed_sequence(p, total_length=7)
    assert tuple(padded.shape) == (7, 3, 2) and ln.numpy().tolist() == [3, 5, 1]
    with pytest.raises(sampan.SampanValueError, match="sorted longest first"):
        srnn.pack_padded_sequence(sampan.randn(4, 2, 1), [1, 3])
    with pytest.raises(sampan.SampanValueError, match="at least the longest"):
        srnn.pad_packed_sequence(p, total_length=2)
    with pytest.raises(sampan.ShapeError, match="one per sequence"):
        srnn.pack_padded_sequence(sampan.randn(4, 2, 1), [3])


E, H = 8, 2


def _enc_layer_map(s, t):
    m = mha_map(f"{s}self_attn.", f"{t}self_attn.")
    m.update(linear_map(f"{s}linear1.", f"{t}linear1."),
             **linear_map(f"{s}linear2.", f"{t}linear2."))
    for n in ("norm1", "norm2"):
        m[f"{s}{n}.weight"], m[f"{s}{n}.bias"] = same(f"{t}{n}.weight"), same(f"{t}{n}.bias")
    return m


def _dec_layer_map(s, t):
    m = _enc_layer_map(s, t)
    m.update(mha_map(f"{s}multihead_attn.", f"{t}multihead_attn."))
    m[f"{s}norm3.weight"], m[f"{s}norm3.bias"] = same(f"{t}norm3.weight"), same(f"{t}norm3.bias")
    return m


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoder_layer_matches_torch(norm_first):
    r = np.random.default_rng(4)
    kw = dict(dim_feedforward=16, dropout=0.0, batch_first=True, norm_first=norm_first)
    s = nn.TransformerDecoderLayer(E, H, **kw).double()
    t = torch.nn.TransformerDecoderLayer(E, H, **kw).double()
    mask = np.triu(np.ones((4, 4), bool), 1)
    compare_layer(s, t, _dec_layer_map("", ""), [rand(r, 2, 4, E), rand(r, 2, 6, E)],
                  s_kwargs=dict(tgt_mask=sampan.tensor(mask)),
                  t_kwargs=dict(tgt_mask=torch.tensor(mask)))


def test_transformer_encoder_and_full_model_match_torch():
    r = np.random.default_rng(5)
    layer_kw = dict(dim_feedforward=16, dropout=0.0)
    s = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, **layer_kw), 2,
                              nn.LayerNorm(E)).double()
    t = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(E, H, **layer_kw), 2,
                                    torch.nn.LayerNorm(E), enable_nested_tensor=False).double()
    m = {}
    for i in range(2):
        m.update(_enc_layer_map(f"layers.{i}.", f"layers.{i}."))
    m["norm.weight"], m["norm.bias"] = same("norm.weight"), same("norm.bias")
    kpm = np.zeros((2, 5), bool)
    kpm[0, 4:] = True
    compare_layer(s, t, m, [rand(r, 5, 2, E)],   # (S, B, E): batch_first=False
                  s_kwargs=dict(src_key_padding_mask=sampan.tensor(kpm)),
                  t_kwargs=dict(src_key_padding_mask=torch.tensor(kpm)))

    kw = dict(d_model=E, nhead=H, num_encoder_layers=1, num_decoder_layers=2,
              dim_feedforward=16, dropout=0.0, batch_first=True)
    s = nn.Transformer(**kw).double()
    t = torch.nn.Transformer(**kw).double()
    m = _enc_layer_map("encoder.layers.0.", "encoder.layers.0.")
    for i in range(2):
        m.update(_dec_layer_map(f"decoder.layers.{i}.", f"decoder.layers.{i}."))
    for n in ("encoder.norm", "decoder.norm"):
        m[f"{n}.weight"], m[f"{n}.bias"] = same(f"{n}.weight"), same(f"{n}.bias")
    smask = nn.Transformer.generate_square_subsequent_mask(4, dtype=sampan.float64)
    tmask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    np.testing.assert_array_equal(smask.numpy(), tmask.numpy())
    compare_layer(s, t, m, [rand(r, 2, 6, E), rand(r, 2, 4, E)],
                  s_kwargs=dict(tgt_mask=smask), t_kwargs=dict(tgt_mask=tmask))
    # every name outside attention is PyTorch's (attention keeps separate q/k/v projections)
    names = {n for n in dict(s.named_parameters()) if "_attn." not in n}
    assert names == {n for n in dict(t.named_parameters()) if "_attn." not in n}


def test_rnn_layers_jit_and_errors():
    lstm = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
    x = sampan.randn(2, 5, 3)
    f = sampan.jit(lambda a: lstm(a)[0])
    np.testing.assert_allclose(f(x).numpy(), lstm(x)[0].numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(sampan.ShapeError, match="num_layers \\* num_directions"):
        lstm(x, (sampan.zeros(1, 2, 4), sampan.zeros(1, 2, 4)))
    with pytest.raises(sampan.SampanValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(sampan.ShapeError, match="LSTMCell"):
        nn.LSTMCell(3, 4)(sampan.randn(2, 5))
    with pytest.raises(sampan.SampanValueError, match="num_layers"):
        nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 0)
    assert "bidirectional=True" in repr(lstm)
