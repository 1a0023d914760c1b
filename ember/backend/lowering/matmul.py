"""Lowerings of ``mm`` and ``addmm``: padded columns for aligned rows, and the CPU bias.

**Unaligned result rows.** cuBLAS runs a bfloat16 ``[8192, 768] x [768, 50257]`` product
(GPT-2's LM head) at 92 TFLOP/s, and at 614 with N padded to 50264 (H100; 6.9 against
1.0 ms; BERT's 30522 columns 1.7 against 0.63, Whisper's 51865 2.8 against 0.42): a row of
50257 elements is not 16-byte aligned, and its fast kernels need that. Where
``config.matmul_padding`` says so, the weight is copied into one padded with zero columns
(a kernel Ember generates; 77 MB for GPT-2), cuBLAS writes the aligned ``[M, N8]`` product,
and the result is its first N columns, an unrealized body: the kernel that reads it (a
softmax, a loss, the copy into the output's own contiguous layout) reads the padded rows.
The cost is that transient padded product, as large as the result (torch.compile instead
returns the padded buffer's slice, with other strides than eager's).

**The CPU bias.** ATen's CPU ``addmm(bias, a, b)`` first copies the broadcast bias into its
result and then lets the GEMM add ``a @ b`` to it: one more pass over the result, which is
as large as the activations (convnext_tiny: 37 of them, 4.7 ms of copies in a 52 ms call).
When every reader of the result is code Ember generates (GELU, a residual add, a layer norm:
through views, each value read once), the lowering runs ``mm`` instead and returns
``mm + bias`` as an unrealized body, so the bias add costs nothing in the kernel that reads
the product anyway. Otherwise (a reader is a library call or a graph output, or another
device: cuBLAS adds the bias in its epilogue) ``addmm`` runs as it is.

Where each applies is the target's answer (``Target.pads_matmuls``, ``adds_addmm_bias``).
"""
from __future__ import annotations

import torch
import torch.fx

from ember import config, logs
from ember.backend.ir import Layout, Pointwise, sym
from ember.backend.lowering.registry import (aten, broadcast_loader, is_ir,
                                             read_by_generated_code_only, register_lowering)
from ember.backend.ops import ops


def _padded_columns(ctx, a, b) -> int | None:
    """The column count ``a @ b`` is computed with: N rounded up to 16 bytes of the result's
    dtype, where ``config.matmul_padding`` pads this product; else None."""
    mode = config.matmul_padding
    if mode == "off" or not (is_ir(a) and is_ir(b)) or len(b.get_size()) != 2:
        return None
    m, n = ctx.out.shape
    multiple = max(1, 16 // ctx.dtype.itemsize)
    if not isinstance(n, int) or n % multiple == 0:
        return None
    small = isinstance(m, int) and m * n < 1 << 20     # a symbolic M counts as large
    if mode == "auto" and (not ctx.graph.target.pads_matmuls(ctx.dtype) or small):
        return None
    return -(-n // multiple) * multiple


def _padded_product(ctx, a, b, b_val: torch.Tensor, columns: int):
    """A loader of ``a @ b``, computed as ``a @ b_padded`` (``columns`` columns, the extra
    ones zero) and read back through its first N columns."""
    k, n = (int(s) for s in b_val.shape)
    load_b = b.make_loader()

    def padded_b(index):
        inside = ops.lt(ops.index_expr(index[1], torch.int64), ops.constant(n, torch.int64))
        return ops.masked(inside, lambda: load_b(index), 0)
    # the weight's own order (a transposed Linear weight is column-major), so the copy reads
    # and writes along the same rows
    strides = [1, k] if b_val.stride()[0] == 1 and k > 1 else [columns, 1]
    weight = ctx.graph.realize(
        Pointwise(ctx.device, b.get_dtype(), padded_b, [sym(k), sym(columns)]),
        Layout(ctx.device, b.get_dtype(), [sym(k), sym(columns)], [sym(s) for s in strides]))
    m = ctx.out.shape[0]
    product = ctx.graph.library_call(aten.mm.default, [a, weight],
                                     ctx.out.new_empty_strided((m, columns), (columns, 1)))
    logs.log("perf_hints", "matmul: %s x %s computed with %d columns for aligned rows (a "
             "transient %.1f MB product)", list(a.get_size()), [k, n], columns,
             m * columns * ctx.dtype.itemsize / 2 ** 20)
    return product.make_loader()


@register_lowering(aten.mm.default)
def _mm(ctx, a, b):
    columns = _padded_columns(ctx, a, b)
    if columns is None:
        return NotImplemented
    product = _padded_product(ctx, a, b, ctx.node.args[1].meta["val"], columns)
    return Pointwise(ctx.device, ctx.dtype, product, ctx.size)


@register_lowering(aten.addmm.default)
def _addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    if beta != 1 or alpha != 1 or not is_ir(bias):
        return NotImplemented
    size = bias.get_size()
    if not (len(size) == 1 or len(size) == 2 and size[0] == 1):
        return NotImplemented
    columns = _padded_columns(ctx, a, b)
    if columns is not None:
        product = _padded_product(ctx, a, b, ctx.node.args[2].meta["val"], columns)
    elif ctx.graph.target.adds_addmm_bias(ctx.dtype) and read_by_generated_code_only(ctx.node):
        product = ctx.graph.library_call(aten.mm.default, [a, b], ctx.out).make_loader()
    else:
        return NotImplemented
    load_bias = broadcast_loader(bias, ctx.size, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype,
                     lambda index: ops.add(product(index), load_bias(index)), ctx.size)
