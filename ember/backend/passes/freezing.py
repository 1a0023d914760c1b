"""``options={"freezing": True}``: parameters and buffers folded as constants (inference).

    frozen = freeze(gm, aten_gm, example_inputs)   # after trace_to_aten, before compile_aten
    compiled = compile_aten(frozen.gm, example_inputs, ...)
    run = frozen.guard(compiled, recompile)        # run(*inputs) == gm(*inputs)

What is frozen
--------------
The *leaves* are the values the graph may treat as fixed: graph inputs that are parameters
or buffers, and the ``get_attr`` tensors of the ATen graph (constants the tracer lifted).
An input is a parameter or buffer when its example value is an ``nn.Parameter`` or its
placeholder's ``meta["source"]`` (set by Ember's frontend: ``L['self'].bn.running_mean`` is a
``ModuleDictSource`` into ``_buffers``) names an entry of a module's ``_parameters`` or
``_buffers``; no new metadata is needed, and the backend contract is unchanged (the frontend
still passes every input on every call). When another frontend hands the graph over (the
``torch_dynamo_backends`` entry point), placeholders carry no Ember source: parameters are
still recognised, buffers are not (so batch norms are not folded there). Not frozen: inputs the graph mutates (training-mode
batch-norm statistics), inference tensors (``torch.inference_mode`` tensors keep no version
counter, so a change could not be seen) and every other input.

The pass (on the ATen graph)
----------------------------
1. Write-backs that change nothing (eval-mode batch norm "updating" its running statistics
   with themselves) never reach this graph: the ATen tracer does not count those inputs as
   mutated (``aot.trace._unchanged``), so those buffers are frozen like any other.
2. ``_native_batch_norm_legit_no_training`` / ``native_batch_norm(training=False)``, if they
   reach the graph undecomposed, are rewritten as ``x * scale + shift`` with per-channel
   ``scale``, ``shift`` computed from the statistics (constants when they are frozen).
3. **Convolution folding.** A ``convolution`` (not transposed) whose weight and bias are
   constant and whose output is read only by a ``mul``/``div``/``add``/``sub`` with a
   constant per-output-channel operand (a scalar, or ``[C, 1, ...]`` along dim 1) absorbs
   it: ``W' = W * c``, ``b' = b * c`` (``/ c``; ``b' = b +- c``). Eval-mode batch norm
   after decomposition is exactly such a chain (``sub mean``, ``mul invstd``, ``mul
   weight``, ``add bias``), so a conv-bn(-relu) becomes one convolution (with bias), plus
   the relu. The folded weight keeps the original weight's strides, so the convolution's
   output layout (which the code generated after it relies on) does not change. Batch norm
   in low precision (its decomposition casts to float32 around the arithmetic) is not folded.
4. **Constant folding.** A node is constant when it is a pure, deterministic ATen op (not
   mutating, not random) whose tensor arguments are all constant. Constant nodes that depend
   on a leaf and are read by a non-constant node are evaluated once, eagerly, and become
   ``get_attr`` constants of the graph (weight transposes, casts, batch-norm scale/shift,
   the folded convolution weights). Not folded: a value that is a view of a leaf (``t(W)``:
   views cost nothing, and a constant aliasing a parameter could not be refreshed in place);
   anything a graph output is, or is a view of (the caller gets a fresh tensor each call,
   as in eager); values with no leaf behind them (``arange``, ``full``: generated inline).

Frozen constants are tensors the generated code reads, never values written into kernel
source: the kernels are the same as without freezing, and a changed weight needs no new
code, only new constants. They are new tensors: the parameters they were computed from stay
with the module, so the folded weights are held twice (resnet18: 42.6 MB of constants).

The guard
---------
The guarded callable records each leaf that feeds a frozen constant: the tensor object
(which it keeps alive, so the identity cannot be reused), its ``data_ptr()`` and its
``_version``. Every call compares them (about 0.25 us per leaf here: 24 us for resnet18's
100 guarded parameters and buffers, 0.2% of its 13 ms call); if one changed (an optimizer
step, ``with no_grad(): w.mul_(2)``, ``load_state_dict``, a replaced ``nn.Parameter``,
``w.data = ...``) it re-freezes before running: the constant program (the folded subgraph,
kept as an FX graph of ATen calls) runs again on the current leaves and its results are
copied into the constants the compiled code reads (resnet18: a call after a weight change
takes ~30 ms more). Should a result's shape, dtype or device differ (it cannot while the
frontend's tensor guards hold), the graph is compiled again instead. Each re-freeze is
logged under ``EMBER_LOGS=recompiles`` with the name of the changed leaf. Leaves read only
directly by the graph (``W`` of an unfolded convolution, ``t(W)`` of a linear) are not
guarded: the compiled code reads them on every call, as without freezing.

Limitation (as in any version-counter check): ``param.data.copy_(...)`` writes through a
tensor that has its own version counter, so it is invisible to the guard; write under
``torch.no_grad()`` to the parameter itself (``param.copy_(...)``), which optimizers and
``load_state_dict`` do. Assigning ``param.data = t`` is seen (the data pointer changes).

Training graphs (grad mode on and an input requiring grad) are not frozen: gradients must
reach the parameters. The backend warns and runs the graph as it runs without freezing.

Prepacking is not done: it was not faster here. Measured on the CPU machine (2 threads,
samples taken while no other process ran): each convolution of resnet18 replaced by a custom
op calling ``mkldnn._convolution_pointwise`` with a weight reordered once by
``mkldnn._reorder_convolution_weight`` gave resnet18 11.12 ms vs 10.73 ms frozen without
it, convnet 7.36 vs 7.42 ms (medians of 20). Alone, the prepacked convolutions are faster
(resnet18's convolutions at 1 thread: 9.2-10.6 ms vs 10.2-12.5 ms), but they return
channels-last outputs for contiguous inputs, which the pointwise kernels after them convert
back, and the call goes through a Python op; the packed weight itself is an opaque MKLDNN
tensor, which the graph's constants (``GraphLowering``: strided tensors) cannot hold. Worth
revisiting together with a channels-last layout pass.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from ember import logs
from ember.backend.passes.fx_utils import dense, is_impure, is_pure, output_aliases

__all__ = ["freeze", "FrozenGraph", "FrozenCallable", "is_parameter_or_buffer"]

aten = torch.ops.aten

_AFFINE_OPS = {aten.mul.Tensor, aten.div.Tensor, aten.add.Tensor, aten.sub.Tensor}


# -- which inputs are parameters or buffers ------------------------------------------------------

def _source_of(node: torch.fx.Node):
    return node.meta.get("source")


def is_parameter_or_buffer(node: torch.fx.Node, value: Any) -> bool:
    """Whether graph input ``node`` (example ``value``) is a module's parameter or buffer."""
    if isinstance(value, torch.nn.Parameter):
        return True
    # Ember's frontend: a ModuleDictSource into the owning module's dict
    return getattr(_source_of(node), "dict_name", None) in ("_parameters", "_buffers")


def _source_name(node: torch.fx.Node) -> str:
    src = _source_of(node)
    try:
        return src.name() if src is not None else node.name
    except Exception:
        return node.name


# -- small graph helpers --------------------------------------------------------------------------

def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


# -- the pass -------------------------------------------------------------------------------------

@dataclass
class _Leaf:
    name: str                          # for messages: the source name, or the get_attr target
    index: int | None                  # graph input position; None for a get_attr constant
    tensor: torch.Tensor
    version: int = 0
    data_ptr: int = 0

    def record(self, t: torch.Tensor) -> None:
        self.tensor, self.version, self.data_ptr = t, t._version, t.data_ptr()


@dataclass
class FrozenGraph:
    gm: torch.fx.GraphModule                     # the frozen ATen graph (same inputs)
    program: torch.fx.GraphModule | None         # program(*leaf tensors) -> constants
    leaves: list[_Leaf]                          # the program's inputs, guarded
    constants: list[torch.Tensor]                # the program's outputs, read by gm
    stats: dict = field(default_factory=dict)

    def guard(self, compiled: Callable, recompile: Callable[[list], Callable]) -> Callable:
        """``compiled`` behind the guard on the frozen leaves (see the module docstring);
        ``recompile(inputs)`` compiles the graph again (used only if a refresh cannot be)."""
        if not self.leaves:
            return compiled
        return FrozenCallable(self, compiled, recompile)


class FrozenCallable:
    """Runs the compiled graph after checking the frozen leaves; re-freezes on a change."""

    def __init__(self, frozen: FrozenGraph, compiled: Callable,
                 recompile: Callable[[list], Callable]):
        self.recompile = recompile
        self.refreezes = 0
        self._use(frozen, compiled)

    def _use(self, frozen: FrozenGraph | None, compiled: Callable) -> None:
        self.frozen = frozen
        self.compiled = compiled
        self._checks = [(lf.index, lf) for lf in frozen.leaves] if frozen else []

    def __getattr__(self, name):            # source, kernel_sources, mutates_inputs, ...
        compiled = self.__dict__.get("compiled")
        if compiled is None:
            raise AttributeError(name)
        return getattr(compiled, name)

    def changed_leaf(self, args) -> _Leaf | None:
        for index, leaf in self._checks:
            t = leaf.tensor if index is None else args[index]
            if t is not leaf.tensor or t._version != leaf.version or \
                    t.data_ptr() != leaf.data_ptr:
                return leaf
        return None

    def __call__(self, *args):
        if self._checks:
            leaf = self.changed_leaf(args)
            if leaf is not None:
                self.refreeze(args, leaf)
        return self.compiled(*args)

    def refreeze(self, args, leaf: _Leaf) -> None:
        t = leaf.tensor if leaf.index is None else args[leaf.index]
        what = ("was replaced by another tensor" if t is not leaf.tensor else
                "moved to other memory" if t.data_ptr() != leaf.data_ptr else
                f"was modified in place (version {leaf.version} -> {t._version})")
        self.refreezes += 1
        frozen = self.frozen
        current = [lf.tensor if lf.index is None else args[lf.index] for lf in frozen.leaves]
        values = _run_program(frozen.program, current)
        if all(_same_meta(old, new) for old, new in zip(frozen.constants, values)):
            logs.log("recompiles", "freezing: %s %s; recomputing %d frozen constant(s)",
                     leaf.name, what, len(values))
            with torch.no_grad(), torch.inference_mode(False):
                for old, new in zip(frozen.constants, values):
                    old.copy_(new)
            for lf, cur in zip(frozen.leaves, current):
                lf.record(cur)
            return
        logs.log("recompiles", "freezing: %s %s; the frozen constants changed shape or dtype, "
                               "compiling the graph again", leaf.name, what)
        new = self.recompile(list(args))
        if isinstance(new, FrozenCallable):
            self._use(new.frozen, new.compiled)
        else:
            self._use(None, new)


def _same_meta(a: torch.Tensor, b) -> bool:
    """A refresh copies ``b`` into ``a``: strides may differ, nothing else."""
    return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype \
        and a.device == b.device


def _run_program(program: torch.fx.GraphModule, leaves: list) -> list:
    with torch.no_grad(), torch.inference_mode(False):
        return list(program(*leaves))


def freeze(gm: torch.fx.GraphModule, aten_gm: torch.fx.GraphModule,
           example_inputs: list) -> FrozenGraph:
    """Fold the parameters and buffers of ``aten_gm`` (traced from ``gm`` on
    ``example_inputs``; same placeholders, in order) into constants. ``aten_gm`` is
    rewritten in place and returned as ``FrozenGraph.gm``."""
    graph = aten_gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    captured = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(captured) != len(placeholders):
        captured = placeholders

    mutated = {n.args[0] for n in graph.nodes
               if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable and n.args}

    leaves: dict[torch.fx.Node, _Leaf] = {}
    for i, (node, src_node, value) in enumerate(zip(placeholders, captured, example_inputs)):
        if not isinstance(value, torch.Tensor) or node in mutated or not node.users or \
                not is_parameter_or_buffer(src_node, value):
            continue
        if value.is_inference():
            logs.log("perf_hints", "freezing: %s is an inference tensor (it has no version "
                                   "counter to guard); not frozen", _source_name(src_node))
            continue
        leaves[node] = _Leaf(_source_name(src_node), i, value)
    for node in graph.nodes:
        if node.op == "get_attr" and node not in mutated:
            value = getattr(aten_gm, node.target)
            if isinstance(value, torch.Tensor) and not value.is_inference():
                leaves[node] = _Leaf(f"constant {node.target}", None, value)

    stats = {"batch_norms_rewritten": _rewrite_batch_norms(graph)}
    _propagate_fakes(graph)
    const = _constant_nodes(graph, leaves)
    stats["folded_into_convolutions"] = _fold_into_convolutions(graph, const)
    graph.eliminate_dead_code(is_impure_node=is_impure)
    _propagate_fakes(graph)

    const = _constant_nodes(graph, leaves)
    values = _evaluate(graph, aten_gm, const, example_inputs)
    program, used, constants = _materialize(aten_gm, const, leaves, values)
    graph.eliminate_dead_code(is_impure_node=is_impure)
    graph.lint()
    aten_gm.recompile()
    for lf in used:
        lf.record(lf.tensor)
    stats["constants"] = len(constants)
    stats["constant_bytes"] = sum(c.numel() * c.element_size() for c in constants)
    stats["guarded"] = [lf.name for lf in used]
    logs.log("output_code", "freezing: %d constant(s) (%.2f MB), %d op(s) folded into "
                            "convolutions, %d parameter(s)/buffer(s) guarded",
             len(constants), stats["constant_bytes"] / 2**20,
             stats["folded_into_convolutions"], len(used))
    return FrozenGraph(aten_gm, program, used, constants, stats)


def _constant_nodes(graph: torch.fx.Graph,
                    leaves: dict[torch.fx.Node, _Leaf]) -> dict[torch.fx.Node, bool]:
    """Constant node -> whether a leaf is behind it (leaves themselves: True)."""
    aliases = output_aliases(graph)
    const: dict[torch.fx.Node, bool] = {n: True for n in leaves}
    for node in graph.nodes:
        if node.op != "call_function" or node in aliases or not is_pure(node):
            continue
        inputs = node.all_input_nodes
        if all(a in const for a in inputs):
            const[node] = any(const[a] for a in inputs)
    return const


def _propagate_fakes(graph: torch.fx.Graph) -> None:
    """``meta["val"]`` for the nodes this pass added, computed on fakes."""
    mode = None
    for node in graph.nodes:
        if node.op != "call_function" or node.meta.get("val") is not None:
            continue
        if mode is None:
            from ember.fake import FakeTensorMode
            mode = FakeTensorMode()
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                             lambda n: n.meta["val"])
        with mode:
            node.meta["val"] = node.target(*args, **kwargs)


# -- batch norm, undecomposed ---------------------------------------------------------------------

def _rewrite_batch_norms(graph: torch.fx.Graph) -> int:
    """Eval-mode batch-norm ops -> ``x * scale + shift`` per channel (so a convolution
    before them can absorb them); returns how many were rewritten. The core decompositions
    already decompose them; this covers graphs traced without them."""
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten._native_batch_norm_legit_no_training.default and \
                len(node.args) == 7:
            x, w, b, mean, var, _momentum, eps = node.args
        elif node.target is aten.native_batch_norm.default and len(node.args) == 8:
            x, w, b, mean, var, training, _momentum, eps = node.args
            if training:
                continue
        else:
            continue
        xv = _val(x)
        users = list(node.users)
        if node.kwargs or mean is None or var is None or not isinstance(xv, torch.Tensor) \
                or xv.dim() < 2 or not all(u.target is operator.getitem and u.args[1] == 0
                                           for u in users):
            continue
        shape = [xv.shape[1]] + [1] * (xv.dim() - 2)
        c = graph.call_function
        with graph.inserting_before(node):
            scale = c(aten.rsqrt.default, (c(aten.add.Tensor, (var, eps)),))
            if w is not None:
                scale = c(aten.mul.Tensor, (scale, w))
            shift = c(aten.neg.default, (c(aten.mul.Tensor, (mean, scale)),))
            if b is not None:
                shift = c(aten.add.Tensor, (shift, b))
            scaled = c(aten.mul.Tensor, (x, c(aten.view.default, (scale, shape))))
            out = c(aten.add.Tensor, (scaled, c(aten.view.default, (shift, shape))))
            if _val(mean).dtype != xv.dtype:
                out = c(aten._to_copy.default, (out,), {"dtype": xv.dtype})
        for u in users:
            u.replace_all_uses_with(out)
            graph.erase_node(u)
        graph.erase_node(node)
        count += 1
    return count


# -- per-channel affine ops folded into convolutions ---------------------------------------------

def _channel_operand(other, conv_val: torch.Tensor, const) -> list[int] | None:
    """``[1]`` for a finite scalar; ``[C]`` or ``[1]`` (its size along dim 1) for a constant
    tensor that varies along the output channels only; else None."""
    if isinstance(other, bool):
        return None
    if isinstance(other, (int, float)):
        return [1] if math.isfinite(other) else None
    if not isinstance(other, torch.fx.Node) or other not in const:
        return None
    v = _val(other)
    if not isinstance(v, torch.Tensor) or v.dtype != conv_val.dtype or \
            v.device != conv_val.device or v.dim() > conv_val.dim():
        return None
    shape = [1] * (conv_val.dim() - v.dim()) + list(v.shape)
    if shape[0] != 1 or any(s != 1 for s in shape[2:]) or \
            shape[1] not in (1, conv_val.shape[1]):
        return None
    return [shape[1]]


def _fold_into_convolutions(graph: torch.fx.Graph, const: dict) -> int:
    """Per-channel ``mul``/``div``/``add``/``sub`` after a convolution with constant
    weights -> new constant weights and bias; returns how many ops were absorbed."""
    folded = 0
    changed = True
    while changed:
        changed = False
        for conv in list(graph.nodes):
            if conv.op != "call_function" or conv.target is not aten.convolution.default \
                    or conv in const or len(conv.users) != 1 or conv.kwargs:
                continue
            x, w, b, stride, padding, dilation, transposed, out_pad, groups = conv.args
            if transposed or w not in const or (b is not None and b not in const):
                continue
            (user,) = conv.users
            if user.op != "call_function" or user.target not in _AFFINE_OPS or \
                    len(user.args) != 2 or set(user.kwargs) - {"alpha"} or \
                    user.kwargs.get("alpha", 1) != 1:
                continue
            conv_val, user_val = _val(conv), _val(user)
            if not isinstance(user_val, torch.Tensor) or user_val.shape != conv_val.shape \
                    or user_val.dtype != conv_val.dtype or \
                    user_val.stride() != conv_val.stride():
                continue
            first = user.args[0] is conv
            other = user.args[1] if first else user.args[0]
            if other is conv or (not first and user.target in (aten.sub.Tensor,
                                                               aten.div.Tensor)):
                continue
            channels = _channel_operand(other, conv_val, const)
            if channels is None:
                continue
            with graph.inserting_before(user):
                new_w, new_b = _affine_weights(graph, const, user.target, w, b, other,
                                               channels, conv_val.shape[1])
                new_conv = graph.call_function(aten.convolution.default, (
                    x, new_w, new_b, stride, padding, dilation, transposed, out_pad, groups))
            new_conv.meta = dict(conv.meta)
            if new_w is not w:
                # the folded weight gets the weight's layout (the convolution's output
                # layout follows it): the stored constant is restrided to it
                new_w.meta["val"] = _val(w)
                new_w.meta["freezing_strides"] = tuple(_val(w).stride())
            user.replace_all_uses_with(new_conv)
            graph.erase_node(user)
            graph.erase_node(conv)
            folded += 1
            changed = True
    return folded


def _affine_weights(graph, const, op, w, b, other, channels, cout):
    """(weight, bias) of ``op(conv(x, w, b), other)`` as one convolution."""
    def call(target, *args, **kwargs):
        n = graph.call_function(target, args, kwargs)
        const[n] = True
        return n

    w_val = _val(w)
    if isinstance(other, torch.fx.Node):
        vec = call(aten.view.default, other, channels)                  # [C] or [1]
        col = call(aten.view.default, other, channels + [1] * (w_val.dim() - 1))
    else:
        vec = col = other
    if op in (aten.mul.Tensor, aten.div.Tensor):
        return call(op, w, col), (None if b is None else call(op, b, vec))
    if b is not None:
        return w, call(op, b, vec)
    if isinstance(vec, torch.fx.Node):
        vec = call(aten.expand.default, vec, [cout])
        return w, call(aten.neg.default if op is aten.sub.Tensor else aten.clone.default, vec)
    return w, call(aten.full.default, [cout], -vec if op is aten.sub.Tensor else vec,
                   dtype=w_val.dtype, device=w_val.device)


# -- evaluation and materialization ---------------------------------------------------------------

def _evaluate(graph, gm, const, example_inputs) -> dict[torch.fx.Node, Any]:
    """Real values of the constant nodes that have a leaf behind them (and of the
    constants they read: an ``arange`` or ``full`` combined with a weight)."""
    wanted = {n for n, has_leaf in const.items() if has_leaf}
    for node in reversed(graph.nodes):
        if node in wanted:
            wanted.update(node.all_input_nodes)
    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        if node in const:
            env[node] = value
    with torch.no_grad(), torch.inference_mode(False):
        for node in graph.nodes:
            if node not in wanted or node in env:
                continue
            if node.op == "get_attr":
                env[node] = getattr(gm, node.target)
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
            env[node] = node.target(*args, **kwargs)
    return env


def _materialize(gm, const, leaves, values):
    """Constant nodes read by nodes that run at call time become ``get_attr`` constants.
    Returns the constant program, the leaves it reads (in its order) and the constants."""
    graph = gm.graph
    leaf_storages = {lf.tensor.untyped_storage().data_ptr() for lf in leaves.values()
                     if lf.tensor.numel() > 0}
    # Nodes computed at call time: the non-constant ones, constants with no leaf behind
    # them, and constants that cannot be stored (views of leaves, overlapping views, non-
    # tensors); their constant inputs are stored instead, up to the leaves.
    runtime = {n for n, has_leaf in const.items() if not has_leaf and n not in leaves}

    def at_runtime(n):
        return n not in const or n in runtime

    stored: list[torch.fx.Node] = []
    changed = True
    while changed:
        changed = False
        stored = []
        for node in graph.nodes:
            if node not in const or node in leaves or node in runtime or \
                    not any(at_runtime(u) for u in node.users):
                continue
            value = values[node]
            if not isinstance(value, torch.Tensor) or not dense(value) or (
                    value.numel() > 0 and value.untyped_storage().data_ptr() in leaf_storages):
                runtime.add(node)
                changed = True
                continue
            stored.append(node)

    # the constant program: what the stored constants need, from the leaves
    needed: set[torch.fx.Node] = set()
    stack = list(stored)
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            if n not in leaves:
                stack.extend(n.all_input_nodes)
    prog = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    used: list[_Leaf] = []
    for node in graph.nodes:
        if node not in needed:
            continue
        if node in leaves:
            env[node] = prog.placeholder(f"leaf{len(used)}")
            used.append(leaves[node])
        else:
            env[node] = prog.node_copy(node, lambda n: env[n])
    prog.output(tuple(env[n] for n in stored))
    program = torch.fx.GraphModule(torch.nn.Module(), prog) if stored else None

    fake_mode = None
    constants = []
    for i, node in enumerate(stored):
        value = values[node]
        strides = node.meta.pop("freezing_strides", None) or value.stride()
        if strides != value.stride() or value.untyped_storage().nbytes() > \
                value.numel() * value.element_size():
            # the layout asked for, in memory of its own (a view of a folded intermediate
            # keeps only what it reads)
            value = torch.empty_strided(value.shape, strides, dtype=value.dtype,
                                        device=value.device).copy_(value)
        name = f"_frozen{i}"
        gm.register_buffer(name, value, persistent=False)
        with graph.inserting_before(node):
            attr = graph.get_attr(name)
        if fake_mode is None:
            from ember.fake import FakeTensorMode
            fake_mode = FakeTensorMode()
        attr.meta["val"] = fake_mode.from_real(value)
        node.replace_all_uses_with(attr, delete_user_cb=at_runtime)
        constants.append(value)
    return program, used, constants
