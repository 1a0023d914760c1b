"""The static pipeline's torch-level passes on a graph with symbolic sizes
(``backend/symbolic.py``): attention masks, dead convolution taps, channels-last layout.

    built = in_best_layout_symbolic(gm, example_inputs, fakes, mode, target, training, build)

Decisions
---------
* **One env.** The passes read ``node.meta["val"]``; the frontend's fakes are over its own
  symbols (or torch's), which the trace's are not. The passes run on a copy of the graph
  whose values are computed again on the backend's fakes (``with_backend_fakes``), so the
  layout pass's comparison of output strides, say, compares expressions over one env. The
  captured graph is left as it is (the per-size path compiles it).
* **Layout** (``passes/layout.py``): decided as for the static graph, the sizes a choice
  weighs (activations against weights) read at their hints, the sizes seen, without a guard:
  either layout computes the same values, so one program serves every size; only its speed
  at sizes far from the hints could differ. A conv net with a dynamic batch thus gets its
  static compile's layout.
* **Dead convolution taps** (``passes/conv_taps.py``): where the spatial sizes are static
  (a symbolic batch); a symbolic plane keeps every tap, as its live taps depend on it.
* **Attention masks** (``passes/attention_masks.py``): a mask built from sizes alone is
  dropped, or made ``is_causal``, only where its construction shows that kind at every size
  (``passes/mask_proofs.py``); evaluating it at a few sizes would be a probe, not a proof.
"""
from __future__ import annotations

from typing import Callable, TypeVar

import torch
import torch.fx

from ember.backend.passes.attention_masks import simplify_constant_masks
from ember.backend.passes.conv_taps import drop_dead_taps
from ember.backend.passes.layout import in_best_layout

T = TypeVar("T")

_SDPA = torch.nn.functional.scaled_dot_product_attention


def _needs_values(gm: torch.fx.GraphModule) -> bool:
    """The graph has what the passes rewrite: a 2-D convolution or an attention call."""
    return any(n.op == "call_function" and n.target in (torch.conv2d, _SDPA)
               for n in gm.graph.nodes)


def with_backend_fakes(gm: torch.fx.GraphModule, fakes: list, mode) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose nodes' ``meta["val"]`` are computed on ``fakes`` (the
    backend's, in fake mode ``mode``)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = torch.fx.GraphModule(gm, graph)

    class Propagate(torch.fx.Interpreter):
        def run_node(self, node):
            value = super().run_node(node)
            if node.op != "output":
                node.meta["val"] = value
            return value
    with torch.no_grad(), mode:
        # fakes of their own: an in-place op of the graph must not change the trace's
        inputs = [torch.empty_strided(f.shape, f.stride(), dtype=f.dtype, device=f.device)
                  if isinstance(f, torch.Tensor) else f for f in fakes]
        Propagate(copy).run(*inputs)
    return copy


def in_best_layout_symbolic(gm: torch.fx.GraphModule, example_inputs: list, fakes: list,
                            mode, target, training: bool,
                            build: Callable[[torch.fx.GraphModule], T],
                            check: Callable[[torch.fx.GraphModule, T], str | None] | None = None
                            ) -> T:
    """``build`` of ``gm`` after the torch-level passes (see the module docstring);
    ``check(graph, built)``: a reason to refuse the channels-last copy, or None."""
    if not _needs_values(gm):
        return build(gm)
    g = with_backend_fakes(gm, fakes, mode)
    simplify_constant_masks(g, example_inputs, symbolic=True)
    g = drop_dead_taps(g)
    return in_best_layout(g, target, training, build,
                          check=(lambda built: check(g, built)) if check else
                          lambda built: None)
