"""Ember's aot stage: ATen-level tracing, functionalisation and decomposition.

``aot_eager(gm, example_inputs)`` is the ``"aot_eager"`` backend (a debugging aid that isolates
this stage): it traces ``gm`` to a functional ATen graph (``trace_to_aten``) and runs that graph
eagerly. A graph that may record gradients (``may_record_grad``) is traced as a joint
forward/backward graph instead, partitioned, and run through an ``autograd.Function``
(``training.compile_training``). When tracing is not possible (unsupported mutation,
fake-tensor limits...) it logs the reason with ``ember.logs.warn`` and runs the captured graph
as it is. An inference graph is bypassed at call time when it may record gradients.
"""
from __future__ import annotations

from typing import Callable

import torch

from ember.aot.autocast import run_without_autocast
from ember.aot.trace import AtenGraph, trace_to_aten

__all__ = ["AtenGraph", "trace_to_aten", "aot_eager", "enables_grad", "may_record_grad"]


def enables_grad(gm: torch.fx.GraphModule) -> bool:
    """The graph turns grad mode on somewhere (it resumes inside ``torch.no_grad()`` and
    leaves the block, or holds a ``torch.enable_grad()`` block)."""
    return any(n.op == "call_function" and n.target is torch._C._set_grad_enabled and n.args
               and n.args[0] for n in gm.graph.nodes)


def may_record_grad(inputs, graph_enables_grad: bool) -> bool:
    """Whether running a graph on ``inputs`` now can record an autograd graph: an input
    requires grad, and grad mode is on or the graph turns it on. The ATen graph is traced
    for inference only (under no_grad), so such graphs run as captured."""
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs) and (
        torch.is_grad_enabled() or graph_enables_grad)


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    from ember import logs
    if may_record_grad(example_inputs, enables_grad(gm)) and not enables_grad(gm):
        from ember.aot.training import compile_training
        try:
            return compile_training(gm, list(example_inputs),
                                    compile_graph=lambda g, inputs: g.forward)
        except NotImplementedError as e:
            logs.warn("aot_eager: running the training graph as captured (%s)", e)
            return gm.forward
    try:
        traced = trace_to_aten(gm, list(example_inputs))
    except Exception as e:                   # NotImplementedError, fake-tensor limits, ...
        logs.warn("aot_eager: running the captured graph without ATen tracing (%s: %s)",
                  type(e).__name__, e)
        return gm.forward
    # the ATen graph holds autocast's casts: it runs with autocast off (``aot.autocast``)
    aten_forward = run_without_autocast(traced.gm.forward)
    captured_forward = gm.forward

    graph_enables_grad = enables_grad(gm)

    def run(*args):
        if may_record_grad(args, graph_enables_grad):
            return captured_forward(*args)   # traced for inference only
        return aten_forward(*args)

    run.aten_graph = traced                  # for inspection and tests
    return run
