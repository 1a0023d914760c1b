"""Training graphs at run time: compiled forward and backward graphs behind autograd.

    run = compile_training(gm, example_inputs, compile_graph=compile_fn)
    loss = run(*inputs)[0].sum(); loss.backward()     # grads as eager's, in .grad

``compile_training`` traces the joint graph (``joint.py``), partitions it (``partition.py``)
and compiles both halves with ``compile_graph(gm, example_inputs)`` (the ``"ember"`` backend
passes ``compile_aten``, so both get generated kernels; ``"aot_eager"`` runs them as FX
graphs). The backward graph is compiled up front, on uninitialised tensors shaped like its
saved values and tangents.

The runtime (``TrainingGraph``) calls ``CompiledFunction.apply``, an ``autograd.Function``:

* its forward runs the forward graph on the inputs as they are now (parameters are read at
  call time, so optimizer steps in between are seen), keeps the saved values with
  ``save_for_backward`` and returns the outputs; outputs that do not get a gradient are
  marked non-differentiable;
* its backward gives the incoming gradients the traced tangents' layouts (contiguous, or
  channels-last where the output is: ``joint.tangent_order``), runs the backward graph and
  returns one gradient per input (None for those that do not require grad, and for those
  that only outputs without a gradient reach); autograd accumulates them into ``.grad`` as
  it does for eager's;
* outputs that got no gradient (``loss`` of ``(loss, logits)`` backpropagated alone) get no
  zeros: the call runs a variant of the backward graph (``backward_without``, compiled on the
  first call that leaves out those outputs) in which every node that only those outputs'
  tangents reach is gone, as eager's autograd never runs them. Zeros would not do: a
  backward formula can turn a zero into NaN (``0 / 0`` in ``a / b``'s backward where ``b``
  is 0), and the NaN would reach the gradients of the outputs that got one;
* a double backward (``create_graph=True`` through a compiled graph) raises a RuntimeError
  saying so.
* the graphs hold autocast's casts (``ember.aot.autocast``): they are compiled and run with
  autocast off, whatever the caller's autocast state.

Calls that cannot record gradients (grad mode off: ``torch.no_grad()`` inference of a module
compiled in train mode) run the forward graph alone. A call whose inputs' ``requires_grad``
differ from the traced ones runs the captured graph as it is.
"""
from __future__ import annotations

from typing import Callable

import sympy
import torch
from torch.utils import _pytree as pytree

from ember import config, logs
from ember.aot.autocast import autocast_off
from ember.aot.joint import JointGraph, tangent_order, inverse_order, trace_joint
from ember.aot.partition import Partition, ancestors, partition
from ember.aot.reductions import merge_reduced_dims
from ember.aot.trace import size_arguments

aten = torch.ops.aten

__all__ = ["compile_training", "TrainingGraph", "CompiledFunction", "stats"]

_autocast_on = torch._C._is_any_autocast_enabled

# counts for tests and tools: training graphs compiled; calls that ran the captured graph
stats = {"compiled": 0, "captured_calls": 0}


def _blank(val):
    """An uninitialised real tensor with a fake's geometry (compiling reads only layouts)."""
    if isinstance(val, torch.Tensor):
        return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device)
    return val


def _placeholder_values(gm: torch.fx.GraphModule, symbolic: bool = False) -> list:
    """Example inputs to compile ``gm`` with: blank tensors, or (``symbolic``: the graph's
    sizes are symbols, which its compile reads from the placeholders) the fakes."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return vals if symbolic else [_blank(v) for v in vals]


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def log_partition(joint: JointGraph, parts: Partition) -> None:
    if logs.enabled("aot"):
        logs.log("aot", "joint graph:\n%s", joint.gm.code)
        logs.log("aot", "forward graph:\n%s\nbackward graph:\n%s", parts.forward.code,
                 parts.backward.code)
        logs.log("aot", "saved for the backward: %s", ", ".join(
            f"{name} {tuple(v.shape)} {v.dtype}" for name, v in zip(
                parts.saved, _saved_vals(parts))) or "nothing")
    logs.log("aot", "partition: %d values saved, %s of activations (eager's autograd saves "
             "%s), %d forward nodes recomputed in the backward, %d random draws replayed",
             len(parts.saved), _mib(parts.saved_bytes), _mib(joint.saved_bytes_eager),
             parts.recomputed, parts.replayed)
    folder = logs.debug_frame_dir("aot")
    if folder is not None:
        logs.dump(folder, "joint.py", joint.gm.code)
        logs.dump(folder, "forward.py", parts.forward.code)
        logs.dump(folder, "backward.py", parts.backward.code)
        logs.dump(folder, "saved.txt", "".join(
            f"{name} {tuple(v.shape)} {v.dtype}\n" for name, v in zip(parts.saved,
                                                                      _saved_vals(parts))))


def _saved_vals(parts: Partition) -> list:
    placeholders = [n for n in parts.backward.graph.nodes if n.op == "placeholder"]
    return [n.meta.get("val") for n in placeholders[:len(parts.saved)]]


def backward_without(backward: torch.fx.GraphModule, num_saved: int,
                     absent: frozenset[int]) -> torch.fx.GraphModule | None:
    """A copy of ``backward`` for calls in which the tangents numbered ``absent`` got no
    gradient. A backward graph is linear in its tangents, so a node that only absent tangents
    reach is zero; eager never computes it. Where such a node meets the rest (a sum of
    gradient contributions), zeros of its shape take its place; the absent tangents are left
    unread. None when a node to replace is not a tensor."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(backward.graph, env))
    placeholders = [env[n] for n in backward.graph.nodes if n.op == "placeholder"]
    reach: dict[torch.fx.Node, frozenset[int]] = {
        p: frozenset([k]) for k, p in enumerate(placeholders[num_saved:])}
    for n in graph.nodes:
        if n.op == "call_function":
            reach[n] = frozenset().union(*(reach.get(a, frozenset())
                                           for a in n.all_input_nodes))
    zero = {n for n, ks in reach.items() if ks and ks <= absent}
    for n in [n for n in graph.nodes if n in zero]:
        outside = [u for u in n.users if u not in zero]
        if not outside:
            continue
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        with graph.inserting_after(n), size_arguments():   # before its users; reads nothing
            zeros = graph.call_function(aten.full.default, ([*val.shape], 0),
                                        {"dtype": val.dtype, "device": val.device,
                                         "pin_memory": False})
        zeros.meta["val"] = torch.zeros_like(val, memory_format=torch.contiguous_format)
        for u in outside:
            u.replace_input_with(n, zeros)
    graph.eliminate_dead_code()
    graph.lint()
    return torch.fx.GraphModule(backward, graph)


class TrainingGraph:
    """The callable a backend returns for a training graph."""

    def __init__(self, joint: JointGraph, parts: Partition, forward: Callable,
                 backward: Callable, captured: Callable, compile_graph: Callable,
                 size_inputs: tuple[int, ...] = (), size_symbols: tuple = ()):
        self.joint = joint
        # positions of the size (int) inputs of a graph with symbolic sizes: the backward
        # takes their values after its tangents
        self.size_inputs = size_inputs
        self.partition = parts
        self.forward = forward
        self.backward = backward
        self.captured = captured
        self.compile_graph = compile_graph
        self.backward_variants: dict[frozenset[int], Callable | None] = {}
        self.num_outputs = joint.num_fw_outputs
        grad_set = set(joint.grad_inputs)
        self.requires_grad = [i in grad_set for i in range(joint.num_primals)]
        self.non_differentiable = [j for j in range(self.num_outputs)
                                   if j not in set(joint.diff_outputs)]
        self.tangent_vals = [n.meta["val"] for n in joint.tangent_nodes]
        self.tangent_orders = [tangent_order(v) for v in self.tangent_vals]
        # which tangents each gradient depends on: a gradient none of whose outputs got a
        # gradient is None, as eager leaves ``.grad`` of parameters the loss does not reach
        tangent_index = {n: k for k, n in enumerate(joint.tangent_nodes)}
        grad_nodes = list(joint.gm.graph.output_node().args[0])[joint.num_fw_outputs:]
        self.tangents_of_grad = [
            {tangent_index[a] for a in ancestors([g]) if a in tangent_index}
            for g in grad_nodes]
        # the per-call path's shortcuts: every tangent contiguous when it arrives so; the
        # gradients a call with every tangent given returns; the output structure rebuilt
        self.tangents_contiguous = all(o is None for o in self.tangent_orders)
        self.grads_when_all_given = [bool(needs) for needs in self.tangents_of_grad]
        self.rebuild = _rebuilder(joint.output_spec)
        # symbolic sizes: the strides the backward was compiled for, per saved value, as
        # expressions of the size inputs' symbols (None: not checked), and their values
        # per sizes met (see saved_in_layout)
        self.saved_strides = _saved_strides(parts, size_symbols) if size_inputs else None
        self.size_symbols = size_symbols
        self.strides_at: dict[tuple, list] = {}

    def backward_for(self, absent: frozenset[int]) -> Callable | None:
        """The backward compiled for calls whose tangents ``absent`` got no gradient (None:
        the full backward, fed zeros for them)."""
        if not absent:
            return None
        if absent not in self.backward_variants:
            outputs = [self.joint.diff_outputs[k] for k in sorted(absent)]   # for the logs
            pruned = backward_without(self.partition.backward, len(self.partition.saved),
                                      absent)
            if pruned is None:
                logs.log("aot", "outputs %s got no gradient: the backward runs on zeros for "
                         "them (a node to leave out is not a tensor)", outputs)
                self.backward_variants[absent] = None
            else:
                before = sum(n.op == "call_function" for n in self.partition.backward.graph.nodes)
                after = sum(n.op == "call_function" for n in pruned.graph.nodes)
                logs.log("aot", "outputs %s got no gradient: compiling a backward without "
                         "their part (%d of %d nodes left)", outputs, after, before)
                try:
                    with autocast_off():
                        compiled = self.compile_graph(
                            pruned, _placeholder_values(pruned, bool(self.size_inputs)))
                except Exception as e:
                    if not config.suppress_errors:
                        raise
                    # inside loss.backward(): run the variant's ATen ops rather than fail
                    logs.warn("ember: compiling the backward without outputs %s failed (%s: "
                              "%s); it runs uncompiled", outputs, type(e).__name__, e)
                    compiled = pruned.forward
                self.backward_variants[absent] = compiled
        return self.backward_variants[absent]

    def saved_in_layout(self, saved: list, sizes: list) -> list:
        """``saved`` (a call's saved values), each in the strides the backward was compiled
        for at ``sizes``: a value the forward returned in other strides (a symbolic layout
        it could not prove free of overlaps came back contiguous) is copied into them, as
        the backward's kernels would read past it otherwise."""
        key = tuple(sizes)
        expected = self.strides_at.get(key)
        if expected is None:
            values = dict(zip(self.size_symbols, key))
            expected = [None if st is None else tuple(int(e.xreplace(values)) for e in st)
                        for st in self.saved_strides]
            self.strides_at[key] = expected
            logged = False
        else:
            logged = True         # (said once per sizes)
        for k, (t, want) in enumerate(zip(saved, expected)):
            if want is None or not isinstance(t, torch.Tensor) or all(
                    n == 1 or w == 0 or have == w
                    for n, have, w in zip(t.shape, t.stride(), want)):
                continue
            if not logged:
                logs.log("perf_hints", "saved value %d of a training graph came back from "
                         "the forward with strides %s, the backward reads %s: copied", k,
                         t.stride(), want)
            saved[k] = torch.empty_strided(t.shape, want, dtype=t.dtype,
                                           device=t.device).copy_(t)
        return saved

    def grads_as_compiled(self, args) -> bool:
        """Whether the inputs that require grad in ``args`` are those this graph was
        compiled for (else a call runs as captured)."""
        return [isinstance(a, torch.Tensor) and a.requires_grad for a in args] == \
            self.requires_grad

    def __call__(self, *args):
        if not torch.is_grad_enabled():
            if _autocast_on():
                with autocast_off():
                    flat = self.forward(*args)[:self.num_outputs]
            else:
                flat = self.forward(*args)[:self.num_outputs]
        elif not self.grads_as_compiled(args):
            stats["captured_calls"] += 1
            return self.captured(*args)
        elif torch._C._are_functorch_transforms_active():
            flat = CompiledFunction.apply(self, *args)
        else:
            flat = _apply(self, *[_unwrap_if_dead(a) if isinstance(a, torch.Tensor) else a
                                  for a in args])
        return self.rebuild(flat)


class CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph: TrainingGraph, *args):
        if _autocast_on():           # the graph holds autocast's casts (``ember.aot.autocast``)
            with autocast_off():
                results = list(graph.forward(*args))
        else:
            results = list(graph.forward(*args))
        outputs, saved = results[:graph.num_outputs], results[graph.num_outputs:]
        ctx.graph = graph
        ctx.sizes = [args[i] for i in graph.size_inputs]
        ctx.output_shapes = [o.shape if isinstance(o, torch.Tensor) else None for o in outputs]
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*saved)
        if graph.non_differentiable:
            ctx.mark_non_differentiable(*[outputs[j] for j in graph.non_differentiable
                                          if isinstance(outputs[j], torch.Tensor)])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if torch.is_grad_enabled():
            raise RuntimeError("ember: double backward (create_graph=True) through a compiled "
                               "training graph is not supported; compile without Ember, or "
                               "take the higher-order gradient outside the compiled region")
        graph: TrainingGraph = ctx.graph
        tangents = [grad_outputs[j] for j in graph.joint.diff_outputs]
        if all(g is not None for g in tangents):
            backward, reaches = graph.backward, graph.grads_when_all_given
            if graph.tangents_contiguous:
                tangents = [g.contiguous() for g in tangents]
            else:
                tangents = [_in_order(g, o) for g, o in zip(tangents, graph.tangent_orders)]
        else:
            backward, tangents, reaches = _some_tangents(ctx, graph, tangents)
        args = list(ctx.saved_tensors)
        if graph.saved_strides is not None:
            args = graph.saved_in_layout(args, ctx.sizes)
        args.extend(tangents)
        args.extend(ctx.sizes)
        tangents = g = grad_outputs = None      # no references but in args
        boxed = getattr(backward, "call_boxed", None)
        with autocast_off():        # a no-op unless ``backward()`` is called inside autocast
            if boxed is None:
                grads = list(backward(*args))
            else:
                # the saved tensors live in ``args`` alone (unless the graph is retained),
                # which the backward empties: each is freed after its last use, not at the end
                ctx.maybe_clear_saved_tensors()
                grads = list(boxed(args))
        per_input = [None] * graph.joint.num_primals
        for i, g, reached in zip(graph.joint.grad_inputs, grads, reaches):
            if reached:
                per_input[i] = g
        return (None, *per_input)


# ``CompiledFunction.apply`` outside functorch's transforms, less its Python part: it binds
# default arguments only for a Function with ``setup_context`` (this one has none) and
# unwraps tensors of finished transforms (the caller does, with the same C function).
# 5 us of a 26 us call (LN 8x256)
_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, CompiledFunction)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _some_tangents(ctx, graph: TrainingGraph, tangents: list) -> tuple:
    """The backward for a call in which some outputs got no gradient (None in
    ``tangents``), its tangents, and which gradients they reach (one bool per gradient)."""
    absent = frozenset(k for k, g in enumerate(tangents) if g is None)
    backward = graph.backward_for(absent) or graph.backward
    out = []
    for k, (j, val, order) in enumerate(zip(graph.joint.diff_outputs, graph.tangent_vals,
                                            graph.tangent_orders)):
        g = tangents[k]
        if g is None:
            # a variant leaves it unread: a broadcast zero costs nothing
            g = torch.zeros((), dtype=val.dtype, device=val.device).expand(
                ctx.output_shapes[j])
            if backward is graph.backward:
                g = _in_order(g, order)
        else:
            g = _in_order(g, order)
        out.append(g)
    given = set(range(len(tangents))) - absent
    return backward, out, [bool(needs & given) for needs in graph.tangents_of_grad]


def _rebuilder(spec: pytree.TreeSpec) -> Callable:
    """flat outputs -> the graph's output structure: a tuple or list of leaves directly
    (most graphs), else through pytree."""
    leaves = list(range(spec.num_leaves))
    try:     # (a registered class's unflatten may reject ints for its tensors)
        probe = pytree.tree_unflatten(leaves, spec)
    except Exception:     # noqa: BLE001
        probe = None
    if type(probe) in (tuple, list) and list(probe) == leaves:
        return type(probe)
    return lambda flat: pytree.tree_unflatten(list(flat), spec)


def _in_order(g: torch.Tensor, order: tuple[int, ...] | None) -> torch.Tensor:
    """``g``, or a copy of it, dense in dim order ``order`` (None: contiguous), the layout
    its tangent was traced in."""
    if order is None:
        return g.contiguous()
    permuted = g.permute(order)
    return g if permuted.is_contiguous() else \
        permuted.contiguous().permute(inverse_order(order))


def compile_training(gm: torch.fx.GraphModule, example_inputs: list, *,
                     compile_graph: Callable, decompositions: dict | None = None,
                     fake_mode=None) -> TrainingGraph:
    """Trace, partition and compile a training graph (``NotImplementedError``: callers run
    the captured graph). ``fake_mode``: ``example_inputs`` are its fakes and SymInts (a
    graph with symbolic sizes; the backward then also takes the size inputs' values)."""
    joint = trace_joint(gm, list(example_inputs), decompositions=decompositions,
                        fake_mode=fake_mode)
    parts = partition(joint)
    sizes = tuple(i for i, x in enumerate(example_inputs) if isinstance(x, torch.SymInt))
    if sizes:
        _take_sizes(parts.backward, [example_inputs[i] for i in sizes])
    log_partition(joint, parts)
    merge_reduced_dims(parts.forward)
    merge_reduced_dims(parts.backward)
    with autocast_off():            # ATen graphs, autocast's casts in them already
        forward = compile_graph(parts.forward, list(example_inputs))
        backward = compile_graph(parts.backward,
                                 _placeholder_values(parts.backward, bool(sizes)))
    stats["compiled"] += 1
    symbols = tuple(example_inputs[i].node.expr for i in sizes)
    return TrainingGraph(joint, parts, forward, backward, gm.forward, compile_graph, sizes,
                         symbols)


def _saved_strides(parts: Partition, symbols: tuple) -> list | None:
    """Per saved value, its strides in the backward's graph as expressions of ``symbols``
    (None for a value that is not a tensor, or whose strides are not such expressions).
    None when the size inputs are not plain symbols."""
    if not all(isinstance(sym, sympy.Symbol) for sym in symbols):
        return None
    out = []
    for val in _saved_vals(parts):
        strides = None
        if isinstance(val, torch.Tensor):
            strides = tuple(st.node.expr if isinstance(st, torch.SymInt) else
                            sympy.Integer(st) for st in val.stride())
            if any(not e.free_symbols <= set(symbols) for e in strides):
                strides = None
        out.append(strides)
    return out


def _take_sizes(backward: torch.fx.GraphModule, sizes: list) -> None:
    """The backward of a graph with symbolic sizes takes the size inputs' values after its
    tangents (its ops' size arguments are expressions over them)."""
    graph = backward.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    # (none: no output the backward differentiates needs a saved value or a tangent)
    anchor = placeholders[-1] if placeholders else None
    for k, size in enumerate(sizes):
        with graph.inserting_after(anchor) if anchor is not None else \
                graph.inserting_before(next(iter(graph.nodes))):
            anchor = graph.placeholder(f"size_{k}")
        anchor.meta["val"] = size
    backward.recompile()
