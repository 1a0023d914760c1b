"""Ember's decomposition table: composite ATen ops rewritten into simpler ATen ops.

The ATen tracer (``ember.aot.trace``) consults this table for every op it meets: an op with an
entry is not recorded; its decomposition runs under the tracer instead, so its parts are
recorded. ``torch._decomp``'s tables are used as the reference library of op semantics.

Choice of decomposed ops (forward ops; the backward ops are listed in ``DECOMPOSED_OPS``):

* Normalisations (``native_layer_norm``, ``native_batch_norm``,
  ``_native_batch_norm_legit.no_stats`` (``instance_norm``'s),
  ``_native_batch_norm_legit_no_training``, ``_native_batch_norm_legit_functional``,
  ``native_group_norm``): reductions + pointwise ops, which a loop-level backend fuses better
  than an opaque kernel; their unused statistics outputs are removed by dead-code elimination.
* Activations written from pointwise parts (``silu``, ``hardswish``, ``hardsigmoid``,
  ``mish``) and small composites (``logsumexp``, ``addcmul``, ``addcdiv``,
  ``_weight_norm_interface``); Ember's own
  ``var_mean`` -> ``var`` + ``mean`` (torch's reference version emits ``prims`` ops, and the
  table aims at ATen ops only).
* ``_native_multi_head_attention`` (``nn.MultiheadAttention``'s inference fast path), self
  attention without mask or weights: its projections and ``scaled_dot_product_attention``.

Kept as they are (the backend lowers them directly, or they are views): ``gelu`` and
``gelu_backward``,
``_softmax``/``_log_softmax`` (one fused reduction kernel each), ``addmm``/``mm``/``bmm``,
``convolution``, view ops (``t``, ``transpose``, ``view``, ``expand``, ``permute``, ...),
``embedding``, ``index``, ``gather``.

Ember's own decompositions can be added with ``@register_decomposition(op)``; they take
precedence over torch's.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten

__all__ = ["core_decompositions", "register_decomposition", "DECOMPOSED_OPS"]

DECOMPOSED_OPS = [
    aten.native_layer_norm,
    aten.native_batch_norm,
    aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit_functional,
    aten.native_group_norm,
    aten.silu,
    aten.hardswish,
    aten.hardsigmoid,
    aten.mish,
    aten.logsumexp,
    aten.addcmul,
    aten.addcdiv,
    # v * (g / ||v||): ATen's CPU kernel took 5.6 ms of Wav2Vec2ForCTC's 80 ms a call on its
    # positional convolution's [768, 48, 128] weight; as a norm reduction and a pointwise
    # op it fuses
    aten._weight_norm_interface,
    # the CPU kernels return channels-last outputs for channels-last inputs, their meta
    # kernels contiguous ones: run as an ATen fallback, the layout check fails
    aten.max_unpool2d,
    aten.max_unpool3d,
    # backward ops (joint graphs, ``ember.aot.joint``): norms' backwards become reductions
    # and pointwise ops the backend fuses (the batch sums of bias and norm gradients among
    # them); activations' backwards are pointwise; select/slice backwards are scatters into
    # zeros. ``convolution_backward``, ``embedding_dense_backward`` and the pooling backwards
    # stay ATen kernels.
    aten.native_layer_norm_backward,
    aten.native_batch_norm_backward,
    aten.batch_norm_backward,
    aten.cudnn_batch_norm_backward,
    aten.native_group_norm_backward,
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.silu_backward,
    aten.sigmoid_backward,
    aten.tanh_backward,
    aten.threshold_backward,
    aten.hardswish_backward,
    aten.hardsigmoid_backward,
    aten.hardtanh_backward,
    aten.leaky_relu_backward,
    aten.elu_backward,
    aten.mish_backward,
    aten.softplus_backward,
    aten.native_dropout_backward,
    aten.select_backward,
    aten.slice_backward,
]

# Ember's own entries: OpOverload -> callable.
_EMBER_DECOMPS: dict = {}


def variance_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype eager's var, std, var_mean and std_mean keep their statistics in, for
    inputs of ``dtype`` on ``device``: on the CPU float64 (ATen's CPU Welford reduction holds
    double state for float32: the variance of float32 values up to ~1e19 is finite, where
    float32 sums of squared deviations overflow), on CUDA float32 (half precision too)."""
    if device.type == "cpu" and dtype in (torch.float32, torch.float64):
        return torch.float64
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def register_decomposition(*ops):
    """Register an Ember decomposition for the given OpOverloads (or packets: all overloads)."""
    def deco(fn: Callable) -> Callable:
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    _EMBER_DECOMPS[getattr(op, name)] = fn
            else:
                _EMBER_DECOMPS[op] = fn
        return fn
    return deco


_cache: dict | None = None


def _writes_kwarg_only(op) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
               for a in op._schema.arguments)


def core_decompositions() -> dict:
    """OpOverload -> decomposition callable (a fresh dict; callers may extend it)."""
    global _cache
    if _cache is None:
        table = get_decompositions(DECOMPOSED_OPS)
        # No out= overloads (the tracer rejects out= before consulting the table). In-place and
        # other mutating overloads stay: their decompositions mutate through ``copy_``, which
        # the tracer functionalises like any in-place op.
        table = {op: fn for op, fn in table.items() if not _writes_kwarg_only(op)}
        _cache = table
    return {**_cache, **_EMBER_DECOMPS}


# > 0 while a layer_norm or group_norm decomposition runs (see _float_statistics); the
# last one's input is float16 or bfloat16 (its statistics are of those values, widened)
_float_statistics_depth = 0
_half_statistics: torch.dtype | None = None
# a half row at most this long sums exactly in float32 where it is constant: bfloat16's 8
# significant bits times up to 2**16, float16's 11 times 2**13, fit float32's 24
_HALF_EXACT_SUM = {torch.bfloat16: 1 << 16, torch.float16: 1 << 13}


@register_decomposition(aten.var_mean.correction)
def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """var and mean from statistics in eager's dtype (``variance_dtype``: float64
    for float32 on the CPU, where ATen's var_mean keeps double Welford state). The mean is
    summed in that dtype and rounded once (exact for a constant row). Where the result is
    one value, eager's plain var takes its mean in the input dtype, var_mean's does not:
    that var is of ``x`` in the statistics dtype. Inside layer_norm and group_norm, whose
    CPU kernels keep float32 statistics, the statistics are of the input dtype."""
    dims = list(dim) if dim else list(range(x.dim()))     # None or []: every dim
    c = 1 if correction is None else correction
    stats = variance_dtype(x.device, x.dtype)
    if _float_statistics_depth:
        # the mean summed in the statistics dtype, rounded once: exact for a constant row
        # (as eager's Welford mean), whose normalised values are then 0, not +-1. Widened
        # half values sum exactly in float32 there (as float32 rows do in float64), and
        # eager's half norms keep float32 statistics: no float64 (the widening cost a
        # bfloat16 layer_norm of 4096 x 1024 a fifth of its time)
        n = math.prod(x.shape[d] for d in dims)
        if _half_statistics and isinstance(n, int) and n <= _HALF_EXACT_SUM[_half_statistics]:
            stats = x.dtype
        mean = aten.mean.dim(x, dims, True, dtype=stats)
        if stats != x.dtype:
            mean = aten._to_copy.default(mean, dtype=x.dtype)
        dev = aten.sub.Tensor(x, mean)
        var = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(dev, dev), dims, keepdim),
                              max(n - c, 0))
        return var, (mean if keepdim else aten.squeeze.dims(mean, dims))
    reduced = {d % max(x.dim(), 1) for d in dims}
    one_result = all(x.shape[d] == 1 for d in range(x.dim()) if d not in reduced)
    src = aten._to_copy.default(x, dtype=stats) if one_result and stats != x.dtype else x
    var = aten.var.correction(src, dims, correction=c, keepdim=keepdim)
    mean = aten.mean.dim(x, dims, keepdim, dtype=stats)
    if stats != x.dtype:
        var = aten._to_copy.default(var, dtype=x.dtype)
        mean = aten._to_copy.default(mean, dtype=x.dtype)
    return var, mean


def _float_statistics(op, cpu_only: bool = False, register: bool = True):
    """torch's decomposition of ``op`` (a packet: its default overload; or an overload),
    whose ``var_mean`` keeps the input dtype: eager's CPU layer_norm and group_norm
    accumulate float32 (their statistics overflow to inf where a float64 var would not, and
    float32 sums keep these norms fast). Eager's CPU batch norm sums in double but stores
    its sum of squared deviations in the input dtype (inf past float32's range, its output
    then 0): float statistics there too (``cpu_only``: its CUDA kernels keep float32
    Welford state, as var_mean on CUDA does)."""
    overload = getattr(op, "default", op)
    reference = get_decompositions([overload])[overload]

    def decomposition(*args, **kwargs):
        global _float_statistics_depth, _half_statistics
        if cpu_only and args[0].device.type != "cpu":
            return reference(*args, **kwargs)
        outer = _half_statistics
        _float_statistics_depth += 1
        _half_statistics = args[0].dtype if args[0].dtype in _HALF_EXACT_SUM else None
        try:
            return reference(*args, **kwargs)
        finally:
            _float_statistics_depth -= 1
            _half_statistics = outer
    return register_decomposition(overload)(decomposition) if register else decomposition


_float_statistics(aten.native_layer_norm)
_float_statistics(aten.native_group_norm)
_float_statistics(aten._native_batch_norm_legit_functional, cpu_only=True)
# no running statistics (F.batch_norm without them, instance_norm): ATen's CPU kernel for
# these was a library call 2.4-4.4x slower than the generated kernels (8x32x32x32, 1 thread)
_float_statistics(aten._native_batch_norm_legit.no_stats, cpu_only=True)
_torch_native_batch_norm = _float_statistics(aten.native_batch_norm, cpu_only=True,
                                             register=False)   # (see _native_batch_norm)


@register_decomposition(aten._safe_softmax.default)
def _safe_softmax(x, dim, dtype=None):
    """Softmax whose rows of only -inf (fully masked attention rows) give 0, not NaN."""
    out = aten._softmax.default(x if dtype is None else aten._to_copy.default(x, dtype=dtype),
                                dim, False)
    masked = aten.all.dim(aten.eq.Scalar(x, float("-inf")), dim, True)
    return aten.where.self(masked, aten.scalar_tensor.default(0.0, dtype=out.dtype,
                                                              device=out.device), out)


def _normalize_eval(x, weight, bias, mean, var, eps):
    """Eval-mode batch norm in a few ATen ops: ``(x - mean) / sqrt(var + eps) * w + b``,
    computed in float32 for half inputs, as eager's kernels do. torch's reference
    decomposition says the same through its type-promotion wrappers, which cost about 10 ms
    of tracing per batch norm (a second per resnet50)."""
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype

    def channel(t):       # [C] -> [1, C, 1, ...] in the compute dtype
        if t.dtype != compute:
            t = aten._to_copy.default(t, dtype=compute)
        return aten.view.default(t, [1, -1] + [1] * (x.dim() - 2))

    xc = x if x.dtype == compute else aten._to_copy.default(x, dtype=compute)
    invstd = aten.reciprocal.default(aten.sqrt.default(aten.add.Tensor(channel(var), eps)))
    y = aten.mul.Tensor(aten.sub.Tensor(xc, channel(mean)), invstd)
    if weight is not None:
        y = aten.mul.Tensor(y, channel(weight))
    if bias is not None:
        y = aten.add.Tensor(y, channel(bias))
    return y if y.dtype == x.dtype else aten._to_copy.default(y, dtype=x.dtype)


def _empty_stat(x):
    return aten.new_zeros.default(x, [0])


_TORCH_CUDNN_BATCH_NORM = get_decompositions([aten.cudnn_batch_norm])[
    aten.cudnn_batch_norm.default]


@register_decomposition(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _normalize_eval(x, weight, bias, running_mean, running_var, eps), \
        _empty_stat(x), _empty_stat(x)


@register_decomposition(aten.native_batch_norm.default)
def _native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training or running_mean is None or running_var is None:
        return _torch_native_batch_norm(x, weight, bias, running_mean, running_var, training,
                                        momentum, eps)
    return _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps)


@register_decomposition(aten.cudnn_batch_norm.default)
def _cudnn_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training or running_mean is None or running_var is None:
        return _TORCH_CUDNN_BATCH_NORM(x, weight, bias, running_mean, running_var, training,
                                       momentum, eps)
    out = _normalize_eval(x, weight, bias, running_mean, running_var, eps)
    return out, _empty_stat(x), _empty_stat(x), aten.new_zeros.default(x, [0],
                                                                       dtype=torch.uint8)


@register_decomposition(aten._native_multi_head_attention.default)
def _native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                 proj_weight, proj_bias, mask=None, need_weights=True,
                                 average_attn_weights=True, mask_type=None):
    """``nn.MultiheadAttention``'s inference fast path (torchvision's ViT) as its parts:
    the qkv projection, ``scaled_dot_product_attention`` and the output projection, so the
    bias adds and head shuffles fuse into Ember's kernels around the library calls. ATen's
    kernel took 5.2 ms a layer of vit_b_16 at 2 threads, 1 ms over its own matmuls. Self
    attention without a mask and without weights only; anything else stays ATen's."""
    if need_weights or mask is not None or not (query is key is value) or query.dim() != 3:
        return NotImplemented
    batch, length, _ = query.shape
    head_dim = embed_dim // num_head
    qkv = aten.linear.default(query, qkv_weight, qkv_bias)
    q, k, v = aten.permute.default(
        aten.view.default(qkv, [batch, length, 3, num_head, head_dim]), [2, 0, 3, 1, 4])
    attn = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    merged = aten.reshape.default(aten.transpose.int(attn, 1, 2), [batch, length, embed_dim])
    return aten.linear.default(merged, proj_weight, proj_bias), None
