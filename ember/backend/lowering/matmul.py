"""Lowerings of ``mm`` and ``addmm``: padded columns for aligned rows, and the CPU bias.

**Unaligned rows.** cuBLAS runs a bfloat16 ``[8192, 768] x [768, 50257]`` product
(GPT-2's LM head) at 92 TFLOP/s, and at 614 with N padded to 50264 (H100; 6.9 against
1.0 ms; BERT's 30522 columns 1.7 against 0.63, Whisper's 51865 2.8 against 0.42): its fast
kernels need each dimension an operand or the result is laid out along (the one of stride 1)
to be a multiple of 16 bytes; an aligned stride with an unaligned size does not do. Where
``config.matmul_padding`` says so, the product is computed on zero-padded operands:

- N (the result's rows): the weight is copied into one with zero columns (a kernel Ember
  generates; 77 MB for GPT-2), cuBLAS writes the aligned ``[M, N8]`` product, and the result
  is its first N columns, an unrealized body: the kernel that reads it (a softmax, a loss,
  the copy into the output's own contiguous layout) reads the padded rows. The cost is that
  transient padded product, as large as the result (torch.compile instead returns the
  padded buffer's slice, with other strides than eager's).
- K (the training step's ``grad_logits @ wte``: 4.6 ms raw, 0.87 + 1.0 for the copy padded):
  both operands get K8 - K zero columns / rows; the product needs no slicing.
- M, where the first operand is column-major (``grad_logits.t() @ hidden``, the head's
  weight gradient: 4.3 ms raw, 0.85 padded): its zero-padded copy has M8 rows and the
  result is the product's first M rows.

A padded copy of one value is made once per graph (``GraphLowering.padded_operands``): the
two products of a head's backward read one ``grad_logits`` padded to ``[8192, 50264]``.

**The CPU bias.** ATen's CPU ``addmm(bias, a, b)`` first copies the broadcast bias into its
result and then lets the GEMM add ``a @ b`` to it: one more pass over the result, which is
as large as the activations (convnext_tiny: 37 of them, 4.7 ms of copies in a 52 ms call).
When every reader of the result is code Ember generates (GELU, a residual add, a layer norm:
through views, each value read once), the lowering runs ``mm`` instead and returns
``mm + bias`` as an unrealized body, so the bias add costs nothing in the kernel that reads
the product anyway. Otherwise (a reader is a library call or a graph output, or another
device: cuBLAS adds the bias in its epilogue) ``addmm`` runs as it is.

**Half precision on a CPU without half GEMMs.** Where oneDNN has no bfloat16 (float16)
kernels for the CPU (no AVX-512: ``torch.ops.mkldnn._is_mkldnn_bf16_supported``), ATen's
half-precision ``mm``, ``addmm`` and ``bmm`` run a scalar loop: a bf16 ``[1024, 256] x
[256, 768]`` took 311 ms on a 2-core AMD EPYC (AVX2), the same product in float32 5 ms with
its conversions. There the operands are cast to float32 (exactly; a body is stored in
float32 directly), the library multiplies in float32, and the readers round the product
once, as eager's kernel, which accumulates in float32, rounds its sum. Convolutions too,
and their backward (``convolution.py``): timm resnet18 bf16 at batch 1 took 893 ms a call in
eager there, 27 ms so; the builtin convnet's bf16 training step 420 ms, 38 ms so.

Where each applies is the target's answer (``Target.pads_matmuls``, ``adds_addmm_bias``,
``upcasts_half_matmuls``).
"""
from __future__ import annotations

import torch
import torch.fx

from ember import config, logs
from ember.backend.ir import Buffer, Layout, Pointwise, ReinterpretView, sym
from ember.backend.lowering.registry import (aten, broadcast_loader, is_ir,
                                             read_by_generated_code_only, register_lowering)
from ember.backend.ops import ops


def _aligned_product(ctx, a, b, a_val: torch.Tensor, b_val: torch.Tensor):
    """``a @ b`` computed on operands padded to aligned dimensions (the module docstring),
    where ``config.matmul_padding`` pads this product and one needs it; else None. Padded
    rows are dropped by a view, padded columns by a body reading the product."""
    mode = config.matmul_padding
    if mode == "off" or not (is_ir(a) and is_ir(b)) or a_val.dim() != 2 or b_val.dim() != 2:
        return None
    if mode == "auto" and not ctx.graph.target.pads_matmuls(ctx.dtype):
        return None
    (m, k), n = a_val.shape, b_val.shape[1]
    if not (isinstance(k, int) and isinstance(n, int)):
        return None
    multiple = max(1, 16 // ctx.dtype.itemsize)
    static_m = isinstance(m, int)           # a symbolic M (a batch) counts as large
    always = mode == "always" or not static_m
    pad_n = n % multiple != 0 and (always or m * n >= 1 << 20)
    pad_k = k % multiple != 0 and (always or m * n * k >= 1 << 30)
    pad_m = static_m and m % multiple != 0 and (always or m * n * k >= 1 << 30) and \
        _column_major(a)
    if not (pad_n or pad_k or pad_m):
        return None
    up = lambda s, pad: -(-s // multiple) * multiple if pad else s     # noqa: E731
    rows, inner, columns = up(m, pad_m), up(k, pad_k), up(n, pad_n)
    if pad_m or pad_k:
        a = _padded(ctx, a, rows, inner)
    if pad_k or pad_n:
        b = _padded(ctx, b, inner, columns)
    product = ctx.graph.library_call(aten.mm.default, [a, b],
                                     ctx.out.new_empty_strided((rows, columns), (columns, 1)))
    logs.log("perf_hints", "matmul: %s x %s computed as %s x %s for aligned rows (a "
             "transient %.1f MB product)", [m, k], [k, n], [rows, inner], [inner, columns],
             rows * columns * ctx.dtype.itemsize / 2 ** 20)
    if pad_n:
        return Pointwise(ctx.device, ctx.dtype, product.make_loader(), ctx.size)
    if pad_m:
        return ReinterpretView(product, Layout(ctx.device, ctx.dtype, [sym(m), sym(n)],
                                               [sym(n), sym(1)]))
    return product


def _column_major(x) -> bool:
    """``x`` (2-D) is memory laid out along its first dimension (a body is realized
    row-major for a library call)."""
    if not isinstance(x, (Buffer, ReinterpretView)):
        return False
    size, stride = x.layout.size, x.layout.stride
    return stride[0] == 1 and size[0] != 1 and size[1] != 1


def _padded(ctx, x, rows: int, columns: int):
    """``x`` ([R, C], static) in a zero-padded ``[rows, columns]`` copy, laid out along the
    same dimension as ``x``'s memory (row-major for a body): a transposed weight stays
    column-major, so the copy reads and writes along the same rows. One copy per storage,
    layout and padding (``GraphLowering.padded_operands``), so ``g @ w`` and ``g.t() @ h``
    share the padded ``g``."""
    transposed = _column_major(x)
    # in storage order: the copy is [outer, inner] row-major, inner the contiguous dimension
    outer, inner = (columns, rows) if transposed else (rows, columns)
    if isinstance(x, (Buffer, ReinterpretView)):
        layout = x.layout      # the key in storage order: x and x.t() share a copy
        order = slice(None, None, -1 if transposed else 1)
        key = (x.name, layout.offset, tuple(layout.size[order]), tuple(layout.stride[order]),
               outer, inner)
    else:
        key = (id(x), outer, inner)
    copies = ctx.graph.padded_operands
    if key not in copies:
        load = x.make_loader()
        extents = [int(s) for s in x.get_size()][::-1 if transposed else 1]

        def padded(index):
            # a masked load per padded dimension: zero past the value's own extent
            beyond = [(var, extent) for var, extent, size in zip(index, extents, (outer, inner))
                      if size != extent]

            def value(k=0):
                if k == len(beyond):
                    return load(index[::-1] if transposed else index)
                var, extent = beyond[k]
                keep = ops.lt(ops.index_expr(var, torch.int64), ops.constant(extent, torch.int64))
                return ops.masked(keep, lambda: value(k + 1), 0)
            return value()
        size = [sym(outer), sym(inner)]
        buf = ctx.graph.realize(Pointwise(ctx.device, x.get_dtype(), padded, size),
                                Layout(ctx.device, x.get_dtype(), size,
                                       [sym(inner), sym(1)]))
        copies[key] = (buf, x)      # (x kept alive: its id is in the key)
    buf = copies[key][0]
    strides = [sym(1), sym(inner)] if transposed else [sym(inner), sym(1)]
    return ReinterpretView(buf, Layout(ctx.device, x.get_dtype(), [sym(rows), sym(columns)],
                                       strides))


def in_float(ctx, op, operands: list, rest: list = ()):
    """``op(*operands, *rest)`` computed in float32 and read back in its result's dtype (the
    module docstring; convolutions and their backward too, ``convolution.py``), where the
    target upcasts the first operand's dtype; else None. An operand may be None (a
    convolution without bias); so may an output of several (an unasked gradient)."""
    if not (all(x is None or is_ir(x) for x in operands) and
            ctx.graph.target.upcasts_half_matmuls(operands[0].get_dtype())):
        return None
    f32 = torch.float32

    def cast(x, dtype):
        return None if x is None else \
            Pointwise(x.get_device(), dtype, broadcast_loader(x, x.get_size(), dtype),
                      x.get_size())

    def in_f32(out):
        return None if out is None else \
            out.new_empty_strided(out.shape, out.stride(), dtype=f32)
    several = isinstance(ctx.out, (tuple, list))
    val = tuple(map(in_f32, ctx.out)) if several else in_f32(ctx.out)
    result = ctx.graph.library_call(op, [cast(x, f32) for x in operands] + list(rest), val)
    first = next(o for o in ctx.out if o is not None) if several else ctx.out
    logs.log("perf_hints", "%s %s in float32 (this CPU has no %s kernel for it)", op,
             list(first.shape), operands[0].get_dtype())
    if several:
        return tuple(None if out is None else cast(buf, out.dtype)
                     for buf, out in zip(result, ctx.out))
    return cast(result, ctx.dtype)


@register_lowering(aten.mm.default)
def _mm(ctx, a, b):
    product = in_float(ctx, aten.mm.default, [a, b]) or \
        _aligned_product(ctx, a, b, *(n.meta["val"] for n in ctx.node.args[:2]))
    return NotImplemented if product is None else product


@register_lowering(aten.bmm.default)
def _bmm(ctx, a, b):
    product = in_float(ctx, aten.bmm.default, [a, b])
    return NotImplemented if product is None else product


@register_lowering(aten.addmm.default)
def _addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    if beta != 1 or alpha != 1 or not is_ir(bias):
        return NotImplemented
    product = in_float(ctx, aten.addmm.default, [bias, a, b])
    if product is not None:
        return product
    size = bias.get_size()
    if not (len(size) == 1 or len(size) == 2 and size[0] == 1):
        return NotImplemented
    product = _aligned_product(ctx, a, b, *(n.meta["val"] for n in ctx.node.args[1:3]))
    if product is None and ctx.graph.target.adds_addmm_bias(ctx.dtype) and \
            read_by_generated_code_only(ctx.node):
        product = ctx.graph.library_call(aten.mm.default, [a, b], ctx.out)
    if product is None:
        return NotImplemented
    product = product.make_loader()
    load_bias = broadcast_loader(bias, ctx.size, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype,
                     lambda index: ops.add(product(index), load_bias(index)), ctx.size)
