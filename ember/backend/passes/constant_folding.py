"""Values a graph computes from no input but needs an ATen fallback for, computed once.

torchvision's Swin Transformer builds each shifted window's attention mask in its forward:
``x.new_zeros(...)``, nine slice assignments of a count, then a ``masked_fill``. In ATen
that was ``new_zeros``, nine ``fill`` + ``as_strided_scatter`` pairs and the mask's
pointwise ops, and ``fill`` and ``as_strided_scatter`` had no lowering then: 90 ATen calls a
call of swin_t, for a value that depends on the shapes alone (swin_t on an H100: 1.48x
eager before this pass, 2.68x after; both ops have lowerings now). This pass (on the ATen
graph, before lowering) evaluates such values once, at compile time, and the graph reads
them as constants (``positions = x.new_ones(n).cumsum(0)``: ``cumsum`` has no lowering).

A node is constant when it is a pure, deterministic ATen op (``fx_utils.is_pure``) whose
tensor arguments are constant: scalar ``get_attr`` tensors the tracer lifted (the count of
``mask[h, w] = count``; not mutated, not parameters: a graph from another frontend may read
its weights through ``get_attr``, and an optimizer updates those in place), and ops that
read only the shape, dtype and device of a tensor (``new_zeros``, ``zeros_like`` and kin),
whatever that tensor holds. A constant read by a node that is not (the frontier)
is folded when a node behind it has no lowering (a fallback that would run on every call)
and its value is dense, at most ``_MAX_BYTES``, and no graph output (a caller gets a fresh
tensor each call, as in eager). Constant values whose ops all have lowerings are left to
the kernels, which compute them inline for free. Graphs with symbolic sizes are left alone.

Values on another device than the graph's are fallbacks too: DeBERTa divides its CUDA
scores by ``torch.sqrt(torch.tensor(64.0) * factor)``, a CPU scalar tensor, and each op
touching it ran eagerly (the division of a 96x512x512 tensor included: 0.2 ms a layer on an
H100, outside the softmax's kernel). Such a value is computed once and, when it is a
0-dim tensor every reader of which computes on the graph's device, kept on that device: a
0-dim operand gives the same type promotion and values wherever it lives, and the readers
lower to kernels.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ember import logs
from ember.backend.passes.fx_utils import (dense, is_impure, is_pure, node_tensors,
                                           output_aliases)

aten = torch.ops.aten

# ops whose tensor argument gives only its shape, dtype and device
_SHAPE_ONLY = {aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
               aten.zeros_like.default, aten.ones_like.default, aten.full_like.default}
_MAX_BYTES = 16 << 20


def _static(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return all(not isinstance(v, torch.Tensor) or
               all(isinstance(s, int) for s in (*v.shape, *v.stride())) for v in vals)


def _constants(graph: torch.fx.Graph, gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    mutated = {n.args[0] for n in graph.nodes
               if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable and n.args}
    aliases = output_aliases(graph)
    const: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor) and value.numel() <= 1 and \
                    not value.requires_grad and node not in mutated:
                const.add(node)
            continue
        if node.op != "call_function" or node in aliases or not is_pure(node) or \
                not _static(node):
            continue
        inputs = node.all_input_nodes
        if node.target in _SHAPE_ONLY and node.args and isinstance(node.args[0], torch.fx.Node):
            inputs = [a for a in inputs if a is not node.args[0]]
        if all(a in const for a in inputs):
            const.add(node)
    return const


def fold_constant_fallbacks(gm: torch.fx.GraphModule, device: torch.device | None = None) -> int:
    """Fold ``gm``'s constant values that need a fallback (see the module's doc) into
    ``get_attr`` constants, in place; returns how many were folded. ``device``: the one the
    graph's kernels run on (values elsewhere are fallbacks)."""
    from ember.backend.lowering import LOWERINGS
    graph = gm.graph
    const = _constants(graph, gm)
    # a scalar constant read as it is by ops on the graph's device (``x + torch.tensor(.5)``)
    moved = [n for n in graph.nodes if n in const and n.op == "get_attr" and
             _moves_to(n, getattr(gm, n.target), device, const)]
    if not moved and not any(n.op == "call_function" for n in const):
        return 0
    needs_fallback: dict[torch.fx.Node, bool] = {}
    for node in graph.nodes:
        if node in const:
            needs_fallback[node] = _is_fallback(node, LOWERINGS, device) or \
                any(needs_fallback.get(a, False) for a in node.all_input_nodes)
    frontier = [n for n in graph.nodes if n.op == "call_function" and needs_fallback.get(n)
                and any(u not in const for u in n.users)] + moved
    if not frontier:
        return 0
    fallbacks = sorted({str(n.target) for n in needs_fallback
                        if _is_fallback(n, LOWERINGS, device)})
    values: dict[torch.fx.Node, object] = {}

    def evaluate(node):
        if node in values:
            return values[node]
        if node.op == "get_attr":
            value = getattr(gm, node.target)
        else:
            def real(arg):
                if node.target in _SHAPE_ONLY and arg is node.args[0]:
                    fake = arg.meta["val"]
                    return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype,
                                               device=fake.device)
                return evaluate(arg)
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), real)
            value = node.target(*args, **kwargs)
        values[node] = value
        return value

    from ember.fake import FakeTensorMode
    fake_mode = FakeTensorMode()
    folded = 0
    with torch.no_grad(), torch.inference_mode(False):
        for node in frontier:
            value = evaluate(node)
            if not isinstance(value, torch.Tensor) or not dense(value) or \
                    value.numel() * value.element_size() > _MAX_BYTES:
                continue
            # memory of its own (a view of a larger intermediate would keep all of it)
            where = device if _moves_to(node, value, device, const) else value.device
            value = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                        device=where).copy_(value)
            name = f"_folded{folded}"
            while hasattr(gm, name):
                name += "_"
            gm.register_buffer(name, value, persistent=False)
            with graph.inserting_before(node):
                attr = graph.get_attr(name)
            attr.meta["val"] = fake_mode.from_real(value)
            node.replace_all_uses_with(attr, delete_user_cb=lambda user: user not in const)
            folded += 1
    if folded:
        graph.eliminate_dead_code(is_impure_node=is_impure)
        graph.lint()
        gm.recompile()
        why = [f"with ATen fallbacks ({', '.join(fallbacks)})"] if fallbacks else []
        if moved:
            why.append(f"{len(moved)} scalar(s) on another device moved to {device}")
        logs.log("perf_hints", "constant folding: %d value(s) computed from no input %s are "
                 "computed once, at compile time", folded, " and ".join(why))
    return folded


def _is_fallback(node: torch.fx.Node, lowerings, device: torch.device | None) -> bool:
    """An op the lowering leaves to ATen: no lowering, or (as ``GraphLowering._supported``
    says) a tensor on another device than the graph's."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    return node.target not in lowerings or (device is not None and any(
        t.device != device for t in node_tensors(node)))


def _moves_to(node: torch.fx.Node, value: torch.Tensor, device: torch.device | None,
              const: set) -> bool:
    """Whether the folded ``value`` of ``node``, a 0-dim tensor elsewhere, may live on the
    graph's ``device``: each reader outside the constants computes there."""
    if device is None or value.dim() != 0 or value.device == device:
        return False
    readers = [u for u in node.users if u not in const]
    return bool(readers) and all(u.op == "call_function" and all(
        isinstance(v, torch.Tensor) and v.device == device for v in _outputs(u))
        for u in readers)


def _outputs(node: torch.fx.Node) -> list:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (list, tuple)) else [val]
