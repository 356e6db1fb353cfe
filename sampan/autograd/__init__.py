"""Tape autograd: recording in eager mode, iterative backward, higher-order grads."""
from .engine import backward, enable_grad, grad, is_grad_enabled, no_grad, set_grad_enabled
from .gradcheck import gradcheck, gradgradcheck
from .inference import inference_mode, is_inference_mode_enabled

__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled",
           "is_grad_enabled", "gradcheck", "gradgradcheck", "inference_mode",
           "is_inference_mode_enabled"]
