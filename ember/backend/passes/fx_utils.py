"""Questions the graph passes ask of ATen-level FX graphs: which nodes are pure (may be
computed once, at compile time), which dead code must stay (``is_impure``, for
``eliminate_dead_code``), which nodes a graph output is a view of, and which tensors are
dense. Shared by freezing.py and constant_folding.py.

``is_impure`` is defined once, in ``ember.aot.trace`` (the ATen trace's own dead-code
elimination uses it, and the aot layer sits below the backend), and re-exported here.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ember.aot.trace import is_impure
from ember.backend.ir import Layout
from ember.fake import returns_alias

__all__ = ["dense", "is_impure", "is_pure", "is_view", "output_aliases"]

aten = torch.ops.aten


def is_pure(node: torch.fx.Node) -> bool:
    """A deterministic ATen op that writes nothing and allocates no uninitialised memory
    (or a ``getitem`` of a multi-output op): its value depends on its arguments only."""
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    return not t._schema.is_mutable and torch.Tag.nondeterministic_seeded not in t.tags \
        and t not in (aten.empty.memory_format, aten.empty_strided.default,
                      aten.empty_like.default, aten.new_empty.default,
                      aten.new_empty_strided.default)


def node_tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    """The fake tensors ``node`` computes and reads (its ``meta["val"]`` and its inputs')."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return [t for v in vals for t in (v if isinstance(v, (list, tuple)) else [v])
            if isinstance(t, torch.Tensor)]


def is_view(node: torch.fx.Node) -> bool:
    """An ATen op whose schema returns an alias of its input."""
    return isinstance(node.target, torch._ops.OpOverload) and returns_alias(node.target)


def output_aliases(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes a graph output is, or is a view of (through chains of view ops)."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    todo = list(out.all_input_nodes)
    seen: set[torch.fx.Node] = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if is_view(n) and n.args and isinstance(n.args[0], torch.fx.Node):
            todo.append(n.args[0])
    return seen


def dense(t: torch.Tensor) -> bool:
    """Elements at distinct addresses, with no gaps, in some order of the dims."""
    return t.numel() == 0 or Layout.from_tensor(t).is_dense()
