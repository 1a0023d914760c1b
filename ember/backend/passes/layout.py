"""Layout decisions for a graph: channels-last convolutions where they are faster.

cuDNN's tensor-core convolutions work on NHWC data; given NCHW tensors in half precision,
they transpose on the way in and out. When ``config.layout_optimization`` says so, every
2-D convolution of the captured (torch-level) graph reads its input and weight through
``.contiguous(memory_format=torch.channels_last)``, before the graph is traced to ATen: one
trace, whose metadata then follows. Convolutions return channels-last results, so the
conversion of a value that is already channels-last is no op at all, and the pointwise and
reduction work around them runs in that layout too (``GraphLowering`` realizes values with
the strides eager would give them, see ``preferred_layout``). Only the graph's first input
and the weights are converted; outputs keep eager's strides. The captured graph itself is
left as it is (it is what runs when compilation fails): the converted graph is a copy.

On CUDA, depthwise convolutions (one filter per channel) read NCHW input and weight unless
eager gives them channels-last input: cuDNN's channels-last depthwise kernels cost seconds
on their first call in a process (H200, mobilenetv3_large_100 bf16 batch 64, eager's first
call: 0.9 s NCHW, 5.9 s channels-last), and for its 3x3 and 5x5 filters ATen's NCHW kernel
runs as fast (Ember, same model: 2.8 s cold and 0.6 s warm first call, 1.7-1.8x eager,
against 5.8 s, 2.6 s and 1.6x with every convolution channels-last). The conversions to and
from NCHW around them fuse into the pointwise kernels next to them. Where eager's input is
channels-last (ConvNeXt: each block permutes back from NHWC), eager runs cuDNN's NHWC
kernel, pays its first call, and is far faster than ATen's NCHW one on 7x7 filters (H100,
torchvision convnext_tiny bf16 batch 32: 41 against 136 us a convolution, 2.5 of Ember's
5.0 ms a call); those stay channels-last. ``layout_optimization="channels_last"`` (asked
for by name) converts every convolution, depthwise ones too. In inference graphs, a
depthwise convolution the target generates as a stencil (``max_generated_depthwise_taps``,
lowering/convolution.py) is not converted at all: the stencil reads either layout, and its
output follows its input's.

Under ``auto`` the target decides (``Target.prefers_channels_last``, and for depthwise
convolutions ``keeps_depthwise_nchw``) by these rules. ``auto`` converts CUDA graphs whose
convolutions compute in float16/bfloat16 (their operands are half, or the graph runs them
under CUDA autocast), training graphs too: their
backward's per-channel reductions (batch norm's statistics and gradients) split into chunks
laid out channel-innermost, so they read channels-last data in contiguous rows
(``lowering/reductions.py``). H200, resnet50 AMP training step, GPU busy time per step:
NCHW 20.7 ms (3.3 ms of it cuDNN's own NCHW<->NHWC transposes), channels-last 16.6 ms
(37.5 ms before those reductions were laid out so).

On the CPU (oneDNN), depthwise convolutions go channels-last too, and ``auto`` converts
inference graphs whose weights that need converting are not large next to the activations
the convolutions read: an NCHW convolution reorders its input and output on every call, a
channels-last graph instead copies every weight that is not already NHWC-contiguous (a
k x k filter over several input channels; 1x1 and depthwise filters are) on every call. On
a 2-core machine the copy costs about 1 ns per weight element and channels-last saves about
2 ns per activation element read, so graphs convert while the weights are at most 1.5
times the activations. Medians, NCHW / channels-last ms (weights / activations): builtin
convnet (batch 16) 2.49 / 1.99 (0.01); torchvision mobilenet_v2 14.6 / 9.0 (0.0),
squeezenet1_1 7.9 / 4.7 (0.32), googlenet 25.3 / 18.2 (0.71), convnext_tiny 52.0 / 53.6
(0.55), deeplabv3_mobilenet_v3_large 24.9 / 22.9 (1.14); alexnet 12.1 / 12.9 (7.3) and
timm resnet18 at batch 1 6.9 / 18.0 (15): they stay NCHW. Training graphs follow the same
rule with the weights counted twice (their gradients convert back): training steps, 1
thread, eager / NCHW / channels-last ms: builtin convnet (batch 16) 29.5 / 24.6 / 21.6,
timm efficientnet_b0 (batch 1) 136 / 114 / 103, convnext_atto 82 / 80 / 80; resnet18 at
batch 1 (weights 15x) 73 / 72 / 86 stays NCHW. Half-precision training graphs whose
convolutions compute on float32 copies (no oneDNN half kernels: AVX2) stay NCHW (the
convnet's bf16 step 30 ms NCHW, 48 channels-last; ``CpuPolicy.prefers_channels_last``).

Outputs keep eager's strides: each output the conversion may have changed is copied back to
its eager layout (a permute, ``contiguous`` and the inverse permute; no copy where the layout
already matches). A graph stays in its captured layout when the converted copy cannot run
(``view`` of a channels-last value that eager could view: ``x.view(n, -1)`` after a
convolution), when an output still has other strides (one that is not dense), or when two
outputs alias each other (copying one back would part them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember import config, logs
from ember.backend.ir import same_strides
from ember.fake import storage_key

if TYPE_CHECKING:
    from ember.backend.targets import Target

T = TypeVar("T")



_HALF = (torch.float16, torch.bfloat16)


def _convolutions(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The graph's 2-D convolutions of batched (4-D) inputs."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.conv2d and len(node.args) >= 2:
            vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                    for a in node.args[:2]]
            if all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in vals):
                out.append(node)
    return out


def half_dtype(gm: torch.fx.GraphModule, convs: list[torch.fx.Node],
               device_type: str = "cuda") -> torch.dtype | None:
    """The float16/bfloat16 dtype the convolutions compute in: their operands', or that of
    the ``device_type`` autocast the graph runs them under; None: not half precision."""
    for n in convs:
        for a in n.args[:2]:
            if a.meta["val"].dtype in _HALF:
                return a.meta["val"].dtype
    if torch.is_autocast_enabled(device_type) and \
            torch.get_autocast_dtype(device_type) in _HALF:
        return torch.get_autocast_dtype(device_type)
    for n in gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "__name__", "") == \
                "_enter_autocast" and n.args[:1] == (device_type,) and n.args[1] in _HALF:
            return n.args[1]
    return None


def weights_convert_cheaply(convs: list[torch.fx.Node], training: bool = False) -> bool:
    """The weights a channels-last graph converts on every call are at most 1.5 times the
    elements its convolutions read; in training twice (each weight's gradient converts
    back to the parameter's layout too)."""
    converted = read = 0
    for node in convs:
        x, w = (a.meta["val"] for a in node.args[:2])
        read += _hint(x.numel())
        if not w.is_contiguous(memory_format=torch.channels_last):
            converted += _hint(w.numel())
    return converted * (4 if training else 2) <= read * 3


def _hint(n) -> int:
    """A count at the sizes seen: a symbolic one's hint, without a guard (either layout
    computes the same values: passes/symbolic_graph.py)."""
    return int(n.node.hint) if isinstance(n, torch.SymInt) else int(n)


def wants_channels_last(gm: torch.fx.GraphModule, target: Target,
                        training: bool = False) -> bool:
    """Whether the captured graph ``gm`` should run its convolutions channels-last (under
    ``auto``: as ``target`` prefers)."""
    choice = config.layout_optimization
    convs = _convolutions(gm)
    if choice == "off" or not convs:
        return False
    if choice == "channels_last":
        wanted = True
    else:
        wanted = target.prefers_channels_last(gm, convs, training)
    if wanted and _outputs_alias(gm):
        logs.log("perf_hints", "layout: the graph stays NCHW: two of its outputs alias each "
                 "other")
        return False
    return wanted


def _outputs(gm: torch.fx.GraphModule) -> list:
    return pytree.tree_leaves(gm.graph.output_node().args[0])


def _outputs_alias(gm: torch.fx.GraphModule) -> bool:
    storages = set()
    for node in dict.fromkeys(o for o in _outputs(gm) if isinstance(o, torch.fx.Node)):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            storage = storage_key(val)
            if storage in storages:
                return True
            storages.add(storage)
    return False


def _dense_order(val: torch.Tensor) -> list[int] | None:
    """The dims of ``val`` outermost first when it is dense (``val.permute(order)`` is
    contiguous; size-1 dims, whose strides indexing never reads, first), else None."""
    sizes, strides = val.shape, val.stride()
    ones = [d for d in range(val.dim()) if sizes[d] == 1 or val.numel() == 0]
    rest = sorted((d for d in range(val.dim()) if d not in ones), key=lambda d: -strides[d])
    expected = 1
    for d in reversed(rest):
        if strides[d] != expected:
            return None
        expected *= sizes[d]
    return ones + rest


def changed_output(gm: torch.fx.GraphModule, traced: torch.fx.GraphModule) -> str | None:
    """Which output of ``traced`` (an ATen trace of ``gm``'s converted copy) has other
    strides than ``gm``'s, in words, or None."""
    for i, (old, new) in enumerate(zip(_outputs(gm), _outputs(traced))):
        vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in (old, new)]
        if all(isinstance(v, torch.Tensor) for v in vals) and not same_strides(
                vals[0].shape, vals[0].stride(), vals[1].shape, vals[1].stride()):
            return (f"output {i} would have strides {vals[1].stride()} where eager's are "
                    f"{vals[0].stride()}")
    return None


def in_best_layout(gm: torch.fx.GraphModule, target: Target, training: bool,
                   build: Callable[[torch.fx.GraphModule], T],
                   check: Callable[[T], str | None] = lambda built: None) -> T:
    """``build(graph)`` of ``gm``'s channels-last copy where ``wants_channels_last`` and the
    copy traces (``ProgramError``: an op rejects the new strides) and passes ``check``
    (a reason to refuse it, or None); else ``build(gm)``."""
    from ember.aot.trace import ProgramError
    if not wants_channels_last(gm, target, training):
        return build(gm)
    try:
        # asked for by name, every convolution goes channels-last, depthwise ones too
        every = config.layout_optimization == "channels_last"
        built = build(convert_convolutions(gm, target, every, training))
        reason = check(built)
    except ProgramError as e:
        reason = f"its channels-last copy fails to trace ({e})"
    if reason is None:
        return built
    logs.log("perf_hints", "layout: the graph stays NCHW: %s", reason)
    return build(gm)


def _groups(node: torch.fx.Node):
    return node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)


def _is_depthwise(node: torch.fx.Node) -> bool:
    """One filter per input channel (``groups`` equal to the channels, above 1)."""
    groups = _groups(node)
    channels = node.args[0].meta["val"].shape[1]
    return isinstance(groups, int) and groups > 1 and groups == channels and \
        node.args[1].meta["val"].shape[1] == 1


def _eager_reads_channels_last(node: torch.fx.Node) -> bool:
    x = node.args[0].meta["val"]
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def convert_convolutions(gm: torch.fx.GraphModule, target: Target, every: bool = False,
                         training: bool = False) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose 2-D convolutions read channels-last input and weight (where
    ``target.keeps_depthwise_nchw``, depthwise ones NCHW unless eager's input is
    channels-last, or ``every``). Outside training, a depthwise convolution the target
    generates as a stencil (lowering/convolution.py) reads its input as it comes: the
    stencil runs in either layout, and a conversion would be a pass of its own."""
    from ember.backend.lowering.convolution import generates_depthwise
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    originals = _convolutions(gm)
    layouts = []
    for n in originals:
        if not every and not training and _is_depthwise(n) and generates_depthwise(
                target, n.args[0].meta["val"], n.args[1].meta["val"], _groups(n)):
            layouts.append(None)
        elif not every and target.keeps_depthwise_nchw and _is_depthwise(n) and \
                not _eager_reads_channels_last(n):
            layouts.append(torch.contiguous_format)
        else:
            layouts.append(torch.channels_last)
    for node, layout in zip((copies[n] for n in originals), layouts):
        for i in (0, 1) if layout is not None else ():
            with graph.inserting_before(node):
                converted = graph.call_method("contiguous", (node.args[i],),
                                              {"memory_format": layout})
            node.update_arg(i, converted)
    _restore_output_layouts(gm, graph, copies)
    graph.lint()
    logs.log("perf_hints", "layout: %d convolutions run channels-last, %d depthwise ones "
             "NCHW, %d generated depthwise ones in their input's layout",
             layouts.count(torch.channels_last), layouts.count(torch.contiguous_format),
             layouts.count(None))
    return torch.fx.GraphModule(gm, graph)


def _restore_output_layouts(gm: torch.fx.GraphModule, graph: torch.fx.Graph,
                            copies: dict[torch.fx.Node, torch.fx.Node]) -> None:
    """Copy each dense tensor output of the converted ``graph`` back to eager's strides."""
    output = graph.output_node()
    restored: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in dict.fromkeys(o for o in _outputs(gm) if isinstance(o, torch.fx.Node)):
        val = node.meta.get("val")
        order = _dense_order(val) if isinstance(val, torch.Tensor) else None
        if order is None or node.op == "placeholder":
            continue
        with graph.inserting_before(output):
            value = copies[node]
            if order != sorted(order):
                value = graph.call_method("permute", (value, *order))
            value = graph.call_method("contiguous", (value,))
            if order != sorted(order):
                inverse = sorted(range(len(order)), key=order.__getitem__)
                value = graph.call_method("permute", (value, *inverse))
        restored[copies[node]] = value
    output.args = pytree.tree_map(lambda a: restored.get(a, a), output.args)
