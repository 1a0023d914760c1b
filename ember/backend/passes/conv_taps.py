"""Convolution taps that only ever read padding are dropped from the captured graph.

A dilated convolution on a small input can have filter taps that fall in the zero padding
for every output position: deeplabv3's ASPP runs 3x3 convolutions of dilation 24 and 36 on
14x14 maps, where only the centre tap ever reads the input. Such a convolution is the same
sum over its live taps: ``conv2d(x, w[:, :, a:b, c:d], padding=p - a * dilation)``, a 1x1
convolution in the ASPP case (9x fewer multiply-adds, and a weight 9x smaller to convert
when the graph runs channels-last). The live taps are found per spatial dim from the static
sizes; a dim is narrowed only when the dead taps are as many on each side (padding is
symmetric, so the output size stays) and the new padding is not negative. The gradient of
a dead tap is zero either way, so training graphs are rewritten too.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ember import logs


def _pair(value) -> tuple[int, int] | None:
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and \
            all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def live_taps(size: int, kernel: int, stride: int, padding: int, dilation: int
              ) -> tuple[int, int]:
    """The first and last filter taps along one dim that read the input for some output
    position (a tap whose first and last reads straddle the input counts as live)."""
    outputs = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    live = [k for k in range(kernel)
            if (outputs - 1) * stride + k * dilation - padding >= 0
            and k * dilation - padding <= size - 1]
    return (live[0], live[-1]) if live else (0, kernel - 1)


_SIGNATURE = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_DEFAULTS = (None, None, None, 1, 0, 1, 1)


def _narrowed(node: torch.fx.Node):
    """The weight slices and new padding and dilation of a conv2d node with dead taps, or
    None."""
    args = list(node.args) + [node.kwargs.get(k, d) for k, d in
                              zip(_SIGNATURE[len(node.args):], _DEFAULTS[len(node.args):])]
    x, w = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in args[:2])
    stride, padding, dilation = (_pair(a) for a in args[3:6])
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 4
            and w.dim() == 4 and stride and padding and dilation):
        return None
    if not all(isinstance(s, int) for s in (*x.shape[2:], *w.shape[2:])):
        return None
    slices, new_padding, new_dilation = [], [], []
    for d in range(2):
        kernel = w.shape[2 + d]
        first, last = live_taps(x.shape[2 + d], kernel, stride[d], padding[d], dilation[d])
        pad = padding[d] - first * dilation[d]
        if first != kernel - 1 - last or pad < 0:
            first, last, pad = 0, kernel - 1, padding[d]
        slices.append((first, last + 1))
        new_padding.append(pad)
        new_dilation.append(dilation[d] if last > first else 1)
    if all(s == (0, w.shape[2 + d]) for d, s in enumerate(slices)):
        return None
    return slices, new_padding, new_dilation


def drop_dead_taps(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, or a copy whose 2-D convolutions read only their live taps."""
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.conv2d
             and len(n.args) >= 2]
    plans = {n: p for n in convs if (p := _narrowed(n)) is not None}
    if not plans:
        return gm
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    for old, (slices, padding, dilation) in plans.items():
        node = copies[old]
        weight = node.args[1]
        index = (slice(None), slice(None), *(slice(a, b) for a, b in slices))
        with graph.inserting_before(node):
            narrow = graph.call_function(operator.getitem, (weight, index))
        kwargs = dict(zip(_SIGNATURE[2:], node.args[2:]), **node.kwargs)
        kwargs.update(padding=tuple(padding), dilation=tuple(dilation))
        node.args, node.kwargs = (node.args[0], narrow), kwargs
        w = old.args[1].meta["val"]
        narrow.meta["val"] = getattr(w, "_meta", w)[index]   # for the layout choice
        logs.log("perf_hints", "convolution %s: taps %s of its %dx%d filter read only "
                 "padding; it runs on the live %dx%d", old.name,
                 "outside " + " x ".join(f"{a}:{b}" for a, b in slices), *w.shape[2:],
                 *(b - a for a, b in slices))
    graph.lint()
    return torch.fx.GraphModule(gm, graph)
