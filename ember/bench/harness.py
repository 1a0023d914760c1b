"""Measure one model or kernel in one process, side by side: eager, ``ember.compile`` (default,
``reduce-overhead`` and ``max-autotune`` modes) and, as a peer, ``torch.compile``.

Decisions:

- Variants (``VARIANTS``, the names ``ember bench --compilers`` takes): ``eager`` (always
  measured: the baseline), ``ember`` (``ember.compile(fn)``), ``ember-reduce-overhead`` and
  ``ember-max-autotune`` (``ember.compile(fn, mode=...)``), ``torch-inductor``
  (``torch.compile(fn)``) and ``torch-inductor-reduce-overhead``. A ``module:callable`` (or
  ``file.py:callable``) is a user's compiler: ``callable(model) -> compiled model``. A variant
  that fails to compile, to run its first call, or later while it is timed, becomes "n/a" with
  a note (``Variant.error``); the others go on.
- One row, the variants timed in alternating rounds (eager, ember, ..., eager, ...), so a slow
  spell of the machine hits all of them alike; each variant's time is the median over its
  rounds. On the CPU a call is timed with ``time.perf_counter``. On CUDA the stream is
  synchronized, then a pair of ``torch.cuda.Event`` is recorded around the call: the time
  covers the GPU work and any launch gaps between kernels (what reduce-overhead removes), not
  just the launches. ``host_ms`` is the CPU time until the call returns (on CUDA: guards,
  Python and launches, without waiting for the GPU).
- ``mode="infer"``: the model is in ``eval()`` mode and every call runs under
  ``torch.no_grad()``. ``mode="train"``: a call is one training step without the optimizer:
  forward, the sum of the outputs as the loss, backward (gradients are cleared first).
- Correctness (``ember.bench.accuracy``): the model and inputs cast up to float64 (float32 for
  half-precision runs) give an eager reference; each variant's first-call outputs, and in
  training its gradients, are checked against it (``Variant.correct``, ``rel_err``).
  ``max_abs_err`` is the largest difference from eager's outputs in the run's dtype.
- ``first_call_s`` is the wall time of a compiled variant's first call (capture + compile +
  run); the frontend's modules are imported beforehand, so it excludes Python imports. Whether
  it is cold depends on the on-disk caches: ``ember bench`` runs each model in a fresh process
  with empty cache folders (cold), then again with ``first_calls_only`` in a second process
  that reuses them (warm).
- Per compiled Ember variant: graphs the frontend handed to the backend, graph breaks, frames
  run eagerly, kernels generated and ops that fell back to ATen, from ``ember.metrics`` and
  ``ember.backend.compile_stats`` counted across its first call. The ``ember`` variant's
  graphs are also counted by a wrapper around the backend (what the backend really received).
- Memory: on CUDA each variant's ``peak_mem_mb`` is the most memory one steady-state call
  allocates beyond what was allocated before it (activations and workspace: the weights and
  inputs are shared by all variants; in training also the gradients and what the forward
  saves for the backward), and ``Row.memory_vs_eager`` its ratio to eager's (variants that
  replay CUDA graphs have none: a replay allocates nothing, its memory is the graph's private
  pool, held from capture on); the row's
  ``peak_rss_mb`` is the process's peak resident memory (on the CPU the only measure: each
  model has its own process under ``ember bench``).
- torch.compile may fail or take long on a model; its errors become "n/a" with a note, and on
  the main thread a SIGALRM budget interrupts a compile that runs past ``torch_compile_budget_s``
  (``torch.compiler.reset()`` runs after each row). DESIGN.md §4: this package is the only
  place in ``ember/`` allowed to call torch.compile.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import resource
import signal
import statistics
import threading
import time
import traceback
from typing import Any, Callable

import torch

import ember
import ember.frontend.convert  # noqa: F401  imported now so compile_s excludes module imports
from ember import metrics
from ember.backend import compile_stats
from ember.backend_registry import lookup_backend
from ember.bench import accuracy, kernels, zoo

VARIANTS = ("eager", "ember", "ember-reduce-overhead", "ember-max-autotune", "torch-inductor",
            "torch-inductor-reduce-overhead")
# replay CUDA graphs on the GPU: a call's peak allocation says nothing of their memory
CUDA_GRAPH_VARIANTS = ("ember-reduce-overhead", "ember-max-autotune",
                       "torch-inductor-reduce-overhead")
DEFAULT_COMPILERS = ("eager", "ember", "torch-inductor")
EMBER_VARIANTS = ("ember", "ember-reduce-overhead", "ember-max-autotune")
TORCH_VARIANTS = ("torch-inductor", "torch-inductor-reduce-overhead")
MODES = ("infer", "train")
# Short names for table headers.
LABELS = {"eager": "eager", "ember": "ember", "ember-reduce-overhead": "ember-ro",
          "ember-max-autotune": "ember-ma", "torch-inductor": "torch.compile",
          "torch-inductor-reduce-overhead": "torch.compile-ro"}

# variant -> make(fn, backend) -> compiled callable. ``backend`` is ``ember bench --backend``
# (for "ember" wrapped in a graph-counting backend).
COMPILERS: dict[str, Callable[[Callable, Any], Callable]] = {
    "ember": lambda fn, backend: ember.compile(fn, backend=backend),
    "ember-reduce-overhead":
        lambda fn, backend: ember.compile(fn, backend=backend, mode="reduce-overhead"),
    "ember-max-autotune":
        lambda fn, backend: ember.compile(fn, backend=backend, mode="max-autotune"),
    "torch-inductor": lambda fn, backend: torch.compile(fn),
    "torch-inductor-reduce-overhead":
        lambda fn, backend: torch.compile(fn, mode="reduce-overhead"),
}


def is_user_compiler(name: str) -> bool:
    return ":" in name


def label(variant: str) -> str:
    """The short name of a variant for table headers (a user compiler: its callable's name)."""
    return LABELS.get(variant, variant.rsplit(":", 1)[-1])


def compiler(name: str) -> Callable[[Callable, Any], Callable]:
    """make(fn, backend) of a variant: a ``COMPILERS`` entry or a user's ``module:callable``."""
    if name in COMPILERS:
        return COMPILERS[name]
    make = zoo.load_callable(name)
    return lambda fn, backend: make(fn)


def resolve_compilers(names=None, with_torch_compile: bool = True) -> tuple[str, ...]:
    """The variants to measure, in ``VARIANTS`` order, ``eager`` always first, then users'
    ``module:callable`` compilers in the order given.

    ``names``: variant names (an iterable, or a comma-separated string; ``"all"`` is every
    variant); None means ``DEFAULT_COMPILERS``. ``with_torch_compile=False`` drops the
    torch-inductor variants. Unknown names raise ValueError."""
    if names is None:
        names = DEFAULT_COMPILERS
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = list(names)
    if "all" in names:
        names = [n for n in names if n != "all"] + list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS and not is_user_compiler(n)]
    if unknown:
        raise ValueError(f"unknown compiler(s): {', '.join(unknown)}; known: "
                         f"{', '.join(VARIANTS)} (or all, or module:callable)")
    builtin = tuple(v for v in VARIANTS if v == "eager" or (
        v in names and (with_torch_compile or v not in TORCH_VARIANTS)))
    return builtin + tuple(dict.fromkeys(n for n in names if is_user_compiler(n)))


@dataclasses.dataclass
class Variant:
    """One variant's results on one row; None: not measured (``error`` says why)."""
    ms: float | None = None              # median time of one call
    host_ms: float | None = None         # median CPU time until the call returned
    first_call_s: float | None = None    # compile + first run (cold under ember bench)
    warm_compile_s: float | None = None  # the same in a second process, caches warm
    max_abs_err: float | None = None     # against eager, over every output tensor
    correct: bool | None = None          # against the float64 reference (accuracy.check)
    rel_err: float | None = None         # largest relative RMS error against the reference
    graphs: int | None = None            # Ember variants: graphs handed to the backend
    graph_breaks: int | None = None
    frames_eager: int | None = None      # frames the frontend ran eagerly
    kernels: int | None = None           # kernels generated
    fallbacks: int | None = None         # ops that ran their ATen kernel
    peak_mem_mb: float | None = None     # CUDA: memory one call needs beyond what was held
    error: str | None = None


@dataclasses.dataclass
class Row:
    model: str
    device: str
    backend: str
    eager_ms: float | None
    ember_ms: float | None = None
    torch_compile_ms: float | None = None
    max_abs_err: float | None = None        # ember vs eager, over every output tensor
    graphs: int | None = None               # graphs the backend received
    graph_breaks: int | None = None
    frames_eager: int | None = None         # frames the frontend ran eagerly (not captured)
    compile_s: float | None = None          # ember's cold first call
    torch_compile_s: float | None = None    # torch.compile's cold first call
    notes: list[str] = dataclasses.field(default_factory=list)
    kind: str = "model"                     # "model" (ember.bench.zoo) or "kernel"
    dtype: str | None = None                # the floating-point dtype of weights and inputs
    batch_size: int | None = None           # models only
    inputs: list[str] = dataclasses.field(default_factory=list)   # "64x3x224x224 bfloat16"
    # every requested variant, eager included, by its VARIANTS name
    variants: dict[str, Variant] = dataclasses.field(default_factory=dict)
    bytes_moved: int | None = None          # kernels: minimum bytes read + written per call
    copy_ms: float | None = None            # kernels: copy_ of bytes_moved bytes, same rounds
    suite: str | None = None                # the suite that selected the row (None: --models)
    mode: str = "infer"                     # "infer" or "train"
    amp: str | None = None                  # autocast dtype (float32 weights), or None
    reference_dtype: str | None = None      # the eager reference's dtype (None: no reference)
    peak_rss_mb: float | None = None        # the measuring process's peak resident memory
    # "ok", or why the row has no numbers: "error" (it could not be built or eager failed),
    # "timeout", "crashed" (under ember bench's process isolation); not measured: "skipped"
    # (--budget), "not run" (the run stopped before it), "interrupted" (stopped during it)
    status: str = "ok"
    error: str | None = None

    @property
    def speedup(self) -> float | None:
        """eager time / ember time: above 1 means ember is faster than eager."""
        return _ratio(self.eager_ms, self.ember_ms)

    @property
    def vs_torch_compile(self) -> float | None:
        """torch.compile time / ember time: above 1 means ember is faster than torch.compile."""
        return _ratio(self.torch_compile_ms, self.ember_ms)

    def ms(self, variant: str) -> float | None:
        """Median ms of one call of ``variant`` (a ``VARIANTS`` name), None if not measured."""
        legacy = {"eager": self.eager_ms, "ember": self.ember_ms,
                  "torch-inductor": self.torch_compile_ms}
        if variant in legacy:
            return legacy[variant]
        result = self.variants.get(variant)
        return None if result is None else result.ms

    def speedup_of(self, variant: str) -> float | None:
        """eager time / ``variant``'s time."""
        return _ratio(self.eager_ms, self.ms(variant))

    def memory_vs_eager(self, variant: str) -> float | None:
        """CUDA: ``variant``'s peak memory of one call over eager's (below 1: it needs less)."""
        eager, result = self.variants.get("eager"), self.variants.get(variant)
        if eager is None or result is None:
            return None
        return _ratio(result.peak_mem_mb, eager.peak_mem_mb)

    @property
    def copy_gbps(self) -> float | None:
        return self._gbps(self.copy_ms)

    def gbps(self, variant: str) -> float | None:
        """Kernels: bytes_moved / time of one call, in GB/s (10^9 bytes per second)."""
        return self._gbps(self.ms(variant))

    def fraction_of_copy(self, variant: str) -> float | None:
        """Kernels: the variant's GB/s over copy_'s GB/s (1.0: as fast as a copy)."""
        return _ratio(self.copy_ms, self.ms(variant))

    def _gbps(self, ms: float | None) -> float | None:
        if self.bytes_moved is None or not ms:
            return None
        return self.bytes_moved / (ms * 1e6)

    def as_dict(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self), "speedup": self.speedup,
               "vs_torch_compile": self.vs_torch_compile,
               "speedup_reduce_overhead": _ratio(self.eager_ms,
                                                 self.ms("ember-reduce-overhead")),
               "vs_torch_compile_reduce_overhead": _ratio(
                   self.ms("torch-inductor-reduce-overhead"), self.ms("ember-reduce-overhead"))}
        for name, variant in out["variants"].items():
            variant["speedup"] = self.speedup_of(name)
            variant["peak_mem_vs_eager"] = self.memory_vs_eager(name)
        if self.kind == "kernel":
            out["copy_gbps"] = self.copy_gbps
            for name, variant in out["variants"].items():
                variant["gbps"] = self.gbps(name)
                variant["fraction_of_copy"] = self.fraction_of_copy(name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Row":
        """The row ``as_dict`` wrote (derived numbers are dropped and recomputed)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        variant_fields = {f.name for f in dataclasses.fields(Variant)}
        row = cls(**{k: v for k, v in data.items() if k in fields and k != "variants"})
        row.variants = {name: Variant(**{k: v for k, v in variant.items()
                                         if k in variant_fields})
                        for name, variant in data.get("variants", {}).items()}
        return row


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


class GraphCountingBackend:
    """Wraps a backend and counts the graphs it is handed."""

    def __init__(self, backend: str | Callable):
        self.inner = lookup_backend(backend)
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        return self.inner(gm, example_inputs)


Progress = Callable[[str], None]


def benchmark_model(name: str, device: str = "cpu", backend: str | Callable = "ember", *,
                    iters: int = 20, warmup: int = 3, with_torch_compile: bool = True,
                    torch_compile_budget_s: float | None = 90.0, compilers=None,
                    dtype: torch.dtype | None = None, batch_size: int | None = None,
                    mode: str = "infer", first_calls_only: bool = False,
                    progress: Progress | None = None, amp: torch.dtype | None = None) -> Row:
    """Time ``name`` (a zoo model, or a user's ``module:callable``) eagerly and under each
    compiler of ``compilers`` (see ``resolve_compilers``; default eager, ember and
    torch-inductor), and check each against the float64 reference. ``dtype`` and
    ``batch_size`` default to the model's own (``zoo.build_model``). ``amp``: float32
    weights, autocast to that dtype inside the compiled frame (``zoo.Autocast``).
    ``first_calls_only``: compile and run each variant once, no reference and no timing (the
    warm-compile pass)."""
    spec = zoo.resolve(name)
    _check_counts(iters, warmup)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    variants = resolve_compilers(compilers, with_torch_compile)
    counting_backend = GraphCountingBackend(backend)   # validates the backend name early
    device = torch.device(device)
    batch_size = spec.default_batch_size(device, mode) if batch_size is None else batch_size
    _report(progress, "building")
    model, inputs = zoo.build_model(name, device, dtype=dtype, batch_size=batch_size,
                                    mode=mode, amp=amp)
    row = Row(name, str(device), _backend_name(backend), eager_ms=None, kind="model",
              dtype=_dtype_name(_weights_dtype(model, inputs)), batch_size=batch_size,
              inputs=[describe(t) for t in inputs], suite=spec.suite, mode=mode,
              amp=None if amp is None else _dtype_name(amp))
    measure_row(row, model, inputs, device, backend, counting_backend, variants, iters=iters,
                warmup=warmup, torch_compile_budget_s=torch_compile_budget_s, mode=mode,
                first_calls_only=first_calls_only, progress=progress)
    return row


def benchmark_kernel(name: str, device: str = "cpu", backend: str | Callable = "ember", *,
                     iters: int = 20, warmup: int = 3, with_torch_compile: bool = True,
                     torch_compile_budget_s: float | None = 90.0, compilers=None,
                     dtype: torch.dtype | None = None, tensor_bytes: int | None = None,
                     first_calls_only: bool = False,
                     progress: Progress | None = None) -> Row:
    """Time the kernel row ``name`` (``ember.bench.kernels``) like ``benchmark_model``, and a
    ``copy_`` of the same number of bytes in the same rounds. ``dtype`` defaults to float32,
    ``tensor_bytes`` (bytes of each input) to the device's default."""
    _check_counts(iters, warmup)
    variants = resolve_compilers(compilers, with_torch_compile)
    counting_backend = GraphCountingBackend(backend)
    device = torch.device(device)
    dtype = torch.float32 if dtype is None else dtype
    case = kernels.build_kernel(name, device, dtype, tensor_bytes)
    row = Row(name, str(device), _backend_name(backend), eager_ms=None, kind="kernel",
              dtype=_dtype_name(dtype), inputs=[describe(t) for t in case.inputs],
              bytes_moved=case.bytes_moved, suite="kernels")
    src = torch.randn(case.copy_numel, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    measure_row(row, case.fn, case.inputs, device, backend, counting_backend, variants,
                iters=iters, warmup=warmup, torch_compile_budget_s=torch_compile_budget_s,
                extra_calls={"copy": lambda: dst.copy_(src)},
                first_calls_only=first_calls_only, progress=progress)
    return row


def _report(progress: Progress | None, stage: str) -> None:
    if progress is not None:
        progress(stage)


class _Step:
    """One call of a variant: ``fn(*inputs)``, or in training forward, loss and backward.
    ``result(out)`` is what correctness compares: the outputs, in training with the
    gradients of ``params`` (the model's, read right after the call)."""

    def __init__(self, fn: Callable, inputs: tuple, mode: str,
                 params: list[torch.nn.Parameter]):
        self.fn, self.inputs, self.mode, self.params = fn, inputs, mode, params

    def __call__(self) -> Any:
        if self.mode == "infer":
            return self.fn(*self.inputs)
        for p in self.params:
            p.grad = None
        out = self.fn(*self.inputs)
        _loss(out).backward()
        return out

    def result(self, out: Any) -> Any:
        return out if self.mode == "infer" else (out, [p.grad for p in self.params])


def _loss(out: Any) -> torch.Tensor:
    """The sum of the outputs that require grad, each weighted along its last dim by
    ``linspace(-1, 1)``. A plain sum has no gradient through a final layer norm (its outputs
    sum to zero in every row, and their squares to a constant), so every gradient below it
    would be rounding noise: GPT-2's were, up to 0.3 off the float32 reference under bf16
    autocast even in eager (CPU, batch 2; at most 0.008 with the weights)."""
    terms = []
    for t in accuracy.tensors(out):
        if t is not None and t.requires_grad:
            weights = torch.linspace(-1, 1, t.shape[-1], device=t.device) if t.dim() else 1.0
            terms.append((t.float() * weights).sum())
    if not terms:
        raise RuntimeError("train mode: no output of the model requires grad")
    return torch.stack(terms).sum()


def _trainable(fn: Callable) -> list[torch.nn.Parameter]:
    return [p for p in fn.parameters() if p.requires_grad] \
        if isinstance(fn, torch.nn.Module) else []


def _reference(fn: Callable, inputs: tuple, mode: str, dtype: torch.dtype) -> Any:
    """The eager result (outputs; in training with gradients) of ``fn`` and ``inputs`` cast
    to ``dtype``: a copy of a module, so ``fn`` keeps its own parameters; without autocast."""
    if isinstance(fn, zoo.Autocast):
        fn = fn.model
    ref_fn = copy.deepcopy(fn).to(dtype) if isinstance(fn, torch.nn.Module) else fn
    step = _Step(ref_fn, accuracy.cast_floating(inputs, dtype), mode, _trainable(ref_fn))
    return step.result(step())


def measure_row(row: Row, fn: Callable, inputs: tuple, device: torch.device, backend,
                counting_backend: "GraphCountingBackend", variants: tuple[str, ...], *,
                iters: int, warmup: int, torch_compile_budget_s: float | None,
                extra_calls: dict[str, Callable[[], Any]] | None = None, mode: str = "infer",
                first_calls_only: bool = False, progress: Progress | None = None) -> Row:
    """Compile ``fn`` under each variant, check its first result against the reference, time
    every variant (and ``extra_calls``, e.g. the kernels' copy) side by side, and fill
    ``row``."""
    row.variants = {name: Variant() for name in variants}
    calls: dict[str, Callable[[], Any]] = {}
    params = _trainable(fn) if mode == "train" else []
    run_dtype = _floating_dtype(fn, inputs)
    grad_mode = torch.enable_grad() if mode == "train" else torch.no_grad()
    try:
        with grad_mode:
            _report(progress, "eager")
            eager_step = _Step(fn, inputs, mode, params)
            try:
                expected = eager_step.result(eager_step())
            except Exception as e:
                row.variants["eager"].error = f"failed: {_one_line(e)}"
                row.status, row.error = "error", f"eager failed: {_one_line(e)}"
                row.notes.append(row.error)
                return row
            reference = None
            if not first_calls_only:
                _report(progress, "reference")
                reference = _checked_reference(row, fn, inputs, mode, run_dtype, expected)
            calls.update(extra_calls or {})
            calls["eager"] = eager_step
            ember.reset()
            for name in variants[1:]:
                _report(progress, f"compiling {name}")
                compiled = _first_call(row, name, fn, inputs, expected, reference, run_dtype,
                                       device, counting_backend if name == "ember" else backend,
                                       torch_compile_budget_s, mode, params)
                if compiled is not None:
                    calls[name] = _Step(compiled, inputs, mode, params)
                if name == "ember" and compiled is not None:
                    _count_graphs(row, counting_backend)
            del expected, reference
            if first_calls_only:
                return row
            _report(progress, "timing")
            errors: dict[str, str] = {}
            times = time_calls(calls, device, iters, warmup, errors)
            if device.type == "cuda":
                _report(progress, "memory")
                _measure_memory(row, calls, device, errors, params)
        for name, (ms, host_ms) in times.items():
            if name in row.variants:
                row.variants[name].ms, row.variants[name].host_ms = ms, host_ms
        if "copy" in times:
            row.copy_ms = times["copy"][0]
        for name, error in errors.items():
            if name in row.variants:
                row.variants[name].error = error
            row.notes.append(f"{name} {error}")
    finally:
        _fill_legacy_fields(row)
        row.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        calls.clear()   # drop the compiled callables (and CUDA graphs' memory) before resets
        ember.reset()
        if any(v in TORCH_VARIANTS or is_user_compiler(v) for v in variants):
            torch.compiler.reset()
    return row


def _floating_dtype(fn: Callable, inputs: tuple) -> torch.dtype:
    """The run's floating-point dtype, which sets the tolerance of its results: the autocast
    dtype under ``zoo.Autocast``, else the weights' (``_weights_dtype``)."""
    if isinstance(fn, zoo.Autocast):
        return fn.dtype
    return _weights_dtype(fn, inputs)


def _weights_dtype(fn: Callable, inputs: tuple) -> torch.dtype:
    """The first floating parameter's or input's dtype."""
    tensors = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    tensors += [t for t in accuracy.tensors(inputs) if t is not None]
    return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)


def _checked_reference(row: Row, fn, inputs, mode, run_dtype, expected) -> Any:
    """The reference result, with eager's own error against it on the row; None (and a note)
    when it cannot be computed: variants are then checked against eager."""
    ref_dtype = accuracy.reference_dtype(run_dtype)
    try:
        reference = _reference(fn, inputs, mode, ref_dtype)
    except Exception as e:
        row.notes.append(f"no {_dtype_name(ref_dtype)} reference ({_one_line(e)}): results "
                         f"are checked against eager")
        return None
    row.reference_dtype = _dtype_name(ref_dtype)
    row.variants["eager"].rel_err = max(accuracy.relative_errors(expected, reference),
                                        default=0.0)
    return reference


def _call(fn, inputs):
    return fn(*inputs)


def _first_call(row: Row, name: str, fn, inputs, expected, reference, run_dtype, device,
                backend, budget_s: float | None, mode: str, params):
    """Compile ``fn`` as variant ``name`` and run its first call (timed, under the budget for
    torch.compile), check it, count what Ember made of it: the compiled callable, or None with
    ``error`` and a note on the row."""
    result = row.variants[name]
    is_peer = name in TORCH_VARIANTS
    before = _counters()
    try:
        with _time_limit(budget_s if is_peer else None):
            start = time.perf_counter()   # a user's compiler may compile before the call
            compiled = compiler(name)(fn, backend)
            step = _Step(compiled, inputs, mode, params)
            _, out = _timed_call(step, (), device)
            result.first_call_s = time.perf_counter() - start
        out = step.result(out)
        result.max_abs_err = max_abs_error(out, expected)
        verdict = accuracy.check(out, expected, expected if reference is None else reference,
                                 run_dtype)
        result.correct, result.rel_err = verdict.correct, verdict.rel_err
        if verdict.strides is not None:
            row.notes.append(f"{name}: wrong strides ({verdict.strides})")
        elif not verdict.correct:
            row.notes.append(f"{name}: wrong result (relative error {verdict.rel_err:.1e}, "
                             f"eager's {row.variants['eager'].rel_err or 0:.1e})")
        elif mode == "train" and row.amp is not None and reference is not None:
            _check_amp_gradients(row, name, fn, params, out, expected, reference)
        del out
        if name in EMBER_VARIANTS:
            _store_counts(result, before, _counters())
            if result.frames_eager and name != "ember":   # "ember": see _count_graphs
                row.notes.append(f"{name} ran {result.frames_eager} frame(s) eagerly")
        return compiled
    except (_BudgetExceeded, Exception) as e:
        if _caused_by_budget(e):
            result.error = f"skipped: compiling took over {budget_s:g} s"
            torch.compiler.reset()   # an interrupted compile may leave half-built state
        else:
            result.error = f"failed: {_one_line(e)}"
        row.notes.append(f"{name} {result.error}")
        return None


def _check_amp_gradients(row: Row, name: str, fn, params, out, expected, reference) -> None:
    """Mixed precision: each gradient at most ``accuracy.GRAD_MULTIPLIER`` times eager's
    error off the float32 reference (``accuracy``'s docstring says why), else the variant
    is wrong."""
    named = {id(p): n for n, p in fn.named_parameters()} \
        if isinstance(fn, torch.nn.Module) else {}
    names = [named.get(id(p), f"parameter {i}") for i, p in enumerate(params)]
    worse = accuracy.gradient_outliers(out[1], expected[1], reference[1], names)
    if worse:
        row.variants[name].correct = False
        pname, err, base = worse[0]
        row.notes.append(f"{name}: wrong gradients ({len(worse)} of {len(names)} more than "
                         f"{accuracy.GRAD_MULTIPLIER:g}x eager's error off the "
                         f"{row.reference_dtype} reference; {pname}: {err:.1e}, eager's "
                         f"{base:.1e})")


def _counters() -> dict[str, int]:
    frontend = metrics.counters["frontend"]
    return {"graphs": frontend["graphs"], "graph_breaks": frontend["graph_breaks"],
            "frames_eager": frontend["frames_eager"],
            "kernels": compile_stats.generated_kernel_count,
            "fallbacks": sum(compile_stats.fallback_ops.values())}


def _store_counts(result: Variant, before: dict[str, int], after: dict[str, int]) -> None:
    for key, value in after.items():
        setattr(result, key, value - before[key])


def _measure_memory(row: Row, calls: dict[str, Callable[[], Any]], device: torch.device,
                    errors: dict[str, str], params: list[torch.nn.Parameter] = ()) -> None:
    """CUDA: each variant's peak allocation during one call beyond what was allocated. In
    training the gradients are dropped first, so the peak counts them (and what the forward
    saved for the backward) for every variant alike."""
    for name, call in calls.items():
        if name not in row.variants or name in errors:
            continue
        if name in CUDA_GRAPH_VARIANTS:     # n/a in the tables (the module's doc says why)
            continue
        for p in params:
            p.grad = None
        torch.cuda.synchronize(device)
        held = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = call()
        torch.cuda.synchronize(device)
        row.variants[name].peak_mem_mb = (torch.cuda.max_memory_allocated(device) - held) / 1e6
        del out


def _count_graphs(row: Row, counting_backend: "GraphCountingBackend") -> None:
    frontend = metrics.counters["frontend"]
    row.graphs = counting_backend.graphs
    row.graph_breaks = frontend["graph_breaks"]
    row.frames_eager = frontend["frames_eager"]
    if frontend["graphs"] and frontend["graphs"] != counting_backend.graphs:
        row.notes.append(f"metrics count {frontend['graphs']} graphs, the backend "
                         f"received {counting_backend.graphs}")
    if row.frames_eager:
        row.notes.append(f"ember ran {row.frames_eager} frame(s) eagerly")


def _fill_legacy_fields(row: Row) -> None:
    """The flat fields of the first version of the row (eager, ember, torch.compile)."""
    get = row.variants.get
    row.eager_ms = get("eager", Variant()).ms
    row.ember_ms = get("ember", Variant()).ms
    row.max_abs_err = get("ember", Variant()).max_abs_err
    row.compile_s = get("ember", Variant()).first_call_s
    row.torch_compile_ms = get("torch-inductor", Variant()).ms
    row.torch_compile_s = get("torch-inductor", Variant()).first_call_s


def _check_counts(iters: int, warmup: int) -> None:
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0, got iters={iters}, "
                         f"warmup={warmup}")


def _backend_name(backend) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(value: Any) -> str:
    """``64x3x224x224 bfloat16`` for a tensor, the type's name otherwise."""
    if isinstance(value, torch.Tensor):
        return f"{'x'.join(map(str, value.shape)) or 'scalar'} {_dtype_name(value.dtype)}"
    return type(value).__name__


def compile_peer(fn, inputs, device, budget_s: float | None, notes: list[str]):
    """``torch.compile(fn)`` and its first call: (compiled, seconds, output), or None with a
    note when it fails or runs past ``budget_s``."""
    try:
        peer = torch.compile(fn)
        with _time_limit(budget_s):
            seconds, out = _timed_call(peer, inputs, device)
        return peer, seconds, out
    except (_BudgetExceeded, Exception) as e:
        if _caused_by_budget(e):
            notes.append(f"torch.compile skipped: compiling took over {budget_s:g} s")
        else:
            notes.append(f"torch.compile failed: {_one_line(e)}")
    torch.compiler.reset()
    return None


def finish_row(row, times: dict[str, float], with_torch_compile: bool):
    """Store the side-by-side medians on ``row`` and drop the compiled state."""
    row.eager_ms = times["eager"]
    row.ember_ms = times.get("ember")
    row.torch_compile_ms = times.get("torch.compile")
    if with_torch_compile:
        torch.compiler.reset()
    ember.reset()
    return row


def _timed_call(fn, inputs, device) -> tuple[float, Any]:
    _sync(device)
    start = time.perf_counter()
    out = fn(*inputs)
    _sync(device)
    return time.perf_counter() - start, out


def _time_side_by_side(variants: dict[str, Callable], inputs, device, iters: int,
                       warmup: int) -> dict[str, float]:
    """Median ms of each of ``variants`` called on ``inputs``; an error propagates."""
    calls = {name: functools.partial(_call, fn, inputs) for name, fn in variants.items()}
    return {name: ms for name, (ms, _) in
            time_calls(calls, torch.device(device), iters, warmup).items()}


def time_calls(calls: dict[str, Callable[[], Any]], device: torch.device, iters: int,
               warmup: int, errors: dict[str, str] | None = None
               ) -> dict[str, tuple[float, float]]:
    """name -> (median ms, median host ms) of each call, over ``iters`` alternating rounds
    after ``warmup`` untimed ones. With ``errors``, a call that raises is dropped (it has no
    entry in the result) and ``errors[name]`` says why; without, the error propagates."""
    device = torch.device(device)
    active = dict(calls)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}

    def run(name: str, timed: bool) -> None:
        try:
            if timed:
                samples[name].append(_sample(active[name], device))
            else:
                active[name]()
        except Exception as e:
            if errors is None:
                raise
            errors[name] = f"failed while timing: {_one_line(e)}"
            del active[name]
            if device.type == "cuda":
                torch.cuda.empty_cache()

    for timed, rounds in ((False, warmup), (True, iters)):
        for _ in range(rounds):
            for name in list(active):
                run(name, timed)
    return {name: (statistics.median(ms for ms, _ in samples[name]),
                   statistics.median(host for _, host in samples[name]))
            for name in active}


def _sample(call: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """(ms, host ms) of one call: CUDA events on CUDA, wall time elsewhere."""
    if device.type != "cuda":
        start = time.perf_counter()
        call()
        ms = (time.perf_counter() - start) * 1e3
        return ms, ms
    torch.cuda.synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    start = time.perf_counter()
    out = call()
    host_ms = (time.perf_counter() - start) * 1e3
    end.record()
    end.synchronize()
    del out
    return begin.elapsed_time(end), host_ms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def max_abs_error(actual: Any, expected: Any) -> float:
    """Largest |actual - expected| over all output tensors; inf if the structures differ."""
    got, want = accuracy.tensors(actual), accuracy.tensors(expected)
    if len(got) != len(want) or any((a is None) != (b is None) or
                                     (a is not None and a.shape != b.shape)
                                     for a, b in zip(got, want)):
        return float("inf")
    errors = [(a.double() - b.double()).abs().max().item() for a, b in zip(got, want)
              if a is not None and a.numel()]
    return max(errors, default=0.0)


class _BudgetExceeded(BaseException):
    """BaseException, like KeyboardInterrupt, so torch's ``except Exception`` lets it pass."""


def _caused_by_budget(e: BaseException | None) -> bool:
    # Dynamo may still wrap it (InternalTorchDynamoError from _BudgetExceeded): walk the chain.
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, _BudgetExceeded):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Raise _BudgetExceeded in the main thread after ``seconds`` (no limit elsewhere). Code
    that catches every exception (Dynamo falls back to eager when its compile raises) may
    swallow it: then the block still raises it when it ends."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []

    def on_alarm(signum, frame):
        fired.append(True)
        raise _BudgetExceeded()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if fired:
        raise _BudgetExceeded()


def _one_line(e: BaseException) -> str:
    text = traceback.format_exception_only(type(e), e)[-1].strip().splitlines()[0]
    return text if len(text) <= 160 else text[:157] + "..."
