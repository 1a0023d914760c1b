"""Graphs specialised on values their inputs hold: size placeholders replaced by their
ints (the per-size compiles of ``backend/dynamic.py``), and ``.item()`` reads of 0-dim
tensor inputs replaced by the values read (a module's float attribute, which torch's
frontend passes as a tensor under ``dynamic=True``; fakes have no values). The caller
checks, per call, that the values still hold."""
from __future__ import annotations

import torch
import torch.fx


def item_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the tensor placeholders the graph reads only through ``.item()``: a
    module's float attribute, which torch's frontend passes as a 0-dim tensor under
    ``dynamic=True``. Compiles specialise on its value (fakes have none), checked per
    call."""
    out = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        if node.users and all(_is_item(u) for u in node.users):
            out.append(i)
    return out


def _is_item(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "item") or (
        node.op == "call_function" and node.target is torch.Tensor.item)


def specialize_graph(gm: torch.fx.GraphModule, sizes: dict[int, int],
                     items: dict[int, object] | None = None, *,
                     keep_meta: bool = False) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose size placeholders (position -> value) are constants and no
    longer inputs, whose ``.item()`` reads of the ``items`` placeholders (position ->
    value) are constants (the placeholders stay, unread), and whose nodes carry no
    symbolic metadata (the static compile computes its own) unless ``keep_meta``."""
    graph = torch.fx.Graph()
    env: dict = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constant_of = {placeholders[i]: value for i, value in sizes.items()}
    item_of = {placeholders[i]: value for i, value in (items or {}).items()}
    for node in gm.graph.nodes:
        if node in constant_of:
            env[node] = constant_of[node]
            continue
        if _is_item(node) and node.args and node.args[0] in item_of:
            env[node] = item_of[node.args[0]]
            continue
        new = graph.node_copy(node, lambda n: env[n])
        if not keep_meta:
            for key in ("val", "example_value"):
                new.meta.pop(key, None)
        env[node] = new
    return torch.fx.GraphModule(gm, graph)
