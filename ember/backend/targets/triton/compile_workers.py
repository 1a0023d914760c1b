"""Worker processes that compile generated Triton kernels into Triton's on-disk cache.

Triton's compiler holds the GIL for much of its work, so threads compile one kernel at a
time; separate processes compile in parallel. Each worker runs this file as
a script (not ``multiprocessing``, whose spawned children re-run the
user's ``__main__`` script when it has no ``if __name__ == "__main__"`` guard). The protocol
on the worker's stdin/stdout is length-prefixed pickles: a task ``(module path, kernel name,
argument dtype names, config, compute capability, warp size, build the launcher?)`` in,
``(error or None, Triton cache key or None, seconds compiling, time.time() when the worker
was ready)`` out. The worker redirects its own stdout to
stderr, so nothing Triton prints can corrupt the protocol.

A worker imports Triton only: no torch, no CUDA context (15 workers importing torch and
creating contexts took 7 s of a 16-core machine, slowing the tracing they overlap). It builds
the compile request the parent's ``JITFunction`` would build for the same call (every
argument a 16-byte aligned pointer, every config entry that names a parameter a constexpr,
the rest compile options), so the parent's own compile is a cache hit; the parent checks
the cache keys (``precompile``). Where Triton builds a C launcher per kernel signature (with
a C compiler, a third of a second each), the worker builds it too, into the same cache:
one task per distinct launcher (argument types and constexprs) is asked to.
"""
from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time


class CompileWorkers:
    """A fixed set of worker processes, started at once, importing torch and Triton while the
    parent goes on."""

    def __init__(self, count: int):
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)     # workers compile for the GPU, never interpret
        self.procs = [subprocess.Popen(worker_command(), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env)
                      for _ in range(count)]
        self.lock = threading.Lock()     # one batch at a time
        self.seconds: dict[str, float] = {}
        self.ready: dict[int, float] = {}

    def run(self, tasks: list[tuple]) -> tuple[list[str], dict[str, str]]:
        """Compile every task, in the order given: the error messages (empty when all
        compiled) and the Triton cache key of each compiled kernel, by kernel name. Each
        kernel's compile time is in ``self.seconds``, and when each worker was ready (its
        imports done, by ``time.time()``) in ``self.ready``."""
        pending: queue.SimpleQueue = queue.SimpleQueue()
        for task in tasks:
            pending.put(task)
        errors: list[str] = []
        keys: dict[str, str] = {}
        self.seconds = {}

        def serve(proc):
            while True:
                try:
                    task = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    _send(proc.stdin, task)
                    reply = _receive(proc.stdout)
                except (OSError, EOFError, struct.error) as e:
                    errors.append(f"worker {proc.pid} died ({type(e).__name__})")
                    return
                error, key, seconds, ready = reply
                self.seconds[task[1]] = seconds
                self.ready[proc.pid] = ready
                if error is not None:
                    errors.append(error)
                else:
                    keys[task[1]] = key

        with self.lock:
            threads = [threading.Thread(target=serve, args=(p,), daemon=True)
                       for p in self.procs if p.poll() is None]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if not pending.empty():
            errors.append("no live worker for some kernels")
        return errors, keys

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


def worker_command() -> list[str]:
    """This file run as a script, not ``-m ember...``: importing the ember package would
    import torch (two seconds of each worker's start)."""
    return [sys.executable, "-c", "import runpy, sys; "
            "runpy.run_path(sys.argv[1], run_name='__main__')", os.path.abspath(__file__)]


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(4)
    if len(head) < 4:
        raise EOFError
    (n,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(n))


def _triton_types() -> dict[str, str]:
    """Triton's own names of torch dtypes (``bool`` is ``u1`` or ``i1`` by version)."""
    try:
        from triton._utils import type_canonicalisation_dict
    except ImportError:
        from triton.runtime.jit import type_canonicalisation_dict
    return type_canonicalisation_dict


def compile_task(path: str, name: str, dtypes: list[str], config: dict, arch: int,
                 warp_size: int, build_launcher: bool, modules: dict) -> str:
    """Compile kernel ``name`` of the generated module at ``path`` into Triton's cache, for
    pointer arguments of ``dtypes`` (torch dtype names) and ``config``, and with
    ``build_launcher`` its C launcher; returns its cache key."""
    import importlib.util

    import triton
    module = modules.get(path)
    if module is None:      # named as the parent names it: the file is <source hash>.py
        key = os.path.basename(path)[:-3]
        spec = importlib.util.spec_from_file_location(triton_module_name(key), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[path] = module
    # ``kernel3#1``: kernel3 in another config (a matmul's tiles, launch.MatmulChoice)
    src, options, target = compile_request(getattr(module, name.split("#")[0]), dtypes,
                                           config, arch, warp_size)
    compiled = triton.compile(src, target=target, options=options)
    if build_launcher:
        _build_launcher(compiled)
    return compiled.hash


def compile_request(fn, dtypes: list[str], config: dict, arch: int, warp_size: int = 32):
    """What ``triton.compile`` is asked when the JIT function ``fn`` is first called with
    pointer arguments of ``dtypes`` (torch dtype names; "size": an int32 size argument) and
    ``config``: the source, the
    compile options and the target."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    params = list(fn.arg_names)
    pointers = [p for p in params if p not in config]
    if len(pointers) != len(dtypes):
        raise ValueError(f"{len(dtypes)} argument dtypes for parameters {pointers}")
    target = GPUTarget("cuda", arch, warp_size)
    backend = make_backend(target)
    names = _triton_types()
    types = dict(zip(pointers, dtypes))
    # what the JIT's binder answers for this call: each pointer 16-byte aligned ("D"), each
    # config entry naming a parameter a constexpr; the JIT's own _pack_args then turns that
    # into the compile request, with this Triton version's rules (3.6 gives constexprs no
    # attribute entry, 3.8 an empty one: either changes the cache key)
    # (a size argument: int32, not specialised on its value, as ``do_not_specialize`` says)
    specialization = [("constexpr", config[p]) if p in config else
                      ("i32", None) if types[p] == "size" else ("*" + names[types[p]], "D")
                      for p in params]
    bound = {p: config.get(p) for p in params}
    knobs = getattr(triton, "knobs", None)
    kwargs = dict(config)
    kwargs["debug"] = bool(getattr(fn, "debug", False)) or \
        bool(knobs is not None and knobs.runtime.debug)
    mode = getattr(getattr(knobs, "compilation", None), "instrumentation_mode", None)
    if mode is not None:
        kwargs["instrumentation_mode"] = mode
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                          specialization, None)
    return ASTSource(fn, signature, constexprs, attrs), options.__dict__, target


def triton_module_name(key: str) -> str:
    """The module name of generated Triton source whose hash is ``key``."""
    return f"ember_triton_{key[:24]}"


def _build_launcher(compiled) -> None:
    """Triton versions that build a C launcher per kernel signature build it when the kernel
    first runs, in the parent, with a C compiler: build it here, into Triton's cache."""
    try:
        from triton.backends.nvidia import driver
    except ImportError:
        return
    if hasattr(driver, "make_launcher"):     # newer Triton launches every kernel generically
        driver.CudaLauncher(compiled.src, compiled.metadata)


_triton_key_lock = threading.Lock()


def warm_up_triton() -> None:
    """Pay Triton's once-per-process cost of compiling through its JIT now: the hash of its
    own sources that keys its cache (about half a second). A failure here is met again,
    and reported, by the first real compile. Once per process:
    threads that ask while another computes it wait (Triton's ``lru_cache`` would let each
    of them compute it again)."""
    try:
        from triton.runtime.cache import triton_key
        with _triton_key_lock:
            triton_key()
    except (ImportError, AttributeError, RuntimeError):
        pass


def _main() -> None:
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                      # prints go to stderr, not into the protocol
    import triton  # noqa: F401        (the slow imports, before the first task arrives)
    import triton.compiler  # noqa: F401
    warm_up_triton()
    ready = time.time()
    tasks = sys.stdin.buffer
    modules: dict = {}
    while True:
        try:
            task = _receive(tasks)
        except EOFError:
            return
        start = time.perf_counter()
        try:
            key, error = compile_task(*task, modules), None
        except Exception as e:
            message = str(e).splitlines()[0] if str(e) else ""
            key, error = None, f"{task[1]}: {type(e).__name__}: {message}"
        _send(reply, (error, key, time.perf_counter() - start, ready))


if __name__ == "__main__":
    _main()
