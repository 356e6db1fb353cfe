"""Helpers to compare sampan layers and functions with PyTorch on identical weights.

Tolerances per dtype: float32 rel 1e-5 (abs 1e-5 on O(1) values; reductions over a few
hundred terms), float64 rel 1e-10 (abs 1e-10)."""
import numpy as np
import torch

import sampan

TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "float64": dict(rtol=1e-10, atol=1e-10)}
torch.set_num_threads(1)


def close(a, b, dtype="float64", what="", scale=1.0):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    tol = TOL[dtype]
    np.testing.assert_allclose(a, b, rtol=tol["rtol"], atol=tol["atol"] * scale,
                               err_msg=what)


def rand(rng, *shape, dtype="float64", low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape).astype(dtype)


def copy_weights(s_layer, t_layer, mapping):
    """mapping: sampan param name -> (torch param name, fn torch array -> sampan layout)."""
    tp = dict(t_layer.named_parameters())
    sp = dict(s_layer.named_parameters())
    assert set(sp) == set(mapping), f"unmapped params: {set(sp) ^ set(mapping)}"
    for sname, (tname, f) in mapping.items():
        a = f(tp[tname].detach().numpy())
        assert a.shape == tuple(sp[sname].shape), (sname, a.shape, sp[sname].shape)
        sp[sname]._data[...] = a


def compare_layer(s_layer, t_layer, mapping, inputs, dtype="float64", out_index=None,
                  rng_seed=0, s_kwargs=None, t_kwargs=None, grad_inputs=True, scale=1.0):
    """Copy weights, run both layers on `inputs` (numpy arrays), compare the output, the
    input gradients and the parameter gradients for one random upstream gradient."""
    s_kwargs, t_kwargs = s_kwargs or {}, t_kwargs or {}
    copy_weights(s_layer, t_layer, mapping)
    diff = [grad_inputs and np.issubdtype(x.dtype, np.floating) for x in inputs]
    s_in = [sampan.tensor(x.copy(), requires_grad=d) for x, d in zip(inputs, diff)]
    t_in = [torch.tensor(x.copy(), requires_grad=d) for x, d in zip(inputs, diff)]
    s_out = s_layer(*s_in, **s_kwargs)
    t_out = t_layer(*t_in, **t_kwargs)
    if out_index is not None:
        s_out, t_out = out_index(s_out), out_index(t_out)
    close(s_out.numpy(), t_out, dtype, "forward", scale)
    g = np.random.default_rng(rng_seed).standard_normal(t_out.shape).astype(dtype)
    s_out.backward(sampan.tensor(g))
    t_out.backward(torch.tensor(g))
    for i, (a, b, d) in enumerate(zip(s_in, t_in, diff)):
        if d:
            close(a.grad.numpy(), b.grad, dtype, f"grad of input {i}", scale)
    tp = dict(t_layer.named_parameters())
    sp = dict(s_layer.named_parameters())
    for sname, (tname, f) in mapping.items():
        tg = tp[tname].grad
        tg = np.zeros(tp[tname].shape, dtype) if tg is None else tg.numpy()
        sg = sp[sname].grad
        sg = np.zeros(sp[sname].shape, dtype) if sg is None else sg.numpy()
        close(sg, f(tg), dtype, f"grad of {sname}", scale)
    return s_out, t_out


def same(name):
    return (name, lambda a: a)


def transposed(name):
    return (name, lambda a: a.T)


def linear_map(prefix_s, prefix_t=None, bias=True):
    prefix_t = prefix_s if prefix_t is None else prefix_t
    m = {f"{prefix_s}weight": transposed(f"{prefix_t}weight")}
    if bias:
        m[f"{prefix_s}bias"] = same(f"{prefix_t}bias")
    return m
