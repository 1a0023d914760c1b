"""Lowerings of elementwise ops, casts, factories and ``where``."""
from __future__ import annotations

import math

import torch

from ember.backend.ir import Pointwise
from ember.backend.lowering.registry import (aten, bool_result, broadcast_loader,
                                             compute_dtype, is_ir, make_pointwise,
                                             register_lowering)
from ember.backend.ops import ops


def _unary(op_name):
    def lower(ctx, x, *rest, **kwargs):
        compute = ctx.dtype if ctx.dtype.is_floating_point else compute_dtype([x], ctx.dtype)
        return make_pointwise(ctx, getattr(ops, op_name), [x], compute=compute)
    return lower


_FLOAT_UNARY = {
    aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log", aten.log2: "log2",
    aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt",
    aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos",
    aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.erf: "erf",
    aten.erfc: "erfc", aten.sigmoid: "sigmoid", aten.reciprocal: "reciprocal",
}
_SAME_UNARY = {
    aten.neg: "neg", aten.abs: "abs", aten.relu: "relu", aten.floor: "floor",
    aten.ceil: "ceil", aten.trunc: "trunc", aten.sign: "sign", aten.bitwise_not: "bitwise_not",
    aten.frac: "frac",
}
for _op, _name in {**_FLOAT_UNARY, **_SAME_UNARY}.items():
    register_lowering(_op.default)(_unary(_name))


@register_lowering(aten.round.default)
def _round(ctx, x):
    return make_pointwise(ctx, ops.round, [x], compute=ctx.dtype)


@register_lowering(aten.logical_not.default, aten.isnan.default, aten.isinf.default)
def _bool_unary(ctx, x):
    name = ctx.node.target.__name__.split(".")[0]
    return make_pointwise(ctx, bool_result(lambda v: getattr(ops, name)(v)), [x],
                          compute=x.get_dtype())


def _binary(op_name, *, float_compute=False):
    def lower(ctx, a, b, *, alpha=1, **kwargs):
        compute = compute_dtype([a, b], ctx.dtype)
        if float_compute and not compute.is_floating_point:
            compute = ctx.dtype
        fn = getattr(ops, op_name)
        if alpha != 1:
            return make_pointwise(ctx, lambda x, y: fn(x, ops.mul(y, ops.constant(alpha, compute))),
                                  [a, b], compute=compute)
        return make_pointwise(ctx, fn, [a, b], compute=compute, float_scalars=op_name == "mul")
    return lower


for _packet, _name in [(aten.add, "add"), (aten.sub, "sub"), (aten.mul, "mul"),
                       (aten.maximum, "maximum"), (aten.minimum, "minimum"),
                       (aten.bitwise_and, "bitwise_and"), (aten.bitwise_or, "bitwise_or"),
                       (aten.bitwise_xor, "bitwise_xor"), (aten.remainder, "remainder"),
                       (aten.fmod, "fmod"), (aten.atan2, "atan2"),
                       (aten.copysign, "copysign"), (aten.hypot, "hypot")]:
    for _overload in ("Tensor", "Scalar", "self", "default"):   # maximum, atan2: default
        if hasattr(_packet, _overload):
            register_lowering(getattr(_packet, _overload))(
                _binary(_name, float_compute=_name in ("atan2", "copysign", "hypot")))


@register_lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(ctx, a, b, alpha=1):
    compute = compute_dtype([a, b], ctx.dtype)
    scaled = (lambda x: x) if alpha == 1 else (lambda x: ops.mul(x, ops.constant(alpha, compute)))
    return make_pointwise(ctx, lambda x, y: ops.sub(y, scaled(x)), [a, b], compute=compute)


@register_lowering(aten.div.Tensor, aten.div.Scalar)
def _div(ctx, a, b):
    return make_pointwise(ctx, ops.truediv, [a, b], compute=ctx.dtype, float_scalars=True)


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, a, b, *, rounding_mode=None):
    compute = compute_dtype([a, b], ctx.dtype)
    if rounding_mode is None:
        return make_pointwise(ctx, ops.truediv, [a, b], compute=ctx.dtype, float_scalars=True)
    op = ops.floordiv if rounding_mode == "floor" else ops.truncdiv
    return make_pointwise(ctx, op, [a, b], compute=compute)


@register_lowering(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx, a, b):
    if not ctx.dtype.is_floating_point:
        # eager raises integers to integer powers by repeated squaring (wrapping on overflow;
        # a negative power is 0 unless the base is 1 or -1); std::pow goes through double
        # (inexact past 2**53, and 0 ** -1 is inf). A constant power is unrolled; a tensor
        # power runs ATen.
        if not is_ir(a) or is_ir(b) or isinstance(b, bool) or not isinstance(b, int) or b < 0:
            return NotImplemented
        return make_pointwise(ctx, lambda x: _int_power(x, b, ctx.dtype), [a],
                              compute=ctx.dtype)
    # constant powers eager computes without pow (ATen's pow_tensor_scalar kernels on CPU
    # and CUDA, in the same order): same values, and a general pow costs a log and an exp
    # (GPT-2's tanh-GELU cubes its input)
    special = None if is_ir(b) or isinstance(b, bool) else _POWER_FORMULAS.get(b)
    if special is not None:
        return make_pointwise(ctx, lambda x: special(x, ctx.dtype), [a], compute=ctx.dtype)
    return make_pointwise(ctx, ops.pow, [a, b], compute=ctx.dtype)


_POWER_FORMULAS = {
    2: lambda x, dtype: ops.mul(x, x),
    3: lambda x, dtype: ops.mul(ops.mul(x, x), x),
    0.5: lambda x, dtype: ops.sqrt(x),
    -0.5: lambda x, dtype: ops.rsqrt(x),
    -1: lambda x, dtype: ops.truediv(ops.constant(1, dtype), x),
    -2: lambda x, dtype: ops.truediv(ops.constant(1, dtype), ops.mul(x, x)),
}


def _int_power(x, n: int, dtype):
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else ops.mul(result, base)
        n >>= 1
        if n:
            base = ops.mul(base, base)
    return ops.constant(1, dtype) if result is None else result


for _packet, _name in [(aten.eq, "eq"), (aten.ne, "ne"), (aten.lt, "lt"), (aten.le, "le"),
                       (aten.gt, "gt"), (aten.ge, "ge"), (aten.logical_and, "logical_and"),
                       (aten.logical_or, "logical_or"), (aten.logical_xor, "logical_xor")]:
    def _cmp(ctx, a, b, _name=_name):
        compute = compute_dtype([a, b], ctx.dtype)
        return make_pointwise(ctx, bool_result(getattr(ops, _name)), [a, b], compute=compute)
    for _overload in ("Tensor", "Scalar", "default"):
        if hasattr(_packet, _overload):
            register_lowering(getattr(_packet, _overload))(_cmp)


@register_lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther,
                   aten.where.Scalar)
def _where(ctx, cond, a, b):
    compute = compute_dtype([a, b], ctx.dtype)
    size = ctx.size
    load_c = broadcast_loader(cond, size, torch.bool)
    load_a = broadcast_loader(a, size, compute)
    load_b = broadcast_loader(b, size, compute)

    def inner(index):
        value = ops.where(load_c(index), load_a(index), load_b(index))
        return value if compute == ctx.dtype else ops.to_dtype(value, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype, inner, size)


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx, x, min=None, max=None):
    args = [x] + [v for v in (min, max) if v is not None]
    compute = compute_dtype(args, ctx.dtype)
    if any(_overflows(v, compute) for v in (min, max)):
        return NotImplemented     # ATen's kernel raises eager's error on every call

    def fn(v, *bounds):
        bounds = list(bounds)
        if min is not None:
            v = ops.maximum(v, bounds.pop(0))
        if max is not None:
            v = ops.minimum(v, bounds.pop(0))
        return v
    return make_pointwise(ctx, fn, args, compute=compute)


def _overflows(bound, dtype: torch.dtype) -> bool:
    """Whether eager refuses the scalar ``bound`` for integer ``dtype`` ("value cannot be
    converted to type int8_t without overflow"); the values it accepts wrap (c10 lets an
    unsigned type take negative values down to -max)."""
    if is_ir(bound) or bound is None or isinstance(bound, bool) or \
            not isinstance(bound, int) or dtype.is_floating_point or dtype is torch.bool:
        return False
    info = torch.iinfo(dtype)
    return bound > info.max or bound < (info.min if dtype.is_signed else -info.max)


@register_lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx, x, bound):
    return _clamp(ctx, x, bound, None)


@register_lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx, x, bound):
    return _clamp(ctx, x, None, bound)


@register_lowering(aten.hardtanh.default)
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return _clamp(ctx, x, min_val, max_val)


@register_lowering(aten.leaky_relu.default)
def _leaky_relu(ctx, x, negative_slope=0.01):
    return make_pointwise(ctx, lambda v: ops.where(
        ops.gt(v, ops.constant(0, ctx.dtype)), v,
        ops.mul(v, ops.constant(negative_slope, ctx.dtype))), [x], compute=ctx.dtype)


@register_lowering(aten.gelu.default)
def _gelu(ctx, x, approximate="none"):
    dt = ctx.dtype

    def c(v):
        return ops.constant(v, dt)

    def fn(v):
        if approximate == "tanh":
            return ops.mul(ops.mul(c(0.5), v), ops.add(c(1.0), _gelu_tanh(v, c)))
        return ops.gelu(v)     # x Phi(x): one op, as the C++ target computes it in fewer steps
    return make_pointwise(ctx, fn, [x], compute=dt)


_GELU_K = math.sqrt(2 / math.pi)       # the tanh approximation: tanh(K (x + 0.044715 x^3))


def _gelu_tanh(v, c):
    return ops.tanh(ops.mul(c(_GELU_K), ops.add(v, ops.mul(c(0.044715),
                                                           ops.mul(v, ops.mul(v, v))))))


@register_lowering(aten.gelu_backward.default)
def _gelu_backward(ctx, grad, x, approximate="none"):
    """``grad`` times gelu's derivative at ``x``: for the exact gelu one op, Phi(x) + x phi(x)
    (the C++ target computes it from one exp, ``ember_gelu_grad_f``); for the tanh
    approximation the derivative of 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3)."""
    dt = ctx.dtype

    def c(v):
        return ops.constant(v, dt)

    def fn(g, v):
        if approximate != "tanh":
            return ops.mul(g, ops.gelu_grad(v))
        th = _gelu_tanh(v, c)
        du = ops.mul(c(_GELU_K), ops.add(c(1.0), ops.mul(c(3 * 0.044715), ops.mul(v, v))))
        left = ops.mul(c(0.5), ops.add(c(1.0), th))
        right = ops.mul(ops.mul(c(0.5), v), ops.mul(ops.sub(c(1.0), ops.mul(th, th)), du))
        return ops.mul(g, ops.add(left, right))
    return make_pointwise(ctx, fn, [grad, x], compute=dt)


@register_lowering(aten._to_copy.default)
def _to_copy(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    if device is not None and torch.device(device) != x.get_device():
        return NotImplemented
    return make_pointwise(ctx, lambda v: v, [x], compute=x.get_dtype())


@register_lowering(aten.copy.default)
def _copy(ctx, x, src, non_blocking=False):
    """Functional ``copy``: ``src`` broadcast to ``x``'s shape, in ``x``'s dtype."""
    if is_ir(src) and src.get_device() != x.get_device():
        return NotImplemented
    return make_pointwise(ctx, lambda v: v, [src], compute=ctx.dtype)


@register_lowering(aten.clone.default)
def _clone(ctx, x, *, memory_format=None):
    return make_pointwise(ctx, lambda v: v, [x], compute=x.get_dtype())


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, x, mask, value):
    return _where(ctx, mask, value, x)


@register_lowering(aten.full.default, aten.scalar_tensor.default)
def _full(ctx, size_or_value, fill_value=None, **kwargs):
    value = fill_value if fill_value is not None else size_or_value
    if is_ir(value):
        return NotImplemented
    dtype = ctx.dtype
    return Pointwise(ctx.device, dtype, lambda index: ops.constant(value, dtype), ctx.size)


@register_lowering(aten.zeros.default, aten.ones.default)
def _zeros_ones(ctx, size, **kwargs):
    value = 1 if ctx.node.target is aten.ones.default else 0
    dtype = ctx.dtype
    return Pointwise(ctx.device, dtype, lambda index: ops.constant(value, dtype), ctx.size)


@register_lowering(aten.new_zeros.default, aten.new_ones.default, aten.new_full.default)
def _new_filled(ctx, x, size, fill_value=None, **kwargs):
    target = ctx.node.target
    value = 0 if target is aten.new_zeros.default else 1 if target is aten.new_ones.default \
        else fill_value
    if is_ir(value):
        return NotImplemented
    dtype = ctx.dtype
    return Pointwise(ctx.device, dtype, lambda index: ops.constant(value, dtype), ctx.size)


@register_lowering(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default)
def _full_like(ctx, x, fill_value=None, **kwargs):
    target = ctx.node.target
    value = 0 if target is aten.zeros_like.default else 1 if target is aten.ones_like.default \
        else fill_value
    dtype = ctx.dtype
    return Pointwise(ctx.device, dtype, lambda index: ops.constant(value, dtype), ctx.size)


@register_lowering(aten.fill.Scalar, aten.fill.Tensor)
def _fill(ctx, x, value):
    dtype = ctx.dtype
    if is_ir(value):     # a 0-d tensor (``mask[h, w] = count`` traces to it)
        return Pointwise(ctx.device, dtype, broadcast_loader(value, ctx.size, dtype), ctx.size)
    return Pointwise(ctx.device, dtype, lambda index: ops.constant(value, dtype), ctx.size)


@register_lowering(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx, *args, **kwargs):
    args = [a for a in args]
    start, step = 0, 1
    if len(args) >= 2:
        start = args[0]
    if len(args) >= 3:
        step = args[2]
    if any(is_ir(a) for a in args):
        return NotImplemented
    dtype = ctx.dtype

    def inner(index):
        i = ops.index_expr(index[0], torch.int64)
        if dtype.is_floating_point:
            return ops.add(ops.mul(ops.to_dtype(i, dtype), ops.constant(step, dtype)),
                           ops.constant(start, dtype))
        return ops.to_dtype(ops.add(ops.mul(i, ops.constant(step, torch.int64)),
                                    ops.constant(start, torch.int64)), dtype)
    return Pointwise(ctx.device, dtype, inner, ctx.size)


@register_lowering(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def _identity(ctx, x):
    return x


@register_lowering(aten.fmax.default, aten.fmin.default)
def _fmax(ctx, a, b):
    """max/min where a NaN loses to a number (eager's fmax/fmin); NaN only if both are."""
    if not ctx.dtype.is_floating_point:
        return NotImplemented
    pick = ops.maximum if ctx.node.target is aten.fmax.default else ops.minimum
    return make_pointwise(ctx, lambda x, y: ops.where(
        ops.isnan(x), y, ops.where(ops.isnan(y), x, pick(x, y))), [a, b])


@register_lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(ctx, a, b):
    return make_pointwise(ctx, ops.floordiv, [a, b], compute=compute_dtype([a, b], ctx.dtype))


def _triangle(ctx, x, diagonal, keep_below: bool):
    """Zero the elements above (tril) or below (triu) ``diagonal`` of the last two dims."""
    size = x.get_size()
    if len(size) < 2:
        return NotImplemented
    load = x.make_loader()
    dtype = ctx.dtype

    def inner(index):
        offset = ops.index_expr(index[-1] - index[-2], torch.int64)
        bound = ops.constant(diagonal, torch.int64)
        keep = ops.le(offset, bound) if keep_below else ops.ge(offset, bound)
        return ops.where(keep, load(index), ops.constant(0, dtype))
    return Pointwise(ctx.device, dtype, inner, size)


@register_lowering(aten.tril.default)
def _tril(ctx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, keep_below=True)


@register_lowering(aten.triu.default)
def _triu(ctx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, keep_below=False)
