"""Code generation targets, and which one serves each device.

A :class:`Target` turns the scheduler's fused kernels into callables: it makes one
``codegen.common.Kernel`` per kernel (whose ``generate()`` gives the source and whose
``call_lines()`` give the wrapper's launch), builds them together, and says which dtypes
its kernels compute (others run their ATen kernels).

- ``cpp``: C++/OpenMP, compiled by g++ and called through ctypes (CPU tensors);
- ``triton``: Triton kernels for CUDA tensors; for CPU tensors, with
  ``options={"cpu_backend": "triton"}``, the same kernels run under Triton's interpreter
  (how CI checks the generated Triton without a GPU).
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import sys

import torch

from ember.backend.codegen.common import Kernel

_COMMON_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32,
                            torch.int16, torch.int8, torch.uint8, torch.bool})


class Target:
    name = ""
    dtypes: frozenset = _COMMON_DTYPES
    source_suffix = ".txt"
    def splits(self, column: bool) -> bool:
        """Whether a reduction to few results runs as two (lowering/reductions.py);
        ``column``: its input is read contiguously along a kept dim (a sum over rows of
        columns)."""
        return False

    # under max_autotune, a matmul and the pointwise kernel after it may run as one kernel
    # (templates.py)
    fuses_matmul_epilogues = False

    def make_kernel(self, step, name: str, dtypes: dict) -> Kernel:
        raise NotImplementedError

    def build(self, kernels: list[Kernel]) -> dict[str, object]:
        """Compile ``kernels`` (sources generated); the wrapper's namespace entries."""
        raise NotImplementedError

    def full_source(self, kernels: list[Kernel]) -> str:
        raise NotImplementedError


class CppTarget(Target):
    name = "cpp"
    source_suffix = ".cpp"

    def splits(self, column: bool) -> bool:
        """Column reductions: a column kernel parallelises over blocks of columns, few
        when the columns are few, and each block reads a slice of every row; split, the
        first kernel's threads take chunks of rows. 2 cores, ``(x * x).sum(0)`` ms, one
        kernel / split: [4096, 96] 0.027 / 0.014, [36864, 128] 0.73 / 0.39, [100000, 16]
        0.24 / 0.12, [2048, 512] 0.12 / 0.05; Wav2Vec2's weight norm (a [768, 48, 128]
        weight) 2.3 / 1.1 (eager 1.2). A row reduction's threads already split its rows."""
        return column

    def make_kernel(self, step, name, dtypes):
        from ember.backend.codegen.cpp import CppKernel
        return CppKernel(step, name, dtypes)

    def full_source(self, kernels):
        from ember.backend.codegen.cpp_prelude import PRELUDE
        return PRELUDE + "\n" + "\n".join(k.source for k in kernels)

    def build(self, kernels):
        from ember.backend import build
        from ember.backend.codegen.cpp_prelude import PRELUDE
        libs = build.compile_many([PRELUDE + "\n" + k.source for k in kernels]) \
            if kernels else []
        namespace = {}
        for kernel, lib in zip(kernels, libs):
            namespace[kernel.name] = build.kernel_function(lib, kernel.name, len(kernel.args))
            if kernel.uses_indirect:     # it checks indices or divisors (codegen/cpp.py)
                flags = getattr(lib, f"{kernel.name}_flags")
                flags.restype, flags.argtypes = ctypes.c_int, []
                namespace[f"{kernel.name}_flags"] = flags
        return namespace


class TritonTarget(Target):
    name = "triton"
    source_suffix = ".py"

    def __init__(self, interpret: bool, debug: bool = False,
                 device: torch.device = torch.device("cpu"), autotune: bool = False):
        self.interpret = interpret
        self.debug = debug
        self.device = device
        self.autotune = autotune
        # the interpreter computes half precision wrongly (DESIGN.md): float32 and wider only
        self.dtypes = _COMMON_DTYPES if interpret else \
            _COMMON_DTYPES | {torch.float16, torch.bfloat16}
        if not interpret:     # their start overlaps this graph's tracing and lowering
            from ember.backend.launch import start_compile_workers
            start_compile_workers()

    @property
    def fuses_matmul_epilogues(self) -> bool:
        return self.autotune

    def splits(self, column: bool) -> bool:
        """Every reduction to few results: a GPU's programs would idle otherwise."""
        return True

    def make_kernel(self, step, name, dtypes):
        from ember.backend.codegen.triton import TritonKernel
        from ember.backend.templates import MatmulEpilogue
        if isinstance(step, MatmulEpilogue):
            from ember.backend.codegen.triton_matmul import TritonMatmulKernel
            return TritonMatmulKernel(step, name, dtypes, interpret=self.interpret,
                                      debug=self.debug)
        return TritonKernel(step, name, dtypes, interpret=self.interpret, debug=self.debug)

    def full_source(self, kernels):
        from ember.backend.codegen.triton import module_source
        return module_source(kernels, self.interpret)

    def build(self, kernels):
        from ember.backend.launch import TritonLauncher, precompile
        if not kernels:
            return {}
        source = self.full_source(kernels)
        module, fresh = load_triton_module(source, self.interpret)
        device_name = "interpreter" if self.interpret else torch.cuda.get_device_name(self.device)
        launchers = {}
        compiled = {}       # what precompile compiles, by name: (launcher, argument names)
        for k in kernels:
            key = hashlib.sha256(f"{device_name}\n{k.source}".encode()).hexdigest()
            if k.matmul_spec:
                launchers[k.name] = choice = _matmul_choice(module, k, key, self.interpret)
                compiled.update(choice.parts(k.name, k.args))
                continue
            launchers[k.name] = TritonLauncher(
                getattr(module, k.name), k.grid, k.config, self.interpret,
                # the interpreter's timings mean nothing: a few configs test the machinery
                candidates=(k.candidates[:3] if self.interpret else k.candidates)
                if self.autotune and not isinstance(k.grid, tuple) else None, rows=k.numel_x,
                written=tuple(i for i, a in enumerate(k.args) if a in k.stored), key=key)
            compiled[k.name] = (launchers[k.name], k.args)
        if not self.interpret:    # compile every kernel now, in parallel
            dtypes = {name: dtype for k in kernels for name, dtype in k.dtypes.items()}
            precompile({name: launcher for name, (launcher, _) in compiled.items()},
                       {name: [torch.empty(1, dtype=dtypes[a], device=self.device)
                               for a in args] for name, (_, args) in compiled.items()},
                       module.__file__, fresh)
        return launchers


def _matmul_choice(module, k, key: str, interpret: bool):
    """The launch.MatmulChoice of a matmul kernel with its epilogue (triton_matmul.py)."""
    from ember.backend.codegen.triton_matmul import matmul_grid
    from ember.backend.launch import MatmulChoice, TritonLauncher
    spec = k.matmul_spec
    fn = getattr(module, k.name)
    templates = [TritonLauncher(fn, matmul_grid(spec, c), c, interpret) for c in k.candidates]
    epilogue = TritonLauncher(getattr(module, spec["epilogue"]), spec["epilogue_grid"],
                              spec["epilogue_config"], interpret)
    return MatmulChoice(templates, epilogue, spec, list(k.args), key, interpret)


def load_triton_module(source: str, interpret: bool):
    """Import generated Triton source from the kernel cache (Triton reads a kernel's source
    through ``inspect``, so it must live in a file). Returns the module and whether its
    source is new to the cache (its kernels were never compiled on this machine)."""
    if interpret:
        _enter_interpreter()
    from ember.backend import disk_cache
    from ember.backend.compile_workers import triton_module_name
    key = hashlib.sha256(source.encode()).hexdigest()
    name = triton_module_name(key)
    if name in sys.modules:
        return sys.modules[name], False
    path, fresh = _module_file(disk_cache.cache_dir(), key, source)
    if path is None:       # the cache could not be written: off for this process (warned)
        path, fresh = _module_file(disk_cache.scratch_dir(), key, source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # the checked source runs, not what the file holds by now (Triton's JIT reads the file
    # for each kernel's source, which this source is the content of)
    exec(compile(source, str(path), "exec"), module.__dict__)
    sys.modules[name] = module
    return module, fresh


def _module_file(root, key: str, source: str):
    """``(path, fresh)`` of the module file of ``source`` (named by its sha256 ``key``) below
    ``root``, written when missing; a file whose content does not hash to its name (damaged)
    is replaced. ``(None, True)`` when writing the cache failed."""
    from ember.backend import disk_cache
    path = root / "triton" / key[:2] / f"{key}.py"
    try:
        stored = path.read_bytes()
    except FileNotFoundError:
        stored = None
    except OSError as e:
        stored = e
    if stored is not None and (isinstance(stored, OSError) or
                               hashlib.sha256(stored).hexdigest() != key):
        disk_cache.discard(path, stored if isinstance(stored, OSError) else
                           "its content does not hash to its name")
        stored = None
    if stored is not None:
        disk_cache.touch(path)
        return path, False
    try:
        disk_cache.atomic_write(path, source.encode())
    except OSError as e:
        if not disk_cache.in_cache(path):
            raise
        disk_cache.failed(e, "storing a Triton module")
        return None, True
    return path, True


def _enter_interpreter() -> None:
    """Triton's interpreter must be chosen before Triton is imported: its own library
    functions (``tl.sum``...) are decorated then. Set ``TRITON_INTERPRET=1`` now if Triton
    is not imported yet; it stays set for the process."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    if "triton" in sys.modules:
        raise RuntimeError(
            "cpu_backend='triton' runs kernels under Triton's interpreter, which must be "
            "enabled before triton is imported: set TRITON_INTERPRET=1 in the environment")
    os.environ["TRITON_INTERPRET"] = "1"


def target_for(device: torch.device, cpu_backend: str = "cpp", debug: bool = False,
               autotune: bool = False) -> Target:
    """The target that generates kernels for tensors on ``device``."""
    if device.type == "cpu":
        if cpu_backend == "cpp":
            return CppTarget()
        if cpu_backend == "triton":
            return TritonTarget(interpret=True, debug=debug, autotune=autotune)
        raise ValueError(f"cpu_backend must be 'cpp' or 'triton', not {cpu_backend!r}")
    if device.type == "cuda":
        return TritonTarget(interpret=False, debug=debug, device=device, autotune=autotune)
    raise NotImplementedError(f"no code generation target for device {device.type!r}")


def variance_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype eager's var, std, var_mean and std_mean keep their statistics in, for
    inputs of ``dtype`` on ``device``: on the CPU float64 (ATen's CPU Welford reduction holds
    double state for float32: the variance of float32 values up to ~1e19 is finite, where
    float32 sums of squared deviations overflow), on CUDA float32 (half precision too)."""
    if device.type == "cpu" and dtype in (torch.float32, torch.float64):
        return torch.float64
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
