"""The loop-level IR: buffers whose bodies are define-by-run functions over sympy indices.

A value during lowering is an :class:`IRNode`. ``make_loader()`` gives a function
``index -> value`` that calls the ``ops`` handler (see ``ops.py``), so consumers inline their
producers' bodies: ``(x + 1).relu()`` is one body ``relu(add(load(x, i), 1))``. Nodes:

- :class:`Pointwise` ``inner_fn(index)`` over ``ranges``; :class:`Reduction`
  ``inner_fn(index, rindex)`` over ``ranges`` x ``reduction_ranges``;
- :class:`Buffer`: memory with a :class:`Layout`. :class:`InputBuffer` (graph inputs and
  constants), :class:`ComputedBuffer` (a realized Pointwise/Reduction; a kernel writes it),
  :class:`ExternBuffer` (written by an ATen call: library kernels and fallbacks);
- views: :class:`ReinterpretView` (same storage, other size/stride/offset: views of buffers
  cost nothing) and :class:`IndexView` (index rewriting over any node: permute, expand,
  slice, select of unrealized bodies).

Sizes, strides and indices are sympy expressions; a static size is a sympy Integer.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Sequence

import sympy
import torch

from ember.backend.ops import ops
from ember.backend.sizevars import size_hint, statically_known_leq

Expr = sympy.Expr


class FloorDiv(sympy.Function):
    """Integer division of non-negative index expressions (``a // b``)."""
    nargs = (2,)

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer):
            return sympy.Integer(int(a) // int(b))
        if a == 0:
            return sympy.Integer(0)
        if isinstance(a, FloorDiv) and isinstance(b, sympy.Integer) and \
                isinstance(a.args[1], sympy.Integer):
            return FloorDiv(a.args[0], a.args[1] * b)      # (x // p) // q == x // (p * q)
        return None


class ModIndex(sympy.Function):
    """``a % b`` for non-negative index expressions."""
    nargs = (2,)

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return sympy.Integer(0)
        if isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer):
            return sympy.Integer(int(a) % int(b))
        return None


def flat_index(index: list, sizes: list) -> Expr:
    """The row-major flat index of ``index`` over dims of ``sizes`` (``split_index``'s
    inverse)."""
    flat = sympy.Integer(0)
    for var, size in zip(index, sizes):
        flat = flat * size + var
    return flat


def split_index(flat: Expr, sizes: list) -> list:
    """``flat``, a row-major index over dims of ``sizes``, as each dim's index: the first a
    quotient, the others remainders (``[x // 16, x % 16]`` for sizes ``[2, 16]``)."""
    parts = [FloorDiv(flat, product(sizes[q + 1:])) for q in range(len(sizes))]
    return [p if q == 0 else ModIndex(p, size) for q, (p, size) in enumerate(zip(parts, sizes))]


def fold_div_mod(expr: Expr) -> Expr:
    """``expr`` with each ``c * a * (x // a) + c * (x % a)`` written ``c * x``, and each
    ``c * a * ((x // a) % b) + c * (x % a)`` written ``c * (x % (a * b))``: a merged view's
    row index, divided into the body's dims and multiplied back by contiguous strides (a
    [B, T, C] body read as [B*T, C], or [B, H, W, C] as [B*H*W, C]), is the row index
    again."""
    coeffs = dict(sympy.expand(expr).as_coefficients_dict())
    folded = True
    while folded:
        folded = False
        for term, c in list(coeffs.items()):
            if not isinstance(term, ModIndex) or not isinstance(term.args[1], sympy.Integer):
                continue
            x, a = term.args
            div = FloorDiv(x, a)
            if coeffs.get(div) == c * a:
                merged = c * x
            else:
                div = next((t for t in coeffs if isinstance(t, ModIndex) and t.args[0] == div
                            and isinstance(t.args[1], sympy.Integer)
                            and coeffs[t] == c * a), None)
                if div is None:
                    continue
                merged = c * ModIndex(x, a * div.args[1])
            del coeffs[term], coeffs[div]
            for t, k in sympy.expand(merged).as_coefficients_dict().items():
                coeffs[t] = coeffs.get(t, 0) + k
            folded = True
            break
    return sympy.Add(*(c * t for t, c in coeffs.items() if c != 0))


def sym(value) -> Expr:
    """A size as a sympy expression: a ``torch.SymInt`` is its symbolic expression."""
    if isinstance(value, sympy.Expr):
        return value
    if isinstance(value, torch.SymInt):
        return value.node.expr
    return sympy.Integer(int(value))


def product(values) -> Expr:
    out = sympy.Integer(1)
    for v in values:
        out = out * v
    return out


def same_strides(size_a, stride_a, size_b, stride_b) -> bool:
    """Equal sizes, and equal strides over the dims whose size is not 1 (the strides
    indexing reads)."""
    return list(size_a) == list(size_b) and all(
        x == y for n, x, y in zip(size_a, stride_a, stride_b) if n != 1)


def contiguous_strides(size: Sequence[Expr]) -> list[Expr]:
    strides, acc = [], sympy.Integer(1)
    for s in reversed(size):
        strides.append(acc)
        acc = acc * sympy.Max(s, 1) if not isinstance(s, sympy.Integer) else acc * max(int(s), 1)
    return list(reversed(strides))


@dataclasses.dataclass
class Layout:
    device: torch.device
    dtype: torch.dtype
    size: list
    stride: list
    offset: Expr = sympy.Integer(0)

    @staticmethod
    def from_tensor(t: torch.Tensor) -> "Layout":
        return Layout(t.device, t.dtype, [sym(s) for s in t.shape], [sym(s) for s in t.stride()],
                      sym(t.storage_offset()))

    def index(self, idx: Sequence[Expr]) -> Expr:
        out = self.offset
        for i, size, stride in zip(idx, self.size, self.stride):
            if size != 1:
                out = out + i * stride
        return fold_div_mod(out) if isinstance(out, sympy.Basic) and out.has(ModIndex) else out

    def is_contiguous(self) -> bool:
        return all(st == cs for sz, st, cs in zip(self.size, self.stride,
                                                   contiguous_strides(self.size)) if sz != 1)

    def is_dense(self) -> bool:
        """Non-overlapping and dense: the strides are a permutation of contiguous ones."""
        if not self._static():
            return self._symbolic_dense()
        dims = sorted((int(st), int(sz)) for sz, st in zip(self.size, self.stride) if sz != 1)
        expected = 1
        for st, sz in dims:
            if st != expected:
                return False
            expected *= sz
        return True

    def _static(self) -> bool:
        return all(isinstance(e, (int, sympy.Integer)) for e in (*self.size, *self.stride))

    def _by_hinted_stride(self) -> list:
        dims = [(size_hint(st), size_hint(sz), i, st, sz)
                for i, (sz, st) in enumerate(zip(self.size, self.stride)) if sz != 1]
        return [(st, sz) for *_, st, sz in sorted(dims, key=lambda d: d[:3])]

    def _symbolic_dense(self) -> bool:
        """``is_dense`` where it holds at every size (the strides' order from the hints)."""
        expected = sympy.Integer(1)
        for st, sz in self._by_hinted_stride():
            if sympy.expand(st - expected) != 0:
                return False
            expected = expected * sz
        return True

    def is_non_overlapping(self) -> bool:
        """No two elements share memory (a slice's gaps allowed; no expanded dims)."""
        if not self._static():
            extent = sympy.Integer(1)
            for st, sz in self._by_hinted_stride():
                if not statically_known_leq(extent, st):
                    return False
                extent = st * (sz - 1) + extent
            return True
        dims = sorted((int(st), int(sz)) for sz, st in zip(self.size, self.stride) if sz != 1)
        extent = 1
        for st, sz in dims:
            if st < extent:
                return False
            extent = st * (sz - 1) + extent
        return True

    def storage_numel(self) -> Expr:
        """Elements of storage the layout spans (for allocation)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + 1 + sum(((s - 1) * st for s, st in zip(self.size, self.stride)),
                                     sympy.Integer(0))


class IRNode:
    def get_size(self) -> list:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def get_device(self) -> torch.device:
        raise NotImplementedError

    def make_loader(self) -> Callable[[Sequence[Expr]], Any]:
        raise NotImplementedError

    def get_numel(self) -> Expr:
        return product(self.get_size())


class _LaidOut(IRNode):
    """A node whose size, dtype and device are those of its ``layout``."""
    layout: Layout

    def get_size(self):
        return list(self.layout.size)

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device


class Buffer(_LaidOut):
    # the ATen ops whose values it holds, in program order (its kernel's name says them:
    # codegen/kernel_names.py); set by the lowering
    origins: tuple = ()

    def __init__(self, name: str, layout: Layout):
        self.name = name
        self.layout = layout

    def make_loader(self):
        name, layout = self.name, self.layout
        return lambda index: ops.load(name, layout.index(index))

    def storage_name(self) -> str:
        return self.name

    def __repr__(self):
        return f"{type(self).__name__}({self.name}, {self.layout.dtype}, {self.layout.size})"


class InputBuffer(Buffer):
    """A graph input or a constant tensor (its memory is provided, never allocated)."""


class SizeInput(InputBuffer):
    """A graph input that is a size (an int at run time): the wrapper binds it to the name
    of its symbol (``name``), which kernels and expressions read."""

    def __init__(self, name: str):
        super().__init__(name, None)


class ComputedBuffer(Buffer):
    """A realized Pointwise/Reduction. ``mutates``: the name of an input this buffer's kernel
    writes in place (``copy_`` of a new value into a graph input) instead of new memory."""

    def __init__(self, name: str, layout: Layout, data: "Loops", mutates: str | None = None):
        super().__init__(name, layout)
        self.data = data
        self.mutates = mutates
        self.reuses: str | None = None   # another buffer's memory, reused (set by scheduler)

    def storage_name(self) -> str:
        return self.mutates or self.reuses or self.name


class ExternBuffer(Buffer):
    """Memory written by an ATen call in the wrapper (``kernel(*args, **kwargs)``); args may
    hold buffers. ``outputs`` indexes into the call's result (for multi-output ops)."""

    def __init__(self, name: str, layout: Layout, kernel, args: list, kwargs: dict,
                 is_library: bool):
        super().__init__(name, layout)
        self.kernel = kernel
        self.args = args
        self.kwargs = kwargs
        self.is_library = is_library
        self.result_index: tuple | None = None   # set for outputs of multi-output calls
        self.parent: "ExternBuffer | None" = None


class ReinterpretView(_LaidOut):
    """A view of a buffer's storage with its own size/stride/offset."""

    def __init__(self, data: Buffer, layout: Layout):
        self.data = data
        self.layout = layout

    @property
    def name(self):
        return self.data.name

    def make_loader(self):
        name, layout = self.data.name, self.layout
        return lambda index: ops.load(name, layout.index(index))


class IndexView(IRNode):
    """``data`` seen through an index rewrite: ``loader(index) = data(reindex(index))``.
    ``permutation``: the dims of ``data`` this view's dims are, where it only permutes."""

    def __init__(self, data: IRNode, size: list, reindex: Callable[[list], list],
                 permutation: tuple | None = None):
        self.data = data
        self.size = size
        self.reindex = reindex
        self.permutation = permutation

    def get_size(self):
        return list(self.size)

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self):
        inner = self.data.make_loader()
        reindex = self.reindex
        return lambda index: inner(reindex(list(index)))


class Loops(IRNode):
    def __init__(self, device, dtype, inner_fn, ranges):
        self.device = device
        self.dtype = dtype
        self.inner_fn = inner_fn
        self.ranges = [sym(r) for r in ranges]

    def get_size(self):
        return list(self.ranges)

    def get_dtype(self):
        return self.dtype

    def get_device(self):
        return self.device


class Pointwise(Loops):
    def make_loader(self):
        return self.inner_fn


class Reduction(Loops):
    """``reduction_type`` over ``reduction_ranges`` of ``inner_fn(index, rindex)``; the result
    has ``ranges``. Types: sum, prod, max, min, any, all, argmax, argmin (the index of the
    first extreme element, flattened over the reduced dims)."""

    def __init__(self, device, dtype, inner_fn, ranges, reduction_ranges, reduction_type,
                 src_dtype):
        super().__init__(device, dtype, inner_fn, ranges)
        self.reduction_ranges = [sym(r) for r in reduction_ranges]
        self.reduction_type = reduction_type
        self.src_dtype = src_dtype

    def make_loader(self):
        raise RuntimeError("a Reduction must be realized before it is read")


class Scatter(Loops):
    """Writes into existing memory (``ComputedBuffer.mutates``) at computed indices: over
    ``ranges``, ``target[store_index(index)] = inner_fn(index)`` (or ``+=`` when
    ``accumulate``). Runs as its own sequential kernel, so duplicate indices resolve as in
    eager (the last write wins, or every value is added)."""

    def __init__(self, device, dtype, inner_fn, ranges, store_index, accumulate: bool):
        super().__init__(device, dtype, inner_fn, ranges)
        self.store_index = store_index
        self.accumulate = accumulate

    def make_loader(self):
        raise RuntimeError("a Scatter is read through the buffer it writes")


def index_vars(prefix: str, n: int) -> list[sympy.Symbol]:
    return [sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(n)]


_names = itertools.count()


def fresh_name(prefix: str = "buf") -> str:
    return f"{prefix}{next(_names)}"
