"""The "ember" backend: aot -> lower -> schedule -> codegen -> build -> a callable.

    compiled = compile_graph(gm, example_inputs)    # compiled(*inputs) == gm(*inputs)

CPU graphs get C++/OpenMP kernels, CUDA graphs Triton kernels (``targets/``; CPU graphs
too with ``cpu_backend="triton"``, under Triton's interpreter). Training graphs (inputs that
require grad, grad mode on) go through ``ember.aot.training``: a joint forward/backward graph,
partitioned, both halves compiled here (``_compile_training``). What this version does not
compile it still runs correctly: an op without a lowering runs its ATen kernel from the
generated wrapper; a training graph the aot stage declines runs as captured.
"""
from __future__ import annotations

import re
import time
from typing import Callable

import torch

from ember import config, logs
from ember.aot.autocast import autocast_off, run_without_autocast
from ember.backend.runtime import graph_cache
from ember.backend import metrics
from ember.backend.passes.constant_folding import fold_constant_fallbacks
from ember.backend.passes.attention_masks import simplify_constant_masks
from ember.backend.codegen.common import Kernel
from ember.backend.codegen.wrapper import WrapperCodegen
from ember.backend.graph import GraphLowering
from ember.backend.runtime.graph_cache import CompiledArtifact, KernelRecord
from ember.backend.ir import Buffer, ReinterpretView
from ember.backend.passes.conv_taps import drop_dead_taps
from ember.backend.passes.layout import changed_output, in_best_layout
from ember.backend.scheduler import FusedKernel, reuse_dying_inputs, schedule
from ember.backend.targets import Target, kernel_device, target_for


generated_sources: list[str] = []   # wrapper and kernel sources, for tests and tools
_GENERATED_SOURCES_KEPT = 1000      # the latest ones (bounded memory); ember.reset() clears


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, *, freezing: bool = False,
                  max_autotune: bool = False, cudagraphs: bool = False, debug: bool = False,
                  cpu_backend: str = "cpp", fallback_random: bool = True) -> Callable:
    """Compile ``gm`` for inputs like ``example_inputs``.

    The keywords are the ember options, with the names and defaults of
    ``ember.backends.EMBER_OPTIONS`` (``ember.compile``'s ``mode=`` and ``options=`` arrive
    here resolved); they are checked as ``ember.compile`` checks them. ``debug``: this graph
    compiles as under ``EMBER_LOGS=output_code`` (its wrapper and kernels are logged).
    ``cudagraphs``: a CUDA graph's launches replay as one CUDA graph (``runtime/cudagraphs.py``); a
    CPU graph has none to replay (a perf hint says so). ``cpu_backend``: the kernel language
    of CPU graphs (``targets.target_for``). ``fallback_random``: random ops run eager's
    kernels (same numbers as eager) instead of fused Philox draws.
    """
    from ember.aot import trace_to_aten
    from ember.backends import check_option
    from ember.decomp import core_decompositions
    options = dict(freezing=freezing, max_autotune=max_autotune, cudagraphs=cudagraphs,
                   debug=debug, cpu_backend=cpu_backend, fallback_random=fallback_random)
    for name, value in options.items():
        check_option(name, value)
    if debug and not logs.enabled("output_code"):
        was_on = [a for a in logs.ARTIFACTS if logs.enabled(a)]
        logs.set_logs(",".join([*was_on, "output_code"]))
        try:
            return compile_graph(gm, example_inputs, **options)
        finally:
            logs.set_logs(",".join(was_on))
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    # kernels are generated for the accelerator's tensors when there is one; ops on the
    # other device's tensors run their ATen kernels
    device = kernel_device(tensors)
    try:
        target = target_for(device, cpu_backend, debug=debug, autotune=max_autotune)
    except NotImplementedError as e:
        target, unsupported = None, e
    if max_autotune and target is not None and not target.tunes_kernels:
        logs.log("perf_hints", "ember backend: max_autotune=True, but C++ kernels have no "
                               "configurations to time (it tunes Triton kernels)")
    if cudagraphs and (target is None or not target.supports_cudagraphs):
        logs.log("perf_hints", "ember backend: cudagraphs=True, but CUDA graphs are not used: "
                               "graph is on %s", device.type)
    if target is None:
        logs.log("perf_hints", "ember backend: %s; graph runs as captured", unsupported)
        return gm.forward
    from ember.aot import enables_grad, may_record_grad
    simplify_constant_masks(gm, example_inputs)
    if may_record_grad(tensors, enables_grad(gm)):
        if freezing:
            logs.warn("ember backend: freezing=True is for inference (call under "
                      "torch.no_grad()); this graph needs gradients and is not frozen")
        return _compile_training(gm, example_inputs, target, device, fallback_random)
    # the traced graph holds autocast's casts: compiled and run with autocast off
    # (``ember.aot.autocast``); the trace itself runs under it, as eager's ops do
    in_autocast = torch._C._is_any_autocast_enabled()
    start = time.perf_counter()
    cache_key = None if freezing or not graph_cache.enabled() else graph_cache.key(
        gm, example_inputs, options, target)
    artifact = graph_cache.load(cache_key) if cache_key else None
    if artifact is not None:
        try:
            with autocast_off():
                compiled = instantiate(artifact, target)
        except Exception as e:     # noqa: BLE001 (an entry that does not load: compiled again)
            graph_cache.discard(cache_key, e)
            artifact = None
    if artifact is not None:
        logs.log("output_code", "graph cache hit: %d kernels loaded in %.3f s",
                 len(artifact.kernels), time.perf_counter() - start)
        compiled = _finish(compiled, gm, example_inputs, cudagraphs, target)
        return run_without_autocast(compiled) if in_autocast else compiled
    stages_before = dict(metrics.compile_seconds)
    try:
        with metrics.timed("aot trace"):
            aten_graph = in_best_layout(
                drop_dead_taps(gm), target, False,
                lambda g: trace_to_aten(g, example_inputs, decompositions=core_decompositions()),
                check=lambda traced: changed_output(gm, traced.gm))
    except NotImplementedError as e:
        logs.log("perf_hints", "ember backend: ATen tracing declined (%s); graph runs as "
                               "captured", e)
        return gm.forward
    frozen = None
    try:
        with autocast_off():
            if freezing:   # parameters and buffers folded as guarded constants (passes/freezing.py)
                from ember.backend.passes.freezing import freeze
                frozen = freeze(gm, aten_graph.gm, example_inputs)
            artifact = generate(aten_graph.gm, example_inputs, target, device,
                                fused_random=not fallback_random)
            compiled = instantiate(artifact, target)
    except Exception as e:
        if not config.suppress_errors:
            raise
        return _as_captured_after(gm, e, "code generation")
    logs.log("output_code", "compiled %d-node graph in %.3f s", len(gm.graph.nodes),
             time.perf_counter() - start)
    _log_stage_times(gm, stages_before, time.perf_counter() - start)
    if cache_key:
        graph_cache.store(cache_key, artifact)
    compiled = _finish(compiled, gm, example_inputs, cudagraphs, target)
    if frozen is not None:
        compiled = frozen.guard(compiled, lambda args: compile_graph(gm, args, **options))
    return run_without_autocast(compiled) if in_autocast else compiled


def _log_stage_times(gm: torch.fx.GraphModule, before: dict, total: float) -> None:
    if logs.enabled("compile_time"):
        stages = ", ".join(f"{stage} {seconds - before.get(stage, 0.0):.2f} s"
                           for stage, seconds in metrics.compile_seconds.items()
                           if seconds - before.get(stage, 0.0) >= 0.005)
        logs.log("compile_time", "%d-node graph compiled in %.2f s: %s", len(gm.graph.nodes),
                 total, stages)


def _finish(compiled, gm, example_inputs, cudagraphs: bool, target: Target) -> Callable:
    """The compiled graph, replayed as a CUDA graph when asked and possible."""
    if cudagraphs and target.supports_cudagraphs:
        if compiled.mutates_inputs:
            logs.log("perf_hints", "cudagraphs: not used, the graph mutates its inputs")
        else:
            from ember.backend.runtime.cudagraphs import CudaGraphRunner
            from ember.backend.passes.freezing import is_parameter_or_buffer
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            compiled = CudaGraphRunner(compiled, example_inputs, [
                is_parameter_or_buffer(node, value)
                for node, value in zip(placeholders, example_inputs)])
    return compiled


def _compile_training(gm: torch.fx.GraphModule, example_inputs: list, target: Target,
                      device: torch.device, fallback_random: bool) -> Callable:
    """A training graph: joint forward/backward graph, partitioned, both halves compiled by
    ``compile_aten`` and run by an ``autograd.Function`` (``ember.aot.training``)."""
    from ember.aot import enables_grad
    from ember.aot.training import compile_training
    from ember.decomp import core_decompositions
    if enables_grad(gm) and not torch.is_grad_enabled():
        logs.log("perf_hints", "ember backend: graph entered with grad off turns it on; runs "
                               "as captured")
        return gm.forward
    start = time.perf_counter()
    # channels-last convolutions when asked: the weights' gradients come back in the
    # parameters' own layout through the conversion's backward
    def build(traced: torch.fx.GraphModule) -> Callable:
        return compile_training(
            traced, example_inputs, decompositions=core_decompositions(),
            compile_graph=lambda g, inputs: compile_aten(g, inputs, target, device,
                                                         fused_random=not fallback_random))
    try:
        compiled = in_best_layout(drop_dead_taps(gm), target, True, build)
    except NotImplementedError as e:
        logs.log("perf_hints", "ember backend: training graph runs as captured (%s)", e)
        return gm.forward
    except Exception as e:
        if not config.suppress_errors:
            raise
        return _as_captured_after(gm, e, "training graph compilation")
    logs.log("output_code", "compiled %d-node training graph in %.3f s", len(gm.graph.nodes),
             time.perf_counter() - start)
    return compiled


def _as_captured_after(gm: torch.fx.GraphModule, error: Exception, what: str) -> Callable:
    """The graph as captured, after ``what`` failed (``config.suppress_errors``), said."""
    logs.warn("ember backend: %s failed (%s: %s); running the graph as captured", what,
              type(error).__name__, error)
    return gm.forward


def compile_aten(gm: torch.fx.GraphModule, example_inputs: list,
                 target: Target | None = None,
                 device: torch.device = torch.device("cpu"),
                 fused_random: bool = False) -> Callable:
    """Compile an ATen graph (``ember.aot``'s output) with ``target``, by default
    ``device``'s (``targets.target_for``)."""
    target = target or target_for(device)
    return instantiate(generate(gm, example_inputs, target, device, fused_random), target)


def generate(gm: torch.fx.GraphModule, example_inputs: list, target: Target,
             device: torch.device, fused_random: bool = False) -> CompiledArtifact:
    """Lower, schedule and generate the wrapper and kernels of an ATen graph (whose
    constant values that need ATen fallbacks are first computed, once: passes/constant_folding.py)."""
    with metrics.timed("lowering"):
        fold_constant_fallbacks(gm)
        graph = GraphLowering(gm, example_inputs, target, device, fused_random).run()
    output_names = {o.name if isinstance(o, Buffer) else o.data.name
                    for o in graph.outputs if isinstance(o, (Buffer, ReinterpretView))}
    with metrics.timed("scheduling"):
        steps = schedule(graph.buffers, output_names)
        steps = target.fuse_templates(steps, output_names)
        reuse_dying_inputs(steps, output_names)
    layouts = {b.name: b.layout for b in [*graph.inputs, *graph.constant_buffers, *graph.buffers]
               if b.layout is not None}
    dtypes = {name: layout.dtype for name, layout in layouts.items()}
    numels = {}      # storage elements of each buffer, for the targets' index widths
    for name, layout in layouts.items():
        n = layout.storage_numel()
        if n.is_Integer:
            numels[name] = int(n)
    kernels: dict[int, Kernel] = {}
    unique: dict[str, Kernel] = {}     # same computation on other buffers -> its first kernel
    with metrics.timed("code generation"):
        for step in steps:
            if isinstance(step, FusedKernel):
                kernel = target.make_kernel(step, f"kernel{len(unique)}", dtypes)
                kernel.numels = numels
                kernel.source = kernel.generate()
                first = unique.setdefault(_computation_key(kernel), kernel)
                kernel.name = first.name    # repeated layers launch one compiled kernel
                kernels[id(step)] = kernel
        wrapper = WrapperCodegen(graph, steps, kernels)
        src = wrapper.generate()
    folder = logs.debug_frame_dir("backend")
    if folder is not None:
        logs.dump(folder, "aten_graph.py", gm.code)
    if len(unique) < len(kernels):
        logs.log("output_code", "%d fused kernels, %d of them distinct (repeated layers "
                 "share one)", len(kernels), len(unique))
    return CompiledArtifact(src, wrapper.consts, dict(graph.constants),
                            [KernelRecord.of(k) for k in unique.values()],
                            bool(graph.input_copies))


_BUFFER_NAME = re.compile(r"(?<![0-9A-Za-z])(?:arg|buf)\d+(?![0-9])")   # in p_buf3, acc_buf3_in


def _computation_key(kernel: Kernel) -> str:
    """``kernel``'s source with its own name and its buffers' names numbered in order of
    appearance (parameters first), with its launch parameters: kernels with equal keys
    compute the same on their arguments."""
    names: dict[str, str] = {}    # buffer name -> its number in order of first appearance

    def number(m):
        return names.setdefault(m.group(0), f"ember_buffer{len(names)}")
    text = re.sub(rf"\b{kernel.name}(?![0-9])", "ember_kernel", kernel.source)
    text = _BUFFER_NAME.sub(number, text)
    return f"{text}\n{getattr(kernel, 'grid', None)!r} {getattr(kernel, 'config', None)!r}"


def instantiate(artifact: CompiledArtifact, target: Target) -> Callable:
    """Build (or load) the kernels and run the wrapper's module: the compiled callable."""
    with metrics.timed("kernel build"):
        namespace: dict = target.build(artifact.kernels)
    namespace.update(artifact.consts)
    namespace.update(artifact.constants)
    src = artifact.wrapper
    exec(compile(src, "<ember wrapper>", "exec"), namespace)
    metrics.generated_kernel_count += len(artifact.kernels)
    kernel_source = target.full_source(artifact.kernels) if artifact.kernels else ""
    if logs.enabled("output_code"):
        logs.log("output_code", "wrapper:\n%s\nkernels:\n%s", src, kernel_source)
    folder = logs.debug_frame_dir("backend")
    if folder is not None:
        logs.dump(folder, "wrapper.py", src)
        logs.dump(folder, "kernels" + target.source_suffix, kernel_source)
    generated_sources.append(src)
    generated_sources.extend(k.source for k in artifact.kernels)
    del generated_sources[:-_GENERATED_SOURCES_KEPT]
    call = namespace["call"]
    compiled = lambda *args: call(list(args))  # noqa: E731
    # ``call_boxed(inputs)`` empties the list it is given: an input the caller no longer
    # holds is freed at its last use (the training backward's saved tensors)
    compiled.call_boxed = call
    compiled.source = src
    compiled.kernel_sources = [k.source for k in artifact.kernels]
    compiled.mutates_inputs = artifact.mutates_inputs
    return compiled
