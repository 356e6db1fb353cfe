"""`sampan.summary` against hand counts and against torchinfo's summary of the same
PyTorch model; `sampan.flops` against hand counts of an MLP and a convolution.

FLOPs here count a multiply and an add as two; torchinfo's mult-adds count a multiply-add
as one and also count each bias add as one, so for a layer with a weight and a bias
``our_flops == 2 * torchinfo_mult_adds - bias_adds`` (bias_adds = elements of the output)."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.nn import functional as F

torch = pytest.importorskip("torch")
torchinfo = pytest.importorskip("torchinfo")


def _cnn():
    sampan.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64, 10))


def test_hand_counts(capsys):
    m = _cnn()
    m[0].weight.requires_grad = False                    # a frozen conv weight
    s = sampan.summary(m, sampan.randn(2, 1, 8, 8))
    printed = capsys.readouterr().out
    assert str(s) in printed and "Total params: 690" in printed
    assert s.total_params == (4 * 9 + 4) + (64 * 10 + 10) == 690
    assert s.trainable_params == 690 - 36 and s.frozen_params == 36
    conv, relu, pool, flat, fc = (s.row(str(i)) for i in range(5))
    assert conv.output_shapes == [(2, 4, 8, 8)] and pool.output_shapes == [(2, 4, 4, 4)]
    assert flat.output_shapes == [(2, 64)] and fc.output_shapes == [(2, 10)]
    assert (conv.params, conv.trainable, conv.frozen) == (40, 4, 36)
    n_conv_out = 2 * 4 * 8 * 8
    assert conv.flops == 2 * n_conv_out * (1 * 3 * 3) + n_conv_out     # MACs x2 + bias
    assert relu.flops == n_conv_out
    assert pool.flops == (2 * 4 * 4 * 4) * (2 * 2)      # a compare per window element
    assert fc.flops == 2 * 2 * 64 * 10 + 2 * 10 and flat.flops == 0
    assert s.total_flops == conv.flops + relu.flops + pool.flops + fc.flops
    assert conv.output_bytes == n_conv_out * 4 and fc.output_bytes == 2 * 10 * 4
    # a view (flatten) allocates nothing; the linear's matmul and bias add both allocate
    assert flat.activation_bytes == 0 and fc.activation_bytes == 2 * (2 * 10 * 4)
    assert s.param_bytes == {"float32": 690 * 4} and s.model_bytes == 2760
    assert s.input_bytes == 2 * 64 * 4
    # a shape stands for a float32 input of that shape (torchinfo's input_size)
    by_shape = sampan.summary(m, (2, 1, 8, 8), verbose=False)
    assert by_shape.total_flops == s.total_flops and by_shape.input_bytes == s.input_bytes


def test_depth_folds_and_shared_layers_and_state_is_kept():
    class Net(nn.Layer):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
            self.head = nn.Linear(6, 2)

        def forward(self, x):
            x = self.block(x)
            x = self.block(x)          # the block is used twice: params once, FLOPs twice
            return sampan.relu(self.head(x))     # an op outside any sub-layer
    net = Net()
    before = net.block[1].running_mean.numpy().copy()
    s = sampan.summary(net, sampan.randn(4, 6), depth=1, verbose=False)
    np.testing.assert_array_equal(net.block[1].running_mean.numpy(), before)
    assert [r.name for r in s.rows] == ["", "block", "head"]
    assert [r.name for r in s.all_rows] == ["", "block", "block.0", "block.1", "head"]
    assert s.total_params == (36 + 6) + (6 + 6) + (12 + 2)
    lin = s.row("block.0")
    assert lin.calls == 2 and lin.flops == 2 * (2 * 4 * 6 * 6 + 4 * 6)
    assert s.row("block").flops == lin.flops + s.row("block.1").flops
    assert s.total_flops == s.row("block").flops + s.row("head").flops + 4 * 2   # + relu
    assert "block (Sequential)" in str(s) and "0 (Linear)" not in str(s)


def _torch_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               torch.nn.Linear(64, 10))


@pytest.mark.parametrize("batch", [1, 8])
def test_against_torchinfo(batch):
    ours = sampan.summary(_cnn(), sampan.randn(batch, 1, 8, 8), verbose=False)
    theirs = torchinfo.summary(_torch_cnn(), input_size=(batch, 1, 8, 8), verbose=0)
    leaves = [li for li in theirs.summary_list if li.depth == 1]
    assert len(leaves) == 5
    assert ours.total_params == theirs.total_params
    assert ours.trainable_params == theirs.trainable_params
    bias_adds = 0
    for i, li in enumerate(leaves):
        row = ours.row(str(i))
        assert row.type == li.class_name
        assert row.params == li.num_params
        assert list(row.output_shapes[0]) == list(li.output_size)
        if li.num_params:     # weight + bias layers: the stated factor
            n_out = int(np.prod(li.output_size))
            bias_adds += n_out
            gemm = row.flops
            assert gemm == 2 * li.macs - n_out
    # the totals: ours = 2 x mult-adds - bias adds + the parameter-free ops (relu, pool)
    extra = ours.row("1").flops + ours.row("2").flops
    assert ours.total_flops == 2 * theirs.total_mult_adds - bias_adds + extra


def test_flops_of_an_mlp_and_a_conv_by_hand():
    sampan.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    x = sampan.randn(16, 64)
    hand = (2 * 16 * 64 * 32 + 16 * 32) + 16 * 32 + (2 * 16 * 32 * 10 + 16 * 10)
    assert sampan.flops(mlp, x) == hand == 76960
    assert sampan.summary(mlp, x, verbose=False).total_flops == hand
    conv = nn.Conv2d(3, 8, 3)
    n_out = 2 * 8 * 8 * 8
    assert sampan.flops(conv, sampan.randn(2, 3, 10, 10)) == 2 * n_out * 27 + n_out
    # a plain function, and a sampan.jit function already called (its cached graph)
    w = sampan.randn(64, 32)
    assert sampan.flops(lambda a: (a @ w).tanh(), x) == 2 * 16 * 64 * 32 + 16 * 32
    f = sampan.jit(lambda a: (a @ w).sum())
    f(x)
    assert sampan.flops(f, x) == 2 * 16 * 64 * 32 + 16 * 32


def test_flops_of_a_training_step_traces_but_does_not_run_it():
    sampan.manual_seed(0)
    lin = nn.Linear(8, 4, bias=False)
    opt = sampan.optim.SGD(lin.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = lin(x).sum()
        loss.backward()
        opt.step()
        return loss
    w0 = lin.weight.numpy().copy()
    n = sampan.flops(step, sampan.randn(5, 8))
    np.testing.assert_array_equal(lin.weight.numpy(), w0)
    forward = 2 * 5 * 8 * 4 + 5 * 4       # x @ W, then the sum reads 20 elements
    grad_w = 2 * 8 * 5 * 4                # x^T @ ones (the sum's gradient is a constant)
    update = 1 + 2 * 8 * 4                # lr cast to float32, then w - lr * dW
    assert n == forward + grad_w + update == 725


def test_summary_rejects_what_is_not_a_layer():
    with pytest.raises(sampan.SampanError, match="expected a sampan.nn.Layer"):
        sampan.summary(lambda x: x, sampan.randn(2))
    with pytest.raises(sampan.SampanError, match="example_inputs"):
        sampan.summary(nn.Linear(2, 2), 3)


def test_jitted_model_and_functional_layers():
    sampan.manual_seed(0)
    m = nn.Linear(4, 3)
    s = sampan.summary(sampan.jit(m), sampan.randn(2, 4), verbose=False)
    assert s.total_params == 15 and s.total_flops == 2 * 2 * 4 * 3 + 2 * 3
    assert F.linear  # the functional form is what Linear runs (one matmul, one add)


def test_frozen_layers_and_batchnorm_against_torchinfo():
    sampan.manual_seed(0)
    ours_m = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    ours_m[0].requires_grad_(False)
    torch.manual_seed(0)
    theirs_m = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16),
                                   torch.nn.ReLU(), torch.nn.Linear(16, 4))
    theirs_m[0].requires_grad_(False)
    ours = sampan.summary(ours_m, (5, 12), verbose=False)
    theirs = torchinfo.summary(theirs_m, input_size=(5, 12), verbose=0)
    assert (ours.total_params, ours.trainable_params) == (theirs.total_params,
                                                          theirs.trainable_params)
    for i, li in enumerate(li for li in theirs.summary_list if li.depth == 1):
        row = ours.row(str(i))
        assert (row.type, row.params, row.trainable) == (li.class_name, li.num_params,
                                                         li.trainable_params)
        assert list(row.output_shapes[0]) == list(li.output_size)
    # BatchNorm's running statistics are buffers: in the model size, not the params
    assert ours.model_bytes == 4 * (ours.total_params + 16 + 16) + 8   # + num_batches_tracked
