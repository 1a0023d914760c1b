"""``addmm`` whose bias joins the kernel after it (CPU).

ATen's CPU ``addmm(bias, a, b)`` first copies the broadcast bias into its result and then
lets the GEMM add ``a @ b`` to it: one more pass over the result, which is as large as the
activations (convnext_tiny: 37 of them, 4.7 ms of copies in a 52 ms call). When every reader
of the result is code Ember generates (GELU, a residual add, a layer norm: through views,
each value read once), the lowering runs ``mm`` instead and returns ``mm + bias`` as an
unrealized body, so the bias add costs nothing in the kernel that reads the product anyway.
Otherwise (a reader is a library call or a graph output, or another device: cuBLAS adds
the bias in its epilogue) ``addmm`` runs as it is.
"""
from __future__ import annotations

import torch
import torch.fx

from ember.backend.ir import Pointwise
from ember.backend.lowering.registry import (LOWERINGS, aten, broadcast_loader, is_ir,
                                             register_lowering)
from ember.backend.ops import ops
from ember.fake import returns_alias


def _read_by_generated_code_only(node: torch.fx.Node) -> bool:
    """``node``'s value (through views: ops whose schema returns an alias) has one reader,
    an op with a lowering that is not a library call."""
    from ember.backend.graph import LIBRARY_OPS
    while len(node.users) == 1:
        (user,) = node.users
        if user.op != "call_function":
            return False
        if not (isinstance(user.target, torch._ops.OpOverload) and returns_alias(user.target)):
            return user.target in LOWERINGS and user.target not in LIBRARY_OPS
        node = user
    return False


@register_lowering(aten.addmm.default)
def _addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    if ctx.device.type != "cpu" or ctx.dtype not in (torch.float32, torch.float64) or \
            beta != 1 or alpha != 1 or not is_ir(bias):
        return NotImplemented
    size = bias.get_size()
    if not (len(size) == 1 or len(size) == 2 and size[0] == 1) or \
            not _read_by_generated_code_only(ctx.node):
        return NotImplemented
    product = ctx.graph.library_call(aten.mm.default, [a, b], ctx.out).make_loader()
    load_bias = broadcast_loader(bias, ctx.size, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype,
                     lambda index: ops.add(product(index), load_bias(index)), ctx.size)
