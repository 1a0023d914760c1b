"""What the lowerings and ``GraphLowering`` weigh: the ops a library does best
(``LIBRARY_OPS``) and the cost of computing one element of a body (``body_cost``).

Design: these sit below both ``graph.py`` (which realizes a body read more than once when
recomputing it costs more than a store and a load) and the lowerings (a view that would
recompute a costly body, an ``addmm`` whose readers are generated code), so neither imports
the other for them.
"""
from __future__ import annotations

import sympy
import torch

from ember.backend.ir import IRNode, index_vars
from ember.backend.ops import use_handler

# Ops a library does best: called from the wrapper on purpose, not counted as fallbacks.
LIBRARY_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
               torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default,
               torch.ops.aten.convolution.default,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
               torch.ops.aten._scaled_dot_product_efficient_attention.default,
               torch.ops.aten._scaled_dot_product_flash_attention.default,
               torch.ops.aten._scaled_dot_product_cudnn_attention.default,
               torch.ops.aten._scaled_dot_product_attention_math.default,
               # the backward of the above (training graphs): cuDNN, cuBLAS, flash attention
               torch.ops.aten.convolution_backward.default,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
               torch.ops.aten._scaled_dot_product_efficient_attention_backward.default,
               torch.ops.aten._scaled_dot_product_flash_attention_backward.default,
               torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default}

# a call of a transcendental function costs about this many simple ops (polynomials)
_TRANSCENDENTAL_OPS = 8
_TRANSCENDENTAL = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin",
                             "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
                             "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "gelu",
                             "gelu_grad", "pow", "sigmoid"})


class BodyCost:
    """An ops handler that counts what a body does."""

    def __init__(self):
        self.ops = 0
        self._loaded = set()       # (buffer, index): ``x * x * x`` loads one value
        self.spanning = ()         # the body's index variables over more than one position
        self.indirect = 0          # loads at indices read from memory (gathers)

    @property
    def loads(self) -> int:
        """The distinct values a body loads."""
        return len(self._loaded)

    def full_load_names(self) -> list[str]:
        """The buffer of each distinct value loaded at an index that moves with every
        index variable: a fresh value per element, where a load broadcast along some dim (a
        row's mean) is read from cache by its neighbours."""
        return [name for name, index in self._loaded
                if all(v in getattr(index, "free_symbols", ()) for v in self.spanning)]

    def load_indices(self) -> list:
        """The index of each distinct value loaded (flat, in its buffer)."""
        return [index for _, index in self._loaded]

    def load(self, name, index):
        self._loaded.add((name, index))
        return 0

    def indirect_indexing(self, value, size, wrap_negative=False, check=None):
        self.indirect += 1
        return sympy.Symbol("indirect", integer=True)

    def masked(self, mask, body, other):
        return body()

    def constant(self, value, dtype):
        """A literal in the generated code: no op (layer norm's ``(x - mean) * rsqrt(var /
        n + eps)`` counted 7 with its two constants, over the C++ target's limit for its
        three readers, and was stored in its backward rather than recomputed)."""
        return 0

    def __getattr__(self, name):
        weight = _TRANSCENDENTAL_OPS if name in _TRANSCENDENTAL else 1

        def op(*args, **kwargs):
            self.ops += weight
            return 0
        return op


def body_cost(node: IRNode) -> BodyCost:
    """What one element of ``node`` costs: ops, loads, masked regions, gathers."""
    counter = BodyCost()
    size = node.get_size()
    index = index_vars("c", len(size))
    with use_handler(counter):
        node.make_loader()(index)
    counter.spanning = tuple(v for v, n in zip(index, size) if n != 1)
    return counter
