"""The joint graph: a training graph's forward and backward traced into one ATen graph.

    joint = trace_joint(gm, example_inputs)
    joint.gm(*primals, *tangents) == (*forward outputs, *grads of the inputs that require grad)

How it works
------------
Ember's fake tensors sit below autograd, so autograd records its graph on them like on real
tensors. ``trace_joint`` runs ``gm`` on fakes of the inputs (``begin_trace``: same tracer, same
decomposition table, same functionalisation as ``trace_to_aten``) with grad mode on; each
output that requires grad then gets a *tangent* placeholder (its incoming gradient), and
``torch.autograd.grad(outputs, inputs that require grad, tangents)`` runs under the same
tracer: the backward's ATen ops (``threshold_backward``, ``mm``, the decomposed
``native_layer_norm_backward``...) are recorded after the forward's. The result is one
functional graph; ``partition.py`` cuts it into a forward and a backward graph. The forward
is traced under the caller's autocast state (its casts become ``_to_copy`` nodes), the
backward with autocast off, as eager's backward runs outside ``torch.autocast`` under AMP
(``ember.aot.autocast``).

* Placeholders: the primals (every graph input, in order), then one tangent per
  differentiable output (``JointGraph.diff_outputs``) of the output's shape and dtype,
  channels-last where the output is (``tangent_order``), else contiguous; the runtime
  copies an incoming gradient of another layout into it. (Contiguous tangents of a
  channels-last batch norm + ReLU made each call copy the gradient and read it transposed:
  5x eager's backward on the CPU.) A tangent may be written by the backward (autograd accumulates gradients in place): functionalised like any tensor.
* Outputs: ``(*forward outputs flattened, *grads)``; a grad that is None (an input not
  reached) is None in the output list.
* Input mutations of the forward (batch norm's running statistics) are replayed as
  ``copy_`` nodes before the backward's nodes, as in ``trace_to_aten``. An input that requires
  grad must not be written (eager rejects it for leaves), nor may the backward write any input
  (``NotImplementedError``: callers fall back).
* ``saved_bytes_eager``: the bytes autograd itself saved for the backward while tracing (a
  ``saved_tensors_hooks`` pack hook sees each; inputs left out), the baseline the partition is
  logged against.
* Parameters of ``gm`` read through ``get_attr`` that require grad are not differentiated here
  (Ember's frontend passes parameters as inputs): ``NotImplementedError``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember.aot.autocast import autocast_off
from ember.aot.trace import (begin_trace, is_impure, output_node, replay_mutations,
                              run_program)

__all__ = ["JointGraph", "trace_joint"]


def tangent_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The dims of ``t`` from outermost to innermost in memory where ``t`` is channels-last
    (4-D or 5-D, channels innermost: convolutions' and norms' outputs, whose incoming
    gradients come from convolutions' backwards in the same layout), else None. Other
    orders stay contiguous: a transposed view's gradient usually arrives contiguous."""
    if t.dim() not in (4, 5) or not all(type(v) is int for v in (*t.stride(), *t.shape)):
        return None
    order = (0, *range(2, t.dim()), 1)
    if t.is_contiguous() or not t.permute(order).is_contiguous():
        return None
    return order


def inverse_order(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(range(len(order)), key=lambda d: order[d]))


@dataclass
class JointGraph:
    gm: torch.fx.GraphModule
    num_primals: int
    num_fw_outputs: int                 # flattened forward outputs, first in the output list
    output_spec: pytree.TreeSpec        # rebuilds gm's output structure from the flat list
    grad_inputs: list[int]              # primal positions that require grad (grads follow)
    diff_outputs: list[int]             # forward outputs that get a tangent
    input_mutations: list[int] = field(default_factory=list)
    saved_bytes_eager: int = 0

    @property
    def tangent_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op == "placeholder"][self.num_primals:]


def _nbytes(t: torch.Tensor) -> int:
    return hint_int(t.numel()) * t.element_size()


def hint_int(n) -> int:
    """A size as an int: a symbolic one's value at its hint (for costs and logs only: a
    comparison of the SymInt itself would be a guard)."""
    return int(n.node.hint) if isinstance(n, torch.SymInt) else int(n)


def trace_joint(gm: torch.fx.GraphModule, example_inputs: list, *,
                decompositions: dict | None = None, fake_mode=None) -> JointGraph:
    """``fake_mode``: ``example_inputs`` are its fakes and SymInts (symbolic sizes:
    ``begin_trace``)."""
    if any(p.requires_grad for p in gm.parameters()):
        raise NotImplementedError("ember.aot: parameters read as graph attributes (not inputs) "
                                  "that require grad")
    state = begin_trace(gm, example_inputs, decompositions, fake_mode)
    tracer, graph = state.tracer, state.graph
    grad_inputs = [i for i, f in enumerate(state.fakes)
                   if isinstance(f, torch.Tensor) and f.requires_grad]
    for i in grad_inputs:
        tracer.frozen_inputs.add(id(state.fakes[i]))
    if len({id(f) for f in state.fakes}) != len(state.fakes):
        raise NotImplementedError("ember.aot: the same tensor passed twice to a training graph")

    saved: dict[int, torch.Tensor] = {}

    def pack(t):
        saved[id(t)] = t
        return t

    with torch.enable_grad(), state.fake_mode, tracer, \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_program(gm, state.fakes)
    flat_out, spec = pytree.tree_flatten(out)
    mutations, copy_of = replay_mutations(state)
    for i in mutations:
        if i in grad_inputs:
            raise NotImplementedError("ember.aot: a training graph writes an input that "
                                      "requires grad")
    fw_nodes = [output_node(state, copy_of, o) for o in flat_out]

    diff_outputs = [j for j, o in enumerate(flat_out) if isinstance(o, torch.Tensor)
                    and o.requires_grad and (o.is_floating_point() or o.is_complex())]
    tangents = []
    anchor = state.placeholders[-1]      # tangents are placeholders too: after the primals
    for j in diff_outputs:
        o = flat_out[j]
        order = tangent_order(o)
        with state.fake_mode:
            if order is None:
                t = torch.empty(o.shape, dtype=o.dtype, device=o.device)
            else:
                t = torch.empty([o.shape[d] for d in order], dtype=o.dtype,
                                device=o.device).permute(inverse_order(order))
        with graph.inserting_after(anchor):
            node = graph.placeholder(f"tangents_{len(tangents)}")
        anchor = node
        node.meta["val"] = t
        tracer.track(t, node)
        tangents.append(t)

    forward_values = {i: tracer.node_of[id(f)] for i, f in enumerate(state.fakes)
                      if isinstance(f, torch.Tensor)}
    grads: list = [None] * len(grad_inputs)
    if diff_outputs and grad_inputs:
        # autocast off, as around eager's ``backward()`` under AMP (``ember.aot.autocast``):
        # each backward op sees the dtypes its forward op ran in
        with state.fake_mode, tracer, autocast_off():
            grads = list(torch.autograd.grad([flat_out[j] for j in diff_outputs],
                                             [state.fakes[i] for i in grad_inputs], tangents,
                                             allow_unused=True))
    if any(tracer.node_of[id(f)] is not forward_values[i] for i, f in enumerate(state.fakes)
           if isinstance(f, torch.Tensor)):
        raise NotImplementedError("ember.aot: the backward writes a graph input")
    grad_nodes = [tracer.to_node(g) if isinstance(g, torch.Tensor) else None for g in grads]
    graph.output([*fw_nodes, *grad_nodes])
    graph.eliminate_dead_code(is_impure_node=is_impure)
    graph.lint()
    return JointGraph(torch.fx.GraphModule(state.root, graph), len(state.fakes), len(flat_out),
                      spec, grad_inputs, diff_outputs, mutations,
                      sum(_nbytes(t) for t in _distinct_storages(saved.values(), state.fakes)))


def _distinct_storages(tensors, inputs):
    """One tensor per storage (views of one saved tensor cost its memory once), inputs'
    storages left out (they are alive anyway)."""
    from ember.fake import storage_key
    input_keys = {storage_key(t) for t in inputs if isinstance(t, torch.Tensor)}
    seen = {}
    for t in tensors:
        key = storage_key(t)
        if key in input_keys:
            continue
        if key not in seen or _nbytes(t) > _nbytes(seen[key]):
            seen[key] = t
    return seen.values()
