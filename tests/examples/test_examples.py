"""The examples reach the accuracy the README promises (slow: `make test-slow`)."""
import os
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")
sys.path.insert(0, EXAMPLES)


@pytest.mark.slow
def test_digits_cnn_reaches_97_percent():
    import digits_cnn
    _, acc, _ = digits_cnn.train(progress=False)
    assert acc >= 0.97


@pytest.mark.slow
def test_digits_mlp_reaches_97_percent():
    import digits_mlp
    assert digits_mlp.main() >= 0.97


@pytest.mark.slow
def test_char_gpt_loss_falls():
    import char_gpt
    first, last = char_gpt.main(steps=120)
    assert last < 0.7 * first


def test_func_transforms_newton_beats_gradient_descent():
    """examples/func_transforms.py: Newton with the exact Hessian gets below 300 steps of
    jit-compiled gradient descent in 8 steps, and its loss never rises."""
    import func_transforms
    gd, nt, acc = func_transforms.main()
    assert nt[-1] <= gd[-1] < gd[0]
    assert all(b <= a + 1e-12 for a, b in zip(nt, nt[1:])) and nt[3] < nt[0] - 0.3
    assert acc >= 0.9
