"""The partitioner: a joint graph cut into a forward graph and a backward graph.

    parts = partition(joint)          # Partition(forward, backward, saved)
    outs_and_saved = parts.forward(*primals)            # (*forward outputs, *saved)
    grads = parts.backward(*saved, *tangents)           # one per input that requires grad

What the forward saves is a minimum cut
---------------------------------------
Nodes that depend on a tangent are the backward's. The other nodes (the forward's, and
tangent-free work the backward needs, such as the statistics a norm's backward re-derives) are
computed by the forward, recomputed by the backward, or both; the backward needs some of
them. Each tensor the forward hands to the backward costs its bytes, held from the forward
to the backward. The choice is a minimum s-t cut (max-flow, Dinic's algorithm) over those
nodes, each split into ``in -> out`` with its bytes as capacity:

* the source feeds every primal (an input: only the forward has it) and every node that must
  not be recomputed: matmuls, convolutions, reductions, random ops (recomputing a draw would
  draw other numbers), anything not known to be cheap; they are saved when the backward
  needs them. A random op the backward reads is first split in two (``rng.py``): the
  forward's draw, which also yields its generator's state, and a replay from that state,
  which is cheap: the cut saves the state (16 bytes on CUDA) rather than a dropout's mask;
* data edges have infinite capacity, and every forward node a backward node reads feeds the
  sink;
* cheap ops (pointwise, views, casts, factories, gathers: ``recomputable``) carry only their
  bytes: the cut may pass above them, so the backward recomputes them from smaller saved
  values (``relu(addmm)`` saves ``addmm``'s output or the boolean mask, not both; a norm's
  normalised output is recomputed from its input and two small statistics).

Primals cost one byte: parameters and inputs stay alive anyway, so saving them is free and
recomputing from them is preferred. The nodes whose ``in`` side the source still reaches
after the flow, and whose ``out`` side it does not, are the saved values.

With ``SAVES_LIBRARY_INPUTS``, a cheap value that a library call (a matmul, a convolution)
reads in the forward and another reads in the backward is saved, not recomputed: the forward
stores it anyway for its reader, and a recompute would store it again for the backward's (a
ReLU's output, read by the next convolution and by that convolution's backward: one more
pass over the activation per layer). The cost is memory held until the backward. Off:
on an H100 (AMP steps, ``benchmarks/partition_trade.py``) resnet50 ran 9% faster, vit_base
and GPT-2 4%, for 43-52% more peak memory (resnet50 3.3 GB, eager's 2.9); on a 2-core CPU
the builtin convnet ran 4% faster. Worth it per value only where memory allows.
"""
from __future__ import annotations

import operator
from collections import deque
from dataclasses import dataclass

import torch
import torch.fx

from ember.aot.joint import JointGraph, hint_int
from ember.aot.rng import ReplayRandom, draws, replay_random_ops, twin
from ember.fake import returns_alias

__all__ = ["Partition", "ancestors", "partition", "recomputable"]

aten = torch.ops.aten

_CHEAP = {aten._to_copy.default, aten.clone.default, aten.full.default, aten.zeros.default,
          aten.ones.default, aten.scalar_tensor.default, aten.full_like.default,
          aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
          aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
          aten.new_empty.default, aten.arange.default, aten.arange.start,
          aten.arange.start_step, aten.embedding.default, aten.index_select.default,
          aten.gather.default, aten.index.Tensor, aten.cat.default,
          aten.constant_pad_nd.default, aten.where.self, aten.masked_fill.Scalar,
          aten.masked_fill.Tensor, aten.lift_fresh_copy.default}


SAVES_LIBRARY_INPUTS = False
_LIBRARY = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
            aten.convolution_backward.default}


def recomputable(node: torch.fx.Node) -> bool:
    """Cheap to compute again in the backward: pointwise, views, casts, factories, gathers,
    a random op's replay from a saved state. Never a random op itself, a mutation, a
    reduction, a matmul or a convolution."""
    target = node.target
    if target is operator.getitem or isinstance(target, ReplayRandom):
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    if target in _CHEAP or torch.Tag.pointwise in target.tags:
        return True
    returns = target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None     # a view


@dataclass
class Partition:
    forward: torch.fx.GraphModule      # primals -> (*forward outputs, *saved)
    backward: torch.fx.GraphModule     # (*saved, *tangents) -> grads of the grad inputs
    saved: list[str]                   # names of the saved values, in order
    saved_bytes: int                   # bytes of the saved values that are not inputs
    recomputed: int                    # forward nodes the backward computes again
    replayed: int = 0                  # random draws the backward makes again from a state


def _nbytes(val) -> int | None:
    if isinstance(val, torch.Tensor):
        return hint_int(val.numel()) * val.element_size()   # (symbolic: at the hints)
    return None


class _FlowNetwork:
    """Dinic's max-flow over integer capacities, then the source side of the min cut."""

    def __init__(self, n: int):
        self.edges_of: list[list[int]] = [[] for _ in range(n)]
        self.head: list[int] = []        # edge -> its head vertex
        self.cap: list[int] = []         # edge -> residual capacity (edge ^ 1 is its reverse)

    def add(self, u: int, v: int, cap: int) -> None:
        self.edges_of[u].append(len(self.head))
        self.head.append(v)
        self.cap.append(cap)
        self.edges_of[v].append(len(self.head))
        self.head.append(u)
        self.cap.append(0)

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self.edges_of)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.edges_of[u]:
                v = self.head[e]
                if self.cap[e] > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level if level[t] >= 0 else None

    def max_flow(self, s: int, t: int) -> None:
        while (level := self._levels(s, t)) is not None:
            next_edge = [0] * len(self.edges_of)
            while True:              # blocking flow: iterative depth-first augmenting paths
                pushed = self._augment(s, t, level, next_edge)
                if not pushed:
                    break

    def _augment(self, s: int, t: int, level: list[int], next_edge: list[int]) -> int:
        path: list[int] = []
        u = s
        while u != t:
            edges = self.edges_of[u]
            while next_edge[u] < len(edges):
                e = edges[next_edge[u]]
                v = self.head[e]
                if self.cap[e] > 0 and level[v] == level[u] + 1:
                    break
                next_edge[u] += 1
            else:                     # dead end: retreat
                if u == s:
                    return 0
                level[u] = -1
                e = path.pop()
                u = self.head[e ^ 1]
                next_edge[u] += 1
                continue
            path.append(e)
            u = self.head[e]
        flow = min(self.cap[e] for e in path)
        for e in path:
            self.cap[e] -= flow
            self.cap[e ^ 1] += flow
        return flow

    def source_side(self, s: int) -> set[int]:
        seen = {s}
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.edges_of[u]:
                v = self.head[e]
                if self.cap[e] > 0 and v not in seen:
                    seen.add(v)
                    queue.append(v)
        return seen


def ancestors(roots, stop=frozenset()) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = [r for r in roots if isinstance(r, torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            stack.extend(n.all_input_nodes)
    return seen


def _choose_saved(nodes: list[torch.fx.Node], backward: set, primals: set, needed: set,
                  read_by_backward: set) -> list[torch.fx.Node]:
    """The minimum cut between the forward's inputs and the backward's reads
    (``read_by_backward``: forward nodes the backward's outputs are, beyond its nodes' reads)."""
    candidates = [n for n in nodes if n in needed and n not in backward]
    index = {n: i for i, n in enumerate(candidates)}
    source, sink = 2 * len(candidates), 2 * len(candidates) + 1
    costs = {n: 1 if n in primals or n.op == "get_attr" else _nbytes(n.meta.get("val"))
             for n in candidates}
    infinite = sum(c for c in costs.values() if c is not None) + 1
    net = _FlowNetwork(2 * len(candidates) + 2)
    kept = _kept_in_forward(candidates, primals)
    for n, i in index.items():
        cost = costs[n]
        net.add(2 * i, 2 * i + 1, infinite if cost is None else cost)
        if n.op != "call_function" or not recomputable(n) or n in kept or \
                SAVES_LIBRARY_INPUTS and _library_read_on_both_sides(n, backward):
            net.add(source, 2 * i, infinite)
        if n in read_by_backward:
            net.add(2 * i + 1, sink, infinite)
        for user in n.users:
            if user in backward:
                net.add(2 * i + 1, sink, infinite)
            elif user in index:
                net.add(2 * i + 1, 2 * index[user], infinite)
    net.max_flow(source, sink)
    reached = net.source_side(source)
    return [n for n, i in index.items() if 2 * i in reached and 2 * i + 1 not in reached]


def _is_view(node: torch.fx.Node) -> bool:
    """A cheap op whose result is a view of its input (``t``, ``view``, ``permute``)."""
    return isinstance(node.target, torch._ops.OpOverload) and recomputable(node) and \
        returns_alias(node.target)


def _library_read_on_both_sides(n: torch.fx.Node, backward: set) -> bool:
    """A library call of the forward and one of the backward read ``n`` (through views)."""
    sides, stack = set(), list(n.users)
    while stack:
        user = stack.pop()
        if user.target in _LIBRARY:
            sides.add(user in backward)
        elif _is_view(user):
            stack.extend(user.users)
    return sides == {True, False}


def _backward_order(nodes: list, backward_nodes: set, backward: set, inputs: set) -> list:
    """The backward graph's nodes: its own in the joint graph's order, each forward node it
    recomputes placed just before its first reader. In the joint graph's order every
    recomputation would come first, and a scheduler that fuses independent loops of one
    shape would make them one kernel that materialises every layer's recomputed values at
    once (GPT-2: each layer-norm output, all held until their layers' turn). ``inputs``:
    the saved values, which the backward takes rather than computes."""
    index = {n: i for i, n in enumerate(nodes)}
    order: list = []
    placed: set = set()

    def place(root):
        stack = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if n in placed:
                continue
            if ready:
                placed.add(n)
                order.append(n)
                continue
            stack.append((n, True))
            if n in inputs or n.op == "placeholder":
                continue
            stack.extend((a, False) for a in sorted(n.all_input_nodes, key=index.__getitem__,
                                                    reverse=True)
                         if a in backward_nodes and a not in placed)

    for n in nodes:
        if n in backward and n in backward_nodes and n.op != "output":
            place(n)
    for n in nodes:             # recomputed values the gradients are themselves
        if n in backward_nodes and n.op != "output":
            place(n)
    return order


MAX_RECOMPUTE_READS = 2   # activations of a value's size one recomputation may read


def _kept_in_forward(nodes: list, primals: set) -> set:
    """Cheap values whose recomputation would read more than ``MAX_RECOMPUTE_READS`` saved
    activations of (about) their size: the forward has them in memory anyway, and a chain of
    them rebuilt in the backward costs reads of every link. A transformer's residual stream
    ``h[k+1] = h[k] + delta[k]`` would otherwise be rebuilt from the embedding and every
    layer's (smaller, bfloat16) deltas, all of it at the start of the backward; with this
    rule every other ``h[k]`` is saved and each layer recomputes one addition at most."""
    reads: dict = {}            # node -> the saved-activation candidates its recompute reads
    kept = set()
    for n in nodes:
        if n in primals or n.op != "call_function":
            reads[n] = frozenset()
            continue
        if not recomputable(n):
            reads[n] = frozenset([n])
            continue
        size = _numel(n)
        mine = frozenset(r for a in n.all_input_nodes for r in reads.get(a, ())
                         if size is None or (_numel(r) or 0) * 4 >= size)
        if len(mine) > MAX_RECOMPUTE_READS:
            kept.add(n)
            mine = frozenset([n])
        reads[n] = mine
    return kept


def _numel(n: torch.fx.Node) -> int | None:
    val = n.meta.get("val")
    return hint_int(val.numel()) if isinstance(val, torch.Tensor) else None


def _copy_graph(nodes, inputs: list[tuple[str, torch.fx.Node]], outputs, root) -> torch.fx.GraphModule:
    """A graph of ``nodes`` (in order) whose values from ``inputs`` become placeholders."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for name, node in inputs:
        env[node] = graph.placeholder(name)
        env[node].meta = dict(node.meta)
    for node in nodes:
        if node in env:
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output([env[o] if isinstance(o, torch.fx.Node) else o for o in outputs])
    graph.lint()
    return torch.fx.GraphModule(root, graph)


def _regions(joint: JointGraph):
    """The joint graph's nodes, primals, tangents, forward outputs, grads, the nodes that
    depend on a tangent, and the forward's input mutations."""
    nodes = list(joint.gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    primals, tangents = placeholders[:joint.num_primals], placeholders[joint.num_primals:]
    outs = list(nodes[-1].args[0])
    fw_outs, grads = outs[:joint.num_fw_outputs], outs[joint.num_fw_outputs:]
    backward: set[torch.fx.Node] = set(tangents)          # nodes that depend on a tangent
    for n in nodes:
        if n.op == "call_function" and any(a in backward for a in n.all_input_nodes):
            backward.add(n)
    effects = [n for n in nodes if n.op == "call_function" and n not in backward
               and n.target is aten.copy_.default]          # input mutations
    return nodes, primals, tangents, fw_outs, grads, backward, effects


def partition(joint: JointGraph) -> Partition:
    gm = joint.gm
    nodes, primals, tangents, fw_outs, grads, backward, effects = _regions(joint)
    if replay_random_ops(gm, backward, ancestors([*fw_outs, *effects])):
        nodes, primals, tangents, fw_outs, grads, backward, effects = _regions(joint)
    needed_by_backward = ancestors(grads)
    saved = _choose_saved(nodes, backward, set(primals), needed_by_backward,
                          {g for g in grads if isinstance(g, torch.fx.Node) and g not in backward})

    mutated = {primals[i] for i in joint.input_mutations}
    for s in saved:
        base = s
        while base.op == "call_function" and _is_view(base) and base.all_input_nodes:
            base = base.all_input_nodes[0]
        if base in mutated:
            raise NotImplementedError("ember.aot: the backward reads an input that the "
                                      "forward writes")

    # a replay's saved output is handed over from the forward's own draw (``twin``); every
    # draw runs in the forward, so the generator advances as in eager
    handed = [twin(s) for s in saved]
    forward_nodes = ancestors([*fw_outs, *effects, *handed,
                               *[n for n in nodes if n not in backward and draws(n)]])
    saved_set = set(saved)
    backward_nodes = ancestors(grads, stop=saved_set | set(tangents))
    stray = [n for n in backward_nodes if n.op == "placeholder" and n not in saved_set
             and n not in tangents]
    if stray:
        raise RuntimeError(f"ember.aot: partition reads primals {stray} in the backward "
                           "without saving them")
    names = [f"saved_{i}_{s.name}" for i, s in enumerate(saved)]
    fw = _copy_graph([n for n in nodes if n in forward_nodes and n.op != "output"],
                     [(p.name, p) for p in primals], [*fw_outs, *handed], gm)
    bw = _copy_graph(_backward_order(nodes, backward_nodes, backward, saved_set),
                     [*zip(names, saved), *[(t.name, t) for t in tangents]], grads, gm)
    recomputed = sum(1 for n in backward_nodes if n not in backward and n not in saved_set
                     and n.op == "call_function")
    saved_bytes = sum(_nbytes(s.meta.get("val")) or 0 for s in saved
                      if s.op not in ("placeholder", "get_attr"))
    replayed = sum(1 for n in backward_nodes if isinstance(n.target, ReplayRandom))
    return Partition(fw, bw, names, saved_bytes, recomputed, replayed)
