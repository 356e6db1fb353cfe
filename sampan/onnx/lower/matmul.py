"""Matrix products: MatMul (inputs cast to one dtype), Einsum."""
from __future__ import annotations

from ._register import register_lowering
from .elementwise import to_out


@register_lowering("matmul")
def _matmul(ctx, a, b):
    return ctx.emit("MatMul", to_out(ctx, a, b))


@register_lowering("einsum")
def _einsum(ctx, *xs, equation):
    return ctx.emit("Einsum", to_out(ctx, *xs), equation=equation)
