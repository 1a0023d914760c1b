"""The Triton target: ``@triton.jit`` kernels for CUDA tensors; for CPU tensors, with
``options={"cpu_backend": "triton"}``, the same kernels under Triton's interpreter (how CI
checks the generated Triton without a GPU)."""
from __future__ import annotations

import hashlib

import torch

from ember.backend.targets import COMMON_DTYPES, Target
from ember.backend.targets.triton.modules import load_triton_module


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
        self.dtypes = COMMON_DTYPES if interpret else \
            COMMON_DTYPES | {torch.float16, torch.bfloat16}
        if not interpret:     # their start overlaps this graph's tracing and lowering
            from ember.backend.targets.triton.launch import start_compile_workers
            start_compile_workers()

    @property
    def fuses_matmul_epilogues(self) -> bool:
        return self.autotune

    def splits(self, column: bool) -> bool:
        """Every reduction to few results: a GPU's programs would idle otherwise."""
        return True

    def make_kernel(self, step, name, dtypes):
        from ember.backend.targets.triton.kernel import TritonKernel
        from ember.backend.targets.triton.templates import MatmulEpilogue
        if isinstance(step, MatmulEpilogue):
            from ember.backend.targets.triton.matmul import TritonMatmulKernel
            return TritonMatmulKernel(step, name, dtypes, interpret=self.interpret,
                                      debug=self.debug)
        return TritonKernel(step, name, dtypes, interpret=self.interpret, debug=self.debug)

    def full_source(self, kernels):
        from ember.backend.targets.triton.kernel import module_source
        return module_source(kernels, self.interpret)

    def build(self, kernels):
        from ember.backend.targets.triton.launch import TritonLauncher, precompile
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
    """The launch.MatmulChoice of a matmul kernel with its epilogue (matmul.py)."""
    from ember.backend.targets.triton.matmul import matmul_grid
    from ember.backend.targets.triton.launch import MatmulChoice, TritonLauncher
    spec = k.matmul_spec
    fn = getattr(module, k.name)
    templates = [TritonLauncher(fn, matmul_grid(spec, c), c, interpret) for c in k.candidates]
    epilogue = TritonLauncher(getattr(module, spec["epilogue"]), spec["epilogue_grid"],
                              spec["epilogue_config"], interpret)
    return MatmulChoice(templates, epilogue, spec, list(k.args), key, interpret)
