"""Reductions over adjacent dims that are contiguous in memory, reduced as one dim.

    merge_reduced_dims(gm)     # in place; returns the number of reductions rewritten

Training graphs reduce over several dims at once: batch norm's statistics and the bias and
norm gradients of its backward sum ``[0, 2, 3]`` of an ``N x C x H x W`` tensor. Lowered as
written, the reduction loop walks one linear index and splits it back into ``r0, r1, r2``
with a division and a remainder per element, and the C++ loop does not vectorise (batch
norm's backward reduction ran ~4x slower than over a ``view`` with ``H`` and ``W`` merged).
``H`` and ``W`` are adjacent, both reduced and contiguous with each other (``stride(2) ==
size(3) * stride(3)``), so the same elements are reduced when the input is first viewed as
``N x C x (H*W)`` and reduced over ``[0, 2]``: this pass rewrites
``sum(x, [0, 2, 3], keepdim)`` into ``sum(view(x, [N, C, H*W]), [0, 2])`` (then a ``view``
to the kept-dim shape). The elements and their dtype are the same; only the order in which
the generated loop adds them may differ (as it may between any two schedules). The view of
a value no kernel stored (batch norm's float32 cast of a bf16 convolution output) is read
through, its loads folding back to the merged index (lowering/views.py ``_merge_dims``).

Rewritten: ``sum.dim_IntList``, ``mean.dim``, ``var.correction``, ``amax``, ``amin``, on
tensors whose layout (the node's fake value) allows the view. Other nodes are left alone.
"""
from __future__ import annotations

import math

import torch
import torch.fx

__all__ = ["merge_reduced_dims", "merged_shape"]

aten = torch.ops.aten

# op -> (position of the dims argument, name of the keepdim keyword, position of keepdim)
_REDUCTIONS = {
    aten.sum.dim_IntList: (1, "keepdim", 2),
    aten.mean.dim: (1, "keepdim", 2),
    aten.amax.default: (1, "keepdim", 2),
    aten.amin.default: (1, "keepdim", 2),
    aten.var.correction: (1, "keepdim", None),      # keepdim is keyword-only
}


def _runs_contiguous(shape, strides, run) -> bool:
    """The dims of ``run`` (adjacent) can be viewed as one: each non-1 dim's stride is the
    next non-1 dim's stride times its size."""
    real = [d for d in run if shape[d] != 1]
    return all(strides[a] == shape[b] * strides[b] for a, b in zip(real, real[1:]))


def merge_groups(shape, strides, dims) -> list[list[int]] | None:
    """The dims grouped into the dims of the merged shape: each run of adjacent reduced dims
    that are contiguous with each other is one group; None when nothing merges."""
    ndim = len(shape)
    reduced = {d % ndim for d in dims}
    groups: list[list[int]] = []
    for d in range(ndim):
        last = groups[-1] if groups else None
        if (d in reduced and last is not None and last[-1] in reduced
                and _runs_contiguous(shape, strides, last + [d])):
            last.append(d)
        else:
            groups.append([d])
    return groups if len(groups) < ndim else None


def merged_shape(shape, strides, dims) -> tuple[list[int], list[int]] | None:
    """The shape with each run of adjacent reduced dims that are contiguous with each other
    merged into one, and the reduced dims of that shape; None when nothing merges."""
    groups = merge_groups(shape, strides, dims)
    if groups is None:
        return None
    reduced = {d % len(shape) for d in dims}
    return ([math.prod(shape[d] for d in g) for g in groups],
            [k for k, g in enumerate(groups) if g[0] in reduced])


def _static(values) -> bool:
    return all(isinstance(v, int) for v in values)


def merge_reduced_dims(gm: torch.fx.GraphModule) -> int:
    rewritten = 0
    # one view per (value, shape): batch norm's variance and mean of the same input then
    # reduce the same node, and the mean is read from the variance's Welford state
    # (lowering/reductions.py ``welford``) instead of a sum of its own in the same loop
    views: dict[tuple, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        spec = _REDUCTIONS.get(node.target) if node.op == "call_function" else None
        if spec is None:
            continue
        dims_at, keep_name, keep_at = spec
        if len(node.args) <= dims_at or not isinstance(node.args[0], torch.fx.Node):
            continue
        dims = node.args[dims_at]
        src, out = node.args[0].meta.get("val"), node.meta.get("val")
        if not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)) or not dims:
            continue
        if not (_static(src.shape) and _static(src.stride()) and _static(out.shape)):
            continue
        merged = merged_shape(list(src.shape), list(src.stride()), list(dims))
        if merged is None:
            continue
        new_shape, new_dims = merged
        args, kwargs = list(node.args), dict(node.kwargs)
        keepdim = kwargs.pop(keep_name, False)
        if keep_at is not None and len(args) > keep_at:
            keepdim = args[keep_at]
            args[keep_at] = False
        groups = merge_groups(list(src.shape), list(src.stride()), list(dims))
        with gm.graph.inserting_before(node):
            view = _sunk(gm, args[0], groups, list(src.shape), set())
            if view is None:
                view = views.get((args[0], tuple(new_shape)))
            if view is None:
                view = gm.graph.call_function(aten.view.default, (args[0], new_shape))
                view.meta["val"] = src.view(new_shape)
                views[args[0], tuple(new_shape)] = view
            args[0], args[dims_at] = view, new_dims
            if keep_at is None:
                kwargs[keep_name] = False
            else:
                kwargs.pop(keep_name, None)
            reduced = gm.graph.call_function(node.target, tuple(args), kwargs)
            result = reduced
            if keepdim:
                result = gm.graph.call_function(aten.view.default, (reduced, list(out.shape)))
        flat_shape = [s for k, s in enumerate(new_shape) if k not in set(new_dims)]
        reduced.meta["val"] = out.reshape(flat_shape) if keepdim else out
        if keepdim:
            result.meta["val"] = out
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        _erase_dead(gm)
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _pointwise(node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and torch.Tag.pointwise in target.tags and not target._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in target.tags)


def _arg_in_merged_shape(gm, arg, groups, full: list[int], created: set):
    """``arg`` of a pointwise op over ``full``-shaped values, seen in the merged shape (a view
    of it, or the op that made it rebuilt in that shape); None when its layout forbids."""
    if not isinstance(arg, torch.fx.Node):
        return arg
    val = arg.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return arg
    if val.dim() == 0:
        return arg                      # broadcasts as it is
    if val.dim() > len(full) or not _static(val.shape) or not _static(val.stride()):
        return None
    pad = len(full) - val.dim()
    shape, strides = [1] * pad + list(val.shape), [0] * pad + list(val.stride())
    new_shape = []
    for g in groups:
        if all(shape[d] == 1 for d in g):
            new_shape.append(1)
        elif all(shape[d] == full[d] for d in g) and _runs_contiguous(shape, strides, g):
            new_shape.append(math.prod(full[d] for d in g))
        else:
            return None
    if list(val.shape) == new_shape:
        return arg
    if shape == full:
        sunk = _sunk(gm, arg, groups, full, created)
        if sunk is not None:
            return sunk
    view = gm.graph.call_function(aten.view.default, (arg, new_shape))
    view.meta["val"] = val.view(new_shape)
    created.add(view)
    return view


def _sunk(gm, node, groups, full: list[int], created: set):
    """``node`` (a ``full``-shaped value) computed in the merged shape: a pointwise op whose
    only user is the reduction is rebuilt over views of its inputs, so the merged view does
    not make the backend write the value to memory first. None when ``node`` is not such an
    op or an input's layout forbids the views."""
    if not isinstance(node, torch.fx.Node) or not _pointwise(node) or len(node.users) != 1:
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or list(val.shape) != full \
            or not all(_runs_contiguous(list(val.shape), list(val.stride()), g)
                       for g in groups):
        return None
    mine: set = set()
    failed = False

    def convert(a):
        nonlocal failed
        out = _arg_in_merged_shape(gm, a, groups, full, mine)
        failed = failed or out is None
        return a if out is None else out
    args = torch.fx.node.map_aggregate(node.args, convert)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, convert)
    if failed:
        while unused := [made for made in mine if not made.users]:
            for made in unused:
                gm.graph.erase_node(made)
                mine.discard(made)
        return None
    created |= mine
    rebuilt = gm.graph.call_function(node.target, args, kwargs)
    rebuilt.meta["val"] = val.view([math.prod(full[d] for d in g) for g in groups])
    created.add(rebuilt)
    return rebuilt


def _erase_dead(gm) -> None:
    """Pointwise ops whose only user was rebuilt in the merged shape are unused now."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(gm.graph.nodes)):
            if not node.users and _pointwise(node):
                gm.graph.erase_node(node)
                changed = True
