"""The "ember" backend: aot -> lower -> schedule -> codegen -> build -> a callable.

    compiled = compile_graph(gm, example_inputs)    # compiled(*inputs) == gm(*inputs)

CPU graphs get C++/OpenMP kernels. What this version does not compile it still runs
correctly: training graphs (inputs that require grad) and non-CPU graphs run the captured
graph as it is (the Triton target and the joint forward/backward graph come later); an op
without a lowering runs its ATen kernel from the generated wrapper.
"""
from __future__ import annotations

import ctypes
import time
from typing import Callable

import torch

from ember import config, logs
from ember.backend import metrics
from ember.backend.codegen.cpp import PRELUDE, CppKernel
from ember.backend.codegen.wrapper import WrapperCodegen
from ember.backend.graph import GraphLowering
from ember.backend.ir import Buffer, ReinterpretView
from ember.backend.scheduler import FusedKernel, schedule


generated_sources: list[str] = []   # wrapper and kernel sources, for tests and tools


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, **options) -> Callable:
    from ember.aot import trace_to_aten
    from ember.decomp import core_decompositions
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if any(t.device.type != "cpu" for t in tensors):
        logs.log("perf_hints", "ember backend: non-CPU graph runs as captured (no GPU codegen "
                               "yet)")
        return gm.forward
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        logs.log("perf_hints", "ember backend: training graph runs as captured (no joint "
                               "graph yet)")
        return gm.forward
    start = time.perf_counter()
    try:
        aten_graph = trace_to_aten(gm, example_inputs, decompositions=core_decompositions())
    except NotImplementedError as e:
        logs.log("perf_hints", "ember backend: ATen tracing declined (%s); graph runs as "
                               "captured", e)
        return gm.forward
    try:
        compiled = compile_aten(aten_graph.gm, example_inputs)
    except Exception as e:
        if not config.suppress_errors:
            raise
        logs.warn("ember backend: code generation failed (%s: %s); running the graph as "
                  "captured", type(e).__name__, e)
        return gm.forward
    logs.log("output_code", "compiled %d-node graph in %.3f s", len(gm.graph.nodes),
             time.perf_counter() - start)
    return compiled


def compile_aten(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    from ember.backend import build
    graph = GraphLowering(gm, example_inputs).run()
    output_names = {o.name if isinstance(o, Buffer) else o.data.name
                    for o in graph.outputs if isinstance(o, (Buffer, ReinterpretView))}
    steps = schedule(graph.buffers, output_names)
    dtypes = {b.name: b.get_dtype() for b in [*graph.inputs, *graph.buffers]
              if b.layout is not None}
    kernels: dict[int, CppKernel] = {}
    sources = []
    for step in steps:
        if isinstance(step, FusedKernel):
            kernel = CppKernel(step, f"kernel{len(kernels)}", dtypes)
            source = kernel.generate()
            kernel.source = source
            kernels[id(step)] = kernel
            sources.append(PRELUDE + "\n" + source)
    libs = build.compile_many(sources) if sources else []
    wrapper = WrapperCodegen(graph, steps, kernels)
    src = wrapper.generate()
    namespace: dict = dict(wrapper.consts)
    namespace.update(graph.constants)
    for kernel, lib in zip(kernels.values(), libs):
        namespace[kernel.name] = build.kernel_function(lib, kernel.name, len(kernel.args))
        if kernel.uses_indirect:
            oob = getattr(lib, f"{kernel.name}_oob")
            oob.restype, oob.argtypes = ctypes.c_int, []
            namespace[f"{kernel.name}_oob"] = oob
    exec(compile(src, "<ember wrapper>", "exec"), namespace)
    metrics.generated_kernel_count += len(kernels)
    if logs.enabled("output_code"):
        logs.log("output_code", "wrapper:\n%s\nkernels:\n%s", src,
                 "\n".join(k.source for k in kernels.values()))
    folder = logs.debug_frame_dir("backend")
    if folder is not None:
        logs.dump(folder, "wrapper.py", src)
        logs.dump(folder, "kernels.cpp", PRELUDE + "\n" + "\n".join(k.source for k in kernels.values()))
        logs.dump(folder, "aten_graph.py", gm.code)
    generated_sources.append(src)
    generated_sources.extend(k.source for k in kernels.values())
    call = namespace["call"]
    compiled = lambda *args: call(list(args))  # noqa: E731
    compiled.source = src
    compiled.kernel_sources = [k.source for k in kernels.values()]
    return compiled
