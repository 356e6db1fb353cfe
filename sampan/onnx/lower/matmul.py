"""Matrix products: MatMul (inputs cast to one dtype), Einsum."""
from __future__ import annotations

from . import register_lowering
from .elementwise import common


@register_lowering("matmul")
def _matmul(ctx, a, b):
    return ctx.emit("MatMul", common(ctx, a, b))


@register_lowering("einsum")
def _einsum(ctx, *xs, equation):
    return ctx.emit("Einsum", common(ctx, *xs), equation=equation)
