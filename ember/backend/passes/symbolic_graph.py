"""The static pipeline's torch-level passes on a graph with symbolic sizes
(``backend/symbolic.py``): attention masks, dead convolution taps, channels-last layout.

    built = in_best_layout_symbolic(gm, example_inputs, fakes, env, target, training, build)

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
* **Attention masks** (``passes/attention_masks.py``): a mask computed from sizes alone
  (``arange`` comparisons, ``ones(s, s).tril()``) is evaluated at the sizes seen and at
  two other sizes the guards admit: one more than each hint, and one past twice every
  integer constant the mask's computation reads (a threshold ``i < 100`` then shows). It is
  dropped, or made ``is_causal``, only when all three agree. This is a probe, not a proof:
  a mask whose kind changed at some other size, with no constant to tell, would be
  misjudged; masks built from index comparisons have no such size.
"""
from __future__ import annotations

import math
from typing import Callable, TypeVar

import sympy
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


def _probe_inputs(gm, example_inputs: list, subst: dict) -> list:
    """The graph's inputs at the sizes ``subst`` gives the symbols: ints for sizes, a zero
    expanded to the sizes' shapes for tensors (the mask reads those for their metadata
    only; no memory)."""
    def at(s) -> int:
        return int(sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else s)
                   .xreplace(subst))
    out = []
    for node, value in zip([n for n in gm.graph.nodes if n.op == "placeholder"],
                           example_inputs):
        fake = node.meta.get("val")
        if isinstance(fake, torch.SymInt):
            out.append(at(fake))
        elif isinstance(fake, torch.Tensor) and any(isinstance(s, torch.SymInt)
                                                    for s in fake.shape):
            out.append(torch.zeros((), dtype=value.dtype, device=value.device).expand(
                [at(s) for s in fake.shape]))
        else:
            out.append(value)
    return out


# a mask is not judged where the product of the symbols' probe values passes this (a
# [batch, 1, seq, seq] mask is computed at the probe sizes)
_LARGEST_PROBE = 2 ** 24


def _probes(gm, example_inputs: list, env, constants: int) -> list[tuple[list, dict]] | None:
    """(inputs, symbol values) at the hints and at the two other sizes the module
    docstring names, or None where the env's guards do not admit them all."""
    hints = {s: sympy.Integer(env.hint_of(s)) for s in env.symbols}
    out = []
    for subst in (hints, {s: h + 1 for s, h in hints.items()},
                  {s: h + 2 * constants + 3 for s, h in hints.items()}):
        sizes = {env.source_of(s): int(v) for s, v in subst.items()}
        if math.prod(sizes.values()) > _LARGEST_PROBE or \
                env.first_failing_guard(sizes) is not None:
            return None
        out.append((_probe_inputs(gm, example_inputs, subst), subst))
    return out


def in_best_layout_symbolic(gm: torch.fx.GraphModule, example_inputs: list, fakes: list,
                            env, mode, target, training: bool,
                            build: Callable[[torch.fx.GraphModule], T],
                            check: Callable[[torch.fx.GraphModule, T], str | None] | None = None
                            ) -> T:
    """``build`` of ``gm`` after the torch-level passes (see the module docstring);
    ``check(graph, built)``: a reason to refuse the channels-last copy, or None."""
    if not _needs_values(gm):
        return build(gm)
    g = with_backend_fakes(gm, fakes, mode)
    sizes = {n for n in g.graph.nodes if n.op == "placeholder"
             and isinstance(n.meta.get("val"), torch.SymInt)}
    simplify_constant_masks(g, example_inputs, sizes,
                            lambda constants: _probes(g, example_inputs, env, constants))
    g = drop_dead_taps(g)
    return in_best_layout(g, target, training, build,
                          check=(lambda built: check(g, built)) if check else
                          lambda built: None)
