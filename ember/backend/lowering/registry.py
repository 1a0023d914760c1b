"""The lowering table and helpers shared by the lowering modules."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from ember.backend.ir import IRNode, Pointwise, sym
from ember.backend.lowering.cost import LIBRARY_OPS
from ember.backend.ops import ops
from ember.fake import returns_alias

aten = torch.ops.aten
LOWERINGS: dict[Any, Callable] = {}


def register_lowering(*targets):
    """Register for an OpOverload, or an OpOverloadPacket (all its overloads)."""
    def deco(fn):
        for target in targets:
            if isinstance(target, torch._ops.OpOverloadPacket):
                for name in target.overloads():
                    LOWERINGS.setdefault(getattr(target, name), fn)
            else:
                LOWERINGS[target] = fn
        return fn
    return deco


class LoweringContext:
    """What a lowering may ask about the node it lowers."""

    def __init__(self, graph, node: torch.fx.Node):
        self.graph = graph
        self.node = node
        self.out = node.meta.get("val")

    @property
    def dtype(self) -> torch.dtype:
        return self.out.dtype

    @property
    def device(self) -> torch.device:
        return self.out.device

    @property
    def size(self) -> list:
        return [sym(s) for s in self.out.shape]

    def output(self, i: int) -> "LoweringContext":
        """The context of output ``i`` of a multi-output op (its dtype, device, size)."""
        ctx = LoweringContext(self.graph, self.node)
        ctx.out = self.out[i]
        return ctx


def is_ir(x) -> bool:
    return isinstance(x, IRNode)


def broadcast_loader(node_or_scalar, out_size: Sequence, dtype: torch.dtype):
    """A loader of the input, broadcast to ``out_size`` and cast to ``dtype``."""
    if not is_ir(node_or_scalar):
        value = node_or_scalar
        return lambda index: ops.constant(value, dtype)
    node = node_or_scalar
    size = node.get_size()
    inner = node.make_loader()
    offset = len(out_size) - len(size)
    src_dtype = node.get_dtype()
    zero = sympy.Integer(0)
    # per input dim: the output dim it follows, or None where it is broadcast (decided once)
    follows = [None if size[k] == 1 and out_size[k + offset] != 1 else k + offset
               for k in range(len(size))]

    def load(index):
        value = inner([zero if d is None else index[d] for d in follows])
        return value if src_dtype == dtype else ops.to_dtype(value, dtype)
    return load


def compute_dtype(args, out_dtype: torch.dtype) -> torch.dtype:
    """The dtype an elementwise op computes in: its inputs promoted as eager promotes them
    (0-d tensors and Python scalars rank below dimensioned tensors); for comparisons this
    differs from the bool output."""
    acc = None
    for a in args:
        if is_ir(a):
            probe = torch.empty(() if len(a.get_size()) == 0 else (1,), dtype=a.get_dtype())
        elif isinstance(a, (bool, int, float)):
            probe = a
        else:
            continue
        if acc is None:
            acc = probe
            continue
        dtype = torch.result_type(acc, probe)
        dims = max(getattr(acc, "dim", lambda: 0)(), getattr(probe, "dim", lambda: 0)())
        any_tensor = isinstance(acc, torch.Tensor) or isinstance(probe, torch.Tensor)
        acc = torch.empty((1,) * dims, dtype=dtype) if any_tensor else dtype
    if acc is None or not isinstance(acc, torch.Tensor):
        return out_dtype
    return acc.dtype


def make_pointwise(ctx: LoweringContext, fn: Callable, args: Sequence, *,
                   compute: torch.dtype | None = None, float_scalars: bool = False) -> Pointwise:
    """An elementwise op over broadcast inputs: loads cast to the compute dtype, ``fn`` on the
    loaded values, result cast to the output dtype. ``float_scalars``: Python scalars are
    taken in float even by a target that rounds them to a half compute dtype
    (``Target.cpu_half_rules``: eager's CPU mul and div)."""
    out_dtype = ctx.dtype
    compute = compute or compute_dtype(args, out_dtype)
    if compute in (torch.float16, torch.bfloat16) and not float_scalars and \
            ctx.graph.target.cpu_half_rules:
        args = [_rounded(a, compute) for a in args]
    size = ctx.size
    loaders = [broadcast_loader(a, size, compute) for a in args]

    def inner(index):
        value = fn(*[load(index) for load in loaders])
        return value

    result_dtype = _fn_result_dtype(fn, compute)

    def cast(index):
        value = inner(index)
        return value if result_dtype == out_dtype else ops.to_dtype(value, out_dtype)
    return Pointwise(ctx.device, out_dtype, cast, size)


def _rounded(arg, dtype: torch.dtype):
    """A Python number ``arg`` as a value of ``dtype`` (through float32, as eager converts);
    anything else as it is."""
    if isinstance(arg, bool) or not isinstance(arg, (int, float)):
        return arg
    return torch.tensor(float(arg), dtype=torch.float32).to(dtype).item()


def _fn_result_dtype(fn, compute):
    return getattr(fn, "result_dtype", compute)


def bool_result(fn):
    fn.result_dtype = torch.bool
    return fn


def _generated_reads(node: torch.fx.Node) -> int | None:
    """How many ops read ``node``'s value (through views: ops whose schema returns an
    alias), where each has a lowering that is not a library call; None where one does not,
    or where nothing reads it (a view included)."""
    reads = 0
    for user in node.users:
        if user.op != "call_function":
            return None
        if isinstance(user.target, torch._ops.OpOverload) and returns_alias(user.target):
            through = _generated_reads(user)
            if through is None:
                return None
            reads += through
        elif user.target not in LOWERINGS or user.target in LIBRARY_OPS:
            return None
        else:
            reads += 1
    return reads or None


def read_by_generated_code(node: torch.fx.Node) -> bool:
    """Every reader of ``node``'s value (through views) is an op with a lowering that is not
    a library call: a library call would store the value in the reader's shape, beside any
    other copy of it."""
    return _generated_reads(node) is not None


def read_by_generated_code_only(node: torch.fx.Node) -> bool:
    """``node``'s value (through views) has one reader, an op with a lowering that is not a
    library call (matmul.py, convolution.py: a bias added by the kernel that reads the
    product)."""
    return _generated_reads(node) == 1
