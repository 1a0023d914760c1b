"""The graph being captured: inputs, nodes with fake values, and the final compile step.

Every tensor the captured code touches is either a graph input (a placeholder with the
Source it was read from) or the output of a node. Each node is evaluated on fake tensors as it
is created, so shapes, dtypes and devices are known without running anything real.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.fx

from ember import fake as fake_mod
from ember.frontend import guards as guards_mod
from ember.frontend.dynamic import ConstraintViolation
from ember.frontend.exc import Unsupported
from ember.frontend.guards import GuardSet
from ember.frontend.side_effects import SideEffects
from ember.frontend.symbolic_inputs import SymbolicInputs
from ember.frontend.source import ConstantSource, Source
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.scalars import scalar_operands

# Graph calls with effects beyond their result: never removed as dead code.
_EFFECTFUL = {operator.setitem, operator.delitem, torch._C._set_grad_enabled, torch._assert,
              torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast,
              torch.autograd.grad_mode._enter_inference_mode,
              torch.autograd.grad_mode._exit_inference_mode,
              *[getattr(operator, n) for n in dir(operator) if n.startswith("i") and
                n[1:] in dir(operator) and callable(getattr(operator, n))]}


@dataclass
class GraphInput:
    node: torch.fx.Node
    source: Source
    value: torch.Tensor          # a size symbol's input: its torch.SymInt
    from_float: bool = False    # the source holds a float: passed as a float64 0-d tensor
    size_of: Any = None         # a size symbol's input: the TensorProperty (or int
    #                             argument's Source) it reads


class OutputGraph:
    def __init__(self, frame_name: str, dynamic: bool | None = None, code=None, seen=None):
        self.graph = torch.fx.Graph()
        self.guards = GuardSet()
        self.side_effects = SideEffects()
        # sizes of dynamic dims (``dynamic=`` policy, marks, automatic dynamic)
        self.symbolic = SymbolicInputs(self, dynamic, code, GraphInput, seen)
        self.fake_mode = fake_mod.FakeTensorMode(shape_env=self.symbolic.env)
        self.inputs: list[GraphInput] = []
        self._input_by_id: dict[int, VariableTracker] = {}
        # id -> (object, its tracker) for mutable objects read from the frame's state; the
        # object is held so its id cannot be reused while capture runs
        self.tracked: dict[int, tuple[Any, VariableTracker]] = {}
        self._constant_tensors: list[torch.Tensor] = []
        # id(real cell) -> its tracker, so every function closing over a cell shares one
        self.cells_by_id: dict[int, VariableTracker] = {}
        # id(module globals) -> (slot name, the dict): globals of other modules read by
        # inlined functions, held by the entry as constants
        self.global_dicts: dict[int, tuple[str, dict]] = {}
        self.frame_name = frame_name
        self.initial_grad_mode = torch.is_grad_enabled()
        # the DistributedDataParallel whose forward the capture entered (ddp_split.py)
        self.ddp_module = None
        # autocast/inference-mode blocks capture is inside: (exit function, real context)
        self.global_contexts: list[tuple[Callable, Any]] = []
        self.location: Callable[[], str] = lambda: ""
        self.guards.add(guards_mod.grad_mode(self.initial_grad_mode))
        # autocast on at entry: guarded, and made explicit in the graph (``finish``)
        self.initial_autocast = guards_mod.autocast_state()
        self.guards.add(guards_mod.autocast_match(self.initial_autocast))

    # -- inputs --------------------------------------------------------------------------------
    def add_input(self, value: torch.Tensor, source: Source | None):
        from ember.frontend.variables.tensor import TensorVariable
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsupported(f"tensor subclass {type(value).__qualname__}")
        if value.layout is not torch.strided:
            raise Unsupported(f"tensor with layout {value.layout}")
        known = self._input_by_id.get(id(value))
        if known is not None:
            if source is not None and known.source is not None and source != known.source:
                self.guards.add(guards_mod.same_object(source, known.source))
            return known
        if source is None:
            source = ConstantSource(f"___tensor{len(self._constant_tensors)}")
            self._constant_tensors.append(value)
            vt = self._placeholder(value, source)
        else:
            vt = self._placeholder(value, source, dynamic=True)
            if fake_mod.is_symbolic(vt.fake):
                self.guards.add(guards_mod.tensor_match_dynamic(source, value, vt.fake))
            else:
                self.guards.add(guards_mod.tensor_match(source, value))
        vt.fake_python_type = type(value)
        self._input_by_id[id(value)] = vt
        return vt

    def add_scalar_input(self, value: torch.Tensor, source: Source):
        """A graph input for the float at ``source`` (``variables/scalars.py``): the entry
        passes it as the 0-d float64 tensor ``value`` stands for."""
        vt = self._placeholder(value, source, from_float=True)
        vt.source = None        # the tensor exists only in the entry's call of the graph
        return vt

    def graph_inputs(self) -> list[GraphInput]:
        """The placeholders' inputs in order: size symbols first, then tensors."""
        return [*self.symbolic.symbol_inputs, *self.inputs]

    def _placeholder(self, value: torch.Tensor, source: Source, from_float: bool = False,
                     dynamic: bool = False):
        from ember.frontend.variables.tensor import TensorVariable
        name = _placeholder_name(source.name(), self.graph)
        # placeholders must come before every other node
        if self.inputs:
            with self.graph.inserting_after(self.inputs[-1].node):
                node = self.graph.placeholder(name)
        else:
            with self.graph.inserting_before(next(iter(self.graph.nodes), None)):
                node = self.graph.placeholder(name)
        try:
            fake = self.symbolic.fake_for(value, source) if dynamic else None
            if fake is None:
                fake = self.fake_mode.from_real(value)
        except ConstraintViolation:     # a marked size outside its bounds: the user's error
            raise
        except Exception as e:
            raise Unsupported(f"cannot make a fake tensor for {source.name()}: {e}") from None
        node.meta["val"] = fake
        node.meta["source"] = source
        self.inputs.append(GraphInput(node, source, value, from_float))
        return TensorVariable(node, fake, source)

    def tracked_object(self, value) -> VariableTracker | None:
        entry = self.tracked.get(id(value))
        return entry[1] if entry is not None else None

    def track_object(self, value, vt: VariableTracker) -> None:
        self.tracked[id(value)] = (value, vt)

    def distinct_object_guards(self) -> None:
        """Objects the code mutated were distinct from every other object of their type it
        read; a later call that passes one object under two names must capture anew (the
        mutation through one name would be invisible through the other)."""
        mutated = {id(vt) for vt in self.side_effects.mutated_objects()}
        by_type: dict[type, list[VariableTracker]] = {}
        for value, vt in self.tracked.values():
            if vt.source is not None:
                by_type.setdefault(type(value), []).append(vt)
        for group in by_type.values():
            if len(group) > 1 and any(id(vt) in mutated for vt in group):
                # one check per group (a set of ids), not one per pair: 50 layers of one
                # class would otherwise cost 1225 comparisons per call
                self.guards.add(guards_mod.all_distinct([vt.source for vt in group]))

    def constant_tensor_slots(self) -> dict[str, torch.Tensor]:
        return {f"___tensor{i}": t for i, t in enumerate(self._constant_tensors)}

    # -- nodes ---------------------------------------------------------------------------------
    def call_function(self, fn, args: list, kwargs: dict) -> VariableTracker:
        return self._call("call_function", fn, args, kwargs)

    def call_method(self, name: str, args: list, kwargs: dict) -> VariableTracker:
        return self._call("call_method", name, args, kwargs)

    def _call(self, kind, target, args, kwargs) -> VariableTracker:
        args = scalar_operands(kind, target, args)
        sym = self.symbolic.node_for
        node_args, fake_args = _unwrap_all(args, sym)
        node_kwargs, fake_kwargs = _unwrap_all(kwargs, sym)
        with self.fake_mode:
            try:
                if kind == "call_function":
                    fake_out = target(*fake_args, **fake_kwargs)
                else:
                    fake_out = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
            except fake_mod.DataDependentError as e:
                raise Unsupported(f"data-dependent operation {e}") from None
            except Unsupported:
                raise
            except Exception as e:
                what = target if isinstance(target, str) else getattr(target, "__name__", target)
                error = Unsupported(f"{what} raised {type(e).__name__} on fake inputs: "
                                    f"{str(e).splitlines()[0] if str(e) else ''}")
                error.symbolic_sizes = not isinstance(e, fake_mod.FakeUnsupported) and \
                    _any_symbolic((fake_args, fake_kwargs))
                raise error from None
        node_args, node_kwargs = self._numpy_scalars_made((node_args, node_kwargs))
        node = self.graph.create_node(kind, target, tuple(node_args), node_kwargs)
        node.meta["stack_trace"] = self.location()
        return self.wrap_result(node, fake_out)

    def _numpy_scalars_made(self, value):
        """``value`` (node arguments) with each NumPy scalar (``np.finfo(np.float32).eps``)
        made by a node ``np.float32(<the Python number>)``: the generated code has no name
        for NumPy, and torch treats a NumPy scalar unlike the Python number (``torch.tensor``
        keeps float64, ``int_tensor + np.bool_`` is float), so the argument stays one."""
        if isinstance(value, np.generic):
            if not isinstance(value, (np.bool_, np.integer, np.float16, np.float32, np.float64,
                                      np.complex64, np.complex128)):
                raise Unsupported(f"a NumPy {type(value).__name__} scalar as an argument of a "
                                  f"graph call")
            node = self.graph.call_function(type(value), (value.item(),))
            node.meta["val"] = value
            return node
        if type(value) in (tuple, list):
            return type(value)(self._numpy_scalars_made(v) for v in value)
        if type(value) is dict:
            return {k: self._numpy_scalars_made(v) for k, v in value.items()}
        if type(value) is slice:
            return slice(*self._numpy_scalars_made([value.start, value.stop, value.step]))
        return value

    def wrap_result(self, node: torch.fx.Node, value: Any) -> VariableTracker:
        from ember.frontend.variables.containers import (ListVariable, NamedTupleVariable,
                                                         SizeVariable, TupleVariable)
        from ember.frontend.variables.symbolic import SYM_TYPES, wrap_sym
        from ember.frontend.variables.tensor import TensorVariable
        if isinstance(value, torch.Tensor):
            node.meta["val"] = value
            return TensorVariable(node, value)
        if isinstance(value, torch.Size):
            self._drop_if_pure(node)
            return SizeVariable([wrap_sym(v) for v in value])
        if isinstance(value, SYM_TYPES):
            # computed again from the size inputs where it is used (symbolic_inputs.py)
            self._drop_if_pure(node)
            return wrap_sym(value)
        if isinstance(value, (tuple, list)):
            node.meta["val"] = value
            items = []
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    sub = self.graph.call_function(operator.getitem, (node, i))
                    sub.meta["val"] = item
                    items.append(TensorVariable(sub, item))
                elif item is None or isinstance(item, (int, float, bool)):
                    items.append(ConstantVariable(item))
                elif isinstance(item, SYM_TYPES):
                    items.append(wrap_sym(item))
                else:
                    raise Unsupported(f"graph call returned a {type(item).__name__} in a "
                                      f"sequence")
            if type(value) is list:
                return ListVariable(items)
            if type(value) is tuple:
                return TupleVariable(items)
            return NamedTupleVariable(items, type(value))
        if value is None:
            return ConstantVariable(None)
        if isinstance(value, (int, float, bool, torch.dtype, torch.device)):
            self._drop_if_pure(node)
            return ConstantVariable(value)
        raise Unsupported(f"graph call returned a {type(value).__name__}")

    def _drop_if_pure(self, node):
        if not node.users and not is_effectful(node):
            self.graph.erase_node(node)

    def set_grad_enabled(self, mode: bool) -> None:
        torch._C._set_grad_enabled(mode)
        self.graph.call_function(torch._C._set_grad_enabled, (mode,))

    # -- finishing ---------------------------------------------------------------------------
    def draws_random(self) -> bool:
        """The graph so far may draw from a random generator when it runs."""
        return draws_random(self.graph)

    def finish(self, outputs: list[torch.fx.Node]) -> torch.fx.GraphModule:
        self.graph.output(tuple(outputs))
        remove_dead_nodes(self.graph)
        self._enter_initial_autocast()
        gm = torch.fx.GraphModule(torch.nn.Module(), self.graph,
                                  class_name=_class_name(self.frame_name))
        return gm

    def _enter_initial_autocast(self) -> None:
        """Autocast that was on when the frame was entered becomes part of the graph (enter
        after the inputs, exit before the output): the graph then means the same whatever
        state a backend compiles it in, and differs from the graph of the same code captured
        without autocast (a backend's cache keyed by the graph keeps them apart)."""
        if not self.initial_autocast or not any(
                n.op.startswith("call_") for n in self.graph.nodes):
            return
        first = next(n for n in self.graph.nodes if n.op != "placeholder")
        output = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        enter = torch.amp.autocast_mode._enter_autocast
        exit_ = torch.amp.autocast_mode._exit_autocast
        for device, dtype, cache in self.initial_autocast:
            with self.graph.inserting_before(first):
                node = self.graph.call_function(enter, (device, dtype, True, cache))
            with self.graph.inserting_before(output):
                output = self.graph.call_function(exit_, (node,))

    def enter_global_context(self, enter_fn, exit_fn, args: tuple, manager=None):
        real = enter_fn(*args)
        self.global_contexts.append((exit_fn, real, manager))
        return real

    def exit_global_context(self, real) -> None:
        exit_fn, top, _ = self.global_contexts.pop()
        assert top is real, "global contexts exit in the order they entered"
        exit_fn(real)

    def open_context_managers(self) -> list:
        """The trackers of the autocast/inference-mode blocks open now, outermost first."""
        return [manager for _, _, manager in self.global_contexts]

    def restore_global_state(self) -> None:
        while self.global_contexts:     # capture stopped inside a block
            exit_fn, real, _ = self.global_contexts.pop()
            exit_fn(real)
        torch._C._set_grad_enabled(self.initial_grad_mode)


# Functions and methods that draw from a random generator: removing one, even with its
# result unused, would leave the generator where eager does not.
_RANDOM_NAMES = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like",
                 "randint_like", "bernoulli", "multinomial", "normal", "poisson", "dropout",
                 "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                 "feature_alpha_dropout", "rrelu", "native_dropout", "fused_dropout",
                 "gumbel_softmax", "binomial", "standard_gamma", "_standard_gamma",
                 "_sample_dirichlet"}


# in-place methods that fill a tensor from the generator
_RANDOM_FILLS = {"normal_", "uniform_", "bernoulli_", "random_", "exponential_", "cauchy_",
                 "geometric_", "log_normal_"}


def draws_random(graph: torch.fx.Graph) -> bool:
    """Some node of ``graph`` may draw from a random generator when the graph runs."""
    for node in graph.nodes:
        if node.op == "call_module":
            return True
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        if name in _RANDOM_NAMES or name in _RANDOM_FILLS:
            return True
    return False


def is_effectful(node: torch.fx.Node) -> bool:
    if node.op == "placeholder" or node.op == "output":
        return True
    target = node.target
    if node.op == "call_method":
        name = target
    else:
        if target in _EFFECTFUL:
            return True
        if getattr(target, "__module__", None) == "_operator":
            return False    # the in-place ones are in _EFFECTFUL; and_/or_ only look it
        name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return True
    if node.kwargs.get("out") is not None or node.kwargs.get("inplace") is True:
        return True
    if isinstance(target, torch.nn.Module) or node.op == "call_module":
        return True     # a module's forward may do anything, random draws included
    return name in ("copy_", "__setitem__", "set_", "resize_") or name in _RANDOM_NAMES


def remove_dead_nodes(graph: torch.fx.Graph) -> None:
    for node in reversed(list(graph.nodes)):
        if node.op not in ("placeholder", "output") and not node.users \
                and not is_effectful(node):
            graph.erase_node(node)


def _unwrap(vt, sym):
    """(value for the FX node, value for the fake run) of one argument; ``sym(value)`` is the
    FX argument computing a symbolic number."""
    from ember.frontend.variables import containers as c
    from ember.frontend.variables.dicts import DictVariable
    from ember.frontend.variables.symbolic import SymNodeVariable
    from ember.frontend.variables.tensor import TensorVariable
    if isinstance(vt, TensorVariable):
        return vt.node, vt.fake
    if isinstance(vt, SymNodeVariable):
        return sym(vt.value), vt.value
    if isinstance(vt, ConstantVariable):
        return vt.value, vt.value
    if isinstance(vt, c.SizeVariable):
        n, f = _unwrap_all(vt.items, sym)
        if any(isinstance(item, torch.fx.Node) for item in n):    # symbolic sizes
            return tuple(n), torch.Size(f)
        return torch.Size(n), torch.Size(f)
    if isinstance(vt, (c.TupleVariable, c.ListVariable)):
        n, f = _unwrap_all(vt.items, sym)
        typ = list if isinstance(vt, c.ListVariable) else tuple
        return typ(n), typ(f)
    if isinstance(vt, c.SliceVariable):
        n, f = _unwrap_all(vt.parts, sym)
        return slice(*n), slice(*f)
    if isinstance(vt, DictVariable):
        n, f = _unwrap_all({k: v for k, v in vt.items.items()}, sym)
        return n, f
    if vt.is_python_constant():
        value = vt.as_python_constant()
        return value, value
    raise Unsupported(f"{vt} as an argument of a graph call")


def _unwrap_all(items, sym):
    if isinstance(items, dict):
        pairs = {k: _unwrap(v, sym) for k, v in items.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    pairs = [_unwrap(v, sym) for v in items]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _any_symbolic(values) -> bool:
    """Some fake tensor or number among ``values`` (nested) has symbolic sizes."""
    from ember.frontend.variables.symbolic import SYM_TYPES
    for v in torch.utils._pytree.tree_leaves(values):
        if isinstance(v, SYM_TYPES) or (fake_mod.is_fake(v) and fake_mod.is_symbolic(v)):
            return True
    return False


def _placeholder_name(source_name: str, graph: torch.fx.Graph) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", source_name).strip("_") or "input"
    if name[0].isdigit():
        name = "_" + name
    return name


def _class_name(frame_name: str) -> str:
    return "Graph_" + re.sub(r"[^0-9a-zA-Z_]", "_", frame_name)[:60]
