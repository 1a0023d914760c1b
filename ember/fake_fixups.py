"""What meta kernels cannot see: answers that depend on the backend a fake stands in for.

Meta tensors carry no backend, so a few meta kernels answer what one backend does (or none
does). ``FIXUPS`` corrects their outputs per op (convolution and CPU ``roll``/``group_norm``
keep channels-last like oneDNN/cuDNN, CPU batch norm in eval returns empty statistics, the
running statistics batch norm updates keep their dtype); ``FAST_META`` computes one answer
faster than its meta kernel; torch's ``device_hint`` (asked by its Python meta kernels)
answers the fake device while ``DEVICE_HINT.device`` is set. ``ember/fake.py`` applies them.
"""
from __future__ import annotations

import threading

import torch
from torch._prims_common import suggest_memory_format

aten = torch.ops.aten
_META = torch.device("meta")


def _conv_layout(out, args, kwargs, device):
    """Meta convolution always answers contiguous (meta tensors carry no backend). Eager's
    CPU (mkldnn/thnn) and CUDA (cudnn) backends all return channels_last(_3d) when the input
    or the weight is laid out that way; reproduce that."""
    inp, weight = args[0], args[1]
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(out.dim())
    if fmt is not None and (suggest_memory_format(inp) == fmt or suggest_memory_format(weight) == fmt):
        return out.contiguous(memory_format=fmt)
    return out


def _bn_eval_stats(training_arg):
    """CPU batch norm in eval mode returns empty save_mean/save_invstd; meta (like CUDA)
    returns (C,). Only the CPU answer needs correcting, and only when not training."""
    def fix(out, args, kwargs, device):
        training = training_arg is not None and args[training_arg]
        if device.type != "cpu" or training:
            return out
        empty = out[1].new_empty((0,))
        return (out[0], empty, out[2].new_empty((0,)))
    return fix


# torch's Python meta kernels ask ``device_hint(tensor)`` which backend they stand in for, and
# on a plain meta tensor the answer is "cuda": CPU ops then get CUDA's output strides (svd,
# fft, nonzero_static). While Ember's mode runs a meta kernel the hint is the fake device.
DEVICE_HINT = threading.local()


def _install_device_hint() -> None:
    import torch._meta_registrations as registrations
    original = registrations.device_hint
    if getattr(original, "ember", False):
        return

    def device_hint(tensor) -> str:
        device = getattr(DEVICE_HINT, "device", None)
        if device is not None and getattr(tensor, "device", None) == _META:
            return device
        return original(tensor)
    device_hint.ember = True
    registrations.device_hint = device_hint


_install_device_hint()


def _batch_norm_inference_meta(x, *rest, **kwargs):
    """``_native_batch_norm_legit_no_training`` on meta runs torch's Python decomposition
    (milliseconds per call, the largest cost of capturing a BatchNorm network). Its answer
    is known: the output has the input's dtype and (dense) strides, the saved statistics are
    (C,) in the computation dtype. None (use the meta kernel) for other layouts."""
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    dense = x.is_contiguous() or (last is not None and x.is_contiguous(memory_format=last))
    if kwargs or x.dim() < 2 or not dense:
        return None
    stats = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return (torch.empty_like(x), x.new_empty((x.shape[1],), dtype=stats),
            x.new_empty((x.shape[1],), dtype=stats))


def _roll_layout(out, args, kwargs, device):
    """CPU ``roll`` is a ``cat`` of two slices of its input, and ``cat`` keeps a channels-last
    input's layout; its Python meta kernel answers contiguous (CUDA's ``roll`` does too)."""
    dims = args[2] if len(args) > 2 else kwargs.get("dims", ())
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(out.dim())
    if device.type != "cpu" or fmt is None or not dims or suggest_memory_format(args[0]) != fmt:
        return out
    return out.contiguous(memory_format=fmt)


def _group_norm_layout(out, args, kwargs, device):
    """CPU ``native_group_norm`` keeps a channels-last input's layout (its kernel has a
    channels-last path); the Python reference torch runs on meta answers contiguous from torch
    2.14 on (it asks the meta tensor's device type). CUDA's output is contiguous."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(out[0].dim())
    if device.type != "cpu" or fmt is None or suggest_memory_format(args[0]) != fmt:
        return out
    return (out[0].contiguous(memory_format=fmt), *out[1:])


def _updated_stats_dtype(out, args, kwargs, device):
    """``_batch_norm_with_update_functional``'s meta kernel gives the updated running
    statistics the computation dtype (float32 for half input); its kernels return them in
    the running statistics' own dtype, which is what the inputs they replace hold."""
    mean, var = args[3], args[4]
    return (*out[:4], out[4].new_empty(out[4].shape, dtype=mean.dtype),
            out[5].new_empty(out[5].shape, dtype=var.dtype))


# Ops whose meta result is computed here, faster than their meta kernel (None: not this call)
FAST_META = {aten._native_batch_norm_legit_no_training.default: _batch_norm_inference_meta}


# Per-op corrections applied to meta outputs, where a meta kernel's answer depends on the
# backend it cannot see.
FIXUPS = {aten.convolution.default: _conv_layout, aten._convolution.default: _conv_layout,
           aten.native_batch_norm.default: _bn_eval_stats(5),
           aten._native_batch_norm_legit.default: _bn_eval_stats(5),
           aten._native_batch_norm_legit_no_training.default: _bn_eval_stats(None),
           aten._batch_norm_with_update_functional.default: _updated_stats_dtype,
           aten.roll.default: _roll_layout, aten.native_group_norm.default: _group_norm_layout}
