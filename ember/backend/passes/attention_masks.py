"""Attention masks that are constants of the graph: dropped, or turned into ``is_causal``.

Under compilation HuggingFace models build their attention mask from ``arange`` comparisons
and ``ones`` (eager skips it when it can prove it is all-True or causal, which it does not try
while tracing). Given a mask, ``scaled_dot_product_attention`` picks a kernel that reads it
(or the math kernel, which computes half precision in float32): BERT-base's attention ran
10x slower than eager's, GPT-2's 2x. A mask that depends on no input value is computed here,
once, at compile time; when it masks nothing the call loses it, and when it is exactly the
causal (lower-triangular) mask the call gets ``is_causal=True`` instead, which is what eager
runs. Shapes are static, so a value read only for its shape, dtype or device (``ones_like(x)``,
``x.size()``) counts as a constant.

With symbolic sizes (one program for every size) a mask computed at one size proves nothing
about the others. There a mask is dropped only when it is *uniform*, every element one value
at every size, by construction: made by ``ones``/``zeros``/``full``, then only viewed,
expanded, cast or combined elementwise with other uniform values or Python numbers
(HuggingFace BERT's ``1.0 - ones(b, s)[:, None, None, :].expand(b, 1, s, s)``, filled with
the dtype's min where true). Each such op is run on a one-element stand-in of its input, so
dtype promotion is eager's. Causal masks stay in symbolic programs.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx

from ember import logs

_SDPA = torch.nn.functional.scaled_dot_product_attention
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                "enable_gqa")
# functions and methods whose first argument is read only for its metadata
_META_FUNCTIONS = {torch.ones_like, torch.zeros_like, torch.full_like}
_META_METHODS = {"size", "dim", "new_ones", "new_zeros", "new_full", "new_tensor"}
_META_ATTRS = {"shape", "dtype", "device", "ndim"}


def simplify_constant_masks(gm: torch.fx.GraphModule, example_inputs: list,
                            symbolic: bool = False) -> int:
    """Rewrite the attention calls of ``gm`` whose constant mask masks nothing or is causal;
    return how many were rewritten. ``symbolic``: ``gm`` serves every size; only masks
    uniform at every size are dropped (module docstring)."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _SDPA]
    if not calls:
        return 0
    constant = _constant_nodes(gm, symbolic)
    values: dict[torch.fx.Node, object] = {}
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
        if symbolic:
            kind = _classify_uniform(_uniform_value(mask, values))
        else:
            try:
                value = _evaluate(gm, mask, example_inputs, values)
            except Exception as e:     # a constant we cannot compute here stays in the graph
                logs.log("perf_hints", "attention mask %s not evaluated at compile time "
                         "(%s: %s)", mask.name, type(e).__name__, e)
                continue
            kind = _classify(value, int(q_val.shape[-2]), int(k_val.shape[-2]))
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
        _remove_unused(gm.graph, constant)
        gm.recompile()
    return rewritten


def _bind(node: torch.fx.Node) -> dict:
    params = dict(zip(_SDPA_PARAMS, node.args))
    params.update(node.kwargs)
    return params


def _constant_nodes(gm: torch.fx.GraphModule, symbolic: bool = False) -> set[torch.fx.Node]:
    """Nodes whose values follow from the graph's shapes alone (``symbolic``: the size
    inputs, ``s0, s1, ...``, count as shapes)."""
    from ember.frontend.output_graph import is_effectful
    constant: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if symbolic and node.op == "placeholder" and isinstance(
                node.meta.get("val", node.meta.get("example_value")), (int, torch.SymInt)):
            constant.add(node)
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


# ops after which a uniform input is still uniform, at every size: views and copies, whose
# elements are the input's elements, and elementwise ops (casts included)
_SHAPE_METHODS = frozenset({"expand", "expand_as", "view", "reshape", "unsqueeze", "squeeze",
                            "contiguous", "clone", "permute", "transpose", "flatten", "detach",
                            "repeat", "broadcast_to"})
_SHAPE_FUNCTIONS = frozenset({torch.reshape, torch.unsqueeze, torch.squeeze, torch.permute,
                              torch.transpose, torch.flatten, torch.broadcast_to, torch.clone,
                              torch.detach})
_ELEMENTWISE_METHODS = frozenset({
    "to", "float", "double", "half", "bfloat16", "bool", "int", "long", "masked_fill",
    "add", "sub", "mul", "div", "neg", "eq", "ne", "lt", "le", "gt", "ge", "logical_not",
    "bitwise_not", "__rsub__", "__radd__", "__rmul__", "__rtruediv__"})
_ELEMENTWISE_FUNCTIONS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.invert,
    operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.and_,
    operator.or_, torch.add, torch.sub, torch.rsub, torch.mul, torch.div, torch.neg, torch.eq,
    torch.ne, torch.lt, torch.le, torch.gt, torch.ge, torch.where, torch.masked_fill,
    torch.logical_not, torch.logical_and, torch.logical_or, torch.bitwise_not})
_FILL_VALUES = {torch.ones: 1, torch.zeros: 0, torch.ones_like: 1, torch.zeros_like: 0,
                "new_ones": 1, "new_zeros": 0}


@dataclasses.dataclass(frozen=True)
class _Bounds:
    """An integer tensor whose every element lies in [lo, hi] at every size (hi None:
    no bound): ``arange(s)`` is [0, None], so ``arange(s) >= 0`` is True everywhere."""
    lo: int
    hi: int | None


def _uniform_value(node: torch.fx.Node, stand_ins: dict) -> torch.Tensor | _Bounds | None:
    """A one-element tensor holding every element of ``node``'s value, at every size, and
    of its dtype (or the bounds of an integer value); None where that is not shown."""
    if node in stand_ins:
        return stand_ins[node]
    result = None
    try:
        result = _uniform_of(node, stand_ins)
    except Exception:     # an op the stand-in cannot run: not shown uniform
        result = None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or (
            isinstance(result, torch.Tensor) and val.dtype != result.dtype) or (
            isinstance(result, _Bounds) and (val.dtype.is_floating_point or
                                             val.dtype in (torch.bool, torch.uint8) or
                                             val.dtype.is_complex)):
        result = None
    stand_ins[node] = result
    return result


def _uniform_of(node: torch.fx.Node, stand_ins: dict) -> torch.Tensor | None:
    val = node.meta.get("val")
    key = node.target if node.op in ("call_function", "call_method") else None
    if key is None or not isinstance(val, torch.Tensor):
        return None
    if key in _FILL_VALUES or key in (torch.full, torch.full_like, "new_full"):
        fill = _FILL_VALUES.get(key)
        if fill is None:
            fill = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value")
        if not isinstance(fill, (bool, int, float)):
            return None
        return torch.full((1,), fill, dtype=val.dtype)
    if key is torch.arange:
        start, step = _arange_start_step(node)
        return _Bounds(start, None) if isinstance(start, int) and isinstance(step, int) \
            and step > 0 else None
    if not node.args:
        return None
    if not isinstance(node.args[0], torch.fx.Node):
        pass         # ``1.0 - mask``: elementwise at most
    elif key in _SHAPE_METHODS if node.op == "call_method" else key in _SHAPE_FUNCTIONS:
        return _uniform_value(node.args[0], stand_ins)
    elif key is operator.getitem:       # slices and new axes only: they never raise
        index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if not all(i is None or i is Ellipsis or (isinstance(i, slice) and not any(
                isinstance(p, torch.fx.Node) for p in (i.start, i.stop, i.step)))
                for i in index):
            return None
        return _uniform_value(node.args[0], stand_ins)
    if key not in (_ELEMENTWISE_METHODS if node.op == "call_method" else
                   _ELEMENTWISE_FUNCTIONS):
        return None

    bounds = _bounds_op(key, node, stand_ins)
    if bounds is not NotImplemented:
        return bounds

    def stand_in(a):
        if isinstance(a, torch.fx.Node):
            u = _uniform_value(a, stand_ins)
            if u is None:
                raise LookupError(a.name)
            return u
        if isinstance(a, torch.device):
            return torch.device("cpu")
        if isinstance(a, (bool, int, float, torch.dtype, type(None))):
            return a
        raise TypeError(f"argument {a!r}")
    args = [stand_in(a) for a in node.args]
    kwargs = {k: stand_in(v) for k, v in node.kwargs.items()}
    if "device" in kwargs:
        kwargs["device"] = torch.device("cpu")
    out = getattr(args[0], key)(*args[1:], **kwargs) if node.op == "call_method" else \
        key(*args, **kwargs)
    return out if isinstance(out, torch.Tensor) and out.numel() == 1 else None


def _arange_start_step(node: torch.fx.Node) -> tuple[object, object]:
    args = list(node.args)
    if len(args) == 1:
        return node.kwargs.get("start", 0), node.kwargs.get("step", 1)
    return args[0], args[2] if len(args) > 2 else node.kwargs.get("step", 1)


_SHIFTS = {operator.add: 1, torch.add: 1, "add": 1, operator.sub: -1, torch.sub: -1, "sub": -1}
_COMPARISONS = {operator.ge: operator.ge, torch.ge: operator.ge, "ge": operator.ge,
                operator.gt: operator.gt, torch.gt: operator.gt, "gt": operator.gt,
                operator.le: operator.le, torch.le: operator.le, "le": operator.le,
                operator.lt: operator.lt, torch.lt: operator.lt, "lt": operator.lt}


def _bounds_op(key, node: torch.fx.Node, stand_ins: dict):
    """An op on bounded integers and a Python int: shifted bounds, or a comparison that
    every element decides the same way (a uniform bool); None where not shown;
    NotImplemented where no operand is bounded."""
    if len(node.args) != 2 or node.kwargs:
        return NotImplemented
    a, b = (_uniform_value(x, stand_ins) if isinstance(x, torch.fx.Node) else x
            for x in node.args)
    if not isinstance(a, _Bounds) and not isinstance(b, _Bounds):
        return NotImplemented
    if not isinstance(a, _Bounds) or not isinstance(b, int) or isinstance(b, bool):
        return None       # (``c - arange`` and bounds on both sides: not needed yet)
    if key in _SHIFTS:
        c = b * _SHIFTS[key]
        return _Bounds(a.lo + c, None if a.hi is None else a.hi + c)
    compare = _COMPARISONS.get(key)
    if compare is None:
        return None
    # decided when both ends of the range give one answer (an open end: the lower one,
    # for comparisons that stay true or false as values grow)
    ends = [compare(a.lo, b)] + ([compare(a.hi, b)] if a.hi is not None else [])
    grows_true = compare in (operator.ge, operator.gt)
    if a.hi is None and ends[0] != grows_true:
        return None       # e.g. arange(s) < 6: true below 6 only
    return torch.tensor([ends[0]]) if len(set(ends)) == 1 else None


def _classify_uniform(value: torch.Tensor | _Bounds | None) -> str | None:
    """"none" when a uniform mask keeps every position (True, or an additive 0)."""
    if not isinstance(value, torch.Tensor):
        return None
    if value.dtype is torch.bool:
        return "none" if bool(value.item()) else None
    if value.is_floating_point() and value.item() == 0:
        return "none"
    return None


def _remove_unused(graph: torch.fx.Graph, candidates: set[torch.fx.Node]) -> None:
    for node in reversed(list(graph.nodes)):
        if node in candidates and not node.users and node.op != "placeholder":
            graph.erase_node(node)

