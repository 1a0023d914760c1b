"""Build C++ kernels: compile to shared libraries, cache them on disk by content hash, load them.

Cache
    ``cache_dir()`` is ``$EMBER_CACHE_DIR`` or ``~/.cache/ember`` (read at each call, created on
    demand). A kernel lives at ``<cache>/cpp/<key[:2]>/<key>.so`` with its source kept next to it
    as ``<key>.cpp`` for debugging (also when compilation fails). ``key`` is the sha256 of the
    source, the flags, the compiler's ``--version`` first line and a host fingerprint (machine
    architecture + the CPU flags from ``/proc/cpuinfo``), because ``-march=native`` makes the
    object code depend on the CPU: a cache directory shared between different hosts must not
    hand one host's AVX-512 kernel to another.

Atomicity
    The compiler writes a temporary file in the same folder, which is then ``os.replace``-d onto
    the final name. A rename within one file system is atomic, so a concurrent process either
    sees no ``.so`` (and compiles it too, harmlessly: same content) or the complete one; it never
    ``dlopen``s a half-written file. The ``.cpp`` is written the same way.

Loading
    ``load_cpp`` memoizes ``ctypes.CDLL`` objects in-process by the ``.so`` path (which contains
    the key and the cache directory). ``torch`` is imported by this module before any kernel is
    loaded: the kernels are linked with ``-fopenmp`` against ``libgomp.so.1``, and torch's wheel
    ships its own ``libgomp.so.1``; with torch loaded first, the dynamic linker resolves the
    kernels' dependency to the already loaded library (same soname), so one OpenMP runtime (one
    thread pool, one ``omp_set_num_threads``) serves both.

Calling (``kernel_function``)
    Every argument is declared ``ctypes.c_void_p`` and the result ``None``. Measured on the
    2-core CPU machine (CPython 3.11, other work running), a no-op kernel with 3 pointer
    arguments costs 0.4-0.8 µs per call given Python ints, 1.2-1.4 µs when the call also
    evaluates three ``t.data_ptr()``; ``c_int64``/``c_size_t`` argtypes were 0.3-0.5 µs slower
    per call (slower converters), and ``PyDLL`` (keeps the GIL) was not measurably faster, so
    ``CDLL`` (releases the GIL while a kernel runs) is used. An ``int64_t`` scalar argument may
    also be passed through a ``c_void_p`` slot: on x86-64 SysV and AArch64 both travel in the
    same 64-bit general-purpose register, and ``c_void_p`` converts negative Python ints to
    their two's-complement bits.

Flags (``cxx_flags``)
    ``-O3``              full optimisation, including loop vectorisation.
    ``-march=native``    use the host's vector ISA (AVX2/AVX-512); kernels are built where they
                         run, and the host fingerprint is part of the cache key.
    ``-fopenmp``         ``#pragma omp parallel for`` / ``simd`` / reductions; links libgomp.
    ``-shared -fPIC``    produce a position-independent shared library for ``dlopen``.
    ``-std=c++17``       a fixed language level, so results do not depend on g++'s default.
    ``-ffp-contract=off`` REQUIRED: with ``-march=native`` g++ would contract ``a*b+c`` into a
                         fused multiply-add (one rounding); eager PyTorch rounds twice, so
                         contraction breaks bit-for-bit agreement with eager.
    ``-fno-math-errno``  math functions need not set ``errno``: ``sqrt`` becomes one instruction
                         (and vectorises) without a call to the libm error path. Values are
                         unchanged (IEEE results, NaN for domain errors), only ``errno`` is
                         not written, which no kernel reads. No ``-ffast-math``: it would
                         reassociate sums and assume no NaN/Inf, changing results.
    ``-DNDEBUG``         no ``assert`` in kernels.
    ``EMBER_CXX`` overrides the compiler (default ``g++``).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import hashlib
import os
import pathlib
import platform
import subprocess
import tempfile
import threading
import time
from typing import Callable, Sequence

import torch  # noqa: F401  -- must be loaded before any kernel: one OpenMP runtime (see above)

from ember import logs

__all__ = ["CppCompileError", "cache_dir", "cxx", "cxx_flags", "compile_cpp", "load_cpp",
           "compile_many", "kernel_function", "build_stats", "BuildStats"]

_STDERR_LIMIT = 4000  # characters of compiler output kept in a CppCompileError


class CppCompileError(RuntimeError):
    """The C++ compiler rejected a kernel. Carries its output and the kept source path."""

    def __init__(self, message: str, *, source_path: pathlib.Path | None = None,
                 stderr: str = ""):
        super().__init__(message)
        self.source_path = source_path
        self.stderr = stderr


@dataclasses.dataclass
class BuildStats:
    """Counters for tests and logs. ``compiled``: compiler runs that succeeded;
    ``cache_hits``: ``.so`` found on disk (no compiler run); ``memo_hits``: library already
    loaded in this process; ``compile_seconds``: total wall time spent in the compiler."""
    compiled: int = 0
    cache_hits: int = 0
    memo_hits: int = 0
    failed: int = 0
    compile_seconds: float = 0.0

    def reset(self) -> None:
        self.compiled = self.cache_hits = self.memo_hits = self.failed = 0
        self.compile_seconds = 0.0


build_stats = BuildStats()
_lock = threading.Lock()                       # guards build_stats and _loaded
_loaded: dict[pathlib.Path, ctypes.CDLL] = {}


_made_dirs: set[str] = set()   # cache roots already created by this process (skip the mkdir)


def cache_dir() -> pathlib.Path:
    """``$EMBER_CACHE_DIR`` or ``~/.cache/ember``, created on demand."""
    root = os.environ.get("EMBER_CACHE_DIR") or os.path.join(os.path.expanduser("~"),
                                                             ".cache", "ember")
    if root not in _made_dirs:
        os.makedirs(root, exist_ok=True)
        _made_dirs.add(root)
    return pathlib.Path(root)


def cxx() -> str:
    """The C++ compiler: ``$EMBER_CXX`` or ``g++``."""
    return os.environ.get("EMBER_CXX") or "g++"


def cxx_flags() -> list[str]:
    """Flags for every kernel (each one's reason is in the module docstring)."""
    return ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
            "-ffp-contract=off", "-fno-math-errno", "-DNDEBUG"]


def _link_flags() -> list[str]:
    """glibc's vector math library: kernels call its SIMD log/sin/cos/... variants (declared
    by the kernel prelude; float exp, erf and tanh are the prelude's own inline code), so
    loops of those functions vectorise too."""
    return ["-lmvec"] if platform.machine() == "x86_64" else []


@functools.lru_cache(maxsize=None)
def _compiler_version(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CppCompileError(f"cannot run the C++ compiler {compiler!r} (set EMBER_CXX): {e}"
                              ) from e
    return out.splitlines()[0].strip() if out else compiler


@functools.lru_cache(maxsize=None)
def _host_fingerprint() -> str:
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86 / ARM
                    parts.append(" ".join(sorted(line.split(":", 1)[1].split())))
                    break
    except OSError:
        parts.append(platform.processor())
    return "|".join(parts)


@functools.lru_cache(maxsize=1)
def has_avx512() -> bool:
    """The host runs AVX-512 (``-march=native`` gives kernels its 16-float vectors)."""
    return "avx512f" in _host_fingerprint().split()


def _key(source: str, flags: Sequence[str], compiler: str) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(flags), compiler, _compiler_version(compiler),
                 _host_fingerprint()):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def _so_path(source: str, extra_flags: Sequence[str]) -> tuple[pathlib.Path, list[str], str]:
    compiler = cxx()
    flags = [*cxx_flags(), *extra_flags]
    key = _key(source, flags, compiler)
    return cache_dir() / "cpp" / key[:2] / f"{key}.so", flags, compiler


def _atomic_write(path: pathlib.Path, text: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


atomic_write = _atomic_write   # also used for generated Triton modules (targets.py)


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _trim(text: str) -> str:
    text = text.strip()
    if len(text) <= _STDERR_LIMIT:
        return text
    return text[:_STDERR_LIMIT] + f"\n... ({len(text) - _STDERR_LIMIT} more characters)"


def _compile(source: str, so: pathlib.Path, flags: list[str], compiler: str) -> pathlib.Path:
    """Run the compiler for one source (no cache check) and move the result into place."""
    so.parent.mkdir(parents=True, exist_ok=True)
    cpp = so.with_suffix(".cpp")
    _atomic_write(cpp, source)
    fd, tmp = tempfile.mkstemp(dir=so.parent, prefix=so.stem + ".", suffix=".tmp.so")
    os.close(fd)
    cmd = [compiler, *flags, str(cpp), "-o", tmp, *_link_flags()]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        _unlink(tmp)
        raise CppCompileError(f"cannot run the C++ compiler {compiler!r}: {e}",
                              source_path=cpp) from e
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        _unlink(tmp)
        with _lock:
            build_stats.failed += 1
        err = _trim(proc.stderr or proc.stdout)
        raise CppCompileError(
            f"C++ compilation failed (exit {proc.returncode}); source kept at {cpp}\n"
            f"command: {' '.join(cmd)}\n{err}", source_path=cpp, stderr=err)
    os.replace(tmp, so)
    with _lock:
        build_stats.compiled += 1
        build_stats.compile_seconds += elapsed
    logs.log("output_code", "compiled %s in %.3f s", so, elapsed)
    return so


def compile_cpp(source: str, *, extra_flags: Sequence[str] = ()) -> pathlib.Path:
    """Path of the shared library for ``source``; runs the compiler only on a cache miss."""
    so, flags, compiler = _so_path(source, extra_flags)
    if so.exists():
        with _lock:
            build_stats.cache_hits += 1
        return so
    return _compile(source, so, flags, compiler)


def _load(so: pathlib.Path) -> ctypes.CDLL:
    with _lock:
        lib = _loaded.get(so)
        if lib is None:
            lib = _loaded[so] = ctypes.CDLL(str(so))
    return lib


def load_cpp(source: str, *, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile (or find in the cache) and load ``source``; memoized in this process."""
    so, _, _ = _so_path(source, extra_flags)
    with _lock:
        lib = _loaded.get(so)
        if lib is not None:
            build_stats.memo_hits += 1
            return lib
    return _load(compile_cpp(source, extra_flags=extra_flags))


def compile_many(sources: Sequence[str], *, extra_flags: Sequence[str] = ()
                 ) -> list[ctypes.CDLL]:
    """Load many kernels, compiling the uncached ones in parallel (one compiler process per
    CPU this process may run on). Returns the libraries in the order of ``sources``. If any
    fails, all compilations still finish (so the good ones are cached) and the first failing
    source's :class:`CppCompileError` is raised."""
    paths = [_so_path(src, extra_flags) for src in sources]
    todo: dict[pathlib.Path, tuple[str, list[str], str]] = {}   # deduplicated misses, in order
    for src, (so, flags, compiler) in zip(sources, paths):
        with _lock:
            memo = so in _loaded
        if memo:
            continue
        if so.exists():
            with _lock:
                build_stats.cache_hits += 1
            continue
        todo.setdefault(so, (src, flags, compiler))
    errors: dict[pathlib.Path, BaseException] = {}
    if len(todo) == 1:
        (so, args), = todo.items()
        try:
            _compile(args[0], so, args[1], args[2])
        except CppCompileError as e:
            errors[so] = e
    elif todo:
        cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
        workers = min(cpus, len(todo))
        with concurrent.futures.ThreadPoolExecutor(workers, "ember-cxx") as pool:
            futures = {so: pool.submit(_compile, src, so, flags, compiler)
                       for so, (src, flags, compiler) in todo.items()}
            for so, fut in futures.items():
                exc = fut.exception()
                if exc is not None:
                    errors[so] = exc
    for so, _, _ in paths:
        if so in errors:
            raise errors[so]
    libs = []
    for so, _, _ in paths:
        with _lock:
            lib = _loaded.get(so)
            if lib is not None:
                build_stats.memo_hits += 1
        libs.append(lib if lib is not None else _load(so))
    return libs


def kernel_function(lib: ctypes.CDLL, name: str, nargs: int) -> Callable[..., None]:
    """The kernel ``name`` of ``lib`` as a Python callable taking ``nargs`` ints: data
    pointers (``t.data_ptr()``) or int64 scalars, all declared ``c_void_p`` (the fastest
    ctypes converter measured; see the module docstring)."""
    fn = lib[name]
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * nargs
    return fn
