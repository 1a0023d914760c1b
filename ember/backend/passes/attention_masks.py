"""Attention masks that are constants of the graph: dropped, or turned into ``is_causal``.

Under compilation HuggingFace models build their attention mask from ``arange`` comparisons
and ``ones`` (eager skips it when it can prove it is all-True or causal, which it does not try
while tracing). Given a mask, ``scaled_dot_product_attention`` picks a kernel that reads it
(or the math kernel, which computes half precision in float32): BERT-base's attention ran
10x slower than eager's, GPT-2's 2x. A mask that depends on no input value is computed here,
once, at compile time; when it masks nothing the call loses it, and when it is exactly the
causal (lower-triangular) mask the call gets ``is_causal=True`` instead, which is what eager
runs. Shapes are static, so a value read only for its shape, dtype or device (``ones_like(x)``,
``x.size()``) counts as a constant. With symbolic sizes (``passes/symbolic_graph.py``) the
size inputs count as constants too, and a mask is judged at several sizes (``probes``).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember import logs

_SDPA = torch.nn.functional.scaled_dot_product_attention
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                "enable_gqa")
# functions and methods whose first argument is read only for its metadata
_META_FUNCTIONS = {torch.ones_like, torch.zeros_like, torch.full_like}
_META_METHODS = {"size", "dim", "new_ones", "new_zeros", "new_full", "new_tensor"}
_META_ATTRS = {"shape", "dtype", "device", "ndim"}


def simplify_constant_masks(gm: torch.fx.GraphModule, example_inputs: list,
                            sizes: set | None = None, probes: Callable | None = None) -> int:
    """Rewrite the attention calls of ``gm`` whose constant mask masks nothing or is causal;
    return how many were rewritten. A graph with symbolic sizes gives its size placeholders
    (``sizes``, constants here) and ``probes(constants)``: the ``(inputs, symbol values)``
    to judge a mask at, given the sum of the integer constants its computation reads (or
    None: not judged); a mask is rewritten when it is the same kind at each."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _SDPA]
    if not calls:
        return 0
    constant = _constant_nodes(gm, sizes or set())
    if probes is None:
        probes = lambda constants: [(example_inputs, {})]   # noqa: E731 (the static sizes)
    values: dict = {}        # probe number -> node -> value
    rewritten = 0
    for node in calls:
        params = _bind(node)
        mask = params.get("attn_mask")
        if not isinstance(mask, torch.fx.Node) or mask not in constant or \
                params.get("is_causal") or params.get("enable_gqa"):
            continue
        query, key = params.get("query"), params.get("key")
        q_val = query.meta.get("val") if isinstance(query, torch.fx.Node) else None
        k_val = key.meta.get("val") if isinstance(key, torch.fx.Node) else None
        if not isinstance(q_val, torch.Tensor) or not isinstance(k_val, torch.Tensor):
            continue
        at = probes(_constants_read(mask, constant))
        if not at:
            continue
        kinds = set()
        for i, (inputs, subst) in enumerate(at):
            try:
                value = _evaluate(gm, mask, inputs, values.setdefault(i, {}))
            except Exception as e:     # a constant we cannot compute here stays in the graph
                logs.log("perf_hints", "attention mask %s not evaluated at compile time "
                         "(%s: %s)", mask.name, type(e).__name__, e)
                kinds.add(None)
                break
            kinds.add(_classify(value, _length(q_val, subst), _length(k_val, subst)))
        kind = kinds.pop() if len(kinds) == 1 else None
        if kind is None:
            continue
        params["attn_mask"] = None
        params["is_causal"] = kind == "causal"
        node.args, node.kwargs = tuple(params.pop(p) for p in _SDPA_PARAMS[:3]), params
        logs.log("perf_hints", "attention %s: its constant mask %s; attention runs %s",
                 node.name, "is causal" if kind == "causal" else "masks nothing",
                 "with is_causal=True" if kind == "causal" else "without a mask")
        rewritten += 1
    if rewritten:
        _remove_unused(gm.graph, constant - (sizes or set()))
        gm.recompile()
    return rewritten


def _bind(node: torch.fx.Node) -> dict:
    params = dict(zip(_SDPA_PARAMS, node.args))
    params.update(node.kwargs)
    return params


def _length(val: torch.Tensor, subst: dict) -> int:
    """``val``'s second-to-last size at the symbol values ``subst``."""
    size = val.shape[-2]
    if isinstance(size, torch.SymInt):
        return int(size.node.expr.xreplace(subst))
    return int(size)


def _constants_read(mask: torch.fx.Node, constant: set) -> int:
    """The sum of the magnitudes of the integer constants the mask's computation reads."""
    total, seen, stack = 0, set(), [mask]
    while stack:
        node = stack.pop()
        if node in seen or node not in constant:
            continue
        seen.add(node)
        for a in pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(a, int) and not isinstance(a, bool):
                total += abs(a)
        stack.extend(node.all_input_nodes)
    return total


def _constant_nodes(gm: torch.fx.GraphModule, sizes: set) -> set[torch.fx.Node]:
    """Nodes whose values follow from the graph's shapes alone (and its size inputs,
    ``sizes``)."""
    from ember.frontend.output_graph import is_effectful
    constant: set[torch.fx.Node] = set(sizes)
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or is_effectful(node):
            continue
        inputs = list(node.all_input_nodes)
        meta_only = _meta_argument(node)
        if all(n in constant or n is meta_only for n in inputs):
            constant.add(node)
    # A value written in place later is not the value computed here, nor is any value that
    # may share its memory (a view's base, other views of it): every constant connected to
    # a written one is dropped.
    tainted = [n for node in gm.graph.nodes if node.op != "output" and is_effectful(node)
               for n in node.all_input_nodes if n in constant]
    while tainted:
        node = tainted.pop()
        if node in constant:
            constant.discard(node)
            tainted.extend(n for n in [*node.all_input_nodes, *node.users] if n in constant)
    return constant


def _meta_argument(node: torch.fx.Node):
    """The argument ``node`` reads only for its shape, dtype or device, if any."""
    first = node.args[0] if node.args else None
    if not isinstance(first, torch.fx.Node):
        return None
    if node.op == "call_method" and node.target in _META_METHODS:
        return first
    if node.op == "call_function":
        if node.target in _META_FUNCTIONS:
            return first
        if node.target is getattr and len(node.args) == 2 and node.args[1] in _META_ATTRS:
            return first
    return None


def _evaluate(gm: torch.fx.GraphModule, target: torch.fx.Node, example_inputs: list,
              values: dict) -> object:
    """The value of constant node ``target``, computed from real tensors (placeholders are
    read only for their metadata)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env = dict(zip(placeholders, example_inputs))
    env.update(values)
    needed: set[torch.fx.Node] = set()
    stack = [target]
    while stack:
        node = stack.pop()
        if node not in needed and node not in env:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node not in needed:
                continue
            args = torch.fx.node.map_arg(node.args, env.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
            if node.op == "call_method":
                env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
            else:
                env[node] = node.target(*args, **kwargs)
            values[node] = env[node]
    return env[target]


def _classify(mask, q_len: int, kv_len: int) -> str | None:
    """"none" when ``mask`` masks nothing, "causal" when it is SDPA's causal mask (query i
    sees keys 0..i), else None."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        return None
    if mask.dtype is torch.bool:
        keep = mask
    elif mask.is_floating_point():
        if bool((mask == 0).all()):
            return "none"
        keep = mask == 0
        if not bool((keep | (mask <= torch.finfo(mask.dtype).min)).all()):
            return None     # a bias, not a mask
    else:
        return None
    if bool(keep.all()):
        return "none"
    if tuple(mask.shape[-2:]) != (q_len, kv_len):
        return None
    causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=mask.device).tril()
    return "causal" if bool((keep == causal).all()) else None


def _remove_unused(graph: torch.fx.Graph, candidates: set[torch.fx.Node]) -> None:
    for node in reversed(list(graph.nodes)):
        if node in candidates and not node.users:
            graph.erase_node(node)

