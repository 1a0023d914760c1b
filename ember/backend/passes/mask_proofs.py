"""What an attention mask is at *every* size, shown from how the graph builds it.

A program compiled for symbolic sizes may drop a mask (or make it ``is_causal``) only if the
mask is that kind at every size the program serves; evaluating it at a few sizes is a probe,
not a proof. Here each node of the mask's computation gets an abstract value that holds at
every size, or none (nothing shown, the mask stays):

* a **uniform** value: a one-element tensor holding every element (``ones``, ``full``, and
  whatever views, expansions, casts and elementwise ops make of them, run on the one-element
  stand-in so dtype promotion is eager's);
* an **affine index** ``_Affine``: an integer tensor whose element at index ``(i0, i1, ...)``
  is ``const + sum(coeffs[d] * i_d)`` (``arange(s)``, ``arange(s)[None, :] + 3``);
* a **half-plane** ``_Pred``: a bool tensor, True where ``sum(coeffs[d] * i_d) <= bound``
  (``kv_idx <= q_idx`` and ``ones(s, s, dtype=bool).tril()`` are the causal mask).

A mask proven uniform True (or additive 0) masks nothing; a half-plane ``i_kv - i_q <= 0``
over the last two dims is SDPA's causal mask (top-left aligned, as ``is_causal`` is).
HuggingFace's masks (transformers 5 under tracing: ``arange(s) + 0 >= 0`` broadcast for
BERT; for GPT-2 ``kv <= q`` combined with a packed-sequence check through ``diff`` and
``cumsum`` of the position ids) are built from exactly these pieces. Ops outside these rules
leave the node unknown; indexing with tensors is accepted only where each index is an
``arange`` over a dim as long as the one it indexes (in bounds at every size, so eager raises
nothing the dropped mask would have raised).
"""
from __future__ import annotations

import dataclasses
import operator

import sympy
import torch
import torch.fx

# ops after which a uniform input is still uniform: views and copies, whose elements are the
# input's elements
_SHAPE_METHODS = frozenset({"expand", "expand_as", "view", "reshape", "unsqueeze", "squeeze",
                            "contiguous", "clone", "permute", "transpose", "flatten", "detach",
                            "repeat", "broadcast_to"})
_SHAPE_FUNCTIONS = frozenset({torch.reshape, torch.unsqueeze, torch.squeeze, torch.permute,
                              torch.transpose, torch.flatten, torch.broadcast_to, torch.clone,
                              torch.detach})
# elementwise ops, run on uniform stand-ins
_ELEMENTWISE_METHODS = frozenset({
    "to", "float", "double", "half", "bfloat16", "bool", "int", "long", "masked_fill",
    "add", "sub", "mul", "div", "neg", "eq", "ne", "lt", "le", "gt", "ge", "logical_not",
    "bitwise_not", "logical_and", "logical_or", "__and__", "__or__", "__rsub__", "__radd__",
    "__rmul__", "__rtruediv__"})
_ELEMENTWISE_FUNCTIONS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.invert,
    operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.and_,
    operator.or_, torch.add, torch.sub, torch.rsub, torch.mul, torch.div, torch.neg, torch.eq,
    torch.ne, torch.lt, torch.le, torch.gt, torch.ge, torch.where, torch.masked_fill,
    torch.logical_not, torch.logical_and, torch.logical_or, torch.bitwise_not})
_FILL_VALUES = {torch.ones: 1, torch.zeros: 0, torch.ones_like: 1, torch.zeros_like: 0,
                "new_ones": 1, "new_zeros": 0}

_ADD = {operator.add, torch.add, "add"}
_SUB = {operator.sub, torch.sub, "sub"}
_LE, _LT = {operator.le, torch.le, "le"}, {operator.lt, torch.lt, "lt"}
_GE, _GT = {operator.ge, torch.ge, "ge"}, {operator.gt, torch.gt, "gt"}
_AND = {operator.and_, torch.logical_and, "logical_and", "__and__"}
_OR = {operator.or_, torch.logical_or, "logical_or", "__or__"}


@dataclasses.dataclass(frozen=True)
class _Affine:
    coeffs: tuple[int, ...]
    const: int


@dataclasses.dataclass(frozen=True)
class _Pred:
    coeffs: tuple[int, ...]
    bound: int


def classify_at_every_size(mask: torch.fx.Node, memo: dict) -> str | None:
    """"none" when ``mask`` keeps every position at every size, "causal" when it is SDPA's
    causal mask at every size, else None. ``memo`` keeps the nodes' abstract values."""
    value = abstract_value(mask, memo)
    if isinstance(value, torch.Tensor):
        if value.dtype is torch.bool:
            return "none" if bool(value.item()) else None
        return "none" if value.is_floating_point() and value.item() == 0 else None
    if isinstance(value, _Pred) and len(value.coeffs) >= 2 and value.bound == 0 and \
            value.coeffs[-2:] == (-1, 1) and not any(value.coeffs[:-2]):
        return "causal"
    return None


def abstract_value(node: torch.fx.Node, memo: dict):
    """``node``'s value at every size: a uniform stand-in, an ``_Affine``, a ``_Pred``, or
    None (not shown)."""
    if node in memo:
        return memo[node]
    val = node.meta.get("val")
    result = None
    if isinstance(val, torch.Tensor):
        try:
            result = _value_of(node, val, memo)
        except Exception:     # an op the stand-in or the rules cannot run: not shown
            result = None
        result = _checked(result, val)
    memo[node] = result
    return result


def _checked(result, val: torch.Tensor):
    """``result`` if it describes a tensor like ``val``; uniform affine values become
    stand-ins, so each kind has one form."""
    if isinstance(result, torch.Tensor):
        return result if result.dtype == val.dtype and result.numel() == 1 else None
    if isinstance(result, (_Affine, _Pred)) and len(result.coeffs) != val.dim():
        return None
    if isinstance(result, _Affine):
        if val.dtype.is_floating_point or val.dtype.is_complex or val.dtype is torch.bool:
            return None
        if not any(result.coeffs):
            return torch.full((1,), result.const, dtype=val.dtype)
    if isinstance(result, _Pred):
        if val.dtype is not torch.bool:
            return None
        if not any(result.coeffs):
            return torch.tensor([0 <= result.bound])
    return result


def _value_of(node: torch.fx.Node, val: torch.Tensor, memo: dict):
    key = node.target if node.op in ("call_function", "call_method") else None
    if key is None:
        return None
    if key in _FILL_VALUES or key in (torch.full, torch.full_like, "new_full"):
        fill = _FILL_VALUES.get(key)
        if fill is None:
            fill = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value")
        return torch.full((1,), fill, dtype=val.dtype) \
            if isinstance(fill, (bool, int, float)) else None
    if key is torch.arange:
        return _arange(node)
    args = [abstract_value(a, memo) if isinstance(a, torch.fx.Node) else a
            for a in node.args]
    if not args:
        return None
    base = args[0]
    method = node.op == "call_method"
    if key is operator.getitem:
        return _getitem(node, base, memo)
    if key in ("unsqueeze", torch.unsqueeze):
        return _unsqueeze(base, args[1] if len(args) > 1 else node.kwargs.get("dim"))
    if key in ("expand", "expand_as", "broadcast_to", torch.broadcast_to):
        return _expand(base, node.args[0], val)
    if key is torch.diff:
        return _diff(node, base, memo)
    if key in ("cumsum", torch.cumsum):
        return _cumsum(base, val)
    if key in ("tril", torch.tril, "triu", torch.triu):
        return _triangle(key in ("tril", torch.tril), base, args, node, val)
    if isinstance(base, torch.Tensor) and isinstance(node.args[0], torch.fx.Node) and (
            key in (_SHAPE_METHODS if method else _SHAPE_FUNCTIONS)):
        return base          # a uniform value viewed, copied or expanded
    if key in ("to", "bool", "long", "int") and isinstance(base, (_Affine, _Pred)):
        return base          # (_checked keeps it only where the dtype allows)
    if any(isinstance(a, (_Affine, _Pred)) for a in args):
        return _index_op(key, args, node)
    if key not in (_ELEMENTWISE_METHODS if method else _ELEMENTWISE_FUNCTIONS):
        return None
    return _run_on_stand_ins(node, key, method, memo)


def _arange(node: torch.fx.Node):
    """``arange(n)`` or ``arange(start, n)``, step 1 and a literal start: an affine index."""
    args = list(node.args)
    start = node.kwargs.get("start", 0) if len(args) == 1 else args[0]
    step = args[2] if len(args) > 2 else node.kwargs.get("step", 1)
    if isinstance(start, bool) or not isinstance(start, int) or step != 1:
        return None
    return _Affine((1,), start)


def _size_expr(size):
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def _getitem(node: torch.fx.Node, base, memo: dict):
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    if any(isinstance(i, torch.fx.Node) for i in index):
        return _gather(node, base, index, memo)
    if not isinstance(base, (torch.Tensor, _Affine, _Pred)):
        return None
    for i in index:
        if i is not None and i is not Ellipsis and not (
                isinstance(i, slice) and i.step in (None, 1) and
                (i.start is None or (isinstance(i.start, int) and i.start >= 0)) and
                not isinstance(i.stop, torch.fx.Node)):
            return None
    if isinstance(base, torch.Tensor):
        return base          # slices and new axes never raise, and keep a uniform value
    if sum(i is Ellipsis for i in index) > 1:
        return None
    coeffs = list(base.coeffs)
    if Ellipsis in index:
        at = index.index(Ellipsis)
        fill = len(coeffs) - sum(1 for i in index if isinstance(i, slice))
        index = (*index[:at], *[slice(None)] * fill, *index[at + 1:])
    out, shift, d = [], 0, 0
    for i in index:
        if i is None:
            out.append(0)
        else:
            out.append(coeffs[d])
            shift += coeffs[d] * (i.start or 0)
            d += 1
    out += coeffs[d:]
    if isinstance(base, _Affine):
        return _Affine(tuple(out), base.const + shift)
    return _Pred(tuple(out), base.bound - shift)


def _gather(node: torch.fx.Node, base, index: tuple, memo: dict):
    """A uniform value indexed by tensors: uniform, where every index is in bounds at every
    size (an arange over a dim as long as the one it indexes)."""
    base_val = node.args[0].meta.get("val")
    if not isinstance(base, torch.Tensor) or not isinstance(base_val, torch.Tensor) or \
            len(index) > base_val.dim():
        return None
    for dim, i in enumerate(index):
        if isinstance(i, slice) and i == slice(None):
            continue
        if not isinstance(i, torch.fx.Node):
            return None
        value, i_val = abstract_value(i, memo), i.meta.get("val")
        if not isinstance(value, _Affine) or value.const != 0 or \
                sorted(value.coeffs) != [0] * (len(value.coeffs) - 1) + [1]:
            return None
        along = value.coeffs.index(1)
        if _size_expr(i_val.shape[along]) != _size_expr(base_val.shape[dim]):
            return None
    return base


def _unsqueeze(base, dim):
    if isinstance(base, torch.Tensor):
        return base
    if not isinstance(base, (_Affine, _Pred)) or not isinstance(dim, int):
        return None
    coeffs = list(base.coeffs)
    dim = dim if dim >= 0 else dim + len(coeffs) + 1
    coeffs.insert(dim, 0)
    return dataclasses.replace(base, coeffs=tuple(coeffs))


def _expand(base, source: torch.fx.Node, val: torch.Tensor):
    """New leading dims, and size-1 dims broadcast, have coefficient 0 (their index is 0)."""
    if isinstance(base, torch.Tensor):
        return base
    if not isinstance(base, (_Affine, _Pred)):
        return None
    src = source.meta.get("val")
    new = val.dim() - src.dim()
    coeffs = [0] * new + [0 if src.shape[d] == 1 else c for d, c in enumerate(base.coeffs)]
    return dataclasses.replace(base, coeffs=tuple(coeffs))


def _diff(node: torch.fx.Node, base, memo: dict):
    """``diff(x, dim=-1, prepend=p)`` of an affine ``x``: its coefficient along the dim
    everywhere, where ``p`` continues the progression (``x[..., :1] - coeff``)."""
    kwargs = dict(node.kwargs)
    dim, n = kwargs.pop("dim", -1), kwargs.pop("n", 1)
    prepend = kwargs.pop("prepend", None)
    if len(node.args) != 1 or kwargs or n != 1 or not isinstance(base, _Affine) or \
            not isinstance(prepend, torch.fx.Node):
        return None
    dim = dim if dim >= 0 else dim + len(base.coeffs)
    p = abstract_value(prepend, memo)
    step = base.coeffs[dim]
    if isinstance(p, torch.Tensor):
        p = _Affine((0,) * len(base.coeffs), int(p.item()))
    if not isinstance(p, _Affine) or len(p.coeffs) != len(base.coeffs):
        return None
    p_val = prepend.meta.get("val")
    others = [d for d in range(len(base.coeffs)) if d != dim]
    if p_val.shape[dim] != 1 or any(base.coeffs[d] != p.coeffs[d] for d in others) or \
            base.const - p.const != step:
        return None
    return _Affine((0,) * len(base.coeffs), step)


def _cumsum(base, val: torch.Tensor):
    """Running sums of zeros are zeros."""
    if isinstance(base, torch.Tensor) and base.item() == 0:
        return torch.zeros(1, dtype=val.dtype)
    return None


def _triangle(lower: bool, base, args: list, node: torch.fx.Node, val: torch.Tensor):
    """``tril``/``triu`` of a uniform True: a half-plane over the last two dims (kept where
    ``j - i <= diagonal``, or ``>=`` for ``triu``)."""
    diagonal = args[1] if len(args) > 1 else node.kwargs.get("diagonal", 0)
    if not isinstance(base, torch.Tensor) or base.dtype is not torch.bool or \
            not bool(base.item()) or isinstance(diagonal, bool) or \
            not isinstance(diagonal, int) or val.dim() < 2:
        return None
    lead = (0,) * (val.dim() - 2)
    if lower:
        return _Pred((*lead, -1, 1), diagonal)
    return _Pred((*lead, 1, -1), -diagonal)


def _as_affine(value, ndim: int):
    if isinstance(value, _Affine):
        return value
    if isinstance(value, torch.Tensor) and not value.is_floating_point() and \
            value.dtype is not torch.bool:
        return _Affine((0,) * ndim, int(value.item()))
    if isinstance(value, int) and not isinstance(value, bool):
        return _Affine((0,) * ndim, value)
    return None


def _aligned(node: torch.fx.Node, i: int, value, ndim: int):
    """``value`` (argument ``i`` of ``node``) with its coefficients broadcast to ``ndim``
    dims: leading dims added, size-1 dims at 0."""
    if not isinstance(value, (_Affine, _Pred)):
        return value
    arg = node.args[i]
    shape = arg.meta["val"].shape
    coeffs = [0] * (ndim - len(value.coeffs)) + [
        0 if shape[d] == 1 else c for d, c in enumerate(value.coeffs)]
    return dataclasses.replace(value, coeffs=tuple(coeffs))


def _index_op(key, args: list, node: torch.fx.Node):
    """Sums and comparisons of affine indices; ands and ors of half-planes with uniform
    bools."""
    if len(args) != 2 or node.kwargs:
        return None
    ndim = node.meta["val"].dim()
    a, b = (_aligned(node, i, v, ndim) for i, v in enumerate(args))
    if key in _AND or key in _OR:
        keep = key in _AND
        for p, other in ((a, b), (b, a)):
            if isinstance(p, _Pred) and isinstance(other, torch.Tensor) and \
                    other.dtype is torch.bool:
                return p if bool(other.item()) == keep else other
        return a if isinstance(a, _Pred) and a == b else None
    x, y = _as_affine(a, ndim), _as_affine(b, ndim)
    if x is None or y is None:
        return None
    if key in _ADD or key in _SUB:
        sign = 1 if key in _ADD else -1
        return _Affine(tuple(p + sign * q for p, q in zip(x.coeffs, y.coeffs)),
                       x.const + sign * y.const)
    diff = _Affine(tuple(p - q for p, q in zip(x.coeffs, y.coeffs)), x.const - y.const)
    if key in _LE or key in _LT:          # x - y <= 0 (or <= -1)
        coeffs, bound = diff.coeffs, -diff.const - (1 if key in _LT else 0)
    elif key in _GE or key in _GT:        # y - x <= 0 (or <= -1)
        coeffs, bound = tuple(-c for c in diff.coeffs), diff.const - (1 if key in _GT else 0)
    else:
        return None
    # indices are >= 0: with every coefficient >= 0 the sum's least value is 0 (all at the
    # origin), with every one <= 0 its largest is 0
    if all(c >= 0 for c in coeffs) and 0 > bound:
        return torch.tensor([False])
    if all(c <= 0 for c in coeffs) and 0 <= bound:
        return torch.tensor([True])
    return _Pred(coeffs, bound)


def _run_on_stand_ins(node: torch.fx.Node, key, method: bool, memo: dict):
    def stand_in(a):
        if isinstance(a, torch.fx.Node):
            u = abstract_value(a, memo)
            if not isinstance(u, torch.Tensor):
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
    out = getattr(args[0], key)(*args[1:], **kwargs) if method else key(*args, **kwargs)
    return out if isinstance(out, torch.Tensor) and out.numel() == 1 else None
