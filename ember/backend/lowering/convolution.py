"""Lowering of depthwise 2-D convolutions (one 2-D filter per channel: MobileNet,
EfficientNet, ConvNeXt) to a Pointwise body, like a pooling window: each output element
loads its window (unrolled, at most ``MAX_UNROLL`` elements), multiplies by the channel's
filter and adds the bias. The body then fuses with what reads it (batch norm, activation)
and inlines what it reads.

cuDNN gains little on such a convolution (no reduction over channels: it is memory-bound),
and in channels-last half precision its first call in a process costs seconds (H200,
mobilenetv3_large_100 bf16: eager's first call 0.9 s NCHW, 5.9 s channels-last). Half
precision inputs are multiplied and summed in float32 and rounded once, as cuDNN's
kernels do. Every other convolution runs its ATen kernel.
"""
from __future__ import annotations

import torch

from ember.backend.ir import Pointwise
from ember.backend.lowering.pooling import MAX_UNROLL, _Axis, _pair, _plane_ok, _static, \
    _window
from ember.backend.lowering.registry import aten, register_lowering
from ember.backend.ops import ops

_HALF = (torch.float16, torch.bfloat16)


@register_lowering(aten.convolution.default)
def _convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    out_size = [int(s) for s in ctx.out.shape]
    size = x.get_size()
    if transposed or len(size) != 4 or not _plane_ok(x, out_size) or 0 in out_size:
        return NotImplemented
    w_size = weight.get_size()
    if not _static(w_size) or groups == 1 or groups != int(size[1]) or \
            int(w_size[0]) != groups or int(w_size[1]) != 1 or \
            weight.get_dtype() != x.get_dtype():
        return NotImplemented        # not depthwise, or a depth multiplier above 1
    kh, kw = int(w_size[2]), int(w_size[3])
    if kh * kw > MAX_UNROLL:
        return NotImplemented
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    axes = [_Axis(size[d - 2], out_size[d - 2], (kh, kw)[d], stride[d], padding[d],
                  dilation[d]) for d in range(2)]
    value = _window(x, axes, 0)
    load_weight = weight.make_loader()
    load_bias = bias.make_loader() if bias is not None else None
    dtype = x.get_dtype()
    compute = torch.float32 if dtype in _HALF else dtype

    def wide(v):
        return v if compute == dtype else ops.to_dtype(v, compute)

    def body(index):
        channel = index[1]
        acc = None
        for i in range(kh):
            for j in range(kw):
                term = ops.mul(wide(value(index, i, j)), wide(load_weight([channel, 0, i, j])))
                acc = term if acc is None else ops.add(acc, term)
        if load_bias is not None:
            acc = ops.add(acc, wide(load_bias([channel])))
        return acc if compute == dtype else ops.to_dtype(acc, dtype)
    return Pointwise(x.get_device(), dtype, body, out_size)
