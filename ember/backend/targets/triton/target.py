"""The Triton target: ``@triton.jit`` kernels for CUDA tensors (:class:`TritonTarget`); for
CPU tensors, with ``options={"cpu_backend": "triton"}``, the same kernels under Triton's
interpreter (:class:`TritonInterpreterTarget`, how CI checks the generated Triton without a
GPU), with the CPU's policies: a CPU graph's lowering and layout are the same on both CPU
targets, only its kernels' language differs."""
from __future__ import annotations

import hashlib

import torch

from ember.backend.targets import COMMON_DTYPES, CpuPolicy, Target, register_target
from ember.backend.targets.triton.modules import load_triton_module


class TritonTarget(Target):
    name = "triton"
    source_suffix = ".py"
    # an H100 does ~20 float ops in the time of one byte of memory traffic: recomputing
    # GPT-2's GELU tanh (~14 ops) for its second reader beats storing and reloading it
    recompute_limit = 64
    # a regrouped node still joins a kernel whose loads it does not share: on a GPU the
    # fusion saves a launch, and a tile reads both orders coalesced (not yet measured
    # against keeping it apart)
    regroups_only_to_share_loads = False
    inlines_merged_views = True

    def __init__(self, interpret: bool, debug: bool = False,
                 device: torch.device = torch.device("cpu"), autotune: bool = False):
        self.interpret = interpret
        self.debug = debug
        self.device = device
        self.autotune = autotune
        # the interpreter computes half precision wrongly (DESIGN.md): float32 and wider only
        self.dtypes = COMMON_DTYPES if interpret else \
            COMMON_DTYPES | {torch.float16, torch.bfloat16}

    @classmethod
    def create(cls, device: torch.device, *, debug: bool, autotune: bool) -> TritonTarget:
        from ember.backend.targets.triton.launch import start_compile_workers
        start_compile_workers()    # their start overlaps this graph's tracing and lowering
        return cls(interpret=False, debug=debug, device=device, autotune=autotune)

    @classmethod
    def ops_handler(cls):
        from ember.backend.targets.triton.ops import TritonOpsHandler
        return TritonOpsHandler

    @classmethod
    def op_templates(cls, arity):
        from ember.backend.targets.triton.ops import BINARY_TRITON, UNARY_TRITON
        return UNARY_TRITON if arity == 1 else BINARY_TRITON

    # -- policy (CUDA) --------------------------------------------------------------------

    tunes_kernels = True
    supports_cudagraphs = True
    # kernels take the size symbols as int arguments: graphs with symbolic sizes compile once
    takes_size_arguments = True
    # cuDNN's channels-last depthwise kernels cost seconds on their first call in a process
    keeps_depthwise_nchw = True
    # depthwise convolutions as stencils (lowering/convolution.py): off until measured in one
    # process (benchmarks/depthwise_stencil.py). H100 bf16, separate processes, 25 taps
    # against 0: mobilenetv3_large_100 2.57 against 2.87 ms a call, GPU busy 1.92 against
    # 2.19; maxvit_tiny_rw_224 GPU busy 6.07 against 6.18 ms but wall 10.4-11.0 against
    # 7.7-7.8 ms, host-bound (and eager 13% slower in those processes too: unexplained)
    max_generated_depthwise_taps = 0

    def fuse_templates(self, steps, output_names):
        """Under ``max_autotune``, matmuls with the pointwise kernel after them (templates.py)."""
        if not self.autotune:
            return steps
        from ember.backend.targets.triton.templates import fuse_matmul_epilogues
        return fuse_matmul_epilogues(steps, output_names, self.dtypes)

    def pads_matmuls(self, dtype):
        """cuBLAS's fast half-precision kernels need 16-byte aligned rows."""
        return dtype in (torch.float16, torch.bfloat16)

    def adds_conv_bias(self, dtype):
        """ATen's cuDNN convolution adds its bias in a kernel of its own."""
        return True

    def prefers_channels_last(self, gm, convolutions, training):
        """cuDNN's tensor-core convolutions work on NHWC data: graphs whose convolutions
        compute in half precision (passes/layout.py)."""
        from ember.backend.passes.layout import half_dtype
        return half_dtype(gm, convolutions) is not None

    def cache_identity(self):
        return torch.cuda.get_device_name(self.device)

    def synchronize(self):
        torch.cuda.synchronize(self.device)

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
        from ember.backend.targets.triton.launch import (SizedTritonLauncher, TritonLauncher,
                                                         precompile)
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
            # the interpreter's timings mean nothing: a few configs test the machinery
            candidates = (k.candidates[:3] if self.interpret else k.candidates) \
                if self.autotune and not isinstance(k.grid, tuple) else None
            written = tuple(i for i, a in enumerate(k.args) if a in k.stored)
            if k.grid is None:     # symbolic sizes: the grid is computed per call
                launchers[k.name] = SizedTritonLauncher(
                    getattr(module, k.name), k.config, self.interpret, candidates=candidates,
                    written=written, key=key)
            else:
                launchers[k.name] = TritonLauncher(
                    getattr(module, k.name), k.grid, k.config, self.interpret,
                    candidates=candidates, rows=k.numel_x, written=written, key=key)
            compiled[k.name] = (launchers[k.name], [*k.args, *k.size_args])
        if not self.interpret:    # compile every kernel now, in parallel
            dtypes = {name: dtype for k in kernels for name, dtype in k.dtypes.items()}
            precompile({name: launcher for name, (launcher, _) in compiled.items()},
                       {name: [torch.empty(1, dtype=dtypes[a], device=self.device)
                               if a in dtypes else 2    # a size argument (int32)
                               for a in args] for name, (_, args) in compiled.items()},
                       module.__file__, fresh)
        return launchers


class TritonInterpreterTarget(CpuPolicy, TritonTarget):
    """Triton kernels for CPU tensors, run by Triton's interpreter."""
    runs_natively = False

    def __init__(self, debug: bool = False, autotune: bool = False):
        super().__init__(interpret=True, debug=debug, autotune=autotune)

    @classmethod
    def create(cls, device: torch.device, *, debug: bool,
               autotune: bool) -> TritonInterpreterTarget:
        return cls(debug=debug, autotune=autotune)


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


register_target("cuda", "triton", TritonTarget)
register_target("cpu", "triton", TritonInterpreterTarget)
