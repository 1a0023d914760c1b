"""Public entry points: ``compile``, ``reset``, ``disable``, ``allow_in_graph``, ``explain``,
``mark_dynamic``, ``maybe_mark_dynamic``, ``mark_static`` (dynamic shapes:
``ember/frontend/dynamic.py``).

``compile(fn)`` returns an :class:`OptimizedFunction`; ``compile(module)`` an
:class:`OptimizedModule` that forwards every attribute to the original module and runs
``forward`` through an OptimizedFunction.

Caching: each OptimizedFunction owns its cache entries (one per set of guards). A call tries
the entries in order; each entry is one generated function with the frame's signature that
checks its guards and, if they hold, runs the compiled graph. A miss captures the frame again,
up to ``config.cache_size_limit`` entries; past that, or when capture fails, the frame runs
eagerly and the reason is logged.

Threads: a miss captures and installs under the function's compile lock, and looks again at
the entries installed while it waited for the lock (running them outside it), so threads
that first call a function together compile it once and share the entry, instead of each
compiling its own copy and filling ``cache_size_limit`` with duplicates. Calls that hit an
entry take no lock: a compile in one thread does not stall them in another. The lock is
re-entrant (a backend that calls the function it compiles gets in again) and is held only
while capturing and compiling, never while compiled code runs, so the functions a frame
hands on (resume functions, calls that broke) are compiled under their own locks.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import importlib.util
import inspect
import linecache
import os
import sysconfig
import threading
import types
import weakref
from typing import Any, Callable

import torch
from torch.nn.modules.lazy import LazyModuleMixin

from ember import config, logs, metrics
from ember.backend.options import check_mode_and_options, resolve_options
from ember.backend_registry import ember_backend, lookup_backend
from ember.frontend import ddp_split, dynamic as _dynamic, support, trace_rules
from ember.frontend.dynamic import (mark_dynamic, mark_static,  # noqa: F401  (public API)
                                    maybe_mark_dynamic)


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    backend: Callable
    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str | None = None
    # the "ember" backend's options, resolved from mode= and options= (every option, its
    # value); empty for any other backend, which is called with (gm, example_inputs) only
    options: dict = dataclasses.field(default_factory=dict)


_live_functions: "weakref.WeakSet[OptimizedFunction]" = weakref.WeakSet()


def _validate(backend, fullgraph, dynamic, mode, options) -> CompileSettings:
    backend_fn = lookup_backend(backend)
    if not isinstance(fullgraph, bool):
        raise TypeError(f"fullgraph must be a bool, got {fullgraph!r}")
    if dynamic not in (None, True, False):
        raise TypeError(f"dynamic must be None, True or False, got {dynamic!r}")
    if backend_fn is not ember_backend:
        check_mode_and_options(mode, options)
        # mode= and options= configure the ember compiler; another backend cannot honour them
        if options:
            raise ValueError("options= is only understood by the 'ember' backend; "
                             f"backend {backend!r} got {sorted(options)}")
        if mode not in (None, "default"):
            raise ValueError(f"mode={mode!r} is only understood by the 'ember' backend; "
                             f"backend {backend!r} cannot honour it (use mode=None)")
        return CompileSettings(backend_fn, fullgraph, dynamic, mode)
    return CompileSettings(backend_fn, fullgraph, dynamic, mode,
                           resolve_options(mode, options))


def compile(fn_or_module=None, *, backend="ember", fullgraph=False, dynamic=None, mode=None,
            options=None):
    """Compile a function or ``nn.Module``; also usable as ``@compile`` or ``@compile(...)``."""
    settings = _validate(backend, fullgraph, dynamic, mode, options)
    if not support.frontend_supported():   # see ember/frontend/support.py
        if fullgraph:
            raise support.refuse("ember.compile(..., fullgraph=True)",
                                 "without fullgraph=True the function runs eagerly")
        support.warn_once(stacklevel=2)
    if fn_or_module is None:
        return lambda f: _wrap(f, settings)
    return _wrap(fn_or_module, settings)


def _wrap(obj, settings: CompileSettings):
    if isinstance(obj, (OptimizedFunction, OptimizedModule)):
        obj = obj._orig_mod if isinstance(obj, OptimizedModule) else obj.__wrapped__
    if isinstance(obj, torch.nn.Module):
        return OptimizedModule(obj, settings)
    if not callable(obj):
        raise TypeError(f"ember.compile expects a function or an nn.Module, "
                        f"got {type(obj).__name__}: {obj!r}")
    return OptimizedFunction(obj, settings)


_MISS = object()


class OptimizedFunction:
    """A callable that captures its function's frames into graphs and caches the result."""
    _ember_wrapper = "function"

    def __init__(self, fn: Callable, settings: CompileSettings,
                 callees: "_Callees | None" = None):
        self.__wrapped__ = fn
        self._settings = settings
        self._callees = callees if callees is not None else _Callees(settings)
        self._entries: list = []
        self._eager_reason: str | None = None
        # the frame's code with its calls routed to Ember (see eager_calls), once it runs
        # eagerly; None: it runs as written
        self._eager_code: types.CodeType | None = None
        self._compile_lock = threading.RLock()   # see the module docstring: Threads
        # A bound method is captured as its function with `self` as the first argument.
        self._bound_self = None
        self._func = fn
        if isinstance(fn, types.MethodType):
            self._bound_self, self._func = fn.__self__, fn.__func__
        elif not isinstance(fn, types.FunctionType) and isinstance(
                getattr(type(fn), "__call__", None), types.FunctionType):
            self._bound_self, self._func = fn, type(fn).__call__
        try:
            functools.update_wrapper(self, fn)
        except AttributeError:
            pass
        _live_functions.add(self)

    def __get__(self, obj, objtype=None):
        # Used as a decorator on a method: bind like a function would.
        return self if obj is None else types.MethodType(self, obj)

    def __call__(self, *args, **kwargs):
        if self._bound_self is not None:
            args = (self._bound_self, *args)
        return self._lookup(args, kwargs)

    def _lookup(self, args, kwargs):
        entries = self._entries
        tried = 0
        for entry in entries:
            out = entry.run(*args, **kwargs)
            if out is not _MISS:
                return out
            tried += 1
        return self._miss(args, kwargs, entries, tried)

    def _miss(self, args, kwargs, entries: list, tried: int):
        """No entry of ``entries`` (the first ``tried``) accepts the arguments: compile one,
        unless another thread installed entries meanwhile (then try those first)."""
        fn = self._func
        if is_disabled(fn):
            return fn(*args, **kwargs)
        if self._eager_reason is not None:
            return self._run_eagerly(args, kwargs)
        with self._compile_lock:
            if self._entries is not entries or len(entries) != tried:
                entry = _MISS   # installed (or reset) while this thread looked or waited
            else:
                entry = self._compile(args, kwargs)
        if entry is _MISS:
            return self._lookup(args, kwargs)
        if entry is None:   # outside the except: the user's exceptions carry no Unsupported
            return self._run_eagerly(args, kwargs)
        out = entry.run(*args, **kwargs)
        if out is _MISS:   # guards must hold for the inputs they were made from
            failed = entry.failed_guards(args, kwargs)
            raise AssertionError(f"ember: fresh entry for {self._name()} rejects its own "
                                 f"inputs; failing guards: {failed}")
        return out

    def _compile(self, args, kwargs):
        """Capture the frame for these arguments and install its entry (under the compile
        lock): the entry, or None when the frame runs eagerly from now on."""
        fn = self._func
        if self._eager_reason is not None:
            return None
        if not support.frontend_supported():   # ember.compile warned
            self._eager_reason = support.unsupported_reason()
            return None
        if self._entries:
            self._log_recompile(args, kwargs)
            if len(self._entries) >= config.cache_size_limit:
                self._run_eagerly_from_now(
                    f"cache_size_limit ({config.cache_size_limit}) reached",
                    compile_callees=False)
                return None
        from ember.frontend.convert import Unsupported, convert_frame
        try:
            with _gc_paused():
                entry = convert_frame(fn, args, kwargs, self._settings, _MISS, self._callees)
        except Unsupported as e:
            if self._settings.fullgraph:
                raise
            self._run_eagerly_from_now(str(e))
            return None
        self._entries.append(entry)
        return entry

    def _run_eagerly_from_now(self, reason: str, compile_callees: bool = True) -> None:
        """From now on the frame runs in Python; with ``compile_callees`` the modules and
        functions it calls go through Ember's compile entry (``ember/frontend/eager_calls.py``).
        Not at ``cache_size_limit``: the frame was captured that many times because what it
        reads changes from call to call, its callees see the same changing values and would
        each fill their own cache in turn, and the limit is there to stop compiling."""
        self._eager_reason = reason
        metrics.counters["frontend"]["frames_eager"] += 1
        if compile_callees:
            try:
                self._eager_code = self._callees.eager_code(self._func)
            except Exception as e:   # an internal error: the frame runs as written
                if not config.suppress_errors:
                    raise
                logs.warn("ember: the calls of %s cannot be routed to Ember (%s: %s)",
                          self._name(), type(e).__name__, e)
        also = "; the modules and functions it calls are compiled" if self._eager_code else ""
        logs.warn("ember: %s runs eagerly: %s%s", self._name(), reason, also)
        if also:
            logs.log("graph_breaks", "%s runs eagerly (%s)%s", self._name(), reason, also)

    def _run_eagerly(self, args, kwargs):
        fn, code = self._func, self._eager_code
        if code is None:
            return fn(*args, **kwargs)
        return _function_running(fn, code)(*args, **kwargs)

    def _log_recompile(self, args, kwargs) -> None:
        if logs.enabled("recompiles"):
            for i, entry in enumerate(self._entries):
                logs.log("recompiles", "recompiling %s: entry %d failed guard %s",
                         self._name(), i, entry.failed_guards(args, kwargs)[:1])

    def _name(self) -> str:
        fn = self._func
        code = getattr(fn, "__code__", None)
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code else ""
        return f"{getattr(fn, '__qualname__', repr(fn))}{where}"

    def _reset(self) -> None:
        # a new list, not cleared: a thread that missed on the old one sees it was replaced
        self._entries = []
        self._eager_reason = None
        self._eager_code = None
        self._callees.seen_sizes.clear()     # the sizes its frames saw (automatic dynamic)
        self._callees._functions_of_code.clear()


@contextlib.contextmanager
def _gc_paused():
    """No cyclic garbage collection while a frame compiles: compiling allocates many objects
    (fake tensors, FX nodes, sympy expressions, generated source), each allocation burst
    triggers collections that walk the user's whole heap (a model's tensors and modules),
    and a fifth of resnet50's capture went to them. Cycles made meanwhile are collected
    later as usual."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Callees:
    """Ember's compile entry for the functions a compiled frame hands on: resume functions
    after a graph break (each a fresh wrapper, held by the entry that calls it) and calls
    that broke inside an inlined function (one wrapper per function, shared)."""

    def __init__(self, settings: CompileSettings):
        self.settings = settings
        # what the captures of these frames saw (automatic dynamic): one memory per
        # ember.compile(...), shared by its resume functions and calls compiled on their own
        self.seen_sizes = _dynamic.SeenSizes()
        self.ddp = None    # ember.compile(ddp): its graphs are cut at the DDP's buckets
        self._compiled: "weakref.WeakKeyDictionary[Any, OptimizedFunction]" = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # how many function objects of each code a frame running eagerly had compiled
        self._functions_of_code: "weakref.WeakKeyDictionary[types.CodeType, int]" = \
            weakref.WeakKeyDictionary()

    def resume(self, fn: types.FunctionType) -> "OptimizedFunction":
        return OptimizedFunction(fn, self.settings, self)

    def compiled(self, fn: types.FunctionType) -> "OptimizedFunction":
        wrapper = self._compiled.get(fn)
        if wrapper is None:
            with self._lock:   # one wrapper (one cache) per function, whichever thread asks
                wrapper = self._compiled.get(fn)
                if wrapper is None:
                    wrapper = self._compiled[fn] = OptimizedFunction(fn, self.settings, self)
        return wrapper

    def eager_code(self, fn) -> types.CodeType | None:
        """``fn``'s code with its calls routed through :meth:`route` (None: nothing to
        route, or not a Python function)."""
        if not isinstance(fn, types.FunctionType):
            return None
        from ember.frontend.eager_calls import routed_code
        routed: list = []    # filled below: a recursive call runs the routed code again
        code = routed_code(fn.__code__, functools.partial(self.route, fn, routed))
        routed.append(code)
        return code

    def route(self, failing: types.FunctionType, routed: list, callee):
        """What a frame running ``failing`` eagerly calls in place of ``callee``: Ember's
        compile entry for a user function, method or module (a ``torch.nn.Sequential`` and
        a DistributedDataParallel too), as the frontend would have inlined them; anything
        else (builtins, classes, torch's own functions and leaf modules, whose graph of one
        op would save nothing, disabled or already compiled callables) as it is.
        ``failing`` itself (recursion) runs eagerly, routed, without another capture."""
        kind = type(callee)
        if kind is types.FunctionType:
            if callee is failing:
                return _function_running(callee, routed[0])
            return self._compiled_unless_made_per_call(callee, failing)
        if kind is types.MethodType:
            func = callee.__func__
            if func is failing:
                return types.MethodType(_function_running(func, routed[0]), callee.__self__)
            if type(func) is types.FunctionType:
                compiled = self._compiled_unless_made_per_call(func, failing)
                if compiled is not func:
                    return types.MethodType(compiled, callee.__self__)
            return callee
        if isinstance(callee, torch.nn.Module) and _compiles_module(callee, failing):
            return functools.partial(self.call, callee)
        return callee

    def _compiled_unless_made_per_call(self, fn: types.FunctionType, failing):
        """``fn``'s compile entry, or ``fn`` where compiling it is no use: not the user's
        (see ``_compiles``), or a function object made anew on each call (defined in the
        failing frame, or a code seen in more function objects than ``cache_size_limit``):
        each would be captured once and never run again."""
        wrapper = self._compiled.get(fn)
        if wrapper is not None:
            return wrapper
        code = fn.__code__
        if not _compiles(fn) or code in failing.__code__.co_consts or \
                self._functions_of_code.get(code, 0) >= config.cache_size_limit:
            return fn
        self._functions_of_code[code] = self._functions_of_code.get(code, 0) + 1
        return self.compiled(fn)

    def call(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` with a Python function's frame (a method's, a module's
        forward) captured on its own."""
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            return self.compiled(fn.__func__)(fn.__self__, *args, **kwargs)
        if isinstance(fn, types.FunctionType) and not is_disabled(fn):
            return self.compiled(fn)(*args, **kwargs)
        if isinstance(fn, torch.nn.Module) and not _has_hooks(fn) and \
                type(fn).__call__ is torch.nn.Module.__call__ and \
                type(fn)._call_impl is _MODULE_CALL_IMPL and "_call_impl" not in fn.__dict__:
            forward = type(fn).forward
            if "forward" not in fn.__dict__ and isinstance(forward, types.FunctionType):
                return self.compiled(forward)(fn, *args, **kwargs)
        return fn(*args, **kwargs)


def _function_running(fn: types.FunctionType, code: types.CodeType | None):
    """``fn`` with ``code`` as its code (its globals, defaults and cells as they are now)."""
    if code is None:
        return fn
    out = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__ = fn.__qualname__
    return out


def _library_dirs() -> tuple[str, ...]:
    """Where the code lives that a frame running eagerly calls as it is: torch, Ember, the
    numeric libraries they use, the standard library, and code without a file."""
    dirs = [sysconfig.get_paths()["stdlib"] + os.sep, "<"]
    for name in ("torch", "ember", "numpy", "sympy", "triton"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            dirs.append(os.path.dirname(spec.origin) + os.sep)
    return tuple(dirs)


_LIBRARIES = _library_dirs()
_NOT_COMPILED_CODE = (inspect.CO_GENERATOR | inspect.CO_COROUTINE
                      | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR)


def _compiles(fn: types.FunctionType) -> bool:
    """A function a frame running eagerly calls through Ember: the user's (not from
    ``_LIBRARIES``), not a generator, not disabled or kept whole."""
    code = fn.__code__
    return not (code.co_filename.startswith(_LIBRARIES) or code.co_flags & _NOT_COMPILED_CODE
                or is_disabled(fn) or is_allowed_in_graph(fn)
                or trace_rules.python_only_reason(fn) is not None)


def _compiles_module(mod: torch.nn.Module, failing) -> bool:
    forward = type(mod).forward
    return not (isinstance(mod, OptimizedModule) or is_disabled(mod) or forward is failing
                or "forward" in mod.__dict__ or type(forward) is not types.FunctionType
                or not (_compiles(forward) or type(mod) is torch.nn.Sequential
                        or ddp_split.is_ddp(mod)))


def _has_hooks(mod: torch.nn.Module) -> bool:
    from torch.nn.modules import module as m
    return bool(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks
                or mod._backward_pre_hooks or m._global_forward_hooks
                or m._global_forward_pre_hooks or m._global_backward_hooks
                or m._global_backward_pre_hooks)


def _on_cuda(mod: torch.nn.Module) -> bool:
    first = next(mod.parameters(), None)
    return first is not None and first.is_cuda


_MODULE_CALL = torch.nn.Module.__call__
_MODULE_CALL_IMPL = torch.nn.Module._call_impl


class OptimizedModule(torch.nn.Module):
    """A compiled ``nn.Module``: every attribute, parameter and method is the original's.

    The instance keeps only ``_orig_mod`` and ``_compiled_forward`` in its own ``__dict__``;
    ``nn.Module``'s machinery (``state_dict``, ``parameters``, ``train``, hooks) reads its
    ``_parameters``/``_modules``/... through ``__getattr__`` from the original module, so keys
    and behaviour are identical and nothing is copied.
    """

    _ember_wrapper = "module"

    def __init__(self, mod: torch.nn.Module, settings: CompileSettings):
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_compiled_forward", OptimizedFunction(mod.forward, settings))
        object.__setattr__(self, "_class_forward", type(mod).forward)
        if ddp_split.is_ddp(mod):
            self._compiled_forward._callees.ddp = mod
        if settings.options and _on_cuda(mod):
            # the kernel compile workers take seconds to start: start them while the first
            # call captures and traces
            from ember.backend.targets.triton.launch import start_compile_workers
            start_compile_workers()

    def __call__(self, *args, **kwargs):
        orig = self._orig_mod
        call = type(orig).__call__
        if call is not _MODULE_CALL:   # the class's own __call__ runs, compiled, as in eager
            return self._compiled_forward._callees.call(
                types.MethodType(call, orig), *args, **kwargs)
        if "_call_impl" in orig.__dict__ or type(orig)._call_impl is not _MODULE_CALL_IMPL:
            # nn.Module.__call__ calls self._call_impl: the class's (or instance's) own runs,
            # compiled (its super()._call_impl runs the hooks and forward in its graph)
            return self._compiled_forward._callees.call(orig._call_impl, *args, **kwargs)
        if isinstance(orig, LazyModuleMixin) and orig.has_uninitialized_params():
            # its initialising pre-hook, run by nn.Module.__call__ on this wrapper (whose hooks
            # are the module's), would turn the wrapper into the class the module becomes:
            # initialise the module itself first, as its own first call would
            orig._infer_parameters(orig, args, kwargs)
        return _MODULE_CALL(self, *args, **kwargs)

    def forward(self, *args, **kwargs):
        orig = self._orig_mod
        if "forward" in orig.__dict__ or type(orig).forward is not self._class_forward:
            # a forward assigned after compiling (or at compile time): compiled on its own
            return self._compiled_forward._callees.call(orig.forward, *args, **kwargs)
        return self._compiled_forward(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(object.__getattribute__(self, "_orig_mod"), name)

    def __setattr__(self, name: str, value) -> None:
        if name == "__class__":
            # a mixin swapped in around the wrapper (FSDP2's fully_shard does so) is the
            # wrapper's: the original module keeps its class
            object.__setattr__(self, name, value)
            return
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self):
        return sorted(set(dir(self._orig_mod)) | {"_orig_mod"})

    def _get_name(self) -> str:
        return f"OptimizedModule[{self._orig_mod._get_name()}]"


def explain(fn: Callable, *, backend="eager", dynamic=None):
    """``explain(fn)(*args, **kwargs)`` runs ``fn`` once under the frontend and returns an
    ``ExplainOutput`` of what that call compiled (calling the same ``explain(fn)`` again
    reuses its compiled entries: a call at another size shows what automatic dynamic
    made of it): ``graph_count``, ``graph_break_count``, ``break_reasons`` (each with
    its text, the user's ``file:line`` and that source line), ``ops_per_graph``, ``graphs``,
    ``dynamic_dims`` (which input dims are symbolic and why: ``dynamic=``, a mark, or
    automatic dynamic after earlier calls of the function saw other sizes); ``print()``
    shows a report."""
    if not support.frontend_supported():   # its report would claim zero graphs
        raise support.refuse("ember.explain", "run it on a supported Python")
    from ember.frontend import graph_break
    from ember.frontend.explain import Collector

    compiled = compile(fn, backend=backend, dynamic=dynamic)

    def run(*args, **kwargs):
        collector = Collector()
        with graph_break.observe(collector):
            compiled(*args, **kwargs)
        return collector.output()
    return run


def reset() -> None:
    """Drop every compiled entry of every compiled function; later calls capture again."""
    for fn in list(_live_functions):
        fn._reset()
    metrics.reset()
    from ember.backend import compile_stats
    compile_stats.reset()
    _forget_sources_of_dead_code()


_PRUNE_AFTER = 64     # new fx sources since the last prune (a prune scans the heap: ~0.2 s)
_sources_kept = 0


def _forget_sources_of_dead_code() -> None:
    """torch.fx keeps the source of every GraphModule's code it ever generated (its linecache
    loader, for tracebacks: ~20 KB a graph, and the globals it ran with, which held fake
    tensors): a process that compiled and reset again and again grew on every cycle. Once
    64 sources have come since the last prune, drop those no live function's code comes
    from."""
    global _sources_kept
    from torch.fx import graph_module
    sources = getattr(getattr(graph_module, "_loader", None), "eval_cache", None)
    if not isinstance(sources, dict) or len(sources) < _sources_kept + _PRUNE_AFTER:
        return
    gc.collect()
    live = {obj.__code__.co_filename for obj in gc.get_objects()
            if type(obj) is types.FunctionType}
    for key in [key for key in sources if key not in live]:
        del sources[key]
        linecache.cache.pop(key, None)
    _sources_kept = len(sources)


def _drop_entries(option: str) -> None:
    """``config.<option>`` changed and compiled code depends on it: compile again."""
    dropped = [fn for fn in list(_live_functions) if fn._entries or fn._eager_reason]
    for fn in dropped:
        fn._reset()
    if dropped:
        logs.log("recompiles", "config.%s changed: %d compiled functions compile again on "
                 "their next call", option, len(dropped))


config.on_recompile_option.append(_drop_entries)


def disable(fn: Callable | None = None):
    """Never compile ``fn``: calls to it run eagerly, also from inside compiled code."""
    if fn is None:
        return disable
    return trace_rules.disable(fn)


def allow_in_graph(fn: Callable) -> Callable:
    """Calls to ``fn`` inside compiled code become one graph node instead of being traced."""
    return trace_rules.allow_in_graph(fn)


is_disabled = trace_rules.is_disabled
is_allowed_in_graph = trace_rules.is_allowed_in_graph
