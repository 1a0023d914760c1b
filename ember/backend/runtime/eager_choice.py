"""Never slower than eager (issue 34): a compiled inference graph runs its compiled program or
the captured FX graph eagerly (ATen's kernels), whichever its first call measured faster.

    run = choose(compiled, gm, options, target, program)     # run(*args) == gm(*args)

Decisions
---------
* **Granularity: the whole graph.** The compiled callable (with its CUDA graph replay, frozen
  guard and autocast wrapper: what later calls would run) against ``gm`` called as is. A
  layer norm whose generated kernel is slower than ATen's, a graph of library calls, both
  are whole graphs; choosing per kernel is later work.
* **Option.** ``ember.compile(..., options={"eager_choice": ...})``: ``"timed"``, ``"off"``,
  or ``"auto"`` (the default), which is ``ember.config.eager_choice`` (``EMBER_EAGER_CHOICE``,
  default ``"timed"``) except on a target whose kernels do not run natively (Triton's
  interpreter: its timings mean nothing, and it exists to test the generated Triton), where
  it is off, said. Timed by default because the first call already compiles (seconds) and
  the timing adds a bounded fraction of a second per graph and input sizes, once per machine
  (the choice is kept on disk); in exchange no compiled graph is slower than eager by more
  than the margin. ``tests/conftest.py`` sets ``EMBER_EAGER_CHOICE=off``: the tests check
  the generated code, which eager running instead would hide; this module's tests turn it on.
* **Timing** (``measure``): after one warm-up run of each path (compiles, first-call
  allocations, oneDNN primitives, a backward's first run), runs alternate compiled,
  eager, ... for at most ``BUDGET_S`` seconds (one round at least, ``MAX_ROUNDS`` at
  most), with ``Target.synchronize`` around each, and each path's fastest run counts.
  Eager wins only when faster by more than ``MARGIN``: the compiled program is kept on a
  tie or noise.
* **Training graphs** (``ember.aot.training.TrainingGraph``) are timed as training steps:
  the forward and ``torch.autograd.grad`` of every differentiable output (tangents of
  ones) with respect to the inputs that require grad, both ways, on detached copies of
  those inputs, so no user hook runs, no ``.grad`` is written and no graph upstream of the
  inputs is walked. The eager way is the captured graph under eager's autograd. The choice
  is made on the first call that records gradients (grad mode on, the inputs requiring
  grad as at compile time); calls before it run compiled. One whose compiled forward and
  backward are only library calls runs as captured without timing (eager's C++ autograd
  nodes cost less per call than the halves' Python autograd Function). Out of GPU memory
  while timing (the eager step holds more activations than Ember's), the compiled program
  is kept, said, and nothing is stored.
* **Only where running twice is unobservable.** Not timed, said under
  ``EMBER_LOGS=perf_hints``: graphs that write their inputs (``mutates_inputs`` of the
  program or of a training graph's forward: batch norm's running statistics), that hold a
  node with effects (``Node.is_impure``: asserts, profiler ranges, random ops;
  collectives), and, found by the first run itself, graphs whose run moved a random
  generator (dropout in training mode) or an input's version counter. That first run is
  then the first call's result, and the program is kept.
* **No generated kernel.** A program of library calls only (and neither frozen nor replayed
  as a CUDA graph, which may make it faster) runs ``gm`` eagerly without timing, said.
* **Long runs.** Where the warm-up compiled run (a training graph's: forward and
  backward) and a second one both take more than ``LONG_RUN_S``, the graph is not timed
  further, said, and runs compiled, nothing stored: the rounds would add more such runs of
  each way to the first call (seconds for a large model on a CPU), and a graph that long
  is not one where the wrapper's per-call cost decides.
* **First call.** After the timing the chosen path runs once more and its result is
  returned: every call's result comes from the path later calls take.
* **Per size.** A program for symbolic sizes (``per_size``) chooses per concrete size
  (``per_size.PerSize``: keyed by its int arguments), ``SIZES_KEPT`` kept.
* **On disk.** ``EMBER_CACHE_DIR/eager_choice/<key>.json`` (``disk_cache.read_json`` /
  ``write_json``: atomic writes; what is read is untrusted and checked, a damaged entry is
  warned about, deleted and timed again). The key: the program's wrapper and kernel sources,
  the captured graph's code, the options, the torch version, the inputs' sizes, strides,
  dtypes and whether they require grad, and the machine (the GPU's name, the CPU's model,
  torch's thread count).
"""
from __future__ import annotations

import functools
import hashlib
import math
import operator
import platform
import time
from typing import Callable

import torch
import torch.utils._pytree as pytree

from ember import config, logs
from ember.backend.runtime import disk_cache
from ember.backend.runtime.per_size import PerSize

MARGIN = 0.05         # eager must be faster by more than this fraction to be chosen
BUDGET_S = 0.1        # seconds of measured runs per choice (after one warm-up run of each)
MAX_ROUNDS = 10
LONG_RUN_S = 0.5      # a warm compiled run longer than this ends the timing: runs compiled
SIZES_KEPT = 64       # per-size choices kept by a program for symbolic sizes
WAYS = ("compiled", "eager")

# nodes with effects that running the graph twice does not show: state the graph restores
# itself (the frontend emits them in pairs), writes to tensors (an input written is caught by
# ``mutates_inputs`` and the version counters, a write to the graph's own values is unseen)
_RERUNNABLE = {torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast,
               torch._C._set_grad_enabled, operator.setitem}


def timed(options: dict, target) -> bool:
    """Whether ``options["eager_choice"]`` (resolved for ``target``) times graphs."""
    value = options.get("eager_choice", "auto")
    if value == "auto":
        if config.eager_choice == "timed" and not target.runs_natively:
            logs.log("perf_hints", "eager choice: off for %s kernels (not run natively: "
                     "timings mean nothing); eager_choice='timed' times them", target.name)
            return False
        value = config.eager_choice
    return value == "timed"


def choose(compiled: Callable, gm: torch.fx.GraphModule, options: dict, target,
           program: Callable | None, *, training: bool = False, rewritten: bool = False,
           per_size: bool = False) -> Callable:
    """``compiled``, ``gm``'s eager forward, or a callable that chooses between them on its
    first call (per size with ``per_size``), as the module docstring says. ``program``: the
    generated program inside ``compiled`` (its sources key the choice on disk);
    ``rewritten``: ``compiled`` does more than run the program (frozen constants, a CUDA
    graph replay), so a program without kernels is timed too."""
    if not timed(options, target):
        return compiled
    name = type(gm).__name__
    if training:
        if _library_calls_only(compiled, gm):
            logs.log("perf_hints", "eager choice: %s runs as captured, under eager's "
                     "autograd: its compiled forward and backward are only library calls "
                     "(no generated kernel); not timed", name)
            return gm.forward
        if not _trains(compiled):
            logs.log("perf_hints", "eager choice: %s not timed: it records gradients and "
                     "runs as %s; runs compiled", name, type(compiled).__name__)
            return compiled
        program = compiled
    if not rewritten and not getattr(program, "kernel_sources", True):
        logs.log("perf_hints", "eager choice: %s runs eagerly: its compiled form is only "
                 "library calls (no generated kernel); not timed", name)
        return gm.forward      # (its outputs a flat tuple, as the program's: compile_shaped)
    why = _not_rerunnable(gm, program)
    if why is not None:
        logs.log("perf_hints", "eager choice: %s not timed: %s; runs compiled", name, why)
        return compiled
    eager, key = gm.forward, program_key(gm, program, options)
    trains = compiled if training else None
    if per_size:
        return PerSize(lambda args: EagerChoice(compiled, eager, name, key, target, trains),
                       SIZES_KEPT, "eager choice")
    return EagerChoice(compiled, eager, name, key, target, trains)


def _trains(compiled: Callable) -> bool:
    """Whether ``compiled`` is a training graph this module can time as training steps."""
    from ember.aot.training import TrainingGraph
    return isinstance(compiled, TrainingGraph)


def _programs(program) -> list:
    """The generated programs of ``program``: a training graph's two halves, or itself."""
    return [program.forward, program.backward] if _trains(program) else [program]


def _library_calls_only(compiled: Callable, gm: torch.fx.GraphModule) -> bool:
    """Whether ``compiled`` is a training graph (``ember.aot.training.TrainingGraph``) of
    ``gm`` as captured (not a channels-last copy, not replayed as a CUDA graph) whose
    compiled halves generate no kernel: the same ATen calls as eager's, behind a Python
    autograd Function that costs more per call than eager's autograd nodes."""
    if getattr(compiled, "captured", None) != gm.forward:
        return False
    halves = (getattr(compiled, "forward", None), getattr(compiled, "backward", None))
    return all(getattr(half, "kernel_sources", None) == [] for half in halves)


def _not_rerunnable(gm: torch.fx.GraphModule, program) -> str | None:
    """Why running ``gm``'s program a second time could be observed, or None."""
    if any(getattr(part, "mutates_inputs", False) for part in _programs(program)):
        return "it writes its inputs"
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_module"):
            continue
        target = node.target
        if node.op == "call_function" and target in _RERUNNABLE:
            continue
        what = f"{node.name} ({getattr(target, '__name__', target)})"
        if node.is_impure():
            return f"{what} has effects or draws random numbers"
        module = getattr(target, "__module__", None) or ""
        if module.startswith("torch.distributed") or "c10d" in str(target):
            return f"{what} communicates"
    return None


def program_key(gm: torch.fx.GraphModule, program, options: dict) -> str:
    """What the two paths' speeds depend on besides the inputs and the machine."""
    parts = ["eager choice v1", torch.__version__, gm.code]
    for part in _programs(program):
        parts += [getattr(part, "source", None) or "", *getattr(part, "kernel_sources", ())]
    parts.append(repr(sorted((k, v) for k, v in options.items() if k != "eager_choice")))
    for node in gm.graph.nodes:
        if node.op == "call_module":
            parts.append(repr(gm.get_submodule(node.target)))
        elif node.op == "get_attr":
            value = getattr(gm, node.target, None)
            parts.append(_describe(value) if isinstance(value, torch.Tensor) else
                         type(value).__name__)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _describe(value, short: bool = False) -> str:
    """An input as the choice's key needs it (``short``: as a log line shows it)."""
    if isinstance(value, torch.Tensor):
        text = f"{'x'.join(map(str, value.shape))} {str(value.dtype).removeprefix('torch.')}"
        if short:
            return text
        grad = " requires grad" if value.requires_grad else ""
        return f"{text} {tuple(value.stride())} {value.device}{grad}"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return type(value).__name__


def _sizes(args) -> str:
    """The call's inputs for a log line (the first few)."""
    shown = [_describe(a, short=True) for a in args[:6]]
    return ", ".join(shown) + (f", ... ({len(args)} inputs)" if len(args) > 6 else "")


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _valid_entry(value) -> bool:
    return isinstance(value, dict) and value.get("way") in WAYS and all(
        isinstance(value.get(k), (int, float)) and math.isfinite(value[k]) and value[k] >= 0
        for k in ("compiled_s", "eager_s"))


class EagerChoice:
    """``choice(*args)``: the compiled program or the eager graph, chosen on the first call
    by ``measure`` or read from disk."""

    def __init__(self, compiled: Callable, eager: Callable, name: str, key: str, target,
                 training=None):
        self.compiled = compiled
        self.eager = eager
        self.name = name
        self.key = key
        self.target = target
        # the TrainingGraph that ``compiled`` is: timed as training steps
        self.training = training
        self.run: Callable | None = None      # the path chosen
        self.source = getattr(compiled, "source", None)
        self.kernel_sources = getattr(compiled, "kernel_sources", [])

    def __call__(self, *args):
        if self.run is not None:
            return self.run(*args)
        if self.training is not None and not (torch.is_grad_enabled() and
                                              self.training.grads_as_compiled(args)):
            return self.compiled(*args)       # chosen on the first call that trains
        self.run, out = self._first_call(args)
        return out

    def _first_call(self, args) -> tuple[Callable, object]:
        """The path for calls like ``args`` and this call's result, computed by it."""
        path = self._path(args)
        stored = disk_cache.read_json(path, _valid_entry)
        if stored is not None:
            self._log(args, stored["compiled_s"], stored["eager_s"], stored["way"],
                      " (from disk)")
            run = self.eager if stored["way"] == "eager" else self.compiled
            return run, run(*args)
        before = _observable_state(args)
        out = self.compiled(*args)
        moved = _moved(before, args)
        if moved is not None:
            logs.log("perf_hints", "eager choice: %s (%s) not timed: its run %s; runs compiled",
                     self.name, _sizes(args), moved)
            return self.compiled, out
        del out
        try:
            if self.training is None:
                compiled_s, eager_s = measure(self.compiled, self.eager, args,
                                              self.target.synchronize)
            else:
                compiled_s, eager_s = measure(_training_step(self.compiled),
                                              _training_step(self.eager), _detached(args),
                                              self.target.synchronize)
        except LongRun as e:
            logs.log("perf_hints", "eager choice: %s (%s) not timed: a compiled run takes "
                     "%.2f s (timing would take more of them); runs compiled", self.name,
                     _sizes(args), e.seconds)
            return self.compiled, self.compiled(*args)
        except torch.OutOfMemoryError:
            logs.log("perf_hints", "eager choice: %s (%s) not timed: out of memory while "
                     "timing; runs compiled", self.name, _sizes(args))
            return self.compiled, self.compiled(*args)
        except Exception as e:     # noqa: BLE001 (compiled ran once: eager's run failed)
            if not config.suppress_errors:
                raise
            logs.warn("ember: eager choice of %s failed (%s: %s); runs compiled", self.name,
                      type(e).__name__, e)
            return self.compiled, self.compiled(*args)
        way = "eager" if eager_s * (1 + MARGIN) < compiled_s else "compiled"
        disk_cache.write_json(path, {"way": way, "compiled_s": compiled_s, "eager_s": eager_s},
                              "storing an eager choice")
        self._log(args, compiled_s, eager_s, way, "")
        run = self.eager if way == "eager" else self.compiled
        return run, run(*args)

    def _path(self, args):
        machine = [self.target.cache_identity() or "", _cpu_model(),
                   f"threads {torch.get_num_threads()}"]
        inputs = [_describe(a) for a in args]
        key = hashlib.sha256("\n".join([self.key, *machine, *inputs]).encode()).hexdigest()
        return disk_cache.cache_dir() / "eager_choice" / f"{key}.json"

    def _log(self, args, compiled_s: float, eager_s: float, way: str, how: str) -> None:
        step = " (forward and backward)" if self.training is not None else ""
        logs.log("perf_hints", "eager choice: %s (%s): compiled %.3f ms, eager %.3f ms%s: "
                 "runs %s%s", self.name, _sizes(args), compiled_s * 1e3, eager_s * 1e3, step,
                 way, how)


def _detached(args) -> list:
    """``args`` with each tensor that requires grad replaced by a new leaf on its storage:
    a timed step's backward runs no hook of the user's and stops at these leaves."""
    return [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad
            else a for a in args]


def _training_step(run: Callable) -> Callable:
    """``step(*args)``: ``run``'s forward, then the gradients of its differentiable outputs
    (tangents of ones) with respect to the inputs that require grad, returned, not
    accumulated."""
    def step(*args):
        outputs = [o for o in pytree.tree_leaves(run(*args))
                   if isinstance(o, torch.Tensor) and o.requires_grad]
        inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        if outputs and inputs:
            torch.autograd.grad(outputs, inputs, [torch.ones_like(o) for o in outputs],
                                allow_unused=True)
    return step


class LongRun(Exception):
    """``measure``'s warm compiled run took ``seconds``, over ``LONG_RUN_S``."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


def measure(compiled: Callable, eager: Callable, args, synchronize: Callable
            ) -> tuple[float, float]:
    """The fastest seconds of ``compiled(*args)`` and of ``eager(*args)``: one warm-up run
    of each (a training step's backward runs here first: its kernels load), then
    alternating runs within ``BUDGET_S``; ``LongRun`` where compiled runs are long (tests
    replace this function to force a choice)."""
    def seconds(run: Callable) -> float:
        synchronize()
        start = time.perf_counter()
        run(*args)
        synchronize()
        return time.perf_counter() - start
    warm = seconds(compiled)
    if warm > LONG_RUN_S:       # (once more: the first may have loaded a backward's kernels)
        warm = seconds(compiled)
        if warm > LONG_RUN_S:
            raise LongRun(warm)
    seconds(eager)
    best = [math.inf, math.inf]
    spent = 0.0
    for _ in range(MAX_ROUNDS):
        round_s = 0.0
        for i, run in enumerate((compiled, eager)):
            s = seconds(run)
            best[i] = min(best[i], s)
            round_s += s
        spent += round_s
        if spent + round_s > BUDGET_S:
            break
    return best[0], best[1]


def _observable_state(args) -> tuple[list, list]:
    """The random generators the call could draw from and its inputs' version counters."""
    from ember.aot.rng import eager_generator
    devices = {torch.device("cpu")} | {a.device for a in args if isinstance(a, torch.Tensor)}
    states = []
    for device in devices:
        try:
            generator = eager_generator(device)
        except NotImplementedError:
            continue
        states.append((generator, generator.get_state()))
    # (inference tensors have no version counter: ``mutates_inputs`` speaks for them)
    versions = [(a, a._version) for a in args
                if isinstance(a, torch.Tensor) and not a.is_inference()]
    return states, versions


def _moved(before: tuple[list, list], args) -> str | None:
    """What a run changed of ``_observable_state``'s, or None."""
    states, versions = before
    for generator, state in states:
        if not torch.equal(generator.get_state(), state):
            return "drew random numbers"
    for tensor, version in versions:
        if tensor._version != version:
            return "wrote an input"
    return None
