"""Lowerings of 2-D pooling: ``max_pool2d_with_indices`` and its backward, ``avg_pool2d`` and
``_adaptive_avg_pool2d``.

A pooled value is one Pointwise body that loads the window's elements (unrolled, in eager's
scan order: rows outer, columns inner) and combines them. Generated C++ has no masked loads,
so a window position that may fall in the padding loads a clamped (in-bounds) index and
``where`` replaces the value by -inf (max) or 0 (sum); which positions need the check is
decided statically from the sizes. Windows larger than ``MAX_UNROLL`` elements become a sum
Reduction over the window (average pools only; a large max pool runs its ATen kernel).

Symbolic sizes (issue 31): the plane's sizes are expressions; a window position is left
unchecked only where the symbols' ranges prove it in bounds for every size, else it is
checked (clamped load and ``where``), so one program is right at every size. Adaptive
windows whose sizes depend on a symbolic plane run ATen's kernel (their shape is decided
per size); a symbolic batch or channel count costs nothing.

Max pooling follows eager's CPU kernel exactly: the running maximum is replaced when a value
is greater or is NaN, so the index is the first maximum in scan order, the last NaN when
there are NaNs, and the first in-bounds position when nothing is greater than -inf. The
indices are a separate Pointwise, so they cost nothing when unused.
"""
from __future__ import annotations

import sympy
import torch

from ember.backend.ir import FloorDiv, Pointwise, Reduction
from ember.backend.lowering.registry import aten, register_lowering
from ember.backend.ops import ops
from ember.backend.sizevars import is_static, statically_known_leq

MAX_UNROLL = 64            # window elements one Pointwise body may load
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def pair(value, default=None):
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return default
    if isinstance(value, int):
        return (value, value)
    value = [int(v) for v in value]
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


class WindowAxis:
    """One pooled dim: output ``o`` reads input positions ``start(o) + k * dilation`` for
    ``k < kernel``; a position outside ``[0, size)`` (or past ``end(o)`` for adaptive
    windows) is padding. ``k`` is a Python int (unrolled) or a reduction symbol."""

    def __init__(self, size, out, kernel, stride, pad=0, dilation=1, adaptive=False):
        self.size, self.out = sympy.sympify(size), sympy.sympify(out)
        self.kernel, self.stride, self.pad, self.dilation = kernel, stride, pad, dilation
        self.adaptive = adaptive
        self._memo: dict = {}    # positions by (o, k): bodies run often, sympy Max/Min is slow
        last = (self.out - 1) * stride - pad
        if adaptive:     # windows [floor(o*size/out), ceil((o+1)*size/out)), not all equal
            counts = [self._end_int(o) - self._start_int(o) for o in range(int(self.out))]
            self.kernel = max(counts)
            self._short = min(counts)      # positions k >= this can be past the window
        else:
            self._high_from = None         # first k whose position can be >= size
            for k in range(kernel):     # (symbolic: unless the ranges prove it in bounds)
                if not statically_known_leq(last + k * dilation + 1, self.size):
                    self._high_from = k
                    break

    def _start_int(self, o):
        return o * int(self.size) // int(self.out)

    def _end_int(self, o):
        return -(-(o + 1) * int(self.size) // int(self.out))

    def start(self, o):
        if self.adaptive:
            return FloorDiv(o * self.size, self.out)
        return o * self.stride - self.pad

    def end(self, o):
        return FloorDiv((o + 1) * self.size + self.out - 1, self.out)

    def pos(self, o, k):
        key = ("pos", o, k)
        p = self._memo.get(key)
        if p is None:
            p = self._memo[key] = self.start(o) + k * self.dilation
        return p

    def need_low(self, k) -> bool:
        if self.adaptive:
            return False
        return (k * self.dilation < self.pad) if isinstance(k, int) else self.pad > 0

    def need_high(self, k) -> bool:
        if self.adaptive:
            return (k >= self._short) if isinstance(k, int) else self._short < self.kernel
        if self._high_from is None:
            return False
        return k >= self._high_from if isinstance(k, int) else True

    def load_pos(self, o, k):
        key = (o, k)
        p = self._memo.get(key)
        if p is None:
            p = self.pos(o, k)
            if self.need_low(k):
                p = sympy.Max(p, 0)
            if self.need_high(k):
                p = sympy.Min(p, self.size - 1)
            self._memo[key] = p
        return p

    def valid(self, o, k):
        """An ops bool that the position is inside the window, or None when it always is."""
        conds = []
        if self.need_low(k) or self.need_high(k):
            i = ops.index_expr(self.pos(o, k), torch.int64)
            if self.need_low(k):
                conds.append(ops.ge(i, ops.constant(0, torch.int64)))
            if self.need_high(k):
                bound = ops.index_expr(self.end(o), torch.int64) if self.adaptive else \
                    ops.constant(int(self.size), torch.int64) if self.size.is_Integer else \
                    ops.index_expr(self.size, torch.int64)
                conds.append(ops.lt(i, bound))
        out = None
        for c in conds:
            out = c if out is None else ops.logical_and(out, c)
        return out

    def first_valid(self, o):
        """The first in-bounds position of the window (eager's initial max index)."""
        s = self.start(o)
        if not self.need_low(0):
            return s
        d = self.dilation
        return s + d * FloorDiv(sympy.Max(-s, 0) + d - 1, d)

    def count(self, o, include_pad: bool):
        """Elements an average divides by: in-bounds ones, or with ``include_pad`` those in
        the padded input (a ceil_mode window past the padding counts only up to it)."""
        if self.adaptive:
            return self.end(o) - self.start(o) if self._short < self.kernel else self.kernel
        s = self.start(o)
        last = (self.out - 1) * self.stride - self.pad
        if include_pad:
            if statically_known_leq(last + self.kernel, self.size + self.pad):
                return self.kernel
            return sympy.Min(s + self.kernel, self.size + self.pad) - s
        if self.pad == 0 and self._high_from is None:
            return self.kernel
        return sympy.Min(s + self.kernel, self.size) - sympy.Max(s, 0)


def _window(ctx, x, axes, fill):
    """``values(index, kh, kw)``: the window element (``fill`` where it is padding). ``x``
    is computed once first when the windows overlap and it costs (googlenet's 3x3 max pool
    of a concatenation of batch norms + ReLUs recomputed them for every tap: 2.6 ms)."""
    reads = 1.0
    for a in axes:
        reads *= a.kernel / a.stride
    load = ctx.graph.computed_once(x, reads).make_loader()
    dtype = x.get_dtype()
    ah, aw = axes

    def value(index, kh, kw):
        oh, ow = index[-2], index[-1]
        v = load(list(index[:-2]) + [ah.load_pos(oh, kh), aw.load_pos(ow, kw)])
        vh, vw = ah.valid(oh, kh), aw.valid(ow, kw)
        ok = vh if vw is None else vw if vh is None else ops.logical_and(vh, vw)
        return v if ok is None else ops.where(ok, v, ops.constant(fill, dtype))
    return value


def _plane_ok(x, out_size):
    """A 2-D pool this module lowers: a float (batch,) channels, height, width input; an
    output none of whose sizes is a static 0."""
    return len(x.get_size()) in (3, 4) and x.get_dtype() in _FLOATS and 0 not in out_size


@register_lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1,
                             ceil_mode=False):
    out_size = ctx.output(0).size
    if not _plane_ok(x, out_size):
        return NotImplemented
    kernel = pair(kernel_size)
    stride = pair(stride, kernel)
    padding, dilation = pair(padding), pair(dilation)
    if kernel[0] * kernel[1] > MAX_UNROLL:
        return NotImplemented
    size = x.get_size()
    axes = [WindowAxis(size[d - 2], out_size[d - 2], kernel[d], stride[d], padding[d], dilation[d])
            for d in range(2)]
    dtype = x.get_dtype()
    value = _window(ctx, x, axes, float("-inf"))
    positions = [(i, j) for i in range(kernel[0]) for j in range(kernel[1])]
    width = size[-1]

    def values(index):
        acc = None
        for i, j in positions:
            v = value(index, i, j)
            # replaced when greater or NaN, as eager's scan (ops.maximum(v, acc) does that)
            acc = v if acc is None else ops.maximum(v, acc)
        return acc

    def indices(index):
        oh, ow = index[-2], index[-1]
        ah, aw = axes
        acc, best = None, None
        for i, j in positions:
            v = value(index, i, j)
            if acc is None:
                acc = v
                best = ops.index_expr(ah.first_valid(oh) * width + aw.first_valid(ow),
                                      torch.int64)
                continue
            take = ops.logical_or(ops.gt(v, acc), ops.isnan(v))
            flat = ops.index_expr(ah.pos(oh, i) * width + aw.pos(ow, j), torch.int64)
            best = ops.where(take, flat, best)
            acc = ops.maximum(v, acc)
        return best

    vals = Pointwise(x.get_device(), dtype, values, out_size)
    idxs = Pointwise(x.get_device(), torch.int64, indices, out_size)
    return vals, idxs     # each realized if read twice (GraphLowering._share)


def _average(ctx, x, axes, divide):
    """Sum of each window (padding adds nothing), then ``divide(sum, index)``."""
    dtype = x.get_dtype()
    out_size = ctx.size
    value = _window(ctx, x, axes, 0)
    kh, kw = axes[0].kernel, axes[1].kernel
    if kh * kw <= MAX_UNROLL:
        def inner(index):
            acc = ops.constant(0, dtype)       # eager's sum starts at +0
            for i in range(kh):
                for j in range(kw):
                    acc = ops.add(acc, value(index, i, j))
            return divide(acc, index)
        return Pointwise(x.get_device(), dtype, inner, out_size)
    red = Reduction(x.get_device(), dtype, lambda index, r: value(index, r[0], r[1]), out_size,
                    [kh, kw], "sum", dtype)
    load = ctx.graph.realize(red).make_loader()
    return Pointwise(x.get_device(), dtype, lambda index: divide(load(index), index), out_size)


def _as_float(expr, dtype):
    if isinstance(expr, (int, sympy.Integer)):
        return ops.constant(int(expr), dtype)
    return ops.to_dtype(ops.index_expr(expr, torch.int64), dtype)


@register_lowering(aten.avg_pool2d.default)
def _avg_pool2d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    out_size = ctx.size
    if not _plane_ok(x, out_size):
        return NotImplemented
    kernel = pair(kernel_size)
    stride = pair(stride, kernel)
    padding = pair(padding)
    size = x.get_size()
    axes = [WindowAxis(size[d - 2], out_size[d - 2], kernel[d], stride[d], padding[d])
            for d in range(2)]
    dtype = x.get_dtype()

    def divide(total, index):
        if divisor_override:
            return ops.truediv(total, ops.constant(int(divisor_override), dtype))
        ch = axes[0].count(index[-2], count_include_pad)
        cw = axes[1].count(index[-1], count_include_pad)
        return ops.truediv(total, _as_float(ch * cw, dtype))   # eager: sum / (int) count
    return _average(ctx, x, axes, divide)


@register_lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx, x, output_size):
    out_size = ctx.size
    size = x.get_size()
    if not _plane_ok(x, out_size) or not is_static(size[-1]) or not is_static(size[-2]):
        return NotImplemented       # (windows of a symbolic plane: decided per size)
    axes = []
    for d in range(2):
        n, o = int(size[d - 2]), int(out_size[d - 2])
        if n % o == 0:
            axes.append(WindowAxis(n, o, n // o, n // o))
        else:
            axes.append(WindowAxis(n, o, 1, 1, adaptive=True))
    dtype = x.get_dtype()

    def divide(total, index):       # eager: sum / kh / kw
        ch = axes[0].count(index[-2], True)
        cw = axes[1].count(index[-1], True)
        return ops.truediv(ops.truediv(total, _as_float(ch, dtype)), _as_float(cw, dtype))
    return _average(ctx, x, axes, divide)


@register_lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(ctx, grad, x, kernel_size, stride, padding, dilation,
                                      ceil_mode, indices):
    """The gradient of each input element: the sum of the output gradients whose window
    chose it (``indices``). An input row ``h`` lies in the windows of outputs
    ``ceil((h + pad - k + 1) / stride)`` to ``floor((h + pad) / stride)``, at most
    ``ceil(k / stride)`` of them per axis, each checked and added in eager's order (output
    rows outer, columns inner); dilated pools, and targets faster with ATen's scatter
    (``Target.generates_max_pool_backward``: the C++ target), run ATen's kernel."""
    size = ctx.size
    out_size = grad.get_size()
    if not ctx.graph.target.generates_max_pool_backward or not _plane_ok(grad, size) or \
            0 in out_size:
        return NotImplemented
    kernel = pair(kernel_size)
    stride = pair(stride, kernel)
    padding, dilation = pair(padding), pair(dilation)
    if dilation != (1, 1):
        return NotImplemented
    dtype = grad.get_dtype()
    load_grad, load_index = grad.make_loader(), indices.make_loader()
    width = size[-1]
    spans = [_Windows(out_size[d - 2], kernel[d], stride[d], padding[d])
             for d in range(2)]

    def body(index):
        h, w = index[-2], index[-1]
        here = ops.index_expr(h * width + w, torch.int64)
        acc = ops.constant(0, dtype)
        for oh, oh_ok in spans[0].candidates(h):
            for ow, ow_ok in spans[1].candidates(w):
                at = list(index[:-2]) + [oh, ow]
                chose = ops.eq(load_index(at), here)
                ok = ops.logical_and(oh_ok, ow_ok)
                acc = ops.where(ops.logical_and(ok, chose), ops.add(acc, load_grad(at)), acc)
        return acc
    return Pointwise(grad.get_device(), dtype, body, size)


class _Windows:
    """The pooling windows (outputs along one axis) that may hold input position ``i``."""

    def __init__(self, out, kernel: int, stride: int, pad: int):
        self.out, self.kernel, self.stride, self.pad = out, kernel, stride, pad

    def candidates(self, i):
        """``(o, in_window)`` for each output ``o`` whose window may hold ``i``: ``o`` clamped
        into range (a safe load), ``in_window`` an ops bool."""
        k, s, p = self.kernel, self.stride, self.pad
        first = FloorDiv(sympy.Max(i + p - k + s, 0), s)
        end = FloorDiv(i + p, s) + 1            # one past the last window holding i
        for j in range(-(-k // s)):
            o = first + j
            ok = ops.lt(ops.index_expr(o, torch.int64),
                        ops.index_expr(sympy.Min(end, self.out), torch.int64))
            yield sympy.Min(o, self.out - 1), ok
