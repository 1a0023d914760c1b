"""The stages of compiling one captured graph, in order: ``STAGES``, and within its
``generate`` stage, ``CODEGEN_STAGES``.

    compiled = run(Compilation(gm, example_inputs, options, recompile))

Design: each stage is a named function of one :class:`Compilation` (the graph's way through
the backend: the target, the ATen graph, the artifact, the callable), so the order of the
passes reads from one list, and a stage is added, moved or timed without touching the
others. A stage ends the compilation by setting ``result`` (the graph runs as captured, or
a training graph went its own way); a graph cache hit skips the stages that would build
what the cache holds (``skip_to``). ``compile.compile_graph`` checks the options and runs
``STAGES``; ``compile.compile_aten`` runs ``generate`` and ``instantiate`` on an ATen graph
(the training halves, tests).
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from typing import Any, Callable, NamedTuple

import torch

from ember import config, logs
from ember.aot.autocast import autocast_off, run_without_autocast
from ember.backend import compile_stats
from ember.backend.codegen.common import Kernel
from ember.backend.codegen.kernel_names import PROVISIONAL_NAME, kernel_name, step_origins
from ember.backend.codegen.wrapper import WrapperCodegen
from ember.backend.graph import GraphLowering
from ember.backend.ir import Buffer, ReinterpretView
from ember.backend.passes.attention_masks import simplify_constant_masks
from ember.backend.passes.constant_folding import fold_constant_fallbacks
from ember.backend.passes.conv_taps import drop_dead_taps
from ember.backend.passes.layout import changed_output, in_best_layout
from ember.backend.runtime import eager_choice, graph_cache
from ember.backend.runtime.graph_cache import CompiledArtifact, KernelRecord
from ember.backend.scheduler import FusionGroup, reuse_dying_inputs, schedule
from ember.backend.targets import Target, kernel_device, target_for

generated_sources: list[str] = []   # wrapper and kernel sources, for tests and tools
_GENERATED_SOURCES_KEPT = 1000      # the latest ones (bounded memory); ember.reset() clears


class Stage(NamedTuple):
    name: str
    run: Callable[[Any], None]
    timed: str | None = None     # the ``compile_stats.compile_seconds`` entry it adds its time to


@dataclasses.dataclass
class Compilation:
    """One captured graph on its way through ``STAGES``."""
    gm: torch.fx.GraphModule
    example_inputs: list
    options: dict                 # the checked ember options (compile_graph's keywords)
    recompile: Callable           # compile_graph(gm, inputs, **options), for frozen guards
    device: torch.device | None = None
    target: Target | None = None
    in_autocast: bool = False     # compiled and run with autocast off, then wrapped
    start: float = 0.0
    stages_before: dict = dataclasses.field(default_factory=dict)
    cache_key: str | None = None
    aten_gm: torch.fx.GraphModule | None = None
    frozen: Any = None            # passes.freezing.FrozenGraph
    artifact: CompiledArtifact | None = None
    program: Callable | None = None   # the generated program (``instantiate``'s callable)
    compiled: Callable | None = None  # it, wrapped by the stages after "build"
    result: Callable | None = None    # set: the compilation ends with it
    skip_to: str | None = None        # set: the next stage to run


def run(c: Compilation, stages: list[Stage] | None = None) -> Callable:
    """Run ``stages`` (``STAGES``) on ``c`` in order; the compiled callable."""
    stages = STAGES if stages is None else stages
    i = 0
    while c.result is None and i < len(stages):
        stage = stages[i]
        with compile_stats.timed(stage.timed) if stage.timed else contextlib.nullcontext():
            stage.run(c)
        i += 1
        if c.skip_to is not None:
            i = [s.name for s in stages].index(c.skip_to)
            c.skip_to = None
    return c.result


# -- the stages of one graph ------------------------------------------------------------

def choose_target(c: Compilation) -> None:
    """The device whose tensors get generated kernels and its target (``targets/``)."""
    tensors = [t for t in c.example_inputs if isinstance(t, torch.Tensor)]
    c.device = kernel_device(tensors)
    options = c.options
    try:
        c.target = target_for(c.device, options["cpu_backend"], debug=options["debug"],
                              autotune=options["max_autotune"])
    except NotImplementedError as e:
        unsupported = e
    if options["max_autotune"] and c.target is not None and not c.target.tunes_kernels:
        logs.log("perf_hints", "ember backend: max_autotune=True, but C++ kernels have no "
                               "configurations to time (it tunes Triton kernels)")
    if options["cudagraphs"] and (c.target is None or not c.target.supports_cudagraphs):
        logs.log("perf_hints", "ember backend: cudagraphs=True, but CUDA graphs are not used: "
                               "graph is on %s", c.device.type)
    if c.target is None:
        logs.log("perf_hints", "ember backend: %s; graph runs as captured", unsupported)
        c.result = c.gm.forward


def simplify_attention_masks(c: Compilation) -> None:
    """Attention masks computed from no input, dropped or made ``is_causal``."""
    simplify_constant_masks(c.gm, c.example_inputs)


def compile_training_graph(c: Compilation) -> None:
    """A graph that may record gradients: a joint forward/backward graph, partitioned, both
    halves compiled by ``compile_aten`` and run by an ``autograd.Function``
    (``ember.aot.training``); the compilation ends here."""
    from ember.aot import enables_grad, may_record_grad
    tensors = [t for t in c.example_inputs if isinstance(t, torch.Tensor)]
    if not may_record_grad(tensors, enables_grad(c.gm)):
        return
    if c.options["freezing"]:
        logs.warn("ember backend: freezing=True is for inference (call under "
                  "torch.no_grad()); this graph needs gradients and is not frozen")
    c.result = _compile_training(c.gm, c.example_inputs, c.target, c.device,
                                 c.options["fallback_random"])
    if c.options["cudagraphs"] and c.target.supports_cudagraphs:
        from ember.backend.runtime import cudagraphs
        c.result = cudagraphs.replay(c.result, c.gm, c.example_inputs, training=True)
    if c.result != c.gm.forward:      # (a declined graph runs as captured: eager already)
        c.result = eager_choice.choose(c.result, c.gm, c.options, c.target, None,
                                       training=True)


def load_from_graph_cache(c: Compilation) -> None:
    """A graph compiled before for the same inputs: its wrapper and kernels loaded from the
    graph cache, and on to "cuda graphs"."""
    # the traced graph holds autocast's casts: compiled and run with autocast off
    # (``ember.aot.autocast``); the trace itself runs under it, as eager's ops do
    c.in_autocast = torch._C._is_any_autocast_enabled()
    c.start = time.perf_counter()
    c.cache_key = None if c.options["freezing"] or not graph_cache.enabled() else \
        graph_cache.key(c.gm, c.example_inputs, c.options, c.target)
    artifact = graph_cache.load(c.cache_key) if c.cache_key else None
    if artifact is not None:
        try:
            with autocast_off():
                c.compiled = c.program = instantiate(artifact, c.target)
        except Exception as e:     # noqa: BLE001 (an entry that does not load: compiled again)
            graph_cache.discard(c.cache_key, e)
            artifact = None
    if artifact is not None:
        logs.log("output_code", "graph cache hit: %d kernels loaded in %.3f s",
                 len(artifact.kernels), time.perf_counter() - c.start)
        c.skip_to = "cuda graphs"
    c.stages_before = dict(compile_stats.compile_seconds)


def trace_in_best_layout(c: Compilation) -> None:
    """Convolution taps that read only padding dropped, the layout chosen (channels-last
    convolutions where the target prefers them) and the graph traced to ATen ops."""
    from ember.aot import trace_to_aten
    from ember.decomp import core_decompositions
    gm, example_inputs = c.gm, c.example_inputs
    try:
        aten_graph = in_best_layout(
            drop_dead_taps(gm), c.target, False,
            lambda g: trace_to_aten(g, example_inputs, decompositions=core_decompositions()),
            check=lambda traced: changed_output(gm, traced.gm))
    except NotImplementedError as e:
        logs.log("perf_hints", "ember backend: ATen tracing declined (%s); graph runs as "
                               "captured", e)
        c.result = gm.forward
        return
    c.aten_gm = aten_graph.gm


@contextlib.contextmanager
def _generating(c: Compilation):
    """Autocast off; a failure ends the compilation with the graph as captured, said
    (``config.suppress_errors``), else raises."""
    try:
        with autocast_off():
            yield
    except Exception as e:
        if not config.suppress_errors:
            raise
        c.result = _as_captured_after(c.gm, e, "code generation")


def freeze_parameters(c: Compilation) -> None:
    """``freezing=True``: parameters and buffers folded as guarded constants
    (passes/freezing.py)."""
    if c.options["freezing"]:
        from ember.backend.passes.freezing import freeze
        with _generating(c):
            c.frozen = freeze(c.gm, c.aten_gm, c.example_inputs)


def generate_code(c: Compilation) -> None:
    """``CODEGEN_STAGES`` on the ATen graph: the wrapper's and kernels' sources."""
    with _generating(c):
        c.artifact = generate(c.aten_gm, c.example_inputs, c.target, c.device,
                              fused_random=not c.options["fallback_random"])


def build_kernels(c: Compilation) -> None:
    """The kernels compiled (or loaded) and the wrapper run: the compiled callable."""
    with _generating(c):
        c.compiled = c.program = instantiate(c.artifact, c.target)
    if c.result is None:
        logs.log("output_code", "compiled %d-node graph in %.3f s", len(c.gm.graph.nodes),
                 time.perf_counter() - c.start)
        log_stage_times(c.gm, c.stages_before, time.perf_counter() - c.start)


def store_in_graph_cache(c: Compilation) -> None:
    if c.cache_key:
        graph_cache.store(c.cache_key, c.artifact)


def replay_as_cuda_graph(c: Compilation) -> None:
    """``cudagraphs=True``: the compiled graph replayed as a CUDA graph where the target
    supports it and the graph writes none of its inputs (runtime/cudagraphs.py)."""
    if not (c.options["cudagraphs"] and c.target.supports_cudagraphs):
        return
    from ember.backend.runtime import cudagraphs
    c.compiled = cudagraphs.replay(c.compiled, c.gm, c.example_inputs)


def guard_frozen(c: Compilation) -> None:
    """A frozen graph checks its frozen tensors on every call and recompiles on a change."""
    if c.frozen is not None:
        gm, recompile = c.gm, c.recompile
        c.compiled = c.frozen.guard(c.compiled, lambda args: recompile(gm, args))


def run_outside_autocast(c: Compilation) -> None:
    """Compiled inside an autocast region: the callable turns autocast off around a call."""
    if c.in_autocast:
        c.compiled = run_without_autocast(c.compiled)


def choose_eager_or_compiled(c: Compilation) -> None:
    """The compiled callable, or the captured graph run eagerly where its first call measures
    that faster (``eager_choice`` option; runtime/eager_choice.py)."""
    rewritten = c.frozen is not None or (c.options["cudagraphs"] and
                                         c.target.supports_cudagraphs)
    c.result = eager_choice.choose(c.compiled, c.gm, c.options, c.target, c.program,
                                   rewritten=rewritten)


STAGES = [
    Stage("target", choose_target),
    Stage("attention masks", simplify_attention_masks),
    Stage("training", compile_training_graph),
    Stage("graph cache", load_from_graph_cache),
    Stage("aten trace", trace_in_best_layout, timed="aot trace"),
    Stage("freezing", freeze_parameters),
    Stage("generate", generate_code),
    Stage("build", build_kernels),
    Stage("graph cache store", store_in_graph_cache),
    Stage("cuda graphs", replay_as_cuda_graph),
    Stage("frozen guard", guard_frozen),
    Stage("autocast", run_outside_autocast),
    Stage("eager choice", choose_eager_or_compiled),
]


def log_stage_times(gm: torch.fx.GraphModule, before: dict, total: float,
                    how: str = "") -> None:
    """``EMBER_LOGS=compile_time``: the seconds of each stage since ``before``."""
    if logs.enabled("compile_time"):
        stages = ", ".join(f"{stage} {seconds - before.get(stage, 0.0):.2f} s"
                           for stage, seconds in compile_stats.compile_seconds.items()
                           if seconds - before.get(stage, 0.0) >= 0.005)
        logs.log("compile_time", "%d-node graph compiled %sin %.2f s: %s", len(gm.graph.nodes),
                 how, total, stages)


def _compile_training(gm: torch.fx.GraphModule, example_inputs: list, target: Target,
                      device: torch.device, fallback_random: bool) -> Callable:
    from ember.aot import enables_grad
    from ember.aot.training import compile_training
    from ember.decomp import core_decompositions
    if enables_grad(gm) and not torch.is_grad_enabled():
        logs.log("perf_hints", "ember backend: graph entered with grad off turns it on; runs "
                               "as captured")
        return gm.forward
    start = time.perf_counter()

    def compile_half(g: torch.fx.GraphModule, inputs: list) -> Callable:
        # through the module, at each call: tests replace compile.compile_aten
        from ember.backend import compile as backend_compile
        return backend_compile.compile_aten(g, inputs, target, device,
                                            fused_random=not fallback_random)

    # channels-last convolutions when asked: the weights' gradients come back in the
    # parameters' own layout through the conversion's backward
    def build(traced: torch.fx.GraphModule) -> Callable:
        return compile_training(traced, example_inputs, decompositions=core_decompositions(),
                                compile_graph=compile_half)
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


# -- code generation: an ATen graph to a wrapper and kernels --------------------------------

@dataclasses.dataclass
class Generation:
    """An ATen graph on its way through ``CODEGEN_STAGES``."""
    gm: torch.fx.GraphModule
    example_inputs: list
    target: Target
    device: torch.device
    fused_random: bool
    graph: GraphLowering | None = None
    output_names: set = dataclasses.field(default_factory=set)
    steps: list = dataclasses.field(default_factory=list)
    artifact: CompiledArtifact | None = None


def fold_constants(g: Generation) -> None:
    """Constant values that need ATen fallbacks computed once (passes/constant_folding.py)."""
    fold_constant_fallbacks(g.gm, g.device)


def lower(g: Generation) -> None:
    """Each ATen op to loop IR, or a fallback (lowering/, graph.py)."""
    g.graph = GraphLowering(g.gm, g.example_inputs, g.target, g.device, g.fused_random).run()
    g.output_names = {o.name if isinstance(o, Buffer) else o.data.name
                      for o in g.graph.outputs if isinstance(o, (Buffer, ReinterpretView))}


def schedule_kernels(g: Generation) -> None:
    """Buffers fused into kernels (scheduler.py)."""
    g.steps = schedule(g.graph.buffers, g.output_names,
                       share_only=g.target.regroups_only_to_share_loads,
                       across=g.target.sums_across_rows)


def fuse_templates(g: Generation) -> None:
    """Library calls merged with the kernel after them where the target generates both
    (``Target.fuse_templates``)."""
    g.steps = g.target.fuse_templates(g.steps, g.output_names)


def reuse_buffers(g: Generation) -> None:
    """Kernels write into the memory of inputs that die at them (scheduler.py)."""
    reuse_dying_inputs(g.steps, g.output_names)


def generate_sources(g: Generation) -> None:
    """The kernels' sources (one per distinct computation) and the wrapper's."""
    graph, target = g.graph, g.target
    layouts = {b.name: b.layout for b in [*graph.inputs, *graph.constant_buffers, *graph.buffers]
               if b.layout is not None}
    dtypes = {name: layout.dtype for name, layout in layouts.items()}
    numels = {}      # storage elements of each buffer, for the targets' index widths
    for name, layout in layouts.items():
        n = layout.storage_numel()
        numels[name] = int(n) if n.is_Integer else n    # (an expression: symbolic sizes)
    kernels: dict[int, Kernel] = {}
    unique: dict[str, Kernel] = {}     # same computation on other buffers -> its first kernel
    for step in g.steps:
        if isinstance(step, FusionGroup):
            kernel = target.make_kernel(step, PROVISIONAL_NAME, dtypes)
            kernel.numels = numels
            kernel.source = kernel.generate()
            first = unique.setdefault(_computation_key(kernel), kernel)
            if first is kernel:     # named for what it computes, once its kind is known
                kernel.rename(kernel_name(kernel.kind, step_origins(step), len(unique) - 1))
            kernel.name = first.name    # repeated layers launch one compiled kernel
            kernels[id(step)] = kernel
    wrapper = WrapperCodegen(graph, g.steps, kernels)
    src = wrapper.generate()
    folder = logs.debug_frame_dir("backend")
    if folder is not None:
        logs.dump(folder, "aten_graph.py", g.gm.code)
    if len(unique) < len(kernels):
        logs.log("output_code", "%d fused kernels, %d of them distinct (repeated layers "
                 "share one)", len(kernels), len(unique))
    g.artifact = CompiledArtifact(src, wrapper.consts, dict(graph.constants),
                                  [KernelRecord.of(k) for k in unique.values()],
                                  bool(graph.input_copies))


CODEGEN_STAGES = [
    Stage("constant folding", fold_constants, timed="lowering"),
    Stage("lowering", lower, timed="lowering"),
    Stage("scheduling", schedule_kernels, timed="scheduling"),
    Stage("templates", fuse_templates, timed="scheduling"),
    Stage("buffer reuse", reuse_buffers, timed="scheduling"),
    Stage("code generation", generate_sources, timed="code generation"),
]


def generate(gm: torch.fx.GraphModule, example_inputs: list, target: Target,
             device: torch.device, fused_random: bool = False) -> CompiledArtifact:
    """Lower, schedule and generate the wrapper and kernels of an ATen graph."""
    g = Generation(gm, example_inputs, target, device, fused_random)
    for stage in CODEGEN_STAGES:
        with compile_stats.timed(stage.timed):
            stage.run(g)
    return g.artifact


# a buffer's name, as it appears in p_buf3, acc_buf3_in
_BUFFER_NAME = re.compile(r"(?<![0-9A-Za-z])(?:arg|buf|const)\d+(?![0-9])")


def _computation_key(kernel: Kernel) -> str:
    """``kernel``'s source with its own name and its buffers' names numbered in order of
    appearance (parameters first), with its launch parameters: kernels with equal keys
    compute the same on their arguments."""
    names: dict[str, str] = {}    # buffer name -> its number in order of first appearance

    def number(m):
        return names.setdefault(m.group(0), f"ember_buffer{len(names)}")
    text = re.sub(rf"\b{kernel.name}(?![0-9])", PROVISIONAL_NAME, kernel.source)
    text = _BUFFER_NAME.sub(number, text)
    return f"{text}\n{getattr(kernel, 'grid', None)!r} {getattr(kernel, 'config', None)!r}"


def instantiate(artifact: CompiledArtifact, target: Target) -> Callable:
    """Build (or load) the kernels and run the wrapper's module: the compiled callable."""
    with compile_stats.timed("kernel build"):
        namespace: dict = target.build(artifact.kernels)
    namespace.update(artifact.consts)
    namespace.update(artifact.constants)
    src = artifact.wrapper
    exec(compile(src, "<ember wrapper>", "exec"), namespace)
    compile_stats.generated_kernel_count += len(artifact.kernels)
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
