"""nn.Modules during capture: attribute lookup in Python's order, calls (a class's own
``__call__``, hooks, ``forward``), the module tree's generators, lazy modules, compiled
modules (``ember.compile(module)`` reached from compiled code) and modules built inside the
frame.

Design: a module outside the frame is read for real and guarded by identity; what the
capture relied on beyond that (the instance ``__dict__`` not shadowing a class attribute
that was used, the keys and order of the ``_parameters``/``_buffers``/``_modules`` dicts a
walk visited) is guarded where it is read, so changing a module after compiling recompiles.
"""
from __future__ import annotations

import inspect
import types

import torch

from ember.frontend import guards
from ember.frontend.exc import ObservedException, Unsupported
from ember.frontend.source import AttrSource, ModuleDictSource
from ember.frontend.variables.attribute_lookup import (MISSING, class_attribute, is_data_descriptor,
                                                       static_lookup)
from ember.frontend.variables.base import (BoundMethodVariable, ConstantVariable, NotConstant,
                                           VariableTracker)
from ember.frontend.variables.container_iterators import ListIteratorVariable
from ember.frontend.variables.containers import BaseSequenceVariable, TupleVariable
from ember.frontend.variables.ctx_manager import NO_OP_CONTEXT_METHODS, NoOpContextMethodVariable
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.functions import UserFunctionVariable, UserMethodVariable
from ember.frontend.variables.tensor import TensorVariable

# nn.Module's own __getattr__ (parameters, buffers, submodules), told apart from a subclass's
MODULE_GETATTR = torch.nn.Module.__dict__["__getattr__"]
_MODULE_METHODS = {"parameters", "named_parameters", "buffers", "named_buffers", "children",
                   "named_children", "modules", "named_modules"}
_CONTAINER_METHODS = {"keys", "values", "items", "__len__", "__iter__", "__getitem__",
                      "__contains__"}
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict,
               torch.nn.ParameterList, torch.nn.ParameterDict)
# nn.Module's own call machinery (a class may override __call__): __call__ (which is
# _wrapped_call_impl) calls self._call_impl, which runs the hooks around forward
MODULE_CALL_IMPL = torch.nn.Module.__dict__["_call_impl"]
_MODULE_CALLS = tuple(torch.nn.Module.__dict__[n] for n in ("__call__", "_call_impl",
                                                           "_wrapped_call_impl")
                      if n in torch.nn.Module.__dict__)


def is_module_call(fn) -> bool:
    """``fn`` is nn.Module's own call (by identity: a class attribute may be anything)."""
    return any(fn is call for call in _MODULE_CALLS)


class NNModuleVariable(VariableTracker):
    """An ``nn.Module`` that exists outside the frame (guarded by identity)."""

    def __init__(self, module: torch.nn.Module, source=None):
        super().__init__(source)
        self.value = module

    def python_type(self):
        return type(self.value)

    def truthy(self, tx):
        if hasattr(type(self.value), "__len__"):
            return self.call_method(tx, "__len__", [], {}).as_python_constant() > 0
        return True

    def _guard_length(self, tx) -> None:
        """A container's length and keys are its dict's (``_modules``, ``_parameters``,
        ParameterDict's ``_keys``): guarded, a module appended later changes them."""
        mod = self.value
        if isinstance(mod, torch.nn.ParameterDict):
            self.guard_keys(tx, ("_keys",))
        elif isinstance(mod, torch.nn.ParameterList):
            self.guard_keys(tx, ("_parameters",))
        else:
            self.guard_keys(tx, ("_modules",))

    def _child_source(self, dict_name, name):
        return ModuleDictSource(self.source, dict_name, name) if self.source else None

    def var_getattr(self, tx, name):
        """``module.name`` in Python's order: a data descriptor of the class (a property),
        the instance ``__dict__``, a class attribute (a method), and only when all of those
        miss, ``nn.Module.__getattr__``'s parameters, buffers and submodules."""
        override = tx.output.side_effects.pending_attr(self, name)
        if override is not None:
            return override
        mod = self.value
        cls = type(mod)
        d = mod.__dict__
        if name == "__class__":
            return tx.wrap(cls, None)
        desc = static_lookup(cls, name)
        if desc is not MISSING and is_data_descriptor(desc):
            return class_attribute(tx, cls, name, self, self.source)
        if name in d:
            return tx.wrap(d[name], AttrSource(self.source, name) if self.source else None)
        if desc is not MISSING:
            if self.source is not None:   # an instance attribute set later would shadow it
                tx.output.guards.add(guards.not_in_instance_dict(self.source, name))
            if is_module_call(desc):
                return ModuleCallVariable(self, impl=desc is MODULE_CALL_IMPL)
            if desc in NO_OP_CONTEXT_METHODS:      # DDP's _inside_ddp_forward
                return NoOpContextMethodVariable(desc, mod)
            if (name in _MODULE_METHODS and desc is torch.nn.Module.__dict__[name]) or (
                    name in _CONTAINER_METHODS and isinstance(mod, _CONTAINERS)):
                return BoundMethodVariable(self, name)
            return class_attribute(tx, cls, name, self, self.source)
        getattr_fn = static_lookup(cls, "__getattr__")
        if getattr_fn is not MODULE_GETATTR:    # the class's own, called as Python would
            if not isinstance(getattr_fn, types.FunctionType):
                raise Unsupported(f"{cls.__name__}.__getattr__ is not a Python function")
            return UserFunctionVariable(getattr_fn).call_function(
                tx, [self, ConstantVariable(name)], {})
        return self.module_getattr(tx, name)

    def module_getattr(self, tx, name):
        """``nn.Module.__getattr__``: a parameter, buffer or submodule, else AttributeError."""
        mod, d = self.value, self.value.__dict__
        for dict_name in ("_parameters", "_buffers", "_modules"):
            table = d.get(dict_name)
            if table is not None and name in table:
                value = table[name]
                if value is None:
                    return ConstantVariable(None)
                return tx.wrap(value, self._child_source(dict_name, name))
        if self.source is not None:   # it may have it on a later call (set on first use)
            tx.output.guards.add(guards.hasattr_match(self.source, name, False))
        message = f"{type(mod).__name__!r} object has no attribute {name!r}"
        raise ObservedException(AttributeError, [ConstantVariable(message)], message)

    def guard_keys(self, tx, dict_names=("_parameters", "_buffers", "_modules")) -> None:
        """The keys (and their order) of this module's parameter, buffer or submodule dicts:
        what iterating over them relied on."""
        if self.source is None:
            return
        for dict_name in dict_names:
            table = self.value.__dict__.get(dict_name)
            if type(table) is dict:
                tx.output.guards.add(guards.dict_keys_match(
                    AttrSource(self.source, dict_name), dict, list(table)))

    def children(self, tx) -> list[tuple[str, VariableTracker]]:
        self.guard_keys(tx, ("_modules",))
        return [(k, tx.wrap(m, self._child_source("_modules", k)) if m is not None
                 else ConstantVariable(None)) for k, m in self.value._modules.items()]

    def unpack(self, tx):
        mod = self.value
        if isinstance(mod, _CONTAINERS):
            self._guard_length(tx)
        if isinstance(mod, torch.nn.ModuleDict):
            return [ConstantVariable(k) for k in mod._modules]
        if isinstance(mod, (torch.nn.Sequential, torch.nn.ModuleList)):
            return [v for _, v in self.children(tx)]
        if isinstance(mod, torch.nn.ParameterList):
            self.guard_keys(tx, ("_parameters",))
            return [tx.wrap(p, self._child_source("_parameters", k))
                    for k, p in mod._parameters.items()]
        if isinstance(mod, torch.nn.ParameterDict):
            return [ConstantVariable(k) for k in mod._keys]
        raise Unsupported(f"iterating over {type(mod).__name__}")

    def call_function(self, tx, args, kwargs):
        """``module(*args)``: ``type(module).__call__``, which is nn.Module's (hooks around
        ``forward``) unless the class overrides it."""
        call = static_lookup(type(self.value), "__call__")
        if not is_module_call(call):
            if not isinstance(call, types.FunctionType):
                raise Unsupported(f"{type(self.value).__name__}.__call__ is not a Python "
                                  f"function")
            return UserFunctionVariable(call).call_function(tx, [self, *args], kwargs)
        if call is MODULE_CALL_IMPL:   # a class whose __call__ is nn.Module._call_impl
            return self.module_call(tx, args, kwargs)
        return self.wrapped_call(tx, args, kwargs)

    def wrapped_call(self, tx, args, kwargs):
        """``nn.Module.__call__`` (``_wrapped_call_impl``): ``self._call_impl(*args)``,
        nn.Module's (``module_call``) unless the class or the instance overrides it, then
        the override is traced (it usually calls ``super()._call_impl``)."""
        mod = self.value
        if mod.__dict__.get("_compiled_call_impl") is not None:   # Module.compile()
            raise Unsupported(f"calling a {type(mod).__name__} whose _compiled_call_impl is "
                              f"set (nn.Module.compile)")
        if "_call_impl" in mod.__dict__ or \
                static_lookup(type(mod), "_call_impl") is not MODULE_CALL_IMPL:
            return self.var_getattr(tx, "_call_impl").call_function(tx, args, kwargs)
        if self.source is not None:   # an instance's _call_impl set later replaces it
            tx.output.guards.add(guards.not_in_instance_dict(self.source, "_call_impl"))
        return self.module_call(tx, args, kwargs)

    def module_call(self, tx, args, kwargs):
        """``nn.Module.__call__``: forward pre-hooks, ``forward``, forward hooks."""
        mod = self.value
        m = torch.nn.modules.module
        if (m._global_forward_hooks or m._global_forward_pre_hooks
                or m._global_backward_hooks or m._global_backward_pre_hooks):
            raise Unsupported("global module hooks are registered")
        if isinstance(mod, torch.nn.modules.lazy.LazyModuleMixin) and \
                mod.has_uninitialized_params():
            initialize_lazy_module(tx, mod, args, kwargs)
        if mod._backward_hooks or mod._backward_pre_hooks:
            raise Unsupported(f"calling {type(mod).__name__} with backward hooks")
        if not (mod._forward_hooks or mod._forward_pre_hooks):
            if self.source is not None:
                tx.output.guards.add(guards.no_hooks(self.source))
            return self._forward(tx, args, kwargs)
        if self.source is None:
            raise Unsupported(f"forward hooks on a {type(mod).__name__} without a source")
        return self._call_with_hooks(tx, args, kwargs)

    def _forward(self, tx, args, kwargs):
        mod = self.value
        if "forward" in mod.__dict__:
            return tx.wrap(mod.__dict__["forward"], AttrSource(self.source, "forward")
                           if self.source else None).call_function(tx, args, kwargs)
        forward = static_lookup(type(mod), "forward")
        if not isinstance(forward, types.FunctionType):
            raise Unsupported(f"{type(mod).__name__}.forward is not a Python function")
        if self.source is not None:   # a forward assigned to the instance later replaces it
            tx.output.guards.add(guards.not_in_instance_dict(self.source, "forward"))
        return UserFunctionVariable(forward).call_function(tx, [self, *args], kwargs)

    def _call_with_hooks(self, tx, args, kwargs):
        """``Module.__call__`` with forward pre-hooks and hooks, in registration order (the
        hook dicts are guarded by their keys, each hook by identity)."""

        def table(name):
            return tx.wrap(getattr(self.value, name), AttrSource(self.source, name))

        def is_none(vt):
            return isinstance(vt, ConstantVariable) and vt.value is None

        pre_kw = table("_forward_pre_hooks_with_kwargs").as_python_constant()
        post_kw = table("_forward_hooks_with_kwargs").as_python_constant()
        for hook_id, hook in table("_forward_pre_hooks").items.items():
            if hook_id in pre_kw:
                result = hook.call_function(tx, [self, TupleVariable(args),
                                                 DictVariable(dict(kwargs))], {})
                if not is_none(result):
                    new_args, new_kwargs = tx.unpack_iterable(result)
                    args = tx.unpack_iterable(new_args)
                    kwargs = {k.as_python_constant(): new_kwargs.items[k.as_python_constant()]
                              for k in new_kwargs.unpack(tx)}
            else:
                result = hook.call_function(tx, [self, TupleVariable(args)], {})
                if not is_none(result):
                    args = tx.unpack_iterable(result) if isinstance(result, TupleVariable) \
                        else [result]
        output = self._forward(tx, args, kwargs)
        for hook_id, hook in table("_forward_hooks").items.items():
            hook_args = [self, TupleVariable(args)]
            if hook_id in post_kw:
                hook_args.append(DictVariable(dict(kwargs)))
            result = hook.call_function(tx, [*hook_args, output], {})
            if not is_none(result):
                output = result
        return output

    def call_method(self, tx, name, args, kwargs):
        mod = self.value
        if name == "__len__":
            if isinstance(mod, _CONTAINERS):
                self._guard_length(tx)
            elif static_lookup(type(mod), "__len__") is not MISSING:
                return super().call_method(tx, name, args, kwargs)    # the class's own
            return ConstantVariable(len(mod))
        if name == "__iter__":
            return ListIteratorVariable(self.unpack(tx))
        if name == "__contains__" and isinstance(mod, torch.nn.ModuleDict):
            self._guard_length(tx)
            return ConstantVariable(args[0].as_python_constant() in mod._modules)
        if name == "__getitem__" and isinstance(mod, (torch.nn.Sequential, torch.nn.ModuleList,
                                                      torch.nn.ModuleDict,
                                                      torch.nn.ParameterList,
                                                      torch.nn.ParameterDict)):
            key = args[0].as_python_constant()
            if isinstance(mod, torch.nn.ParameterDict):
                return tx.wrap(mod[key], self._child_source("_parameters", key))
            if isinstance(mod, torch.nn.ParameterList):
                self.guard_keys(tx, ("_parameters",))
                keys = list(mod._parameters)
                return tx.wrap(mod[key], self._child_source("_parameters", keys[key]))
            if isinstance(key, slice):
                return TupleVariable(self.unpack(tx)[key])
            if isinstance(mod, torch.nn.ModuleDict):
                return tx.wrap(mod[key], self._child_source("_modules", key))
            self.guard_keys(tx, ("_modules",))
            keys = list(mod._modules)
            return tx.wrap(mod._modules[keys[key]], self._child_source("_modules", keys[key]))
        if isinstance(mod, torch.nn.ModuleDict) and name in ("keys", "values", "items"):
            pairs = self.children(tx)
            if name == "keys":
                return TupleVariable([ConstantVariable(k) for k, _ in pairs])
            if name == "values":
                return TupleVariable([v for _, v in pairs])
            return TupleVariable([TupleVariable([ConstantVariable(k), v]) for k, v in pairs])
        if name in ("children", "named_children", "modules", "named_modules", "parameters",
                    "named_parameters", "buffers", "named_buffers"):
            return self._walk(tx, name, args, kwargs)
        if name == "__call__":
            return self.call_function(tx, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def _walk(self, tx, name, args, kwargs) -> "ModuleIteratorVariable":
        """``module.<name>(...)`` (``parameters``, ``named_modules``...): the real module
        tree's items, with the keys of the dicts walked guarded as items are taken: a
        parameter or submodule added, removed or re-registered later changes the items or
        their order."""
        try:
            const_args = [a.as_python_constant() for a in args]
            const_kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
        except Exception:
            raise Unsupported(f"{type(self.value).__name__}.{name}() with non-constant "
                              f"arguments") from None
        named = name.startswith("named_")
        base = name if named else "named_" + name
        kind = base[len("named_"):]
        if kind in ("modules", "children"):
            dicts = ("_modules",)
        else:
            dicts = ("_parameters" if kind == "parameters" else "_buffers", "_modules")
        try:
            bound = inspect.signature(getattr(torch.nn.Module, name)).bind(
                self.value, *const_args, **const_kwargs).arguments
        except TypeError as e:
            raise Unsupported(f"{name}(): {e}") from None
        bound.pop("self")
        # the real walk, with prefix "" so keys are paths from here (the prefix comes back)
        prefix = bound.pop("prefix", "")
        if kind != "children":
            bound["prefix"] = ""
        pairs = list(getattr(self.value, base)(**bound))
        recurse = kind == "modules" or (kind != "children" and bound.get("recurse", True))
        walked = list(self.value.named_modules()) if recurse else [("", self.value)]
        position = {path: i for i, (path, _) in enumerate(walked)}
        guarded = [0]

        def guard_through(n: int | None) -> None:
            n = len(walked) if n is None else n
            for path, sub in walked[guarded[0]:n]:
                tx.wrap(sub, self._module_source(path)).guard_keys(tx, dicts)
            guarded[0] = max(guarded[0], n)
        out, owners = [], []
        for key, value in pairs:
            if kind in ("modules", "children"):
                src = self._module_source(key)
                owner = position.get(key, len(walked) - 1) if kind == "modules" else 0
            else:
                src = self._path_source(tx, key, dicts[0])
                owner = position.get(key.rpartition(".")[0], len(walked) - 1)
            full = prefix + ("." if prefix and key else "") + key if named else None

            def read(value=value, src=src, full=full):
                vt = tx.wrap(value, src)
                return vt if full is None else TupleVariable([ConstantVariable(full), vt])
            out.append(read)
            owners.append(owner)
        return ModuleIteratorVariable(out, owners, guard_through)

    def _module_source(self, dotted: str):
        src = self.source
        if src is not None and dotted:
            for part in dotted.split("."):
                src = ModuleDictSource(src, "_modules", part)
        return src

    def _path_source(self, tx, dotted: str, dict_name: str):
        if self.source is None:
            return None
        *mods, leaf = dotted.split(".")
        src = self.source
        for m in mods:
            src = ModuleDictSource(src, "_modules", m)
        return ModuleDictSource(src, dict_name, leaf)

    def __repr__(self):
        return f"NNModuleVariable({type(self.value).__name__})"


class _BoundModuleMethod(VariableTracker):
    """An ``nn.Module`` method bound to a module, reached through ``super()``."""

    def __init__(self, module: NNModuleVariable):
        super().__init__()
        self.module = module

    def python_type(self):
        return types.MethodType

    def truthy(self, tx):
        return True


class ModuleGetattrVariable(_BoundModuleMethod):
    """``nn.Module.__getattr__`` bound to a module (``super().__getattr__(name)`` in a class
    that overrides ``__getattr__``): its parameters, buffers and submodules."""

    def call_function(self, tx, args, kwargs):
        if len(args) != 1 or kwargs or not args[0].is_python_constant():
            raise Unsupported("nn.Module.__getattr__ with a non-constant name")
        return self.module.module_getattr(tx, args[0].as_python_constant())


class ModuleCallVariable(_BoundModuleMethod):
    """``nn.Module.__call__``/``_wrapped_call_impl`` bound to a module (``super().__call__``
    in a class that overrides ``__call__``): the module's ``_call_impl``; with ``impl``,
    ``nn.Module._call_impl`` itself (``super()._call_impl`` in a class that overrides it):
    hooks and ``forward``."""

    def __init__(self, module: NNModuleVariable, impl: bool):
        super().__init__(module)
        self.impl = impl

    def call_function(self, tx, args, kwargs):
        if self.impl:
            return self.module.module_call(tx, args, kwargs)
        return self.module.wrapped_call(tx, args, kwargs)


class ModuleIteratorVariable(ListIteratorVariable):
    """``module.parameters()``, ``named_buffers()``, ``children()``...: a generator in
    eager, so ``next(...)`` works on it. Its items are the module tree's at capture, each
    read (made a graph input, guarded) when it is taken, and the dicts that decide the items
    taken so far are guarded then too (``guard_through(n)`` guards the walk's first n
    modules): ``next(self.parameters())`` on a large model reads one parameter and guards a
    few dicts, not the whole tree."""

    def __init__(self, thunks: list, owners: list[int], guard_through):
        super().__init__(thunks)
        self.owners = owners            # item i comes from the walk's module owners[i]
        self.guard_through = guard_through

    def python_type(self):
        return types.GeneratorType

    def _take(self, upto: int) -> None:
        """Items before ``upto`` are taken (past the end: the walk was seen to end)."""
        for i in range(min(upto, len(self.items))):
            if not isinstance(self.items[i], VariableTracker):
                self.items[i] = self.items[i]()
        if upto > len(self.items):
            self.guard_through(None)
        elif upto > 0:
            self.guard_through(self.owners[upto - 1] + 1)

    def next(self, tx):
        if self.index >= len(self.items):
            self._take(len(self.items) + 1)
            return None
        self._take(self.index + 1)
        return super().next(tx)

    def unpack(self, tx):
        self._take(len(self.items) + 1)
        return super().unpack(tx)

    def loop_iterator(self, tx) -> ListIteratorVariable:
        """``for p in module.parameters()``: when no name holds the generator, the loop
        takes all its items as a plain iterator, which a graph break in the loop passes on
        by its items (the resume function is compiled too); a generator a name holds keeps
        its identity (the name sees how far the loop took it)."""
        frame = tx
        while frame is not None:
            if any(v is self for v in (*frame.symbolic_locals.values(), *frame.stack)):
                return self
            frame = frame.parent
        return ListIteratorVariable(self.unpack(tx))

    def rebuild(self, cg):
        # a graph break passes it on as one list iterator (built once: the stack and the
        # locals naming it share it), not by its items as a for loop's own iterator
        self._take(len(self.items) + 1)
        return cg.temp(self, f"iter([{cg.items(self.items[self.index:])}])")


def initialize_lazy_module(tx, mod, args, kwargs) -> None:
    """A lazy module (``nn.LazyLinear``) called for the first time: its parameters are made
    now, as eager's first call makes them (its initialisation pre-hook, run for real on
    tensors of the inputs' sizes, dtypes and devices; it reads only those), and the
    initialised module is captured. Its initialisation draws from the random generator at
    capture, where eager draws at the call: after random ops of the graph (which draw when
    it runs) the graph breaks at the call instead, so the call initialises it in eager's
    order."""
    from torch.utils._python_dispatch import _disable_current_modes

    if tx.output.draws_random():
        raise Unsupported(f"initialising a {type(mod).__name__} after random ops of the graph "
                          f"(its initialisation draws random numbers after theirs)")

    def real(vt):
        if isinstance(vt, TensorVariable):
            fake = vt.fake
            # symbolic sizes at their current values, unguarded: initialisation happens
            # once, and the forward captured next guards what the new parameters need
            shape = tuple(s.node.hint if isinstance(s, torch.SymInt) else s for s in fake.shape)
            return torch.zeros(shape, dtype=fake.dtype, device=fake.device)
        try:
            return vt.as_python_constant()
        except Exception:
            raise Unsupported(f"initialising a {type(mod).__name__} with a {vt}") from None
    real_args = tuple(real(a) for a in args)
    real_kwargs = {k: real(v) for k, v in kwargs.items()}
    hook = getattr(mod, "_initialize_hook", None)
    if hook is None or mod._forward_pre_hooks.get(hook.id) is None:
        raise Unsupported(f"uninitialised {type(mod).__name__} without its initialisation hook")
    with _disable_current_modes(), torch.no_grad():
        try:
            mod._infer_parameters(mod, real_args, real_kwargs)
        except Exception as e:
            raise Unsupported(f"{type(e).__name__} initialising {type(mod).__name__}: {e}") \
                from None


class CompiledModuleVariable(NNModuleVariable):
    """``ember.compile(module)`` (an OptimizedModule) reached from compiled code. It is its
    own type to ``type()``/``isinstance``/``__class__``, as in eager; everything else (its
    attributes, calls, iteration over the tree) is the original module's, which the
    wrapper forwards to (``inner``, read through ``_orig_mod``)."""

    def __init__(self, inner: NNModuleVariable, wrapper: torch.nn.Module, source=None):
        super().__init__(inner.value, source)
        self.inner = inner
        self.wrapper = wrapper

    def python_type(self):
        return type(self.wrapper)

    def truthy(self, tx):
        return True         # the wrapper has no __len__

    def var_getattr(self, tx, name):
        if name == "__class__":
            return tx.wrap(type(self.wrapper), None)
        if name == "_orig_mod":
            return self.inner
        if name in self.wrapper.__dict__:        # the wrapper's own (_compiled_forward)
            return tx.wrap(self.wrapper.__dict__[name],
                           AttrSource(self.source, name) if self.source else None)
        if name == "_get_name":                  # "OptimizedModule[Linear]"
            return UserMethodVariable(UserFunctionVariable(type(self.wrapper)._get_name), self)
        return self.inner.var_getattr(tx, name)

    def call_function(self, tx, args, kwargs):
        return self.inner.call_function(tx, args, kwargs)

    def module_call(self, tx, args, kwargs):
        return self.inner.module_call(tx, args, kwargs)

    def call_method(self, tx, name, args, kwargs):
        if name in ("__len__", "__iter__", "__getitem__", "__contains__"):
            raise Unsupported(f"{name} of a compiled module (the wrapper has none)")
        return self.inner.call_method(tx, name, args, kwargs)

    def children(self, tx):
        return self.inner.children(tx)

    def unpack(self, tx):
        raise Unsupported("iterating over a compiled module (the wrapper is not iterable)")

    def guard_keys(self, tx, dict_names=("_parameters", "_buffers", "_modules")) -> None:
        self.inner.guard_keys(tx, dict_names)

    def rebuild(self, cg):
        return cg.const(self.wrapper)

    def __repr__(self):
        return f"CompiledModuleVariable({type(self.value).__name__})"


class NewModuleVariable(NNModuleVariable):
    """An ``nn.Module`` built by the frame (``nn.Softmax(dim=1)(x)``, a small user module).
    It is made once, at capture: built for real when torch defines it, else made empty and
    its ``__init__`` traced, with attribute stores applied to it for real. Only modules
    without parameters or buffers: those are new tensors on every eager call (and their
    initialisation draws random numbers), so building one breaks the graph."""

    def __init__(self, module: torch.nn.Module):
        super().__init__(module, None)
        self.initialising = False

    def store_attr(self, tx, name, value):
        if not self.initialising:
            raise Unsupported(f"setting attribute {name!r} of a {type(self.value).__name__} "
                              f"built inside the compiled region, outside its __init__")
        setattr(self.value, name, real_module_argument(value))

    def rebuild(self, cg):
        # eager makes a new module on every call: handing out the capture's one would alias
        raise Unsupported(f"a {type(self.value).__name__} built inside the compiled region "
                          f"escapes it")


def real_module_argument(vt: VariableTracker):
    """The Python value a module built inside the frame may hold: constants, modules built
    inside the frame, and tuples, lists and dicts of them."""
    if isinstance(vt, NewModuleVariable):
        return vt.value
    if isinstance(vt, BaseSequenceVariable):
        return vt.python_type()(real_module_argument(v) for v in vt.items)
    if isinstance(vt, DictVariable):
        return {vt.keys[k].as_python_constant(): real_module_argument(v)
                for k, v in vt.items.items()}
    try:
        return vt.as_python_constant()
    except NotConstant:
        raise Unsupported(f"a module built inside the compiled region holding {vt} (only "
                          f"constants and modules built there)") from None


def create_module(tx, cls: type, args, kwargs) -> NewModuleVariable:
    if cls.__module__.startswith("torch.nn."):
        real_args = [real_module_argument(a) for a in args]
        real_kwargs = {k: real_module_argument(v) for k, v in kwargs.items()}
        with torch.random.fork_rng(devices=[]):   # eager's generator must not move here
            try:
                module = cls(*real_args, **real_kwargs)
            except Exception as e:
                raise Unsupported(f"{type(e).__name__} building {cls.__name__}: {e}") from None
        vt = NewModuleVariable(module)
    else:
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        vt = NewModuleVariable(module)
        init = static_lookup(cls, "__init__")
        if isinstance(init, types.FunctionType) and init is not torch.nn.Module.__init__:
            vt.initialising = True
            with torch.random.fork_rng(devices=[]):
                UserFunctionVariable(init).call_function(tx, [vt, *args], kwargs)
            vt.initialising = False
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise Unsupported(f"building a {cls.__name__} module with parameters or buffers "
                          f"inside a compiled region (new tensors on every call)")
    return vt
