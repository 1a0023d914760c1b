"""Ember's aot stage: ATen-level tracing, functionalisation and decomposition.

``aot_eager(gm, example_inputs)`` is the ``"aot_eager"`` backend (a debugging aid that isolates
this stage): it traces ``gm`` to a functional ATen graph (``trace_to_aten``) and runs that graph
eagerly. When tracing is not possible (training graphs, unsupported mutation, fake-tensor
limits...) it logs the reason with ``ember.logs.warn`` and runs the captured graph as it is. A
graph traced for inference is also bypassed at call time if it is called with grad mode on and
an input requiring grad.
"""
from __future__ import annotations

from typing import Callable

import torch

from ember.aot.trace import AtenGraph, trace_to_aten

__all__ = ["AtenGraph", "trace_to_aten", "aot_eager"]


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    from ember import logs
    try:
        traced = trace_to_aten(gm, list(example_inputs))
    except Exception as e:                   # NotImplementedError, fake-tensor limits, ...
        logs.warn("aot_eager: running the captured graph without ATen tracing (%s: %s)",
                  type(e).__name__, e)
        return gm.forward
    aten_forward = traced.gm.forward
    captured_forward = gm.forward

    def run(*args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            return captured_forward(*args)   # traced for inference only
        return aten_forward(*args)

    run.aten_graph = traced                  # for inspection and tests
    return run
