"""Launching generated Triton kernels cheaply, and compiling them ahead of the first call.

``kernel[grid](*args, XBLOCK=...)`` goes through Triton's generic launcher, which binds
arguments, computes a specialization key and looks up its cache on every call: tens of µs
of Python per launch, which on a GPU is longer than most fused kernels run. A
:class:`TritonLauncher` takes that path once (it compiles the kernel); later calls go
straight to the compiled kernel's C launcher with the grid, the stream and the packed
metadata prepared: the arguments are the only per-call work. The kernel's arguments are
always whole buffers (offsets of views are in the kernel's indices), allocated with the
alignment Triton specialised on, so the compiled kernel stays valid for every call.

If the fast path does not work with the installed Triton (its launcher's arguments differ
between versions), the launcher logs why and keeps the generic path.

:func:`precompile` compiles a graph's kernels before its first call. Kernels new to this
machine compile in a pool of worker processes (Triton's compiler holds the GIL for much of
its work, so threads serialise); each compiled kernel lands in Triton's on-disk cache, from
which this process then loads it by the cache key the worker answered, past Triton's JIT.
The keys are kept beside the module, so a warm start loads its kernels the same way. The
pool starts when the first CUDA graph begins compiling (:func:`start_compile_workers`), so
its start overlaps tracing and lowering.
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import re
import threading
import time

import torch

from ember import logs


LAUNCH_OPTIONS = ("num_warps", "num_stages")     # config entries that are not constexprs


class TritonLauncher:
    """``launcher(*buffers)`` runs one generated kernel over a fixed grid and config.

    With ``candidates`` (max_autotune), the first call times each candidate config on the
    real arguments (the buffers the kernel writes are restored between trials, so a kernel
    that updates memory in place or accumulates atomically is timed on the same data) and
    keeps the fastest; the choice is cached on disk by the kernel's source and device."""

    def __init__(self, fn, grid: int, config: dict[str, int], interpret: bool,
                 candidates: list | None = None, rows: int = 1, written: tuple = (),
                 key: str = ""):
        self.fn = fn
        self.grid = grid if isinstance(grid, tuple) else (grid,)   # programs per axis
        self.interpret = interpret
        self.fast = None
        self.compiled = None       # Triton's compiled kernel, once precompile loaded it
        self._use(config)
        self.candidates = candidates or []
        self.rows = rows           # the grid covers ceil(rows / XBLOCK) programs
        self.written = written     # argument positions the kernel writes
        self.key = key

    def _use(self, config) -> None:
        self.config = dict(config)
        self.compiled = None
        self.constexprs = tuple(v for k, v in config.items() if k not in LAUNCH_OPTIONS)

    def __call__(self, *args):
        if 0 in self.grid:
            return
        if self.fast is not None:
            return self.fast(*args)
        if self.candidates:
            self._autotune(args)
        if not self.interpret:
            self.fast = self._first_launch(args)
            if self.fast is not None:
                return
        self.fn[self.grid](*args, **self.config)

    def warmup(self, args):
        """Compile for ``args`` (tensors like the real ones) without launching; returns
        Triton's compiled kernel."""
        return self.fn.warmup(*args, grid=self.grid, **self.config)

    def _first_launch(self, args, sized: bool = False):
        """Launch through the compiled kernel's launcher once, recording the arguments it
        passes to Triton's C launch function; returns the launch for later calls (None, and
        nothing launched, when this Triton's kernels do not work that way).

        Later calls go straight to the C function with the recorded constants (the launch
        flags, the packed metadata, the empty scratch buffers, the argument types), past the
        Python wrapper that recomputes them on every call. Where that wrapper allocates
        scratch memory per launch, or the recording does not show where the kernel's
        arguments go, later calls keep the wrapper. ``sized``: the launch returned takes the
        grid (three programs counts) before the arguments."""
        try:
            compiled = self.compiled or self.warmup(args)    # loaded or compiled by precompile
            run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
            real = run.launch
        except AttributeError as e:    # another Triton's compiled kernel: the generic path
            logs.log("perf_hints", "triton: direct launch unavailable (%s: %s)",
                     type(e).__name__, e)
            return None
        stream_of = torch._C._cuda_getCurrentRawStream
        device = args[0].device.index if args else torch.cuda.current_device()
        grid = (*self.grid, 1, 1)[:3]
        consts = self.constexprs
        recorded = []

        def record(*a):
            result = real(*a)
            recorded.append(a)
            return result
        run.launch = record
        try:
            run(*grid, stream_of(device), function, packed, None, None, None, *args, *consts)
        except TypeError as e:        # its arguments are not this Triton's: nothing ran
            logs.log("perf_hints", "triton: direct launch unavailable (%s); using Triton's "
                                   "launcher", e)
            return None
        finally:
            run.launch = real

        def through_wrapper(*a):
            run(*grid, stream_of(device), function, packed, None, None, None, *a, *consts)

        def sized_through_wrapper(g, *a):
            run(*g, stream_of(device), function, packed, None, None, None, *a, *consts)
        if not recorded or getattr(run, "global_scratch_size", 0) or \
                getattr(run, "profile_scratch_size", 0):
            return sized_through_wrapper if sized else through_wrapper
        fixed, where = _launch_constants(recorded[0], grid, args + consts)
        if sized:
            if where == "spread":
                return lambda g, *a: real(*g, stream_of(device), *fixed, *a, *consts)
            if where == "tuple":
                return lambda g, *a: real(*g, stream_of(device), *fixed, a + consts)
            return sized_through_wrapper
        if where == "spread":
            return lambda *a: real(*grid, stream_of(device), *fixed, *a, *consts)
        if where == "tuple":
            return lambda *a: real(*grid, stream_of(device), *fixed, a + consts)
        return through_wrapper

    # -- max_autotune ---------------------------------------------------------------------------
    def _autotune(self, args, key: str | None = None) -> None:
        candidates, self.candidates = self.candidates, []
        path = _autotune_path(key or self.key)
        best = _read_json(path)
        if best is not None and best not in candidates:    # damaged, or another candidate set
            _discard(path, "not one of the kernel's configs")
            best = None
        if best is None:
            configs = {str(config): config for config in candidates}

            def way(config):
                grid = (-(-self.rows // config["XBLOCK"]),)
                return lambda: self.fn[grid](*args, **config)
            timings = _time_ways({name: way(c) for name, c in configs.items()}, args,
                                 self.written, self.interpret)
            best = configs[timings[0][1]]
            _write_json(path, best)
            logs.log("perf_hints", "autotune: %s",
                     ", ".join(f"{name} {t * 1e6:.1f} us" for t, name in timings))
        self._use(best)
        self.grid = (-(-self.rows // best["XBLOCK"]),)


class SizedTritonLauncher(TritonLauncher):
    """``launcher(numels, *arguments)`` runs a kernel over symbolic sizes: ``numels`` (the
    wrapper computes them from the call's sizes) are the elements along the grid's axes,
    covered by blocks of the config's XBLOCK (and RBLOCK on a 2-D grid); the grid is
    computed per call, the compiled kernel is the same for every size.

    With ``candidates`` (max_autotune), the config is chosen per size bucket (the numels
    and the size arguments, each rounded up to a power of two): the first call of a bucket
    times the candidates, whose choice is kept on disk under the kernel's source and the
    bucket; every candidate is right at every size (blocks are masked), so a bucket's
    choice serves any size in it."""

    def __init__(self, fn, config: dict[str, int], interpret: bool,
                 candidates: list | None = None, written: tuple = (), key: str = ""):
        super().__init__(fn, (1,), config, interpret, candidates, 1, written, key)
        self.tuned: dict[tuple, dict] = {}     # size bucket -> its config (max_autotune)
        self.fasts: dict[str, object] = {}     # config -> its direct launch
        self.all_candidates = list(candidates or [])

    def _use(self, config) -> None:
        super()._use(config)
        self.xblock = config["XBLOCK"]
        self.rblock = config.get("RBLOCK", 1)

    def __call__(self, numels, *args):
        if self.all_candidates and len(numels) == 1:    # (a 2-D grid's tiles: one config)
            self._choose(numels, args)
        grid = (-(-numels[0] // self.xblock), 1 if len(numels) == 1 else
                -(-numels[1] // self.rblock), 1)
        if 0 in grid:      # (a size expression may be 0: a slice x[1:-1] of 2 rows)
            return
        if self.fast is not None:
            return self.fast(grid, *args)
        self.grid = grid[:len(numels)]
        if not self.interpret:
            self.fast = self._first_launch(args, sized=True)
            if self.fast is not None:
                self.fasts[str(self.config)] = self.fast
                return
        self.fn[self.grid](*args, **self.config)

    def _choose(self, numels, args) -> None:
        """The config of the call's size bucket (timed on its first call): its numels and
        size arguments, each rounded up to a power of two."""
        sizes = [*numels, *(a for a in args if isinstance(a, int))]
        bucket = tuple(1 << max(int(n) - 1, 0).bit_length() for n in sizes)
        config, previous = self.tuned.get(bucket), self.config
        if config is None:
            self.candidates = list(self.all_candidates)
            self.rows = numels[0]
            self._autotune(args, f"{self.key}-{'x'.join(map(str, bucket))}")
            config = self.tuned[bucket] = self.config
        if config != previous:     # the direct launch of this config's compiled kernel
            self._use(config)
            self.fast = self.fasts.get(str(config))


def _time_ways(ways: dict, args, written: tuple, interpret: bool) -> list[tuple[float, str]]:
    """``(median seconds, name)`` of each of ``ways`` (name -> a call that runs it on
    ``args``), fastest first. The buffers at the ``written`` positions of ``args`` are
    restored before each trial and after the last, so every way runs on the same data (an
    in-place update or an atomic accumulation is timed on its real input). A way that
    raises (out of shared memory) is left out, and the log says so."""
    saved = [args[i].clone() for i in written]

    def restore():
        for i, value in zip(written, saved):
            args[i].copy_(value)
    timings = []
    for name, run in ways.items():
        try:
            timings.append((_median_seconds(run, restore, interpret), name))
        except Exception as e:     # e.g. out of shared memory: not a candidate
            logs.log("perf_hints", "autotune: %s skipped (%s)", name, type(e).__name__)
    restore()
    return sorted(timings)


def _median_seconds(run, restore, interpret: bool) -> float:
    """Median seconds of ``run()`` (each after ``restore()``), after a first untimed run (it
    compiles): CUDA events on the GPU, the clock under the interpreter."""
    repeat = 1 if interpret else 5
    times = []
    for _ in range(repeat + 1):
        restore()
        if interpret:
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        else:
            begin, end = torch.cuda.Event(enable_timing=True), \
                torch.cuda.Event(enable_timing=True)
            begin.record()
            run()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
    return sorted(times[1:])[len(times[1:]) // 2]


class MatmulChoice:
    """``choice(*args)`` runs a matmul with its pointwise epilogue
    (``targets/triton/matmul.py``) the fastest way for its shape: the generated kernel in one
    of its tile configs, or the library's matmul (cuBLAS through ATen) followed by the
    epilogue alone. The first call times every way on the real arguments (buffers the
    epilogue writes are restored between trials) and caches the winner on disk by the
    kernel's source and device, like ``TritonLauncher``'s configs. Under Triton's
    interpreter timings mean nothing: the generated kernel runs, so tests check it."""

    def __init__(self, templates: list[TritonLauncher], epilogue: TritonLauncher, spec: dict,
                 args: list[str], key: str, interpret: bool):
        self.templates = templates
        self.epilogue = epilogue
        self.spec = spec
        self.key = key
        self.interpret = interpret
        self.run = None
        position = {name: i for i, name in enumerate(args)}
        self.operands = {role: None if op is None else (position[op[0]], *op[1:])
                         for role, op in spec["operands"].items()}
        # the epilogue's arguments among ours; -1: the matmul's result
        self.epilogue_args = [-1 if name == spec["out"] else position[name]
                              for name in spec["epilogue_args"]]
        stored = set(spec["epilogue_args"]) - {spec["out"]}
        self.written = tuple(i for i, name in enumerate(args) if name in stored)

    def parts(self, name: str, args: list[str]) -> dict[str, tuple]:
        """The kernels to compile ahead, by the names the compile workers take, with their
        argument names (``args``: the fused kernel's)."""
        out = {f"{name}#{i}": (launcher, args) for i, launcher in enumerate(self.templates)}
        out[self.spec["epilogue"]] = (self.epilogue, self.spec["epilogue_args"])
        return out

    def __call__(self, *args):
        if self.run is None:
            self.run = self._choose(args)
        return self.run(*args)

    def library(self, *args):
        from ember.backend.runtime import reinterpret, with_layout
        views = {role: None if op is None else reinterpret(args[op[0]], *op[1:])
                 for role, op in self.operands.items()}
        if self.spec["op"] == "mm":
            out = torch.mm(views["a"], views["b"])
        else:
            out = torch.addmm(views["bias"], views["a"], views["b"], beta=self.spec["beta"],
                              alpha=self.spec["alpha"])
        out = with_layout(out, *(tuple(v) for v in self.spec["out_layout"]))
        self.epilogue(*[out if i < 0 else args[i] for i in self.epilogue_args])

    def _ways(self) -> dict:
        ways = {f"triton {_config_name(t.config)}": t for t in self.templates}
        ways["library"] = self.library
        return ways

    def _choose(self, args):
        ways = self._ways()
        if self.interpret:
            return self.templates[0]
        path = _autotune_path(self.key)
        stored = _read_json(path)
        best = stored.get("way") if isinstance(stored, dict) else None
        if stored is not None and best not in ways:
            _discard(path, "not one of the matmul's ways")
        if best not in ways:
            timings = _time_ways({name: functools.partial(way, *args)
                                  for name, way in ways.items()}, args, self.written, False)
            best = timings[0][1]
            _write_json(path, {"way": best})
            logs.log("perf_hints", "autotune: matmul %dx%d with its epilogue: %s",
                     self.spec["rows"], self.spec["cols"],
                     ", ".join(f"{n} {t * 1e6:.1f} us" for t, n in timings))
        return ways[best]


def _config_name(config: dict) -> str:
    return "x".join(str(config[k]) for k in ("XBLOCK", "RBLOCK", "KBLOCK")) + \
        f" w{config['num_warps']} s{config['num_stages']}"


def _launch_constants(recorded: tuple, grid: tuple, values: tuple):
    """Split the recorded arguments of a C launch into the constants between the stream and
    the kernel's arguments ``values``, and where those went: spread at the end ("spread",
    Triton 3.6) or as a last tuple ("tuple", 3.8). (None, None) when the recording is not
    grid, stream, constants, arguments."""
    if tuple(recorded[:3]) != grid:
        return None, None

    def same(got, want):
        return len(got) == len(want) and all(g is w for g, w in zip(got, want))
    if len(recorded) >= 4 + len(values) and same(recorded[len(recorded) - len(values):], values):
        return recorded[4:len(recorded) - len(values)], "spread"
    if isinstance(recorded[-1], tuple) and same(recorded[-1], values):
        return recorded[4:-1], "tuple"
    return None, None


def _autotune_path(key: str):
    from ember.backend.runtime.disk_cache import cache_dir
    return cache_dir() / "autotune" / f"{key}.json"


_KEY = re.compile(r"[0-9A-Za-z_-]{1,128}")


def _is_key_index(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) and _KEY.fullmatch(v)
        for k, v in value.items())


_POOL_MIN_KERNELS = 4          # fewer new kernels compile in this process
_workers = None                # CompileWorkers, started once per process
_workers_broken = False


def _worker_count() -> int:
    env = os.environ.get("EMBER_COMPILE_WORKERS")
    if env is not None:
        if not env.isdigit():
            raise ValueError(f"EMBER_COMPILE_WORKERS={env!r}: expected a number of worker "
                             f"processes (0: compile in this process)")
        return int(env)
    return max(0, min(16, (os.cpu_count() or 2) - 1))


def start_compile_workers() -> None:
    """Start the worker processes now (each imports Triton: about a second), so they are
    ready by the time the graph's kernels are generated. ``EMBER_COMPILE_WORKERS=0``: none."""
    global _workers, _workers_broken
    if _workers is not None or _workers_broken or _worker_count() == 0:
        return
    from ember.backend.targets.triton.compile_workers import CompileWorkers
    try:
        _workers = CompileWorkers(_worker_count())
    except OSError as e:     # no processes here (a sandbox): threads compile instead
        _workers_broken = True
        logs.log("perf_hints", "triton: no compile workers (%s); compiling in threads", e)


def precompile(launchers: dict, example_args: dict, module_path: str,
               fresh: bool) -> tuple[int, int]:
    """Compile or load every kernel (name -> launcher) for its example arguments before the
    first call.

    Kernels of a ``fresh`` module (its source new to this machine) compile in the worker
    processes, each into Triton's cache; this process then loads them from there directly,
    by the cache key the worker answered, past Triton's JIT (which would hash Triton's own
    sources, run ``ptxas --version`` and walk each kernel's AST to compute the same key).
    The keys are kept beside the module, so a later process loads the same kernels directly
    too. Whatever is not loaded that way (few kernels, no workers, a key not kept or its
    cache entry gone) goes through Triton's JIT, in threads: a cache hit where a worker or an
    earlier process compiled it. Returns how many kernels were loaded directly and how many
    through the JIT."""
    items = [(name, launcher, example_args[name]) for name, launcher in launchers.items()
             if 0 not in launcher.grid and name in example_args]
    if not items:
        return 0, 0
    start = time.perf_counter()
    major, minor = torch.cuda.get_device_capability(items[0][2][0].device)
    arch = major * 10 + minor
    index_path = module_path[:-3] + ".compiled.json"
    known = {} if fresh else _read_json(index_path) or {}
    if not _is_key_index(known):     # the keys name folders of Triton's cache: checked
        _discard(index_path, "not a map of Triton cache keys")
        known = {}
    keys = {}
    if fresh and len(items) >= _POOL_MIN_KERNELS:
        driver = threading.Thread(target=_prepare_driver, daemon=True)
        driver.start()              # while the workers compile
        keys = _compile_in_workers(items, module_path, arch)
        driver.join()
    requests = {}
    triton_state = (_triton_fingerprint(), _triton_env())
    for name, launcher, args in items:
        try:
            requests[name] = src, index_key = _request(launcher, args, arch, triton_state)
        except (AttributeError, TypeError, ValueError, KeyError) as e:   # another Triton's JIT
            logs.log("perf_hints", "triton: %s not loaded from Triton's cache directly (%s: "
                     "%s)", name, type(e).__name__, e)
            continue
        key = keys.get(name) or known.get(index_key)
        if key is not None:
            launcher.compiled = _load_compiled(src, key)
    direct = sum(launcher.compiled is not None for _, launcher, _ in items)
    rest = [item for item in items if item[1].compiled is None]
    if rest:
        from ember.backend.targets.triton.compile_workers import warm_up_triton
        warm_up_triton()     # once, before the threads below each look up Triton's cache
        with concurrent.futures.ThreadPoolExecutor(min(len(rest), os.cpu_count() or 1,
                                                       16)) as pool:
            futures = [pool.submit(launcher.warmup, args) for _, launcher, args in rest]
            for (_, launcher, _), future in zip(rest, futures):
                launcher.compiled = future.result()
    now = {requests[name][1]: launcher.compiled.hash for name, launcher, _ in items
           if name in requests and getattr(launcher.compiled, "hash", None)}
    if any(known.get(k) != v for k, v in now.items()):
        _write_json(index_path, {**known, **now})
    logs.log("perf_hints", "triton: %d kernels ready in %.2f s (%d loaded from Triton's "
             "cache directly, %d through its JIT)", len(items), time.perf_counter() - start,
             direct, len(rest))
    return direct, len(rest)


def _prepare_driver() -> None:
    """Triton's CUDA driver module, which the first launch needs: built with a C compiler
    the first time on a machine (a third of a second), loaded from Triton's cache after."""
    try:
        from triton.runtime import driver
        driver.active.utils   # noqa: B018
    except Exception:    # noqa: BLE001 (met again, and reported, by the first launch)
        pass


def _request(launcher, args, arch: int, triton_state: tuple):
    """The kernel's compile request (Triton's source object) and the key under which its
    Triton cache key is kept: everything that decides Triton's key (``triton_state``: the
    installation and its environment variables) but the kernel's source, which the
    module's file name is the hash of. The constexprs are part of it: a matmul template's
    tile configs are one function with different block sizes, and one config's binary
    launched on another's grid computes wrong values."""
    from ember.backend.targets.triton.compile_workers import compile_request
    dtypes = _dtype_names(args)
    src, options, _ = compile_request(launcher.fn, dtypes, launcher.config, arch)
    parts = [*triton_state, src.name, dtypes, arch, sorted(options.items()),
             sorted(src.constants.items()), sorted(src.signature.items()), repr(src.attrs)]
    return src, hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _load_compiled(src, key: str):
    """Triton's compiled kernel for ``src`` from its cache entry ``key``, or None when the
    entry is gone or this Triton builds compiled kernels differently (it is then compiled
    or loaded through the JIT, and the log says why)."""
    try:
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.cache import get_cache_manager
        metadata = f"{src.name[:150]}.json"
        group = get_cache_manager(key).get_group(metadata)
        if not group or metadata not in group:
            return None
        return CompiledKernel(src, group, key)
    except (ImportError, AttributeError, TypeError, KeyError, ValueError, OSError) as e:
        logs.log("perf_hints", "triton: %s not loaded from Triton's cache directly (%s: %s)",
                 src.name, type(e).__name__, e)
        return None


@functools.lru_cache(maxsize=1)
def _triton_fingerprint() -> str:
    """Triton's version and the size and time of its native libraries and bundled tools
    (``ptxas``): a kept Triton cache key is not used across an upgrade or a rebuild."""
    import triton
    root = os.path.dirname(triton.__file__)
    stats = [triton.__version__]
    for folder in ("_C", os.path.join("backends", "nvidia", "bin")):
        try:
            names = sorted(os.listdir(os.path.join(root, folder)))
        except OSError:
            continue
        for name in names:
            st = os.stat(os.path.join(root, folder, name))
            stats.append((folder, name, st.st_size, st.st_mtime_ns))
    return repr(stats)


def _triton_env() -> str:
    """The environment variables that change what Triton compiles (Triton's own list)."""
    try:
        from triton.compiler import compiler
        variables = compiler.get_cache_invalidating_env_vars()
    except (ImportError, AttributeError):
        variables = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    return repr(sorted(variables.items()))


def _read_json(path):
    from ember.backend.runtime import disk_cache
    return disk_cache.read_json(path)


def _discard(path, reason) -> None:
    from ember.backend.runtime import disk_cache
    disk_cache.discard(path, reason)


def _write_json(path, value) -> None:
    from ember.backend.runtime import disk_cache
    disk_cache.write_json(path, value, "storing a kernel choice")


def _compile_in_workers(items, module_path: str, arch: int) -> dict[str, str]:
    """Compile in the worker processes; returns each compiled kernel's Triton cache key."""
    start_compile_workers()
    if _workers is None:
        return {}
    start, started_at = time.perf_counter(), time.time()
    tasks, launchers = [], set()
    # the longest sources first (reductions, many inputs): they take longest to compile,
    # and the batch ends with its slowest kernel
    for name, launcher, args in sorted(items, key=lambda item: -len(_source_of(item[1]))):
        dtypes = _dtype_names(args)
        # kernels of one argument signature and constexprs share a C launcher: build it once
        signature = (tuple(dtypes), tuple(sorted(launcher.config.items())))
        tasks.append((module_path, name, dtypes, launcher.config, arch, 32,
                      signature not in launchers))
        launchers.add(signature)
    errors, keys = _workers.run(tasks)
    if errors:    # this process compiles what the workers could not, and says why
        logs.log("perf_hints", "triton: compile workers failed on %d kernels (first: %s)",
                 len(errors), errors[0])
    seconds = _workers.seconds
    slowest = max(seconds, key=seconds.get, default=None)
    waited = max((ready - started_at for ready in _workers.ready.values()), default=0.0)
    logs.log("perf_hints", "triton: %d kernels compiled by %d workers in %.2f s (%.2f s of "
             "compiling; slowest %s %.2f s; the last worker ready %.2f s after the batch began)",
             len(items), len(_workers.procs), time.perf_counter() - start,
             sum(seconds.values()), slowest, seconds.get(slowest, 0.0), max(waited, 0.0))
    return keys


def _dtype_names(args) -> list[str]:
    """torch's names of the arguments' dtypes ("bfloat16"), as the workers take them;
    "size" for a size argument (an int)."""
    return [str(a.dtype).split(".")[-1] if isinstance(a, torch.Tensor) else "size"
            for a in args]


def _source_of(launcher) -> str:
    return getattr(launcher.fn, "src", "") or ""
