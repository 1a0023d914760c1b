"""Code generation targets, and which one serves each device.

A :class:`Target` turns the scheduler's fused kernels into callables: it makes one
``codegen.common.Kernel`` per kernel (whose ``generate()`` gives the source and whose
``call_lines()`` give the wrapper's launch), builds them together, and says which dtypes
its kernels compute (others run their ATen kernels).

Design: what differs between devices is asked of the target, never decided by
``device.type`` outside this package (and the wrapper's run-time helpers): the policy hooks
of :class:`Target` (``pads_matmuls``, ``prefers_channels_last``, ``supports_cudagraphs``...)
say what the device's library kernels and the target's own kernels favour, with defaults
that change nothing, so a new target overrides only what it knows better. Targets are found
through a registry, ``register_target(device_type, name, factory)``: the first target
registered for a device type is its default, and ``cpu_backend`` names one of the CPU's.
The registry holds Target classes, not instances (``Target.create`` makes one): tests check
a target's ops handler against the ops table without making it (making the CUDA one starts
its compile workers).

- ``cpp/``: C++/OpenMP, compiled by g++ and called through ctypes (CPU tensors);
- ``triton/``: Triton kernels for CUDA tensors; for CPU tensors, with
  ``options={"cpu_backend": "triton"}``, the same kernels run under Triton's interpreter
  (how CI checks the generated Triton without a GPU).

A new target: a package beside these with a Target subclass (``make_kernel``: a
``codegen.common.Kernel`` whose ops handler implements every name of ``ops.OP_NAMES``,
named by ``ops_handler``; ``op_templates``, its table of math ops; ``build``;
``full_source``; the policy hooks it knows better),
registered at the end of its module with ``register_target(device_type, name, cls)`` and
imported at the end of this one; tests/backend/targets/test_target_coverage.py then checks its ops.

``register_op(name, arity, cpp=..., triton=...)`` adds a math op to the ops table and every
target's code for it at run time (a plugin's op, a test's); Ember's own are written in the
tables (``ops.UNARY``, each target's ``op_templates``).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from ember.backend import ops as ops_table
from ember.backend.codegen.common import Kernel

if TYPE_CHECKING:
    from ember.backend.runtime.graph_cache import KernelRecord

COMMON_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32,
                            torch.int16, torch.int8, torch.uint8, torch.bool})


class Target:
    name = ""
    dtypes: frozenset = COMMON_DTYPES
    source_suffix = ".txt"
    device = torch.device("cpu")     # whose tensors its kernels read

    def splits(self, column: bool) -> bool:
        """Whether a reduction to few results runs as two (lowering/reductions.py);
        ``column``: its input is read contiguously along a kept dim (a sum over rows of
        columns)."""
        return False

    @classmethod
    def create(cls, device: torch.device, *, debug: bool, autotune: bool) -> Target:
        """The target for ``device``'s tensors (``target_for``): ``debug``, checks in the
        generated code; ``autotune``, ``max_autotune``."""
        return cls()

    @classmethod
    def ops_handler(cls) -> type:
        """The class of the ops handler its kernels run bodies under: it implements every
        name of ``ops.OP_NAMES`` (tests/backend/targets/test_target_coverage.py checks)."""
        raise NotImplementedError

    @classmethod
    def op_templates(cls, arity: int) -> dict[str, str]:
        """Its ops handler's table of math ops of ``arity`` (1 or 2) operands: name -> a
        format string of the operands' expressions (``{0}``, ``{1}``), which
        ``register_op`` adds to."""
        raise NotImplementedError(f"target {cls.name!r} has no table of math ops")

    def make_kernel(self, step, name: str, dtypes: dict) -> Kernel:
        raise NotImplementedError

    def build(self, kernels: list[KernelRecord]) -> dict[str, object]:
        """Compile (or load) the kernels ``make_kernel`` generated, as the graph cache
        records them (name, source, args...); the wrapper's namespace entries."""
        raise NotImplementedError

    def full_source(self, kernels: list[KernelRecord]) -> str:
        """The kernels' sources as one file (``EMBER_LOGS=output_code``, debug dumps)."""
        raise NotImplementedError

    # -- policy hooks: the defaults change nothing --------------------------------------

    # graphs with symbolic sizes (backend/symbolic.py): its kernels read the size symbols
    # their source names (``kernel.size_args``, set by ``generate()``: int64 values after
    # the buffers) and its ``call_lines`` pass them by name (the wrapper binds each symbol);
    # a target without it gets such graphs compiled once per size instead
    takes_size_arguments = False
    # under max_autotune, its kernels have configurations to time (else a perf hint says
    # there is nothing to tune)
    tunes_kernels = False
    # ``cudagraphs=True`` replays the compiled graph's launches as one CUDA graph
    # (runtime/cudagraphs.py)
    supports_cudagraphs = False
    # on ``channels_last`` graphs, depthwise convolutions stay NCHW unless eager's input is
    # channels-last (passes/layout.py)
    keeps_depthwise_nchw = False
    # depthwise convolutions of at most this many filter taps are generated as stencils
    # fused with their neighbours (lowering/convolution.py); 0: the library runs them all
    max_generated_depthwise_taps = 0
    # float16/bfloat16 ops follow eager's CPU kernels where they differ from its CUDA ones:
    # a Python scalar operand is rounded to the op's dtype first, except mul's and div's,
    # which take it in float (lowering/registry.py ``make_pointwise``), and index_add and
    # scatter_add accumulate in float32, rounding once (lowering/indexing.py)
    cpu_half_rules = False
    # a body read more than once is recomputed by each reader while ops x extra reads stays
    # within this (graph.py ``computed_once``), else stored once: where a store and a load
    # of a value cost about as much as a dozen simple ops (a CPU core's caches)
    recompute_limit = 12
    # a pointwise node joins a kernel whose loops it reads in another grouping (its dims
    # regrouped, ``scheduler.Regroup``) only where it consumes the kernel's values or shares
    # a per-element load with it: on a CPU, a regrouped node that reads the same buffers
    # transposed makes one of the two read every element strided (scheduler.py
    # ``_shares_a_read``)
    regroups_only_to_share_loads = True
    # a split column sum's first half (partial sums over chunks of rows) joins a row kernel
    # that reads the same elements, accumulated as its rows go by (scheduler.py ``Across``):
    # layer norm's backward reads its input and gradient once, not twice
    sums_across_rows = False
    # max_pool2d's backward is generated (a gather of the output gradients whose windows
    # chose each input element, fused with its neighbours) rather than ATen's scatter
    generates_max_pool_backward = True
    # a body viewed with outer dims merged ([B, T, C] as [B*T, C]) is read through the view,
    # its loads dividing the row index (lowering/views.py ``_merge_rows``), instead of being
    # stored first: where integer division is cheap next to memory traffic
    inlines_merged_views = False

    # its kernels run at their real speed, so timing them against eager's means something
    # (runtime/eager_choice.py); False under an interpreter
    runs_natively = True

    def synchronize(self) -> None:
        """Wait for the work its kernels and eager's queued on its device (before and after
        a timed run: runtime/eager_choice.py)."""

    def fuse_templates(self, steps: list, output_names: set[str]) -> list:
        """The scheduled steps with library calls and the kernels after them merged where
        the target generates both as one kernel (Triton's matmul epilogues under
        ``max_autotune``: targets/triton/templates.py)."""
        return steps

    def pads_matmuls(self, dtype: torch.dtype) -> bool:
        """Whether ``config.matmul_padding="auto"`` pads the columns of large ``dtype``
        matmuls whose rows are not 16-byte aligned (lowering/matmul.py)."""
        return False

    def adds_addmm_bias(self, dtype: torch.dtype) -> bool:
        """Whether an ``addmm`` whose readers are all generated code runs as ``mm`` with the
        bias added in the kernel that reads it (lowering/matmul.py): where the library's
        addmm costs a pass over its result to copy the bias in."""
        return False

    def upcasts_half_matmuls(self, dtype: torch.dtype) -> bool:
        """Whether ``dtype`` matmuls (float16/bfloat16 ``mm``, ``addmm``, ``bmm``),
        convolutions and their backward compute on float32 copies of their operands, the
        results rounded by their readers (lowering/matmul.py): where the library's
        half-precision GEMM is a slow loop."""
        return False

    def adds_conv_bias(self, dtype: torch.dtype) -> bool:
        """Whether a ``convolution`` whose readers are all generated code runs without its
        bias, the bias added in the kernel that reads it (lowering/convolution.py): where
        the library adds the bias in a pass of its own."""
        return False

    def prefers_channels_last(self, gm: torch.fx.GraphModule, convolutions: list,
                              training: bool) -> bool:
        """Whether ``config.layout_optimization="auto"`` runs the captured graph ``gm``'s 2-D
        ``convolutions`` channels-last (passes/layout.py)."""
        return False

    def cache_identity(self) -> str | None:
        """What compiled kernels depend on besides their source and the compiler versions
        (a GPU's model), for the graph cache's key; None: nothing."""
        return None


class CpuPolicy:
    """The policy answers of targets whose kernels read CPU tensors: what ATen's CPU
    kernels (oneDNN convolutions, the BLAS's addmm) favour. Listed before ``Target`` (or a
    GPU target) among a target's bases, it overrides their answers."""
    supports_cudagraphs = False
    keeps_depthwise_nchw = False
    max_generated_depthwise_taps = 0     # oneDNN's depthwise kernels fuse nothing but win
    cpu_half_rules = True
    recompute_limit = 12
    inlines_merged_views = False

    def pads_matmuls(self, dtype: torch.dtype) -> bool:
        return False

    def cache_identity(self) -> str | None:
        return None

    def synchronize(self) -> None:
        """CPU kernels and ATen's CPU ops finish before they return."""

    def adds_addmm_bias(self, dtype: torch.dtype) -> bool:
        """ATen's CPU addmm copies the broadcast bias into its result before the GEMM adds
        to it (lowering/matmul.py); in float32 and float64."""
        return dtype in (torch.float32, torch.float64)

    def adds_conv_bias(self, dtype: torch.dtype) -> bool:
        """oneDNN adds a convolution's bias inside its kernel."""
        return False

    def upcasts_half_matmuls(self, dtype: torch.dtype) -> bool:
        """Where oneDNN has no kernels of ``dtype`` for this CPU (AVX2: no AVX-512), ATen's
        half-precision GEMM is a scalar loop, 60x slower than float32's."""
        return half_gemm_is_slow(dtype)

    def prefers_channels_last(self, gm, convolutions, training):
        """Graphs whose weights that need converting are not large next to the activations
        (passes/layout.py; training counts them twice). Not training graphs whose half
        convolutions compute on float32 copies (``upcasts_half_matmuls``): channels-last
        made the builtin convnet's bf16 step 1.6x slower on AVX2 (48 against 30 ms)."""
        from ember.backend.passes.layout import half_dtype, weights_convert_cheaply
        if training:
            half = half_dtype(gm, convolutions, "cpu")     # (CPU autocast included)
            if half is not None and self.upcasts_half_matmuls(half):
                return False
        return weights_convert_cheaply(convolutions, training)


# device type -> target name -> Target class; the first of a device type is its default
_TARGETS: dict[str, dict[str, type[Target]]] = {}
# ops.<name> added by register_op -> its arity
_added_ops: dict[str, int] = {}


@functools.lru_cache(maxsize=None)
def half_gemm_is_slow(dtype: torch.dtype) -> bool:
    """oneDNN has no ``dtype`` (bfloat16/float16) kernels for this CPU, so ATen's CPU GEMM
    of that dtype is its scalar fallback."""
    if dtype == torch.bfloat16:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def register_target(device_type: str, name: str, factory: type[Target]) -> None:
    """Generate kernels for tensors of ``device_type`` with ``factory.create(device,
    debug=..., autotune=...)`` (``factory``: a Target subclass). The first registered for a
    device type is its default; on the CPU, ``options={"cpu_backend": name}`` chooses among
    them."""
    _TARGETS.setdefault(device_type, {})[name] = factory


def registered_targets() -> list[tuple[str, str, type[Target]]]:
    """``(device type, name, Target class)`` of every registered target."""
    return [(device_type, name, factory) for device_type, by_name in _TARGETS.items()
            for name, factory in by_name.items()]


def register_op(name: str, arity: int, **code: str) -> None:
    """Add ``ops.<name>``, elementwise math of ``arity`` (1 or 2) operands whose result has
    their dtype, with each registered target's code for it: ``code[target name]`` (``cpp=``,
    ``triton=``), a format string of the operands as in the target's ``op_templates``.
    Ember's own ops are written in those tables; this adds one from outside (a plugin, a
    test). Every target must have its code, so no body meets a target that lacks it."""
    names = {target_name for _, target_name, _ in registered_targets()}
    if name in ops_table.OP_NAMES:
        raise ValueError(f"ops.{name} already exists")
    if arity not in (1, 2):
        raise ValueError(f"register_op({name!r}): arity must be 1 or 2, not {arity!r}")
    if set(code) != names:
        raise ValueError(f"register_op({name!r}) needs code for each target "
                         f"({', '.join(sorted(names))}); given: {', '.join(sorted(code))}")
    for _, target_name, cls in registered_targets():
        if hasattr(cls.ops_handler(), name):    # its own method would shadow the template
            raise ValueError(f"register_op({name!r}): the {target_name} ops handler has a "
                             f"method of that name")
    tables = [(cls.op_templates(arity), code[target_name])
              for _, target_name, cls in registered_targets()]    # all asked before any change
    for table, template in tables:
        table[name] = template
    (ops_table.UNARY if arity == 1 else ops_table.BINARY).append(name)
    ops_table.OP_NAMES.append(name)
    _added_ops[name] = arity


def unregister_op(name: str) -> None:
    """Take out an op ``register_op`` added."""
    if name not in _added_ops:
        raise ValueError(f"ops.{name} was not added by register_op")
    arity = _added_ops.pop(name)
    for _, _, cls in registered_targets():
        cls.op_templates(arity).pop(name, None)
    (ops_table.UNARY if arity == 1 else ops_table.BINARY).remove(name)
    ops_table.OP_NAMES.remove(name)


def target_for(device: torch.device, cpu_backend: str = "cpp", debug: bool = False,
               autotune: bool = False) -> Target:
    """The target that generates kernels for tensors on ``device``."""
    by_name = _TARGETS.get(device.type)
    if not by_name:
        raise NotImplementedError(f"no code generation target for device {device.type!r}")
    if device.type == "cpu":
        if cpu_backend not in by_name:
            raise ValueError(f"cpu_backend must be {' or '.join(map(repr, by_name))}, not "
                             f"{cpu_backend!r}")
        factory = by_name[cpu_backend]
    else:
        factory = next(iter(by_name.values()))
    return factory.create(device, debug=debug, autotune=autotune)


def kernel_device(tensors: list[torch.Tensor]) -> torch.device:
    """The device whose tensors a graph's kernels are generated for: the accelerator's when
    there is one (ops on the other device's tensors run their ATen kernels)."""
    return next((t.device for t in tensors if t.device.type != "cpu"), torch.device("cpu"))


# the built-in targets register themselves (each imports Target from above: the cycle is
# why these imports come last)
from ember.backend.targets.cpp import target as _cpp_target  # noqa: E402,F401
from ember.backend.targets.triton import target as _triton_target  # noqa: E402,F401
