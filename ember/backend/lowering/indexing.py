"""Lowerings that choose what to load by index: cat, stack, constant padding, and indirect
indexing (embedding, index_select, gather, ``x[..., idx]``).

Both branches of a select are evaluated in a generated kernel, so cat and pad clamp every load
into its input's bounds and ``where`` picks the value. Indirect loads read the index from a
tensor (``ops.indirect_indexing``); the generated code checks its range (see targets/cpp/kernel.py)
and raises the exception eager's op raises (``_bounds_check``: eager's gather, scatter and
index_add raise RuntimeError, embedding, index_select, ``x[idx]`` and index_put IndexError).
"""
from __future__ import annotations

import sympy
import torch

from ember.backend.ir import ComputedBuffer, IndexView, Pointwise, Scatter
from ember.backend.lowering.registry import aten, register_lowering
from ember.backend.ops import IndexCheck, ops

# eager's embedding and index_select say this for any index out of range
_IN_SELF = IndexCheck("IndexError", "index out of range in self")


def _bounds_check(error: str, op: str, dim: int, size) -> IndexCheck:
    """Eager's "index 5 is out of bounds for dimension 0 with size 3", without the index
    (the kernel keeps only a flag) and naming the op."""
    return IndexCheck(error, f"{op}: an index is out of bounds for dimension {dim} with "
                             f"size {size}")


@register_lowering(aten.cat.default)
def _cat(ctx, tensors, dim=0):
    tensors = [t for t in tensors if not (len(t.get_size()) == 1 and t.get_size()[0] == 0)]
    if not tensors:
        return NotImplemented
    out = ctx.size
    dim %= len(out)
    dtype = ctx.dtype
    parts, offset = [], sympy.Integer(0)
    for t in tensors:
        n = t.get_size()[dim]
        parts.append((t.make_loader(), offset, n, t.get_dtype()))
        offset = offset + n

    def inner(index):
        # each element loads only from the part it lies in (masked: no read elsewhere)
        value = None
        for load, start, n, src in reversed(parts):
            idx = list(index)
            idx[dim] = index[dim] - start
            i = ops.index_expr(index[dim], torch.int64)
            inside = ops.logical_and(ops.ge(i, ops.constant(start, torch.int64)),
                                     ops.lt(i, ops.constant(start + n, torch.int64)))

            def part(load=load, idx=idx, src=src):
                v = load(idx)
                return v if src == dtype else ops.to_dtype(v, dtype)
            v = ops.masked(inside, part, 0)
            value = v if value is None else ops.where(inside, v, value)
        return value
    return Pointwise(ctx.device, dtype, inner, out)


@register_lowering(aten.stack.default)
def _stack(ctx, tensors, dim=0):
    """``cat`` of the tensors, each seen with a size-1 dim at ``dim`` (ViT's backward stacks
    its q/k/v gradients)."""
    dim %= len(ctx.size)

    def unsqueezed(t):
        size = t.get_size()
        return IndexView(t, size[:dim] + [sympy.Integer(1)] + size[dim:],
                         lambda index: index[:dim] + index[dim + 1:])
    return _cat(ctx, [unsqueezed(t) for t in tensors], dim)


@register_lowering(aten.constant_pad_nd.default)
def _constant_pad(ctx, x, pad, value=0):
    size = x.get_size()
    ndim = len(size)
    if any(p < 0 for p in pad):
        return NotImplemented
    load = x.make_loader()
    dtype = ctx.dtype
    # pad lists (left, right) pairs from the last dim backwards
    lows = {ndim - 1 - i: pad[2 * i] for i in range(len(pad) // 2)}

    def inner(index):
        idx = list(index)
        inside = None
        for d, low in lows.items():
            idx[d] = index[d] - low
            i = ops.index_expr(index[d], torch.int64)
            ok = ops.logical_and(ops.ge(i, ops.constant(low, torch.int64)),
                                 ops.lt(i, ops.constant(low + size[d], torch.int64)))
            inside = ok if inside is None else ops.logical_and(inside, ok)
        if inside is None:
            return load(idx)
        # padding reads nothing: the load is masked off there
        return ops.masked(inside, lambda: load(idx), value)
    return Pointwise(ctx.device, dtype, inner, ctx.size)


@register_lowering(aten.embedding.default)
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    load_w = weight.make_loader()
    load_i = indices.make_loader()
    rows = weight.get_size()[0]
    nidx = len(indices.get_size())

    def inner(index):
        i = ops.indirect_indexing(load_i(index[:nidx]), rows, check=_IN_SELF)
        return load_w([i, index[nidx]])
    return Pointwise(ctx.device, ctx.dtype, inner, ctx.size)


@register_lowering(aten.index_select.default)
def _index_select(ctx, x, dim, index):
    ndim = len(x.get_size())
    dim %= max(ndim, 1)
    load_x, load_i = x.make_loader(), index.make_loader()
    # a 0-d ``x`` is selected from as if it had one dim of size 1 (its one index must be 0)
    size = x.get_size()[dim] if ndim else sympy.Integer(1)
    scalar_index = len(index.get_size()) == 0

    def inner(idx):
        at = [] if scalar_index else [idx[dim] if ndim else sympy.Integer(0)]
        i = ops.indirect_indexing(load_i(at), size, check=_IN_SELF)
        full = list(idx)
        if ndim:
            full[dim] = i
        return load_x(full)
    return Pointwise(ctx.device, ctx.dtype, inner, ctx.size)


@register_lowering(aten.gather.default)
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    ndim = len(x.get_size())
    dim %= max(ndim, 1)
    load_x, load_i = x.make_loader(), index.make_loader()
    # ``x`` and ``index`` have the same rank, or one is 0-d: a 0-d ``x`` is gathered from as
    # if it had one dim of size 1; a 0-d ``index`` (with a 1-d ``x``) is one position
    size = x.get_size()[dim] if ndim else sympy.Integer(1)
    same_rank = len(index.get_size()) == ndim
    check = _bounds_check("RuntimeError", "gather", dim, size)

    def inner(idx):
        i = ops.indirect_indexing(load_i(idx), size, check=check)
        if not ndim:
            return load_x([])
        full = list(idx) if same_rank else [sympy.Integer(0)] * ndim
        full[dim] = i
        return load_x(full)
    return Pointwise(ctx.device, ctx.dtype, inner, ctx.size)


@register_lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(ctx, x, indices):
    """``x[..., i, j, ...]``: integer index tensors on adjacent dims (after leading
    ``None`` s), broadcast together; their broadcast shape takes those dims' place (a
    bilinear upsample's ``x[:, :, rows, cols]`` with ``rows`` ``[H, 1]`` and ``cols``
    ``[W]``). Index tensors apart from each other (NumPy then moves the broadcast dims to
    the front) and boolean masks run ATen's kernel."""
    given = [(d, t) for d, t in enumerate(indices) if t is not None]
    dims = [d for d, _ in given]
    if not given or dims != list(range(dims[0], dims[0] + len(dims))) or any(
            t.get_dtype() not in (torch.int64, torch.int32) for _, t in given):
        return NotImplemented
    first = dims[0]
    shapes = [list(t.get_size()) for _, t in given]
    rank = max(len(sh) for sh in shapes)
    loads = [(t.make_loader(), sh, x.get_size()[d],
              _bounds_check("IndexError", "index", d, x.get_size()[d]))
             for (d, t), sh in zip(given, shapes)]
    load_x = x.make_loader()

    def inner(idx):
        b = list(idx[first:first + rank])       # a position in the broadcast shape
        picked = []
        for load, shape, size, check in loads:
            at = [sympy.Integer(0) if s == 1 else v
                  for v, s in zip(b[rank - len(shape):], shape)]
            picked.append(ops.indirect_indexing(load(at), size, True, check=check))
        return load_x(list(idx[:first]) + picked + list(idx[first + rank:]))
    return Pointwise(ctx.device, ctx.dtype, inner, ctx.size)


def _scatter_into_copy(ctx, x, ranges, store_index, value_fn, accumulate,
                       in_float=False):
    """A copy of ``x`` (a new buffer), then a sequential kernel writing into it.
    ``in_float``: a half-precision sum accumulates in a float32 copy, rounded once after
    (eager's CPU index_add and scatter_add; index_put rounds each addition), where the
    target follows eager's CPU kernels (``Target.cpu_half_rules``)."""
    dtype = ctx.dtype
    if in_float and accumulate and dtype in (torch.float16, torch.bfloat16) and \
            ctx.graph.target.cpu_half_rules:
        dtype = torch.float32
    load_x = x.make_loader()
    out = ctx.graph.realize(Pointwise(ctx.device, dtype, (lambda i: ops.to_dtype(
        load_x(i), dtype)) if dtype != x.get_dtype() else load_x, x.get_size()))
    value = value_fn if dtype == ctx.dtype else (lambda i: ops.to_dtype(value_fn(i), dtype))
    data = Scatter(ctx.device, dtype, value, ranges, store_index, accumulate)
    buf = ComputedBuffer(ctx.graph.new_name(), out.layout, data, mutates=out.name)
    buf.origins = out.origins     # (the op being lowered, as the copy's)
    ctx.graph.buffers.append(buf)
    return out


def _in_dtype(ctx, out):
    """The scattered buffer ``out`` as the op's result (rounded, where it was summed in
    float32)."""
    if out.get_dtype() == ctx.dtype:
        return out
    load = out.make_loader()
    return Pointwise(ctx.device, ctx.dtype, lambda i: ops.to_dtype(load(i), ctx.dtype),
                     out.get_size())


@register_lowering(aten.scatter.src, aten.scatter.value, aten.scatter_add.default)
def _scatter(ctx, x, dim, index, src, reduce=None):
    if reduce is not None or len(x.get_size()) == 0:
        return NotImplemented
    accumulate = ctx.node.target is aten.scatter_add.default
    dim %= len(x.get_size())
    load_i = index.make_loader()
    load_src = src.make_loader() if hasattr(src, "make_loader") else None
    size = x.get_size()[dim]
    check = _bounds_check("RuntimeError", "scatter_add" if accumulate else "scatter", dim, size)

    def value(idx):
        if load_src is None:
            return ops.constant(src, ctx.dtype)
        v = load_src(idx)
        return v if src.get_dtype() == ctx.dtype else ops.to_dtype(v, ctx.dtype)

    holder = {}

    def store_index(idx):
        i = ops.indirect_indexing(load_i(idx), size, check=check)
        full = list(idx)
        full[dim] = i
        return holder["layout"].index(full)
    out = _scatter_into_copy(ctx, x, index.get_size(), store_index, value, accumulate,
                             in_float=True)
    holder["layout"] = out.layout
    return _in_dtype(ctx, out)


@register_lowering(aten.index_put.default)
def _index_put(ctx, x, indices, values, accumulate=False):
    """``x[idx] = values`` with one integer index tensor on the first dim."""
    if len(indices) != 1 or indices[0] is None or indices[0].get_dtype() not in (
            torch.int64, torch.int32) or len(indices[0].get_size()) != 1:
        return NotImplemented
    index = indices[0]
    load_i = index.make_loader()
    size = x.get_size()
    n = index.get_size()[0]
    ranges = [n] + list(size[1:])
    load_v = values.make_loader()
    vsize = values.get_size()
    check = _bounds_check("IndexError", "index_put", 0, size[0])
    holder = {}

    def value(idx):
        offset = len(ranges) - len(vsize)
        vi = [sympy.Integer(0) if vsize[k] == 1 else idx[k + offset] for k in range(len(vsize))]
        v = load_v(vi)
        return v if values.get_dtype() == ctx.dtype else ops.to_dtype(v, ctx.dtype)

    def store_index(idx):
        i = ops.indirect_indexing(load_i([idx[0]]), size[0], True, check=check)
        return holder["layout"].index([i] + list(idx[1:]))
    out = _scatter_into_copy(ctx, x, ranges, store_index, value, accumulate)
    holder["layout"] = out.layout
    return out


@register_lowering(aten.index_add.default)
def _index_add(ctx, x, dim, index, source, *, alpha=1):
    """``x[..., index[j], ...] += alpha * source[..., j, ...]`` (atomics on the GPU)."""
    size = x.get_size()
    if len(size) == 0 or len(source.get_size()) != len(size) or \
            len(index.get_size()) != 1:
        return NotImplemented
    dim %= len(size)
    load_i, load_src = index.make_loader(), source.make_loader()
    check = _bounds_check("RuntimeError", "index_add", dim, size[dim])
    holder = {}

    def value(idx):
        v = load_src(idx)
        v = v if source.get_dtype() == ctx.dtype else ops.to_dtype(v, ctx.dtype)
        return v if alpha == 1 else ops.mul(v, ops.constant(alpha, ctx.dtype))

    def store_index(idx):
        full = list(idx)
        full[dim] = ops.indirect_indexing(load_i([idx[dim]]), size[dim], check=check)
        return holder["layout"].index(full)
    out = _scatter_into_copy(ctx, x, source.get_size(), store_index, value, True,
                             in_float=True)
    holder["layout"] = out.layout
    return _in_dtype(ctx, out)
