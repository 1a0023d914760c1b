"""Lowering an ATen graph to the loop IR: a registry from ATen op to IR builder.

``@register_lowering(aten.add.Tensor)`` registers ``fn(ctx, *args, **kwargs) -> IRNode`` (or a
tuple of them); tensor arguments arrive as IR nodes, the rest as Python values, and ``ctx``
carries the node's fake output (``ctx.out``) and the graph being built. An op without a
lowering runs its ATen kernel from the wrapper (a fallback: correct, just not fused).
"""
from ember.backend.lowering.registry import LOWERINGS, register_lowering

from ember.backend.lowering import pointwise, reductions, views, indexing, pooling, random, matmul, convolution  # noqa: F401,E501

__all__ = ["LOWERINGS", "register_lowering"]
