"""Measure one model side by side: eager, ``ember.compile`` and (as a peer) ``torch.compile``.

Decisions:

- One process, one model, the three variants timed in alternating rounds (eager, ember,
  torch.compile, eager, ...), so a slow spell of the machine hits all of them alike; each
  variant's time is the median over its rounds. On CUDA every call is bracketed by
  ``torch.cuda.synchronize()``, so the time covers the kernels, not just their launch.
- Inference only: everything runs under ``torch.no_grad()`` on an ``eval()`` model.
- ``compile_s`` is the wall time of the first call of the compiled model (capture + compile +
  run, cold for this model after ``ember.reset()``); the frontend's modules are imported
  beforehand, so the first model does not pay for Python imports.
- Graphs are counted twice: by a counting wrapper around the chosen backend (what the backend
  really received) and by ``ember.metrics.counters["frontend"]``; the row reports the wrapper's
  count and the metrics' graph breaks and eager frames.
- torch.compile may fail or take long on a model; its errors become "n/a" with a note, and on
  the main thread a SIGALRM budget interrupts a compile that runs past ``torch_compile_budget_s``
  (later models are unaffected: ``torch.compiler.reset()`` runs after each model).
  DESIGN.md §4: this package is the only place in ``ember/`` allowed to call torch.compile.
"""
from __future__ import annotations

import contextlib
import dataclasses
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
from ember.bench import models


@dataclasses.dataclass
class Row:
    model: str
    device: str
    backend: str
    eager_ms: float
    ember_ms: float | None = None
    torch_compile_ms: float | None = None
    max_abs_err: float | None = None        # ember vs eager, over every output tensor
    graphs: int | None = None               # graphs the backend received
    graph_breaks: int | None = None
    frames_eager: int | None = None         # frames the frontend ran eagerly (not captured)
    compile_s: float | None = None          # ember's cold first call
    torch_compile_s: float | None = None    # torch.compile's cold first call
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        """eager time / ember time: above 1 means ember is faster than eager."""
        return _ratio(self.eager_ms, self.ember_ms)

    @property
    def vs_torch_compile(self) -> float | None:
        """torch.compile time / ember time: above 1 means ember is faster than torch.compile."""
        return _ratio(self.torch_compile_ms, self.ember_ms)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "speedup": self.speedup,
                "vs_torch_compile": self.vs_torch_compile}


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
                    torch_compile_budget_s: float | None = 90.0) -> Row:
    """Time ``name`` from the model zoo eagerly, under ember.compile and under torch.compile."""
    models.check_names([name])
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0, got iters={iters}, "
                         f"warmup={warmup}")
    counting_backend = GraphCountingBackend(backend)   # validates the backend name early
    device = torch.device(device)
    model, inputs = models.build_model(name, device)
    backend_name = backend if isinstance(backend, str) else getattr(backend, "__name__",
                                                                     repr(backend))
    with torch.no_grad():
        expected = model(*inputs)
        row = Row(name, str(device), backend_name, eager_ms=float("nan"))
        variants: dict[str, Callable] = {"eager": model}

        ember.reset()
        compiled = ember.compile(model, backend=counting_backend)
        try:
            row.compile_s, actual = _timed_call(compiled, inputs, device)
        except Exception as e:   # report, keep benchmarking the other models
            row.notes.append(f"ember failed: {_one_line(e)}")
        else:
            variants["ember"] = compiled
            row.max_abs_err = max_abs_error(actual, expected)
            frontend = metrics.counters["frontend"]
            row.graphs = counting_backend.graphs
            row.graph_breaks = frontend["graph_breaks"]
            row.frames_eager = frontend["frames_eager"]
            if frontend["graphs"] and frontend["graphs"] != counting_backend.graphs:
                row.notes.append(f"metrics count {frontend['graphs']} graphs, the backend "
                                 f"received {counting_backend.graphs}")
            if row.frames_eager:
                row.notes.append(f"ember ran {row.frames_eager} frame(s) eagerly")

        if with_torch_compile:
            peer = compile_peer(model, inputs, device, torch_compile_budget_s, row.notes)
            if peer is not None:
                variants["torch.compile"], row.torch_compile_s, _ = peer

        times = _time_side_by_side(variants, inputs, device, iters, warmup)
    return finish_row(row, times, with_torch_compile)


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
    for _ in range(warmup):
        for fn in variants.values():
            fn(*inputs)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(iters):
        for name, fn in variants.items():
            seconds, _ = _timed_call(fn, inputs, device)
            samples[name].append(seconds * 1e3)
    return {name: statistics.median(ms) for name, ms in samples.items()}


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
