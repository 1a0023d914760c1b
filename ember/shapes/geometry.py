"""Symbolic geometry of an input tensor: sizes, strides and storage offset as expressions.

    sizes, strides, offset, extent = symbolic_geometry(env, t.shape, t.stride(),
                                                       t.storage_offset(), {0}, "L['x']")

Decisions
---------
* **Sources.** Dim ``d``'s size is read from ``TensorProperty(source, "size", d)`` (printed
  ``L['x'].size(0)``); a stride or the storage offset that gets a symbol of its own reads from
  ``.stride(d)`` / ``.storage_offset()``. The env sees these as ordinary sources.
* **Sizes.** Dims in ``dynamic_dims`` get a symbol from the env (duck sizing and 0/1
  specialisation as the env does); the others are static, with the env's "specialized"
  guard, so the env's guards alone say which inputs the geometry is valid for.
* **Strides are inferred where the tensor is dense in its stride order** (contiguous,
  channels-last, any permutation of them): walking the dims from the smallest stride, a
  stride equal to the product of the sizes walked so far *is* that product, symbolically.
  A stride that is not (a slice, a strided view, an expanded dim with stride 0) gets its own
  symbol through the env, as does a non-zero storage offset: the compiled program then
  reads them from the input. 0 and 1 are specialised, but these symbols are not duck-sized
  (a stride equal to some size is most often a coincidence of the example).
* **Extent.** The number of elements a storage must hold for the geometry: ``offset +
  sum((size - 1) * stride) + 1`` (0 for an empty tensor): the storage size of a fake of a
  tensor that fills its storage (``ember.fake`` gives views a storage-size symbol instead).
"""
from __future__ import annotations

import dataclasses
from typing import Hashable, Iterable, Sequence

import sympy


@dataclasses.dataclass(frozen=True)
class TensorProperty:
    """Where a size, stride or storage offset of an input tensor is read from."""
    tensor: Hashable
    prop: str                  # "size", "stride", "storage_offset" or "storage_nbytes"
    dim: int | None = None

    def __str__(self) -> str:
        if self.prop == "storage_offset":
            return f"{self.tensor}.storage_offset()"
        if self.prop == "storage_nbytes":
            return f"{self.tensor}.untyped_storage().nbytes()"
        return f"{self.tensor}.{self.prop}({self.dim})"


def symbolic_geometry(env, sizes: Sequence[int], strides: Sequence[int], offset: int,
                      dynamic_dims: Iterable[int], source: Hashable, bounds=None):
    """(sizes, strides, storage offset, extent in elements) of a tensor with this concrete
    geometry whose ``dynamic_dims`` are symbolic, as sympy expressions over ``env``'s
    symbols (see the module docstring). ``bounds``: dim -> (min, max) or (min, max, duck)
    of a dynamic dim's size (min/max may be None; ``duck=False``: a symbol of its own, never
    shared with an equal size), as ``ShapeEnv.create_symbol`` takes them."""
    bounds = bounds or {}
    ndim = len(sizes)
    dynamic = set()
    for d in dynamic_dims:
        if not -ndim <= d < ndim:
            raise IndexError(f"dynamic dim {d} out of range for a tensor of {ndim} dims")
        dynamic.add(d % ndim)
    sym_sizes = []
    for d, n in enumerate(sizes):
        lo, hi, *duck = bounds.get(d, (None, None)) if d in dynamic else (None, None)
        sym_sizes.append(env.create_symbol(n, TensorProperty(source, "size", d),
                                           dynamic=d in dynamic, min=lo, max=hi,
                                           duck=duck[0] if duck else True))
    # smallest stride first; among equal strides the later dim first (contiguous order)
    order = sorted(range(ndim), key=lambda d: (strides[d], -d))
    sym_strides: list = [None] * ndim
    expected, expected_expr = 1, sympy.Integer(1)
    for d in order:
        if strides[d] == expected and sizes[d] != 0:
            sym_strides[d] = expected_expr
            expected, expected_expr = expected * sizes[d], expected_expr * sym_sizes[d]
        else:
            sym_strides[d] = env.create_symbol(strides[d], TensorProperty(source, "stride", d),
                                               duck=False)
    sym_offset = (sympy.Integer(0) if offset == 0 else
                  env.create_symbol(offset, TensorProperty(source, "storage_offset"),
                                   duck=False))
    if any(n == 0 for n in sizes):
        extent = sympy.Integer(0)
    else:
        extent = sym_offset + 1 + sum(((n - 1) * s for n, s in zip(sym_sizes, sym_strides)),
                                      sympy.Integer(0))
    return sym_sizes, sym_strides, sym_offset, sympy.expand(extent)


__all__ = ["TensorProperty", "symbolic_geometry"]
