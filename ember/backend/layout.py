"""Layout decisions for a graph: channels-last convolutions where they are faster.

cuDNN's tensor-core convolutions work on NHWC data; given NCHW tensors in half precision,
they transpose on the way in and out. When ``config.layout_optimization`` says so, every
2-D convolution's input and weight are converted to channels-last in the ATen graph
(``aten.clone(memory_format=channels_last)``), and the graph is traced again so that every
value's metadata follows: convolutions then return channels-last results, and the pointwise
and reduction work around them runs in that layout too (``GraphLowering`` realizes values
with the strides eager would give them, see ``preferred_layout``). A conversion whose input
is already channels-last after the second trace is removed (``drop_redundant_conversions``:
a copy would cost a second write of the value), so only the graph's first input and the
weights are converted; outputs keep eager's strides.

``auto`` converts CUDA graphs whose convolutions compute in float16/bfloat16. On the 2-core
CPU machine channels-last made the builtin convnet slower (eager, 2 threads: 3.8 ms NCHW,
7.3 ms NHWC), so CPU graphs are converted only when asked (``channels_last``).
"""
from __future__ import annotations

import torch
import torch.fx

from ember import config, logs

aten = torch.ops.aten


def _convolutions(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    out = []
    for node in gm.graph.nodes:
        if node.target is aten.convolution.default:
            val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) \
                else None
            if isinstance(val, torch.Tensor) and val.dim() == 4 and not node.args[6]:
                out.append(node)   # 2-D, not transposed
    return out


def wants_channels_last(gm: torch.fx.GraphModule, device: torch.device) -> bool:
    choice = config.layout_optimization
    if choice not in ("auto", "channels_last", "off"):
        raise ValueError(f"config.layout_optimization={choice!r}: expected 'auto', "
                         f"'channels_last' or 'off'")
    convs = _convolutions(gm)
    if choice == "off" or not convs:
        return False
    if choice == "channels_last":
        return True
    half = any(n.args[0].meta["val"].dtype in (torch.float16, torch.bfloat16) for n in convs)
    return device.type == "cuda" and half


def convert_convolutions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Each 2-D convolution reads its input and weight as channels-last copies."""
    convs = _convolutions(gm)
    for node in convs:
        for i in (0, 1):
            src = node.args[i]
            with gm.graph.inserting_before(node):
                clone = gm.graph.call_function(aten.clone.default, (src,),
                                               {"memory_format": torch.channels_last})
            node.update_arg(i, clone)
    gm.graph.lint()
    gm.recompile()
    logs.log("perf_hints", "layout: %d convolutions run channels-last", len(convs))
    return gm


def drop_redundant_conversions(gm: torch.fx.GraphModule) -> int:
    """Remove the channels-last copies (made by ``convert_convolutions``) whose input the
    traced graph already holds channels-last: convolutions read the value itself."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.target is not aten.clone.default or \
                node.kwargs.get("memory_format") is not torch.channels_last:
            continue
        src = node.args[0]
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() != 4 or \
                not val.is_contiguous(memory_format=torch.channels_last):
            continue
        if all(user.target is aten.convolution.default for user in node.users):
            node.replace_all_uses_with(src)
            gm.graph.erase_node(node)
            dropped += 1
    if dropped:
        gm.graph.lint()
        gm.recompile()
    return dropped
