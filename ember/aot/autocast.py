"""Autocast and ATen graphs: autocast applies once, while tracing; never to the traced graph.

Autocast is a dispatcher layer above autograd: under ``torch.autocast`` an op on its
lower-precision list (``mm``, ``addmm``, convolutions, attention) gets its inputs cast to the
autocast dtype, an op on its float32 list (CPU: ``mse_loss``, ``nll_loss``, ``prod``...;
CUDA: ``layer_norm``, ``softmax``, ``pow``, ``sum``...) gets them cast to float32, and the
casts are ``_to_copy`` ops that autograd records. The ATen tracer sits below autocast, so a
traced graph holds those casts as ``_to_copy`` nodes and every node's dtype is the one eager
computes in. Hence:

* The traced graph must *run* (and be compiled, constant-folded...) with autocast off: its
  ATen calls would otherwise pass through autocast a second time, and an op autocast put
  in float32 (or a ``torch.autocast(enabled=False)`` block's float32 matmul) would run in
  bfloat16, with results of another dtype than the graph says (``run_without_autocast``).
* The backward is traced with autocast off (``autocast_off``): eager's autograd runs the
  backward with the autocast state of the thread that calls ``backward()``, which under
  AMP is outside the ``torch.autocast`` block (as torch's documentation asks), while the
  joint trace runs inside the forward's call. Traced under autocast, the backward of a
  float32 op (a ``layer_norm`` on CUDA, a float32 block's ``mm``) had its matmuls and
  float32-list ops cast again, against eager's backward, which runs each op in the dtypes
  its forward used and casts gradients back through the ``_to_copy``'s backward.
  A ``backward()`` called inside autocast is not followed (the graph is fixed).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

__all__ = ["autocast_off", "run_without_autocast"]


def autocast_off():
    """A context with autocast off for every device type (it can be re-entered inside)."""
    return torch._C._DisableAutocast()


def run_without_autocast(fn: Callable) -> Callable:
    """``fn`` (which runs a traced ATen graph) called with autocast off when it is on at call
    time; attributes of ``fn`` stay readable on the wrapper."""
    is_on = torch._C._is_any_autocast_enabled

    @functools.wraps(fn)
    def run(*args):
        if not is_on():
            return fn(*args)
        with torch._C._DisableAutocast():
            return fn(*args)

    return run
