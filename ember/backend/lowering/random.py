"""Random numbers in generated kernels: rand, randn, bernoulli and dropout.

Every element's value is a counter-based Philox draw, ``ops.rand(seed, offset)`` /
``ops.randn(seed, offset)``: a pure function of a seed and the element's offset, so fused
kernels compute it anywhere, in any order, and the same seed gives the same values.

Used with ``fallback_random=False``; by default random ops run eager's kernels instead (the
same numbers as eager). The seed: once per call of the compiled graph the wrapper draws one from torch's generator
(``aten.randint``, a library call on the graph's device), so results follow
``torch.manual_seed`` and differ from call to call as eager's do. Each random op of the
graph takes its own range of offsets. The values match eager in distribution, not bit for
bit (eager's generators use other algorithms and orders).
"""
from __future__ import annotations

import torch

from ember.backend.ir import ExternBuffer, Layout, Pointwise, contiguous_strides, product
from ember.backend.lowering.registry import aten, register_lowering
from ember.backend.ops import ops

_FLOAT = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _seed_and_offset(graph, numel):
    """The graph's seed buffer (made on first use) and a fresh range of ``numel`` offsets."""
    seed = graph.random_seed
    if seed is None:
        layout = Layout(graph.device, torch.int64, [1], contiguous_strides([1]))
        seed = ExternBuffer(graph.new_name("seed"), layout, aten.randint.low,
                            [0, 2**31 - 1, [1]], {"dtype": torch.int64, "device": graph.device},
                            True)
        graph.buffers.append(seed)
        graph.random_seed = seed
    base = graph.random_offset
    graph.random_offset = base + int(numel)
    return seed, base


def _linear(index, size):
    out = 0
    for i, s in zip(index, size):
        out = out * s + i
    return out


def _draws(ctx, size, normal: bool):
    """``index -> Philox value`` (float32) for a tensor of ``size``."""
    seed, base = _seed_and_offset(ctx.graph, product(size))
    name = seed.name

    def draw(index):
        offset = ops.index_expr(base + _linear(index, size), torch.int64)
        key = ops.load(name, 0)
        return ops.randn(key, offset) if normal else ops.rand(key, offset)
    return draw


def _eager_kernel(ctx, generator=None) -> bool:
    """Leave the op to eager's kernel: asked to (fallback_random), or a user's generator."""
    return not ctx.graph.fused_random or generator is not None


def _random(ctx, normal: bool, dtype=None):
    if ctx.dtype not in _FLOAT or not ctx.device == ctx.graph.device:
        return NotImplemented
    size = ctx.size
    draw = _draws(ctx, size, normal)

    def inner(index):
        v = draw(index)
        return v if ctx.dtype == torch.float32 else ops.to_dtype(v, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype, inner, size)


@register_lowering(aten.rand.default, aten.rand_like.default)
def _rand(ctx, *args, generator=None, **kwargs):
    if _eager_kernel(ctx, generator):
        return NotImplemented
    return _random(ctx, normal=False)


@register_lowering(aten.randn.default, aten.randn_like.default)
def _randn(ctx, *args, generator=None, **kwargs):
    if _eager_kernel(ctx, generator):
        return NotImplemented
    return _random(ctx, normal=True)


def _bernoulli_mask(ctx, p_loader, size):
    """1 where a uniform draw is below ``p`` (probability of a one)."""
    draw = _draws(ctx, size, normal=False)
    return lambda index: ops.lt(draw(index), p_loader(index))


@register_lowering(aten.bernoulli.default)
def _bernoulli(ctx, p, *, generator=None):
    if _eager_kernel(ctx, generator) or ctx.dtype not in _FLOAT:
        return NotImplemented
    load_p = p.make_loader()
    src = p.get_dtype()
    to32 = (lambda v: v) if src == torch.float32 else (lambda v: ops.to_dtype(v, torch.float32))
    hit = _bernoulli_mask(ctx, lambda index: to32(load_p(index)), ctx.size)
    return Pointwise(ctx.device, ctx.dtype, lambda index: ops.to_dtype(hit(index), ctx.dtype),
                     ctx.size)


@register_lowering(aten.bernoulli.p)
def _bernoulli_p(ctx, x, p=0.5, *, generator=None):
    if _eager_kernel(ctx, generator) or ctx.dtype not in _FLOAT:
        return NotImplemented
    hit = _bernoulli_mask(ctx, lambda index: ops.constant(p, torch.float32), ctx.size)
    return Pointwise(ctx.device, ctx.dtype, lambda index: ops.to_dtype(hit(index), ctx.dtype),
                     ctx.size)


@register_lowering(aten.native_dropout.default)
def _native_dropout(ctx, x, p, train):
    """(x * keep / (1 - p), keep) with keep ~ Bernoulli(1 - p), as eager's kernel."""
    if _eager_kernel(ctx) or not train or x.get_dtype() not in _FLOAT or not 0 <= p < 1:
        return NotImplemented
    size = x.get_size()
    dtype = x.get_dtype()
    load = x.make_loader()
    keep = _bernoulli_mask(ctx, lambda index: ops.constant(1.0 - p, torch.float32), size)
    scale = 1.0 / (1.0 - p)

    def out(index):
        v = ops.mul(load(index), ops.constant(scale, dtype))
        return ops.where(keep(index), v, ops.constant(0.0, dtype))
    return (Pointwise(x.get_device(), dtype, out, size),
            Pointwise(x.get_device(), torch.bool, keep, size))
