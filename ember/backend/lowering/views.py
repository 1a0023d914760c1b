"""Lowerings of view ops. A view of memory (a buffer) is a ReinterpretView whose layout comes
from running the same ATen view op on a meta tensor with the buffer's layout (so every view
op gets eager's exact sizes, strides and offset for free); a view of an unrealized body is an
IndexView that rewrites indices (reshapes that need div/mod realize the body first)."""
from __future__ import annotations

import sympy
import torch
import torch.fx

from ember.backend.ir import (Buffer, FloorDiv, IndexView, InputBuffer, Layout, ModIndex,
                              Pointwise, ReinterpretView, contiguous_strides, split_index, sym)
from ember.backend.lowering.cost import body_cost
from ember.backend.lowering.registry import aten, read_by_generated_code, register_lowering
from ember.backend.ops import ops
from ember.backend.sizevars import (evaluate_min, is_static, shape_env, size_hint,
                                    statically_known_equals, statically_known_leq)
from ember.shapes.functions import FloorDiv as SizeFloorDiv, Mod as SizeMod, _split_multiples
from ember.fake import returns_alias, storage_key


def _memory_view(x):
    """(buffer, layout) when x is memory (a buffer or a view of one), else None."""
    if isinstance(x, ReinterpretView):
        return x.data, x.layout
    if isinstance(x, Buffer):
        return x, x.layout
    return None


def _meta_view(layout: Layout, op, args, kwargs) -> Layout:
    if not all(is_static(e) for e in (*layout.size, *layout.stride, layout.offset)) or any(
            isinstance(a, sympy.Basic) and not a.is_Integer
            for a in _flat_args(args, kwargs)):
        return _symbolic_meta_view(layout, op, args, kwargs)
    numel = int(layout.storage_numel())
    base = torch.empty(max(numel, 1), dtype=layout.dtype, device="meta").as_strided(
        [int(s) for s in layout.size], [int(s) for s in layout.stride], int(layout.offset))
    out = op(base, *args, **kwargs)
    return Layout(layout.device, layout.dtype, [sym(s) for s in out.shape],
                  [sym(s) for s in out.stride()], sym(out.storage_offset()))


def to_symint(expr):
    """A size as torch takes it: an int, or a ``torch.SymInt`` of the graph's ShapeEnv
    (``sizevars.symbols``), for meta kernels that compute views with symbolic sizes."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    env = shape_env()
    if env is None:
        raise NotImplementedError(f"the symbolic size {expr} outside a symbolic compile")
    return env.wrap(expr.replace(FloorDiv, SizeFloorDiv).replace(ModIndex, SizeMod))


def _flat_args(args, kwargs):
    for a in [*args, *kwargs.values()]:
        yield from (a if isinstance(a, (list, tuple)) else [a])


def _symbolic_meta_view(layout: Layout, op, args, kwargs) -> Layout:
    """``_meta_view`` of a layout or arguments with symbolic sizes: the op runs on a meta
    tensor sized by SymInts of the graph's ShapeEnv (``to_symint``)."""
    from torch._dispatch.python import enable_python_dispatcher

    def convert(a):
        if isinstance(a, (list, tuple)):
            return type(a)(convert(x) for x in a)
        return to_symint(a) if isinstance(a, sympy.Basic) else a
    with enable_python_dispatcher():
        base = torch.empty_strided([to_symint(s) for s in layout.size],
                                   [to_symint(s) for s in layout.stride], dtype=layout.dtype,
                                   device="meta")
        if layout.offset != 0:
            base = base.as_strided(base.shape, base.stride(), to_symint(layout.offset))
        out = op(base, *convert(list(args)), **{k: convert(v) for k, v in kwargs.items()})
        return Layout(layout.device, layout.dtype, [sym(s) for s in out.shape],
                      [sym(s) for s in out.stride()], sym(out.storage_offset()))


def _view_lowering(index_view, op=None):
    """``index_view(ctx, x, *args) -> IndexView`` for bodies; memory goes through meta (with
    ``op``, by default the node's own)."""
    def lower(ctx, x, *args, **kwargs):
        mem = _memory_view(x)
        if mem is not None:
            buf, layout = mem
            try:
                return ReinterpretView(buf, _meta_view(layout, op or ctx.node.target, args,
                                                       kwargs))
            except RuntimeError:
                # ``view`` that eager's strides allow and this buffer's do not (the backend
                # laid out the value otherwise, e.g. autograd's reshape of a transposed
                # gradient): view a contiguous copy
                size = x.get_size()
                buf = ctx.graph.realize(x, Layout(x.get_device(), x.get_dtype(), size,
                                                  contiguous_strides(size)))
                return ReinterpretView(buf, _meta_view(buf.layout, op or ctx.node.target,
                                                       args, kwargs))
        return index_view(ctx, x, *args, **kwargs)
    return lower


def _permute(ctx, x, dims):
    ndim = len(x.get_size())
    dims = [d % ndim for d in dims]
    size = [x.get_size()[d] for d in dims]
    inverse = [dims.index(i) for i in range(ndim)]
    return IndexView(x, size, lambda idx: [idx[inverse[i]] for i in range(ndim)],
                     permutation=tuple(dims))


register_lowering(aten.permute.default)(_view_lowering(_permute))


def _transpose(ctx, x, d0, d1):
    ndim = len(x.get_size())
    dims = list(range(ndim))
    if ndim:
        dims[d0 % ndim], dims[d1 % ndim] = dims[d1 % ndim], dims[d0 % ndim]
    return _permute(ctx, x, dims)


register_lowering(aten.transpose.int)(_view_lowering(_transpose))
register_lowering(aten.t.default)(_view_lowering(
    lambda ctx, x: _transpose(ctx, x, 0, 1) if len(x.get_size()) == 2 else x))


def _expand(ctx, x, size, *, implicit=False):
    out = ctx.size
    in_size = x.get_size()
    if list(out) == list(in_size):     # the body itself (a transposed one stays one)
        return x
    offset = len(out) - len(in_size)
    return IndexView(x, out, lambda idx: [sympy.Integer(0) if in_size[k] == 1 and
                                          out[k + offset] != 1 else idx[k + offset]
                                          for k in range(len(in_size))])


register_lowering(aten.expand.default)(_view_lowering(_expand))


def _reshape_by_ones(ctx, x, *args):
    """A view that only adds or removes size-1 dims (unsqueeze/squeeze/view of that kind)."""
    in_size, out = x.get_size(), ctx.size
    in_real = [i for i, s in enumerate(in_size) if s != 1]
    out_real = [i for i, s in enumerate(out) if s != 1]
    if [in_size[i] for i in in_real] != [out[i] for i in out_real]:
        return None

    def reindex(idx):
        full = [sympy.Integer(0)] * len(in_size)
        for i, o in zip(in_real, out_real):
            full[i] = idx[o]
        return full
    return IndexView(x, out, reindex)


_SPLIT_MAX_LOADS, _SPLIT_MAX_OPS = 2, 4    # a matmul's product and its bias, added


def _costly_behind(ctx, cost) -> bool:
    """A body of ``cost`` that costs more than reading it back, behind a view whose readers
    may broadcast it (swin's relative-position bias, a gather viewed [49, 49, heads] and
    added to every window's scores, took 8 ms a call recomputed per window, scalar)."""
    return (cost.indirect or cost.loads > _SPLIT_MAX_LOADS or cost.ops > _SPLIT_MAX_OPS) \
        and not _read_once(ctx.node)


def _split_dims(ctx, x):
    """A view that splits dims into several (a linear's [M*N, C] result viewed as
    [M, N, C]): each input index is a sum of output indices times constants, no division.
    (Merging dims needs a division in every load: ``_merge_rows``, where the target allows.)
    A body too costly to read through a view stays stored (``_costly_behind``)."""
    ins, outs = [sympy.sympify(s) for s in x.get_size()], [sympy.sympify(s) for s in ctx.size]
    if not all(s.is_positive for s in [*ins, *outs]):     # (size symbols are >= 2)
        return None
    groups, j = [], 0
    for size in ins:     # the output dims whose product is this input dim (symbolic: equal)
        start, prod = j, sympy.Integer(1)
        while not statically_known_equals(prod, size) and j < len(outs):
            prod *= outs[j]
            j += 1
        if not statically_known_equals(prod, size):
            return None
        groups.append((start, j))
    if any(s != 1 for s in outs[j:]):
        return None
    if _costly_behind(ctx, body_cost(x)):      # (runs the body: only for views that fit)
        return None

    def reindex(idx):
        full = []
        for start, end in groups:
            acc, scale = sympy.Integer(0), 1
            for d in range(end - 1, start - 1, -1):
                acc += idx[d] * scale
                scale *= outs[d]
            full.append(acc)
        return full
    return IndexView(x, list(ctx.size), reindex)


def _merged(x, ins: list[int], outs: list[int]) -> IndexView | None:
    """``x`` (static sizes ``ins``) viewed as ``outs``, where each output dim merges a run of
    adjacent input dims: each load divides its index back into the run's dims (quotient
    and remainders); None when the view is not such a merge."""
    groups, j = [], 0      # per output dim: the input dims it covers
    for size in outs:
        start, prod = j, 1
        while j < len(ins) and (prod < size or (ins[j] == 1 and j == start)):
            prod *= ins[j]
            j += 1
        if prod != size:
            return None
        groups.append((start, j))
    if any(ins[k] != 1 for k in range(j, len(ins))):
        return None

    def reindex(idx):
        full = [sympy.Integer(0)] * len(ins)      # size-1 dims: index 0
        for o, (start, end) in enumerate(groups):
            dims = [d for d in range(start, end) if ins[d] != 1]
            for d, part in zip(dims, split_index(idx[o], [sympy.Integer(ins[d]) for d in dims])):
                full[d] = part
        return full
    return IndexView(x, [sympy.Integer(s) for s in outs], reindex)


def _static_sizes(ctx, x) -> tuple[list[int], list[int]] | None:
    ins, outs = list(x.get_size()), list(ctx.size)
    if not all(is_static(s) for s in [*ins, *outs]):
        return None
    return [int(s) for s in ins], [int(s) for s in outs]


def _merge_rows(ctx, x):
    """A view that merges runs of outer dims into one, the last dim kept (a [B, T, C] body
    viewed [B*T, C] for a matmul's gradient or a column sum), on targets that index through
    it (``Target.inlines_merged_views``): each load divides the merged row index back into
    the body's dims, a few integer ops against storing and reloading the body (layer
    norm's ``(x - mean) * rstd`` in ViT's backward). Static sizes; no gathers, and a costly
    body only where no reader broadcasts the view."""
    if not ctx.graph.target.inlines_merged_views or (sizes := _static_sizes(ctx, x)) is None:
        return None
    ins, outs = sizes
    real_in, real_out = [s for s in ins if s != 1], [s for s in outs if s != 1]
    if not real_in or not real_out or real_in[-1] != real_out[-1]:
        return None
    view = _merged(x, ins, outs)
    if view is None:
        return None
    cost = body_cost(x)
    return None if cost.indirect or _costly_behind(ctx, cost) else view


def _merge_dims(ctx, x):
    """A view that merges runs of adjacent dims (batch norm's statistics over ``[N, C, H*W]``,
    ``aot/reductions.py``), where every load of the body, divided back into its dims, folds
    to an index linear in the merged one (``ir.fold_div_mod``: the dims are contiguous with
    each other in the buffers the body reads): no division in any load, so the body is read
    through the view, on every target. Without it the view stored its body first: a float32
    copy of each bf16 convolution output before its batch norm, in every AMP training step.
    Static sizes; no gathers; a costly body only where no reader broadcasts the view; only
    generated code reads the view (a matmul would store the view apart from the body)."""
    if not read_by_generated_code(ctx.node) or (sizes := _static_sizes(ctx, x)) is None:
        return None
    view = _merged(x, *sizes)
    if view is None:
        return None
    cost = body_cost(view)
    if cost.indirect or _costly_behind(ctx, cost) or any(
            isinstance(i, sympy.Basic) and i.has(FloorDiv, ModIndex)
            for i in cost.load_indices()):
        return None
    return view


# reductions that read each element of their input once, in one pass (var and std may take
# two: WELFORD_MIN_NUMEL)
_ONE_PASS_REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim,
                        aten.mean.default, aten.amax.default, aten.amin.default,
                        aten.prod.dim_int, aten.prod.default}


def _read_once(node: torch.fx.Node) -> bool:
    """Each element of ``node``'s value is read about once: its readers, through views, are
    ops with results of its size (none broadcasts it) or one-pass reductions. DeBERTa's
    attention scores, gathered relative-position terms added and viewed [batch, heads, S,
    S], are then computed in the masked softmax's kernel instead of a pass of their own;
    batch norm's backward sums over ``[N, C, H*W]`` compute ReLU's masked gradient
    themselves (stored first, it cost a float32 pass of its own per layer in resnet50's AMP
    step: 140 us of 550 at 64x256x56x56 on an H100)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not node.users:
        return False
    for user in node.users:
        out = user.meta.get("val")
        if user.op == "call_function" and user.target in _ONE_PASS_REDUCTIONS and \
                user.args and user.args[0] is node:
            continue
        if user.op != "call_function" or not isinstance(out, torch.Tensor) or \
                out.numel() != val.numel():
            return False
        if returns_alias(user.target) and not _read_once(user):
            return False
    return True


def _view(ctx, x, *args):
    if list(ctx.size) == list(x.get_size()):     # matmul's 3-D operands are viewed so
        return x
    for cheap in (_reshape_by_ones, _split_dims, _merge_dims, _merge_rows):
        view = cheap(ctx, x)
        if view is not None:
            return view
    buf = ctx.graph.realize(x)   # contiguous body -> memory, then a free view of it
    return ReinterpretView(buf, _meta_view(buf.layout, ctx.node.target, args, {}))


for _op in (aten.view.default, aten._unsafe_view.default, aten.unsqueeze.default,
            aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.reshape.default):
    register_lowering(_op)(_view_lowering(_view))


def _select(ctx, x, dim, index):
    size = x.get_size()
    dim %= len(size)
    index = index + size[dim] if index < 0 else index
    out = size[:dim] + size[dim + 1:]
    return IndexView(x, out, lambda idx: idx[:dim] + [sym(index)] + idx[dim:])


register_lowering(aten.select.int)(_view_lowering(_select))


@register_lowering(aten.unbind.int)
def _unbind(ctx, x, dim=0):
    """One select view per index along ``dim`` (vit's ``q, k, v = qkv.unbind(0)``)."""
    size = x.get_size()
    dim %= len(size)
    if not size[dim].is_Integer:
        return NotImplemented
    select = _view_lowering(_select, aten.select.int)
    return tuple(select(ctx, x, dim, i) for i in range(int(size[dim])))


def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    size = x.get_size()
    dim %= len(size)
    if size[dim].is_Integer:
        length = int(size[dim])
        start, end, _ = slice(start, end, step).indices(length)
        start = min(max(start, 0), length)
    elif start is None or type(start) is int and start >= 0:
        # a symbolic length (``x[:, :k]``, ``x[1:]``): the output's size says where it ends
        start = evaluate_min(start or 0, size[dim])
    elif isinstance(start, sympy.Expr) and statically_known_leq(0, start) and \
            _known_leq(start, size[dim]):      # ``x[s // 2:]``: a start inside the dim
        pass
    elif type(start) is int:     # ``x[-3:]``: from the end, or from 0 if the dim is shorter
        start = size[dim] + start if statically_known_leq(-start, size[dim]) else \
            sympy.Max(size[dim] + start, 0)
    else:
        raise NotImplementedError(f"slice from {start} of a dim of symbolic size {size[dim]}")
    out = ctx.size
    return IndexView(x, out, lambda idx: idx[:dim] + [idx[dim] * step + start] + idx[dim + 1:])


register_lowering(aten.slice.Tensor)(_view_lowering(_slice))


def storage_owner(node):
    """The FX node whose eager result owns ``node``'s storage: up the chain of view ops (each
    node's first argument, while it shares the storage)."""
    def key(n):
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        if not isinstance(v, torch.Tensor):
            return None
        return storage_key(v)
    own = key(node)
    while node.op == "call_function" and node.args and own is not None \
            and key(node.args[0]) == own:
        node = node.args[0]
    return node


@register_lowering(aten.as_strided.default, aten._reshape_alias.default)
def _as_strided(ctx, x, size, stride, storage_offset=None):
    """``storage_offset`` counts from the start of the *eager* storage and the strides walk
    that storage (``strided_view``); ``_reshape_alias`` is ``as_strided`` at the input's own
    offset."""
    arg = ctx.node.args[0]
    fake = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(fake, torch.Tensor):
        return NotImplemented
    offset = fake.storage_offset() if storage_offset is None else storage_offset
    return strided_view(ctx.graph, arg, ctx.out.shape, ctx.out.stride(), offset)


def strided_view(graph, node: torch.fx.Node, size, stride, offset: int):
    """A view (``size``, ``stride``, ``offset`` in eager's storage) of the memory of the node
    that owns ``node``'s storage in eager (up the chain of views): a graph input or constant
    is that very memory (its layout here counts from its data pointer, so the offset is
    shifted by its own storage offset); any other owner is used (or realized) with eager's
    layout, when eager's storage is exactly that dense tensor. Else ``NotImplemented``."""
    owner = storage_owner(node)
    owner_fake = owner.meta["val"]
    owner_ir = graph.env.get(owner)
    if owner_ir is None:
        return NotImplemented
    mem = _memory_view(owner_ir)
    if mem is not None and isinstance(mem[0], InputBuffer):
        buf, layout = mem
        # buf's data pointer in eager
        base = sym(owner_fake.storage_offset()) - layout.offset
    else:
        want = Layout.from_tensor(owner_fake)
        meta = getattr(owner_fake, "_meta", owner_fake)
        if owner_fake.storage_offset() != 0 or not want.is_dense() or \
                not statically_known_equals(want.storage_numel() * owner_fake.element_size(),
                                            sym(meta.untyped_storage().nbytes())):
            return NotImplemented
        if mem is not None and statically_known_equals(mem[1].offset, 0) and all(
                statically_known_equals(a, b)
                for n, a, b in zip(want.size, mem[1].stride, want.stride)
                if n != 1) and not isinstance(mem[0], InputBuffer):
            buf = mem[0]
        else:
            want.device = owner_ir.get_device()
            buf = graph.realize(owner_ir, want)
        base = 0
    return ReinterpretView(buf, Layout(buf.get_device(), buf.get_dtype(),
                                       [sym(s) for s in size], [sym(s) for s in stride],
                                       sym(offset - base)))


def _piece(x, dim: int, start: int, end: int):
    """``x[..., start:end, ...]`` along ``dim``: a view of memory, or of the body."""
    mem = _memory_view(x)
    if mem is not None:
        buf, layout = mem
        return ReinterpretView(buf, _meta_view(layout, aten.slice.Tensor, (dim, start, end), {}))
    size = list(x.get_size())
    out = size[:dim] + [sym(end - start)] + size[dim + 1:]
    return IndexView(x, out, lambda idx: idx[:dim] + [idx[dim] + start] + idx[dim + 1:])


def _pieces(x, dim: int, sizes: list[int]):
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    return tuple(_piece(x, dim, a, b) for a, b in bounds)


@register_lowering(aten.split.Tensor)
def _split(ctx, x, split_size, dim=0):
    """Views of consecutive pieces (GPT-2's ``q, k, v = qkv.split(768, dim=2)``)."""
    size = x.get_size()
    dim %= len(size)
    if not size[dim].is_Integer or not isinstance(split_size, int) or split_size <= 0:
        return _pieces_as_traced(ctx, x, dim)
    length = int(size[dim])
    return _pieces(x, dim, [min(split_size, length - s) for s in range(0, length, split_size)]
                   or [0])


@register_lowering(aten.split_with_sizes.default)
def _split_with_sizes(ctx, x, split_sizes, dim=0):
    size = x.get_size()
    dim %= len(size)
    if not size[dim].is_Integer or not all(isinstance(n, int) for n in split_sizes):
        return _pieces_as_traced(ctx, x, dim)
    if sum(split_sizes) != int(size[dim]):
        return NotImplemented
    return _pieces(x, dim, list(split_sizes))


def _pieces_as_traced(ctx, x, dim: int):
    """A split of a symbolic size: the pieces the trace made (their number is fixed by
    the frontend's guards; their sizes are expressions)."""
    if not is_static(x.get_size()[dim]) and isinstance(ctx.out, (list, tuple)) and all(
            isinstance(o, torch.Tensor) for o in ctx.out):
        return _pieces(x, dim, [sym(o.shape[dim]) for o in ctx.out])
    return NotImplemented


@register_lowering(aten.roll.default)
def _roll(ctx, x, shifts, dims=()):
    """``out[i] = x[(i + back) mod size]`` along each rolled dim, ``back = -shift mod size``
    (over a symbolic size, a size expression the kernel computes)."""
    size = x.get_size()
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims or len(dims) != len(shifts) or not all(isinstance(s, int) for s in shifts):
        return NotImplemented       # a roll of the flattened tensor: eager's kernel
    back = {d % len(size): SizeMod(-s, size[d]) for d, s in zip(dims, shifts)
            if size[d] != 0}

    def reindex(idx):
        return [ModIndex(i + back[d], size[d]) if back.get(d, 0) != 0 else i
                for d, i in enumerate(idx)]
    return IndexView(x, list(size), reindex)


@register_lowering(aten.repeat.default)
def _repeat(ctx, x, repeats):
    """``out[i] = x[i mod size]`` per dim; leading new dims are broadcast."""
    size = list(x.get_size())
    lead = len(repeats) - len(size)
    if lead < 0 or not all(s.is_positive for s in size):     # (size symbols are >= 2)
        return NotImplemented
    out = [sym(r) for r in repeats[:lead]] + [s * r for s, r in zip(size, repeats[lead:])]

    def reindex(idx):
        return [i if r == 1 else ModIndex(i, s)
                for i, s, r in zip(idx[lead:], size, repeats[lead:])]
    return IndexView(x, out, reindex)


def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    size = x.get_size()
    ndim = len(size)
    dim1, dim2 = dim1 % ndim, dim2 % ndim
    row, col = max(-offset, 0), max(offset, 0)
    others = [d for d in range(ndim) if d not in (dim1, dim2)]
    out = [size[d] for d in others] + [ctx.size[-1]]    # (its length: the trace's)

    def reindex(idx):
        full = [None] * ndim
        for d, i in zip(others, idx[:-1]):
            full[d] = i
        full[dim1], full[dim2] = idx[-1] + row, idx[-1] + col
        return full
    return IndexView(x, out, reindex)


register_lowering(aten.diagonal.default)(_view_lowering(_diagonal))


@register_lowering(aten.slice_scatter.default)
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``src`` written over ``x[start:end:step]`` along ``dim``; ``src`` is read
    only inside the slice (a masked load)."""
    size = x.get_size()
    dim %= len(size)
    if not size[dim].is_Integer:
        return NotImplemented
    start, end, step = slice(start, end, step).indices(int(size[dim]))
    load_x, load_src = x.make_loader(), src.make_loader()
    dtype = ctx.dtype

    def inner(index):
        i = index[dim]
        at = ops.index_expr(i, torch.int64)
        inside = ops.logical_and(ops.ge(at, ops.constant(start, torch.int64)),
                                 ops.lt(at, ops.constant(end, torch.int64)))
        if step != 1:
            inside = ops.logical_and(inside, ops.eq(
                ops.index_expr(ModIndex(i + step - start % step, step), torch.int64),
                ops.constant(0, torch.int64)))
        src_index = index[:dim] + [FloorDiv(i - start + step, step) - 1] + index[dim + 1:]
        picked = ops.masked(inside, lambda: _cast(load_src(src_index), src, dtype),
                            _cast(load_x(index), x, dtype))
        return picked
    return Pointwise(ctx.device, dtype, inner, size)


def clone_layout(val: torch.Tensor) -> Layout:
    """The layout of eager's ``val.clone()``: ``val``'s strides where it is dense, else
    contiguous ones; at offset 0."""
    layout = Layout.from_tensor(val)
    layout.offset = sympy.Integer(0)
    if not layout.is_dense():
        layout.stride = contiguous_strides(layout.size)
    return layout


def _static_box(xsize, strides, size, stride, offset):
    """``(starts, mapping)`` of the view's box in ``x``'s layout (static sizes), or None."""
    xsize, strides = [int(n) for n in xsize], [int(st) for st in strides]
    starts, rest = [0] * len(xsize), offset
    for d in sorted((d for d in range(len(xsize)) if xsize[d] > 1), key=lambda d: -strides[d]):
        starts[d], rest = divmod(rest, strides[d])
    if rest or any(s >= n for s, n in zip(starts, xsize)):
        return None
    mapping = []      # per view dim: (dim of x, step along it), or None for one element
    for n, st in zip(size, stride):
        if n == 1:
            mapping.append(None)
            continue
        # the coarsest dim whose stride divides the view's (a finer one would step past
        # its own size: checked below either way)
        fits = [d for d in range(len(xsize)) if xsize[d] > 1 and st > 0 and
                st % strides[d] == 0]
        if not fits:
            return None
        d = max(fits, key=lambda d: strides[d])
        step = st // strides[d]
        if any(m is not None and m[0] == d for m in mapping) or \
                starts[d] + (n - 1) * step >= xsize[d]:
            return None
        mapping.append((d, step))
    return [sympy.Integer(v) for v in starts], mapping


def _symbolic_box(xsize, strides, size, stride, offset):
    """As ``_static_box`` over expressions: the offset split into whole multiples of each
    dim's stride (coarsest first, at the hints), each view dim matched to the dim of ``x``
    whose stride its own is a constant multiple of; then the box is proven inside ``x`` for
    every size (else None)."""
    size, stride = [sym(n) for n in size], [sym(st) for st in stride]
    starts, rest = [sympy.Integer(0)] * len(xsize), sym(offset)
    for d in sorted((d for d in range(len(xsize)) if xsize[d] != 1),
                    key=lambda d: -size_hint(strides[d])):
        q, rest = _split_multiples(sympy.expand(rest), strides[d])
        if rest.is_Integer and strides[d].is_Integer:
            extra, r = divmod(int(rest), int(strides[d]))
            q, rest = q + extra, sympy.Integer(r)
        starts[d] = q
    if rest != 0 or not all(statically_known_leq(0, v) for v in starts):
        return None
    mapping = []
    for n, st in zip(size, stride):
        if n == 1:
            mapping.append(None)
            continue
        steps = {d: sympy.simplify(st / strides[d]) for d in range(len(xsize))
                 if xsize[d] != 1}
        fits = [d for d, q in steps.items() if q.is_Integer and q > 0]
        if not fits:
            return None
        d = max(fits, key=lambda d: size_hint(strides[d]))
        step = int(steps[d])
        if any(m is not None and m[0] == d for m in mapping) or \
                not _known_leq(starts[d] + (n - 1) * step + 1, xsize[d]):
            return None
        mapping.append((d, step))
    # (a dim the view steps along may start at its end: then the box is empty)
    stepped = {m[0] for m in mapping if m is not None}
    if not all(_known_leq(v + 1, n) for d, (v, n) in enumerate(zip(starts, xsize))
               if d not in stepped):
        return None
    return starts, mapping


def _known_leq(a, b) -> bool:
    """``a <= b`` for every size, where ``a``'s floor divisions by positive constants (with
    positive coefficients) may be bounded by the exact quotients: ``s // 2 <= s``, which
    the ranges' interval arithmetic does not see."""
    if statically_known_leq(a, b):
        return True
    a = sympy.expand(a)
    floors = [f for f in a.atoms(SizeFloorDiv) if f.args[1].is_Integer and f.args[1] > 0]
    if not floors or any(not a.coeff(f).is_positive for f in floors):
        return False
    return statically_known_leq(a.xreplace({f: f.args[0] / f.args[1] for f in floors}), b)


def _index_value(e):
    return ops.constant(int(e), torch.int64) if e.is_Integer else \
        ops.index_expr(e, torch.int64)


@register_lowering(aten.as_strided_scatter.default)
def _as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
    """``x`` with ``src`` written where the view ``(size, stride, storage_offset)`` of its
    clone lands (a slice assignment into a view of a computed value traces to it: Swin's
    masks). The clone has eager's strides where ``x`` is dense, else contiguous ones. Done
    when the view is a box of that layout: each view dim of more than one element steps
    along its own dim of ``x`` (a multiple of its stride: a sliced step), inside it, from a
    start the offset decomposes into; its addresses are then exactly the box's."""
    layout = clone_layout(ctx.node.args[0].meta["val"])
    xsize, strides = layout.size, layout.stride
    geometry = [*xsize, *strides, *map(sym, size), *map(sym, stride), sym(storage_offset or 0)]
    found = (_static_box if all(e.is_Integer for e in geometry) else _symbolic_box)(
        xsize, strides, size, stride, storage_offset or 0)
    if found is None:
        return NotImplemented
    starts, mapping = found
    box = {m[0]: (sym(n), m[1]) for n, m in zip(size, mapping) if m is not None}
    load_x, load_src = x.make_loader(), src.make_loader()
    dtype = ctx.dtype

    def inner(index):
        inside = None
        for d, n in enumerate(xsize):
            if n == 1:
                continue
            count, step = box.get(d, (1, 1))
            at = ops.index_expr(index[d], torch.int64)
            ok = ops.logical_and(ops.ge(at, _index_value(starts[d])),
                                 ops.lt(at, _index_value(starts[d] + (count - 1) * step + 1)))
            if step != 1:
                ok = ops.logical_and(ok, ops.eq(ops.index_expr(
                    ModIndex(index[d] + step - SizeMod(starts[d], step), step), torch.int64),
                    ops.constant(0, torch.int64)))
            inside = ok if inside is None else ops.logical_and(inside, ok)
        src_index = [sympy.Integer(0) if m is None else
                     FloorDiv(index[m[0]] - starts[m[0]] + m[1], m[1]) - 1 for m in mapping]
        if inside is None:
            return _cast(load_src(src_index), src, dtype)
        return ops.masked(inside, lambda: _cast(load_src(src_index), src, dtype),
                          _cast(load_x(index), x, dtype))
    return Pointwise(ctx.device, dtype, inner, x.get_size())


@register_lowering(aten.select_scatter.default)
def _select_scatter(ctx, x, src, dim, index):
    """``x`` with ``src`` written over ``x.select(dim, index)`` (the backward of ``select``:
    a ViT's class token)."""
    size = x.get_size()
    dim %= len(size)
    if not size[dim].is_Integer:
        return NotImplemented
    index = index + int(size[dim]) if index < 0 else index
    load_x, load_src = x.make_loader(), src.make_loader()
    dtype = ctx.dtype

    def inner(at):
        here = ops.eq(ops.index_expr(at[dim], torch.int64), ops.constant(index, torch.int64))
        return ops.masked(here, lambda: _cast(load_src(at[:dim] + at[dim + 1:]), src, dtype),
                          _cast(load_x(at), x, dtype))
    return Pointwise(ctx.device, dtype, inner, size)


def _cast(value, node, dtype):
    return value if node.get_dtype() == dtype else ops.to_dtype(value, dtype)
