"""Lowering of ``convolution``: on CUDA, the bias is added in the kernel that reads the result.

ATen's cuDNN convolution writes the product and then adds the bias in a kernel of its own,
one more pass over an output as large as the activations (H100, torchvision vgg16_bn bf16
batch 32: 13 of those passes, 1.28 of Ember's 3.80 ms a call, where torch.compile took 2.85).
When every reader of the result is code Ember generates (a batch norm, a ReLU: through
views, each value read once), the lowering runs the convolution without its bias and returns
``conv + bias`` as an unrealized body, so the bias add costs nothing in the kernel that reads
the product anyway. Otherwise (a reader is a library call or a graph output, or a CPU graph:
oneDNN adds the bias inside its kernel) ``convolution`` runs as it is.

The bias is added in float32 to the rounded product and rounded once with what reads it:
eager rounds the product, adds, rounds again; the result differs from eager's by at most
the one rounding a half-precision value has.

Where this applies is the target's answer (``Target.adds_conv_bias``).
"""
from __future__ import annotations

from ember.backend.ir import Pointwise
from ember.backend.lowering.registry import (aten, is_ir, read_by_generated_code_only,
                                             register_lowering)
from ember.backend.ops import ops


@register_lowering(aten.convolution.default)
def _convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    if not (is_ir(bias) and ctx.graph.target.adds_conv_bias(ctx.dtype)
            and len(ctx.size) >= 3 and read_by_generated_code_only(ctx.node)):
        return NotImplemented
    product = ctx.graph.library_call(
        aten.convolution.default,
        [x, weight, None, stride, padding, dilation, transposed, output_padding, groups],
        ctx.out).make_loader()
    load_bias = bias.make_loader()
    cast = bias.get_dtype() != ctx.dtype

    def body(index):
        b = load_bias([index[1]])         # one bias per output channel (dim 1)
        return ops.add(product(index), ops.to_dtype(b, ctx.dtype) if cast else b)
    return Pointwise(ctx.device, ctx.dtype, body, ctx.size)
