"""Measure one model or kernel side by side: eager, ``ember.compile`` and (as a peer)
``torch.compile``, each compiler in its default and its ``reduce-overhead`` mode.

Decisions:

- Variants (``VARIANTS``, the names ``ember bench --compilers`` takes): ``eager`` (always
  measured: the baseline), ``ember`` (``ember.compile(fn)``), ``ember-reduce-overhead``
  (``ember.compile(fn, mode="reduce-overhead")``), ``torch-inductor`` (``torch.compile(fn)``)
  and ``torch-inductor-reduce-overhead`` (``torch.compile(fn, mode="reduce-overhead")``, CUDA
  graphs on CUDA). A variant that fails to compile, to run its first call, or later while it
  is timed, becomes "n/a" with a note (``Variant.error``); the others go on.
- One process, one row, the variants timed in alternating rounds (eager, ember, ...,
  eager, ...), so a slow spell of the machine hits all of them alike; each variant's time is
  the median over its rounds. On the CPU a call is timed with ``time.perf_counter``. On CUDA
  the stream is synchronized, then a pair of ``torch.cuda.Event`` is recorded around the
  call: the time covers the GPU work and any launch gaps between kernels (what reduce-overhead
  removes), not just the launches. ``host_ms`` is the CPU time until the call returns (on
  CUDA: guards, Python and launches, without waiting for the GPU), the per-call overhead on a
  cache hit when the GPU work is small.
- Kernel rows (``ember.bench.kernels``) also time a plain ``copy_`` of the same number of
  bytes in the same rounds; the row reports GB/s of each variant and of the copy.
- Inference only: everything runs under ``torch.no_grad()`` on an ``eval()`` model.
- ``compile_s`` is the wall time of the first call of the compiled model (capture + compile +
  run, cold for this model after ``ember.reset()``); the frontend's modules are imported
  beforehand, so the first model does not pay for Python imports.
- Graphs are counted twice: by a counting wrapper around the chosen backend (what the backend
  really received) and by ``ember.metrics.counters["frontend"]``; the row reports the wrapper's
  count and the metrics' graph breaks and eager frames.
- torch.compile may fail or take long on a model; its errors become "n/a" with a note, and on
  the main thread a SIGALRM budget interrupts a compile that runs past ``torch_compile_budget_s``
  (later models are unaffected: ``torch.compiler.reset()`` runs after each model; the CLI
  also collects garbage and empties the CUDA cache between rows).
  DESIGN.md §4: this package is the only place in ``ember/`` allowed to call torch.compile.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
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
from ember.backends import lookup_backend
from ember.bench import kernels, models

VARIANTS = ("eager", "ember", "ember-reduce-overhead", "torch-inductor",
            "torch-inductor-reduce-overhead")
DEFAULT_COMPILERS = ("eager", "ember", "torch-inductor")
TORCH_VARIANTS = ("torch-inductor", "torch-inductor-reduce-overhead")
# Short names for table headers.
LABELS = {"eager": "eager", "ember": "ember", "ember-reduce-overhead": "ember-ro",
          "torch-inductor": "torch.compile", "torch-inductor-reduce-overhead": "torch.compile-ro"}

# variant -> make(fn, backend) -> compiled callable. ``backend`` is ``ember bench --backend``
# (for "ember" wrapped in a graph-counting backend).
COMPILERS: dict[str, Callable[[Callable, Any], Callable]] = {
    "ember": lambda fn, backend: ember.compile(fn, backend=backend),
    "ember-reduce-overhead":
        lambda fn, backend: ember.compile(fn, backend=backend, mode="reduce-overhead"),
    "torch-inductor": lambda fn, backend: torch.compile(fn),
    "torch-inductor-reduce-overhead":
        lambda fn, backend: torch.compile(fn, mode="reduce-overhead"),
}


def resolve_compilers(names=None, with_torch_compile: bool = True) -> tuple[str, ...]:
    """The variants to measure, in ``VARIANTS`` order, ``eager`` always first.

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
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown compiler(s): {', '.join(unknown)}; known: "
                         f"{', '.join(VARIANTS)} (or all)")
    return tuple(v for v in VARIANTS if v == "eager" or (
        v in names and (with_torch_compile or v not in TORCH_VARIANTS)))


@dataclasses.dataclass
class Variant:
    """One variant's results on one row; None: not measured (``error`` says why)."""
    ms: float | None = None              # median time of one call
    host_ms: float | None = None         # median CPU time until the call returned
    first_call_s: float | None = None    # compile + first run, cold (compiled variants)
    max_abs_err: float | None = None     # against eager, over every output tensor
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
    kind: str = "model"                     # "model" (ember.bench.models) or "kernel"
    dtype: str | None = None                # the floating-point dtype of weights and inputs
    batch_size: int | None = None           # models only
    inputs: list[str] = dataclasses.field(default_factory=list)   # "64x3x224x224 bfloat16"
    # every requested variant, eager included, by its VARIANTS name
    variants: dict[str, Variant] = dataclasses.field(default_factory=dict)
    bytes_moved: int | None = None          # kernels: minimum bytes read + written per call
    copy_ms: float | None = None            # kernels: copy_ of bytes_moved bytes, same rounds

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
        if self.kind == "kernel":
            out["copy_gbps"] = self.copy_gbps
            for name, variant in out["variants"].items():
                variant["gbps"] = self.gbps(name)
                variant["fraction_of_copy"] = self.fraction_of_copy(name)
        return out


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


def benchmark_model(name: str, device: str = "cpu", backend: str | Callable = "ember", *,
                    iters: int = 20, warmup: int = 3, with_torch_compile: bool = True,
                    torch_compile_budget_s: float | None = 90.0, compilers=None,
                    dtype: torch.dtype | None = None, batch_size: int | None = None) -> Row:
    """Time ``name`` from the model zoo eagerly and under each compiler of ``compilers`` (see
    ``resolve_compilers``; default eager, ember and torch-inductor). ``dtype`` and
    ``batch_size`` default to the model's own (``models.build_model``)."""
    models.check_names([name])
    _check_counts(iters, warmup)
    variants = resolve_compilers(compilers, with_torch_compile)
    counting_backend = GraphCountingBackend(backend)   # validates the backend name early
    device = torch.device(device)
    spec = models.MODELS[name]
    batch_size = spec.default_batch_size(device) if batch_size is None else batch_size
    model, inputs = models.build_model(name, device, dtype=dtype, batch_size=batch_size)
    row = Row(name, str(device), _backend_name(backend), eager_ms=None, kind="model",
              dtype=_dtype_name(dtype or spec.dtype), batch_size=batch_size,
              inputs=[describe(t) for t in inputs])
    measure_row(row, model, inputs, device, backend, counting_backend, variants, iters=iters,
                warmup=warmup, torch_compile_budget_s=torch_compile_budget_s)
    return row


def benchmark_kernel(name: str, device: str = "cpu", backend: str | Callable = "ember", *,
                     iters: int = 20, warmup: int = 3, with_torch_compile: bool = True,
                     torch_compile_budget_s: float | None = 90.0, compilers=None,
                     dtype: torch.dtype | None = None, tensor_bytes: int | None = None) -> Row:
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
              bytes_moved=case.bytes_moved)
    src = torch.randn(case.copy_numel, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    measure_row(row, case.fn, case.inputs, device, backend, counting_backend, variants,
                iters=iters, warmup=warmup, torch_compile_budget_s=torch_compile_budget_s,
                extra_calls={"copy": lambda: dst.copy_(src)})
    return row


def measure_row(row: Row, fn: Callable, inputs: tuple, device: torch.device, backend,
                counting_backend: "GraphCountingBackend", variants: tuple[str, ...], *,
                iters: int, warmup: int, torch_compile_budget_s: float | None,
                extra_calls: dict[str, Callable[[], Any]] | None = None) -> Row:
    """Compile ``fn`` under each variant, check its first output against eager's, time every
    variant (and ``extra_calls``, e.g. the kernels' copy) side by side, and fill ``row``."""
    row.variants = {name: Variant() for name in variants}
    calls: dict[str, Callable[[], Any]] = {}
    try:
        with torch.no_grad():
            try:
                expected = fn(*inputs)
            except Exception as e:
                row.variants["eager"].error = f"failed: {_one_line(e)}"
                row.notes.append(f"eager failed: {_one_line(e)}")
                return row
            calls.update(extra_calls or {})
            calls["eager"] = lambda: fn(*inputs)
            ember.reset()
            for name in variants[1:]:
                compiled = _first_call(row, name, fn, inputs, expected, device,
                                       counting_backend if name == "ember" else backend,
                                       torch_compile_budget_s)
                if compiled is not None:
                    calls[name] = functools.partial(_call, compiled, inputs)
                if name == "ember" and compiled is not None:
                    _count_graphs(row, counting_backend)
            del expected
            errors: dict[str, str] = {}
            times = time_calls(calls, device, iters, warmup, errors)
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
        calls.clear()   # drop the compiled callables (and CUDA graphs' memory) before resets
        ember.reset()
        if any(v in TORCH_VARIANTS for v in variants):
            torch.compiler.reset()
    return row


def _call(fn, inputs):
    return fn(*inputs)


def _first_call(row: Row, name: str, fn, inputs, expected, device, backend,
                budget_s: float | None):
    """Compile ``fn`` as variant ``name`` and run its first call (timed, under the budget for
    torch.compile): the compiled callable, or None with ``error`` and a note on the row."""
    result = row.variants[name]
    is_peer = name in TORCH_VARIANTS
    frames_eager = metrics.counters["frontend"]["frames_eager"]
    try:
        compiled = COMPILERS[name](fn, backend)
        with _time_limit(budget_s if is_peer else None):
            result.first_call_s, out = _timed_call(compiled, inputs, device)
        result.max_abs_err = max_abs_error(out, expected)
        del out
        ran_eagerly = metrics.counters["frontend"]["frames_eager"] - frames_eager
        if ran_eagerly and name == "ember-reduce-overhead":   # "ember": see _count_graphs
            row.notes.append(f"{name} ran {ran_eagerly} frame(s) eagerly")
        return compiled
    except (_BudgetExceeded, Exception) as e:
        if _caused_by_budget(e):
            result.error = f"skipped: compiling took over {budget_s:g} s"
            torch.compiler.reset()   # an interrupted compile may leave half-built state
        else:
            result.error = f"failed: {_one_line(e)}"
        row.notes.append(f"{name} {result.error}")
        return None


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


def output_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested output (tuples, lists, dicts, HF ModelOutputs), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):   # also transformers' ModelOutput (an OrderedDict)
        return [t for v in value.values() for t in output_tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in output_tensors(v)]
    return []


def max_abs_error(actual: Any, expected: Any) -> float:
    """Largest |actual - expected| over all output tensors; inf if the structures differ."""
    got, want = output_tensors(actual), output_tensors(expected)
    if len(got) != len(want) or any(a.shape != b.shape for a, b in zip(got, want)):
        return float("inf")
    errors = [(a.double() - b.double()).abs().max().item() for a, b in zip(got, want)
              if a.numel()]
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
    """Raise _BudgetExceeded in the main thread after ``seconds`` (no limit elsewhere)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise _BudgetExceeded()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _one_line(e: BaseException) -> str:
    text = traceback.format_exception_only(type(e), e)[-1].strip().splitlines()[0]
    return text if len(text) <= 160 else text[:157] + "..."
