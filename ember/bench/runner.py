"""Run benchmark rows, each in its own process under a timeout, and measure warm compiles.

Decisions:

- One process per row (``IsolatedRunner``), so a crash (a segfault in a generated kernel, an
  abort in a library) or a hang costs only that row: the row comes back with status
  ``crashed`` or ``timeout``, what it was doing (the last stage the child reported:
  ``building``, ``reference``, ``compiling ember``, ``timing``...), and the last line of its
  output. The child's stdout and stderr go to ``<log_dir>/<row>.log``, so compiler warnings
  do not garble the progress bar.
- Processes come from a ``multiprocessing`` *forkserver*: a clean, single-threaded server
  process that imports torch, Ember (and, per ``EMBER_BENCH_PRELOAD``, timm, transformers,
  torchvision and torch.compile's modules) once, then forks one child per row. A child
  starts in milliseconds with nothing compiled and no CUDA context, and its first compile
  does not pay for Python imports (``harness``: compile times exclude them). ``fork`` from
  the parent is not used: the parent runs a progress bar thread and may hold locks, and may
  have initialized CUDA, which a forked child cannot use. The server must not initialize
  CUDA either: none of the preloaded imports does, and ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
  keeps ``torch.cuda.is_available()`` from doing it.
- Cold and warm compile times. Each row gets fresh, empty cache folders (``EMBER_CACHE_DIR``,
  ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``), so the first child's first calls are
  cold. With ``warm=True`` a second child then compiles and runs each variant once with the
  same folders (now filled): ``Variant.warm_compile_s``. The folders are removed afterwards.
- ``InProcessRunner`` runs rows in this process: for debugging (pdb works) and for tests; no
  timeout, no isolation and no warm compile.
- A run is stopped only on purpose, and never silently. ``stop_on_signals`` turns SIGTERM,
  SIGHUP and SIGINT in the parent into ``RunStopped``: it leaves the wait for the current
  child (which is killed), and ``ember bench`` then marks that row ``interrupted`` and the
  rows after it ``not run``, writes its outputs and prints its table. (A run killed with
  SIGKILL cannot do that; its ``results.json`` still lists the rows it had not finished as
  ``not run``, because every row is written as pending before the first one starts.)
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Callable

import torch

from ember.bench import harness, report, zoo
from ember.bench.harness import Row

# Stages a child reports, for the progress bar and for the error of a row that hangs.
StageCallback = Callable[["Task", str], None]
CACHE_VARIABLES = {"EMBER_CACHE_DIR": "ember", "TORCHINDUCTOR_CACHE_DIR": "inductor",
                   "TRITON_CACHE_DIR": "triton"}
# Row statuses. A finished row has its numbers or the reason it has none; an unfinished one
# was never measured (``ember bench --resume`` runs it).
FINISHED = report.FINISHED
NOT_RUN = ("not run", "interrupted", "skipped")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class RunStopped(BaseException):
    """The run was told to stop (a signal): a BaseException, so no ``except Exception`` on the
    way (the harness's, a library's) swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def stop_on_signals():
    """Raise ``RunStopped`` in the main thread on SIGTERM, SIGHUP or SIGINT, once: a second
    signal while the run saves its results is ignored. The previous handlers come back on
    exit. Elsewhere than the main thread (tests in threads) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = []

    def on_signal(signum, frame):
        if not stopping:
            stopping.append(signum)
            raise RunStopped(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclasses.dataclass(frozen=True)
class Task:
    """One row to measure: what ``harness.benchmark_model``/``benchmark_kernel`` need."""
    kind: str                        # "model" or "kernel"
    name: str
    suite: str | None                # the suite that selected it (None: --models)
    device: str
    backend: str
    compilers: tuple[str, ...]
    mode: str = "infer"
    dtype: str | None = None         # None: the row's own
    batch_size: int | None = None
    kernel_bytes: int | None = None
    iters: int = 20
    warmup: int = 3
    torch_compile_budget_s: float | None = 90.0
    threads: int | None = None
    amp: str | None = None           # autocast dtype of model rows (float32 weights)


def run_task(task: Task, first_calls_only: bool = False,
             progress: Callable[[str], None] | None = None) -> Row:
    """Measure ``task`` in this process; a row that cannot be built becomes an error row."""
    if task.threads is not None:
        torch.set_num_threads(task.threads)
    dtype = zoo.DTYPES[task.dtype] if task.dtype else None
    common = dict(iters=task.iters, warmup=task.warmup, compilers=task.compilers,
                  torch_compile_budget_s=task.torch_compile_budget_s, dtype=dtype,
                  first_calls_only=first_calls_only, progress=progress)
    try:
        if task.kind == "kernel":
            row = harness.benchmark_kernel(task.name, task.device, task.backend,
                                           tensor_bytes=task.kernel_bytes, **common)
        else:
            row = harness.benchmark_model(task.name, task.device, task.backend,
                                          batch_size=task.batch_size, mode=task.mode,
                                          amp=zoo.DTYPES[task.amp] if task.amp else None,
                                          **common)
    except Exception as e:   # the row could not be built: report it, measure the rest
        row = error_row(task, "error", f"not measured: {harness._one_line(e)}")
    row.suite = task.suite
    return row


def error_row(task: Task, status: str, error: str) -> Row:
    """A row without numbers: ``status`` ("error", "timeout", "crashed", or one of
    ``NOT_RUN``) and ``error`` say why."""
    row = Row(task.name, task.device, task.backend, eager_ms=None, kind=task.kind,
              dtype=task.dtype, suite=task.suite, mode=task.mode, status=status, error=error,
              notes=[error], batch_size=task.batch_size, amp=task.amp)
    row.variants = {name: harness.Variant(error=error) for name in task.compilers}
    return row


class InProcessRunner:
    """Rows measured in this process, one after the other."""

    def __init__(self, on_stage: StageCallback | None = None):
        self.on_stage = on_stage

    def run(self, task: Task) -> Row:
        return run_task(task, progress=self._progress(task))

    def _progress(self, task: Task):
        return None if self.on_stage is None else lambda stage: self.on_stage(task, stage)

    def close(self) -> None:
        pass


class IsolatedRunner(InProcessRunner):
    """Each row in a forked child process with a timeout; then, with ``warm``, a second child
    measures warm compile times."""

    def __init__(self, timeout_s: float, log_dir: str, *, warm: bool = True,
                 preload: tuple[str, ...] = (), on_stage: StageCallback | None = None):
        super().__init__(on_stage)
        self.timeout_s, self.log_dir, self.warm = timeout_s, log_dir, warm
        os.makedirs(log_dir, exist_ok=True)
        # The server reads the preload list from the environment when it starts (on the
        # first child); later runners in this process share that server.
        os.environ["EMBER_BENCH_PRELOAD"] = ",".join(preload)
        # torch.cuda.is_available() through NVML, not the CUDA runtime: a server that
        # initialized CUDA could not fork children that use it.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["ember.bench._preload"])
        self.cache_root = tempfile.mkdtemp(prefix="ember-bench-cache-")

    def log_path(self, task: Task) -> str:
        return os.path.join(self.log_dir, re.sub(r"[^\w.-]+", "_", task.name) + ".log")

    def run(self, task: Task) -> Row:
        cache_dir = tempfile.mkdtemp(prefix="row-", dir=self.cache_root)
        try:
            row = self._child(task, False, cache_dir)
            compiled = [name for name, v in row.variants.items()
                        if name != "eager" and v.first_call_s is not None]
            if self.warm and row.status == "ok" and compiled:
                self._measure_warm(dataclasses.replace(task, compilers=("eager", *compiled)),
                                   row, cache_dir)
            return row
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)

    def _measure_warm(self, task: Task, row: Row, cache_dir: str) -> None:
        """Compile again the variants that compiled cold (``task.compilers``)."""
        warm = self._child(task, True, cache_dir, stage_prefix="warm: ")
        if warm.status != "ok":
            row.notes.append(f"warm compile not measured: {warm.error}")
            return
        for name, variant in warm.variants.items():
            if name in row.variants and name != "eager":
                row.variants[name].warm_compile_s = variant.first_call_s

    def _child(self, task: Task, first_calls_only: bool, cache_dir: str,
               stage_prefix: str = "") -> Row:
        """Run ``task`` in a child; its row, or an error row when it times out or dies."""
        receiver, sender = self.context.Pipe(duplex=False)
        log_path = self.log_path(task)
        process = self.context.Process(
            target=_child_main, args=(task, first_calls_only, cache_dir, log_path, sender),
            name=f"ember-bench {task.name}", daemon=True)
        process.start()
        sender.close()
        stage, deadline = "starting", time.monotonic() + self.timeout_s
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return error_row(task, "timeout", f"timed out after {self.timeout_s:g} s "
                                                      f"({stage_prefix}{stage})")
                if not receiver.poll(min(remaining, 0.5)):
                    continue
                try:
                    kind, payload = receiver.recv()
                except EOFError:   # the child died without sending its row
                    process.join()
                    return error_row(task, "crashed", f"crashed: {_exit_reason(process.exitcode)}"
                                                      f" ({stage_prefix}{stage})"
                                                      f"{_last_line(log_path)}")
                if kind == "stage":
                    stage = payload
                    if self.on_stage is not None:
                        self.on_stage(task, stage_prefix + stage)
                else:
                    return Row.from_dict(payload)
        finally:
            receiver.close()
            if process.is_alive():
                process.kill()
            process.join()

    def close(self) -> None:
        shutil.rmtree(self.cache_root, ignore_errors=True)


def _child_main(task: Task, first_calls_only: bool, cache_dir: str, log_path: str,
                sender) -> None:
    """A child: output to the log, fresh cache folders, one row measured and sent."""
    log = open(log_path, "a", buffering=1)
    log.write(f"==== {task.name}: {'warm compile' if first_calls_only else 'measure'}\n")
    log.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    for variable, folder in CACHE_VARIABLES.items():
        os.environ[variable] = os.path.join(cache_dir, folder)
    row = run_task(task, first_calls_only, progress=lambda stage: sender.send(("stage", stage)))
    sender.send(("row", row.as_dict()))
    sys.stdout.flush()
    sys.stderr.flush()
    sender.close()
    # A child leaves through os._exit, without finalizers: stop torch.compile's worker pool
    # here, or its semaphores are reported as leaked when the run ends.
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        async_compile.shutdown_compile_workers()


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


def _last_line(log_path: str) -> str:
    """``; last output: ...`` from the child's log, or nothing."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.strip() for line in f.read()[-4000:].splitlines() if line.strip()]
    except OSError:
        return ""
    lines = [line for line in lines if not line.startswith("====")]
    if not lines:
        return ""
    text = lines[-1] if len(lines[-1]) <= 160 else lines[-1][:157] + "..."
    return f"; last output: {text}"
