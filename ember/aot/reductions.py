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
the generated loop adds them may differ (as it may between any two schedules).

Rewritten: ``sum.dim_IntList``, ``mean.dim``, ``var.correction``, ``amax``, ``amin``, on
tensors whose layout (the node's fake value) allows the view. Other nodes are left alone.
"""
from __future__ import annotations

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


def merged_shape(shape, strides, dims) -> tuple[list[int], list[int]] | None:
    """The shape with each run of adjacent reduced dims that are contiguous with each other
    merged into one, and the reduced dims of that shape; None when nothing merges."""
    ndim = len(shape)
    reduced = {d % ndim for d in dims}
    new_shape, new_dims, merged_any = [], [], False
    d = 0
    while d < ndim:
        size = shape[d]
        if d in reduced:
            end = d
            while (end + 1 < ndim and end + 1 in reduced
                   and (shape[end + 1] == 1 or shape[end] == 1
                        or strides[end] == shape[end + 1] * strides[end + 1])):
                end += 1
                size = size * shape[end]
            merged_any = merged_any or end > d
            new_dims.append(len(new_shape))
            new_shape.append(size)
            d = end + 1
        else:
            new_shape.append(size)
            d += 1
    return (new_shape, new_dims) if merged_any else None


def _static(values) -> bool:
    return all(isinstance(v, int) for v in values)


def merge_reduced_dims(gm: torch.fx.GraphModule) -> int:
    rewritten = 0
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
        with gm.graph.inserting_before(node):
            view = gm.graph.call_function(aten.view.default, (args[0], new_shape))
            view.meta["val"] = src.view(new_shape)
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
        gm.graph.lint()
        gm.recompile()
    return rewritten
