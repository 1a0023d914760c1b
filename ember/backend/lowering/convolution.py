"""Lowering of ``convolution``: depthwise convolutions generated as stencils; on CUDA, the bias
of a library convolution is added in the kernel that reads the result.

**Depthwise convolutions** (one 2-D filter per channel, ``Target.max_generated_depthwise_taps``
filter taps at most) are a Pointwise body: each output loads its window's taps (unrolled,
rows outer, columns inner, through ``pooling.WindowAxis``) and sums ``weight * input`` in float32
after the bias, as ATen's CUDA depthwise kernel does, rounding once; a tap in the padding is
skipped (a ``where`` on the product: an inf weight times padding adds nothing, as in eager).
The body fuses with the batch norm and activation after it, and reads the input in whatever
layout it has. H100, timm maxvit_tiny_rw_224 bf16 batch 32: ATen's NCHW depthwise kernel took
1.03 ms of Ember's 7.9 ms a call, cuDNN's channels-last one 0.32 ms in torch.compile's run
(whose first call costs seconds per shape: passes/layout.py); the stencils' GPU time is
about ATen's there, lower in mobilenetv3 (targets/triton/target.py has the numbers that keep
them off for now).

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

import torch

from ember.backend.ir import Pointwise
from ember.backend.lowering.matmul import in_float
from ember.backend.lowering.pooling import WindowAxis, pair
from ember.backend.lowering.registry import (aten, is_ir, read_by_generated_code_only,
                                             register_lowering)
from ember.backend.ops import ops

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def generates_depthwise(target, x: torch.Tensor, weight: torch.Tensor, groups,
                        transposed=False) -> bool:
    """Whether ``target`` generates this 2-D convolution (tensors or fake tensors) as a
    stencil: depthwise (``groups`` equal to the channels, one filter per channel) with at most
    ``target.max_generated_depthwise_taps`` static taps, float operands of one dtype."""
    if transposed or x.dim() != 4 or weight.dim() != 4 or x.dtype not in _FLOATS or \
            weight.dtype != x.dtype:
        return False
    channels, (out_channels, per_group, kh, kw) = x.shape[1], weight.shape
    # (a symbolic size is a SymInt: channels and filter sizes must be static)
    if not all(isinstance(v, int) for v in (groups, channels, per_group, kh, kw)):
        return False
    return groups > 1 and channels == groups == out_channels and per_group == 1 and \
        kh * kw <= target.max_generated_depthwise_taps


def _depthwise(ctx, x, weight, bias, stride, padding, dilation):
    """``sum over taps of weight * input`` after the bias, in float32, rounded once."""
    size, out_size = x.get_size(), ctx.size
    kh, kw = (int(k) for k in weight.get_size()[2:])
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    axes = [WindowAxis(size[d + 2], out_size[d + 2], (kh, kw)[d], stride[d], padding[d],
                  dilation[d]) for d in range(2)]
    taps = [(i, j) for i in range(kh) for j in range(kw)]
    load_x = ctx.graph.computed_once(x, kh * kw / (stride[0] * stride[1])).make_loader()
    load_w, load_b = weight.make_loader(), bias.make_loader() if is_ir(bias) else None
    f32 = torch.float32
    ah, aw = axes

    def body(index):
        n, c, oh, ow = index
        acc = ops.to_dtype(load_b([c]), f32) if load_b else ops.constant(0.0, f32)
        for i, j in taps:
            v = load_x([n, c, ah.load_pos(oh, i), aw.load_pos(ow, j)])
            term = ops.mul(ops.to_dtype(v, f32), ops.to_dtype(load_w([c, 0, i, j]), f32))
            vh, vw = ah.valid(oh, i), aw.valid(ow, j)
            ok = vh if vw is None else vw if vh is None else ops.logical_and(vh, vw)
            if ok is not None:
                term = ops.where(ok, term, ops.constant(0.0, f32))
            acc = ops.add(acc, term)
        return ops.to_dtype(acc, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype, body, out_size)


@register_lowering(aten.convolution.default)
def _convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    if is_ir(x) and is_ir(weight) and (bias is None or is_ir(bias)) and \
            0 not in ctx.size and generates_depthwise(
                ctx.graph.target, ctx.node.args[0].meta["val"], ctx.node.args[1].meta["val"],
                groups, transposed):
        return _depthwise(ctx, x, weight, bias, stride, padding, dilation)
    # (a half-precision convolution on a CPU whose oneDNN has no half kernels: matmul.py)
    product = in_float(ctx, aten.convolution.default, [x, weight, bias],
                       [stride, padding, dilation, transposed, output_padding, groups])
    if product is not None:
        return product
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


@register_lowering(aten.convolution_backward.default)
def _convolution_backward(ctx, grad, x, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    # (half precision on a CPU whose oneDNN has no half kernels: ATen's fallback there is a
    # scalar loop, 25 ms for a 16x32x32x32 3x3 layer on an AVX2 EPYC; matmul.py)
    grads = in_float(ctx, aten.convolution_backward.default, [grad, x, weight],
                     [bias_sizes, stride, padding, dilation, transposed, output_padding,
                      groups, output_mask])
    return NotImplemented if grads is None else grads
