"""Build C++ kernels: compile to shared libraries, cache them on disk by content hash, load them.

Cache
    ``cache_dir()`` is the checked cache directory (``disk_cache.py``: ``$EMBER_CACHE_DIR`` or
    ``~/.cache/ember``, owned by the user, not writable by others), or, when the process
    does not use it (warned once: unusable directory, full disk...), a private scratch
    directory: a library must be a file to be loaded. A kernel lives at
    ``<cache>/cpp/<key[:2]>/<key>.so`` with its source kept next to it as ``<key>.cpp`` for
    debugging (also when compilation fails). ``key`` is the sha256 of the source, the flags,
    the compiler's ``--version`` first line and a host fingerprint (machine architecture +
    the CPU flags from ``/proc/cpuinfo``), because ``-march=native`` makes the object code
    depend on the CPU: a cache directory shared between different hosts must not hand one
    host's AVX-512 kernel to another.

Atomicity and integrity
    The compiler writes a temporary file in the same folder, which is sealed (its length and
    sha256 appended: ``disk_cache.seal_file``) and then ``os.replace``-d onto the final name.
    A rename within one file system is atomic, so a concurrent process either sees no ``.so``
    (and compiles it too, harmlessly: same content) or the complete one. Before a library is
    ``dlopen``-ed its seal is checked: a truncated or overwritten library would otherwise be
    mapped and kill the process with SIGBUS on first touch (or fail with "file too short"
    in every later process). A damaged one is deleted (never rewritten in place: another
    process may have it mapped) and compiled again. A failure to write the cache (full disk,
    read-only) turns the cache off for the process and the kernel is built in the scratch
    directory.

Loading
    ``load_cpp`` memoizes ``ctypes.CDLL`` objects in-process by the ``.so`` path (which contains
    the key and the cache directory), weakly: a library no compiled graph uses any more (after
    ``ember.reset()``) is ``dlclose``-d, so a long-running process that compiles again and again
    does not keep every library it ever loaded mapped. That is safe because a ctypes function
    pointer keeps its library object alive, and nothing else holds a kernel's address; a
    kernel's OpenMP region has ended when its call returns (libgomp's idle threads do not
    refer to it). ``torch`` is imported by this module before any kernel is
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
    ``-fno-trapping-math`` floating-point operations may be computed where their result is
                         then discarded: without it g++ keeps a loop with a float ``?:``
                         (``where``, leaky ReLU, tanh's two ranges) scalar on AVX2, which
                         has no masked arithmetic to hide an exception (AVX-512 has; an
                         AMD EPYC here left them all scalar). Values are unchanged; only
                         the FP exception flags, which no kernel reads, may differ.
    ``-mno-mmx``         REQUIRED: on a CPU without AVX g++ 12 may keep 64-bit values of a
                         reduction in MMX registers and return without ``emms``; the x87
                         state it leaves makes eager's next float op give NaN. SSE2 serves.
    ``-DNDEBUG``         no ``assert`` in kernels.
    ``EMBER_CXX`` overrides the compiler (default ``g++``).
"""
from __future__ import annotations

import _ctypes
import concurrent.futures
import ctypes
import dataclasses
import errno
import functools
import hashlib
import os
import pathlib
import platform
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Callable, Sequence

import torch  # noqa: F401  -- must be loaded before any kernel: one OpenMP runtime (see above)

from ember import logs
from ember.backend.runtime import disk_cache
from ember.backend.runtime.disk_cache import cache_dir

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
# loaded libraries, by path, while a compiled graph uses them (see Loading above)
_loaded: "weakref.WeakValueDictionary[pathlib.Path, ctypes.CDLL]" = weakref.WeakValueDictionary()


def loaded_count() -> int:
    """Kernel libraries loaded now (tests check it stays bounded)."""
    return len(_loaded)


def cxx() -> str:
    """The C++ compiler: ``$EMBER_CXX`` or ``g++``."""
    return os.environ.get("EMBER_CXX") or "g++"


def cxx_flags() -> list[str]:
    """Flags for every kernel (each one's reason is in the module docstring)."""
    return ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
            "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-mno-mmx",
            "-DNDEBUG"]


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


_FORMAT = "sealed-1"     # how a library is stored (a changed format never reads an old entry)


def _key(source: str, flags: Sequence[str], compiler: str) -> str:
    h = hashlib.sha256()
    for part in (_FORMAT, source, "\0".join(flags), compiler, _compiler_version(compiler),
                 _host_fingerprint()):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def _so_path(source: str, extra_flags: Sequence[str]) -> tuple[pathlib.Path, list[str], str]:
    compiler = cxx()
    flags = [*cxx_flags(), *extra_flags]
    key = _key(source, flags, compiler)
    return cache_dir() / "cpp" / key[:2] / f"{key}.so", flags, compiler


# also used for generated Triton modules (targets/triton/modules.py)
atomic_write = disk_cache.atomic_write
_atomic_write = atomic_write
_unlink = disk_cache.unlink


def _trim(text: str) -> str:
    text = text.strip()
    if len(text) <= _STDERR_LIMIT:
        return text
    return text[:_STDERR_LIMIT] + f"\n... ({len(text) - _STDERR_LIMIT} more characters)"


def _compile(source: str, so: pathlib.Path, flags: list[str], compiler: str) -> pathlib.Path:
    """Compile one source (no cache check) into ``so``; returns where the library is: ``so``,
    or its twin in the scratch directory when writing the cache failed (the cache is then
    off for this process, warned once)."""
    if disk_cache.in_cache(so):
        try:
            return _compile_into(source, so, flags, compiler)
        except OSError as e:
            disk_cache.failed(e, "storing a compiled kernel")
        so = _scratch_twin(so)
    return _compile_into(source, so, flags, compiler)


def _scratch_twin(so: pathlib.Path) -> pathlib.Path:
    return disk_cache.scratch_dir() / "cpp" / so.parent.name / so.name


_DISK_MESSAGES = ("No space left on device", "Read-only file system", "Disk quota exceeded")


def _compile_into(source: str, so: pathlib.Path, flags: list[str], compiler: str
                  ) -> pathlib.Path:
    disk_cache.makedirs(so.parent)
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
        err = _trim(proc.stderr or proc.stdout)
        written = next((m for m in _DISK_MESSAGES if m in err), None)
        if written is not None and disk_cache.in_cache(so):   # the cache's fault, not the source's
            raise OSError(errno.EIO, f"the compiler could not write its output ({written})",
                          str(so.parent))
        with _lock:
            build_stats.failed += 1
        raise CppCompileError(
            f"C++ compilation failed (exit {proc.returncode}); source kept at {cpp}\n"
            f"command: {' '.join(cmd)}\n{err}", source_path=cpp, stderr=err)
    try:
        disk_cache.seal_file(tmp)
        os.replace(tmp, so)
    except BaseException:
        _unlink(tmp)
        raise
    disk_cache.stored(so.stat().st_size)
    with _lock:
        build_stats.compiled += 1
        build_stats.compile_seconds += elapsed
    logs.log("output_code", "compiled %s in %.3f s", so, elapsed)
    return so


def _whole(so: pathlib.Path) -> bool:
    """``so`` is in the cache and whole; a damaged one is deleted (and said)."""
    try:
        disk_cache.check_sealed_file(so)
    except FileNotFoundError:
        return False
    except (OSError, disk_cache.DamagedEntry) as e:
        disk_cache.discard(so, e)
        return False
    disk_cache.touch(so)
    return True


def compile_cpp(source: str, *, extra_flags: Sequence[str] = ()) -> pathlib.Path:
    """Path of the shared library for ``source`` (checked whole); runs the compiler only on a
    cache miss."""
    so, flags, compiler = _so_path(source, extra_flags)
    if _whole(so):
        with _lock:
            build_stats.cache_hits += 1
        return so
    return _compile(source, so, flags, compiler)


def _load(so: pathlib.Path, key: pathlib.Path | None = None) -> ctypes.CDLL:
    """Load the (checked) library ``so``, memoized under ``key`` (default: ``so``)."""
    key = key or so
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            lib = ctypes.CDLL(str(so))
            finalizer = weakref.finalize(lib, _ctypes.dlclose, lib._handle)
            finalizer.atexit = False      # nothing to gain from unloading at exit
            _loaded[key] = lib
    return lib


def _load_checked(source: str, so: pathlib.Path, flags: list[str], compiler: str,
                  whole: bool | None = None) -> ctypes.CDLL:
    """Load the library of ``source`` at ``so``, compiling it again when it is damaged or
    fails to load (deleted first: never rewritten in place, another process may map it).
    ``whole``: ``_whole(so)`` when the caller knows it."""
    with _lock:
        lib = _loaded.get(so)
    if lib is not None:
        return lib
    if not (_whole(so) if whole is None else whole):
        return _load(_compile(source, so, flags, compiler), so)
    try:
        return _load(so)
    except OSError as e:        # whole but not loadable (written by another compiler...)
        disk_cache.discard(so, e)
        return _load(_compile(source, so, flags, compiler), so)


def load_cpp(source: str, *, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile (or find in the cache) and load ``source``; memoized in this process."""
    so, flags, compiler = _so_path(source, extra_flags)
    with _lock:
        lib = _loaded.get(so)
        if lib is not None:
            build_stats.memo_hits += 1
            return lib
    whole = _whole(so)
    if whole:
        with _lock:
            build_stats.cache_hits += 1
    return _load_checked(source, so, flags, compiler, whole)


def compile_many(sources: Sequence[str], *, extra_flags: Sequence[str] = ()
                 ) -> list[ctypes.CDLL]:
    """Load many kernels, compiling the uncached ones in parallel (one compiler process per
    CPU this process may run on). Returns the libraries in the order of ``sources``. If any
    fails, all compilations still finish (so the good ones are cached) and the first failing
    source's :class:`CppCompileError` is raised."""
    paths = [_so_path(src, extra_flags) for src in sources]
    todo: dict[pathlib.Path, tuple[str, list[str], str]] = {}   # deduplicated misses, in order
    held = []       # libraries already loaded, kept alive until they are returned
    whole = set()   # found whole in the cache
    for src, (so, flags, compiler) in zip(sources, paths):
        with _lock:
            lib = _loaded.get(so)
        if lib is not None:
            held.append(lib)
            continue
        if so in whole or _whole(so):
            whole.add(so)
            with _lock:
                build_stats.cache_hits += 1
            continue
        todo.setdefault(so, (src, flags, compiler))
    errors: dict[pathlib.Path, BaseException] = {}
    built: dict[pathlib.Path, pathlib.Path] = {}     # where each was built (cache or scratch)
    if len(todo) == 1:
        (so, args), = todo.items()
        try:
            built[so] = _compile(args[0], so, args[1], args[2])
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
                else:
                    built[so] = fut.result()
    for so, _, _ in paths:
        if so in errors:
            raise errors[so]
    libs = []
    for src, (so, flags, compiler) in zip(sources, paths):
        with _lock:
            lib = _loaded.get(so)
            if lib is not None:
                build_stats.memo_hits += 1
        if lib is None:
            lib = _load(built[so], so) if so in built else \
                _load_checked(src, so, flags, compiler, so in whole)
        libs.append(lib)
    del held
    return libs


def kernel_function(lib: ctypes.CDLL, name: str, nargs: int) -> Callable[..., None]:
    """The kernel ``name`` of ``lib`` as a Python callable taking ``nargs`` ints: data
    pointers (``t.data_ptr()``) or int64 scalars, all declared ``c_void_p`` (the fastest
    ctypes converter measured; see the module docstring)."""
    fn = lib[name]
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * nargs
    return fn
