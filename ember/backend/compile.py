"""The "ember" backend: aot -> lower -> schedule -> codegen -> build -> a callable.

    compiled = compile_graph(gm, example_inputs)    # compiled(*inputs) == gm(*inputs)

``compile_graph`` checks the options and runs the stages of ``pipeline.py`` (their order
reads there); ``compile_aten`` compiles an ATen graph (the training halves).

CPU graphs get C++/OpenMP kernels, CUDA graphs Triton kernels (``targets/``; CPU graphs
too with ``cpu_backend="triton"``, under Triton's interpreter). Training graphs (inputs that
require grad, grad mode on) go through ``ember.aot.training``: a joint forward/backward
graph, partitioned, both halves compiled by ``compile_aten`` (the pipeline's "training"
stage). What this version does not compile it still runs correctly: an op without a
lowering runs its ATen kernel from the generated wrapper; a training graph the aot stage
declines runs as captured.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.utils._pytree as pytree

from ember import logs
from ember.backend import pipeline
from ember.backend.pipeline import generate, generated_sources, instantiate
from ember.backend.options import DEFAULTS, check_option
from ember.backend.targets import Target, target_for

# ``generated_sources`` is the pipeline's list (its ``instantiate`` appends), read here by
# tests and tools
__all__ = ["compile_aten", "compile_graph", "generate", "generated_sources", "instantiate"]


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, *,
                  freezing: bool = DEFAULTS["freezing"],
                  max_autotune: bool = DEFAULTS["max_autotune"],
                  cudagraphs: bool = DEFAULTS["cudagraphs"], debug: bool = DEFAULTS["debug"],
                  cpu_backend: str = DEFAULTS["cpu_backend"],
                  fallback_random: bool = DEFAULTS["fallback_random"],
                  eager_choice: str = DEFAULTS["eager_choice"]) -> Callable:
    """Compile ``gm`` for inputs like ``example_inputs``.

    The keywords are the ember options, with the names and defaults of the one table,
    ``ember.backend.options.OPTIONS`` (``ember.compile``'s ``mode=`` and ``options=`` arrive
    here resolved); they are checked as ``ember.compile`` checks them. ``debug``: this graph
    compiles as under ``EMBER_LOGS=output_code`` (its wrapper and kernels are logged).
    ``cudagraphs``: a CUDA graph's launches replay as one CUDA graph
    (``runtime/cudagraphs.py``); a CPU graph has none to replay (a perf hint says so).
    ``cpu_backend``: the kernel language of CPU graphs (``targets.target_for``).
    ``fallback_random``: random ops run eager's kernels (same numbers as eager) instead of
    fused Philox draws. ``eager_choice``: whether an inference graph may run eagerly where
    that is faster (``runtime/eager_choice.py``).
    """
    options = dict(freezing=freezing, max_autotune=max_autotune, cudagraphs=cudagraphs,
                   debug=debug, cpu_backend=cpu_backend, fallback_random=fallback_random,
                   eager_choice=eager_choice)
    for name, value in options.items():
        check_option(name, value)
    if debug and not logs.enabled("output_code"):
        was_on = [a for a in logs.ARTIFACTS if logs.enabled(a)]
        logs.set_logs(",".join([*was_on, "output_code"]))
        try:
            return compile_graph(gm, example_inputs, **options)
        finally:
            logs.set_logs(",".join(was_on))
    return compile_shaped(gm, lambda flat_gm: pipeline.run(pipeline.Compilation(
        flat_gm, example_inputs, options,
        recompile=lambda graph, inputs: compile_graph(graph, inputs, **options))))


def compile_shaped(gm: torch.fx.GraphModule,
                   compile_flat: Callable[[torch.fx.GraphModule], Callable]) -> Callable:
    """``compile_flat(g)`` for ``gm`` returning its outputs as one flat tuple (the form the
    generated wrapper returns, and the frontends' graphs have), the result rebuilding what
    ``gm`` returns: a single tensor, a list, nested containers. Both backend entries
    (``compile_graph``, ``dynamic.compile_dynamic``) compile through it."""
    value = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    if type(value) is tuple and not any(isinstance(v, (tuple, list, dict)) for v in value):
        return compile_flat(gm)
    graph = torch.fx.Graph()
    flat, spec = pytree.tree_flatten(_mutable(graph.graph_copy(gm.graph, {})))
    graph.output(tuple(flat))
    flat_gm = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    flat_gm.meta.update(gm.meta)
    compiled = compile_flat(flat_gm)
    return functools.wraps(compiled, updated=())(
        lambda *args: pytree.tree_unflatten(list(compiled(*args)), spec))


def _mutable(value):
    """FX's immutable containers as the ``list``/``dict`` the graph's code returns."""
    if isinstance(value, list):
        return [_mutable(v) for v in value]
    if isinstance(value, tuple):
        items = [_mutable(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {k: _mutable(v) for k, v in value.items()}
    return value


def compile_aten(gm: torch.fx.GraphModule, example_inputs: list,
                 target: Target | None = None,
                 device: torch.device = torch.device("cpu"),
                 fused_random: bool = False) -> Callable:
    """Compile an ATen graph (``ember.aot``'s output) with ``target``, by default
    ``device``'s (``targets.target_for``)."""
    target = target or target_for(device)
    return instantiate(generate(gm, example_inputs, target, device, fused_random), target)
