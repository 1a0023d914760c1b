"""Which torch callables become graph nodes, and the few that capture answers itself.

Public callables of torch's op namespaces (``torch``, ``torch.nn.functional``,
``torch.special``, ``torch.linalg``, ``torch.fft``) and Tensor methods called unbound go into
the graph as one node each; their fake outputs come from running them on fake tensors.
Functions that ask about the running program (``torch.compiler.is_compiling``,
``torch.is_grad_enabled``, ``torch.jit.is_scripting``...) are answered at capture time; the
few with effects outside tensors (seeding, saving, global settings) are unsupported.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from typing import Callable

import torch

from ember.frontend import guards
from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import ConstantVariable, NotConstant
from ember.frontend.variables.builtins import bind_arguments, constants, fold, type_argument
from ember.frontend.variables.containers import ListVariable, SizeVariable, TupleVariable
from ember.frontend.variables.ctx_manager import (PROFILER_RANGES, GlobalContextVariable,
                                                  GradModeVariable, ProfilerRangeVariable)
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.tensor import TensorVariable

_NAMESPACES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft",
               "torch.functional")
_DENIED_NAMES = {
    "manual_seed", "seed", "initial_seed", "save", "load", "compile", "set_default_dtype",
    "set_default_device", "set_default_tensor_type", "use_deterministic_algorithms",
    "set_printoptions", "set_rng_state", "get_rng_state", "set_num_threads", "set_flush_denormal",
    "set_warn_always", "set_float32_matmul_precision", "set_anomaly_enabled", "from_numpy",
    "frombuffer", "asarray", "typename", "is_storage",
}

_graph_callables: dict[int, object] | None = None


def _collect() -> dict[int, object]:
    found: dict[int, object] = {}
    import importlib
    for ns_name in _NAMESPACES:
        ns = importlib.import_module(ns_name)
        for name in dir(ns):
            if name.startswith("_") or name in _DENIED_NAMES or _sets_global_state(name):
                continue
            obj = getattr(ns, name, None)
            if callable(obj) and not isinstance(obj, (type, types.ModuleType)):
                found[id(obj)] = obj
    for ns in (torch._C._VariableFunctions, torch._C._nn, torch._C._linalg,
               torch._C._special, torch._C._fft):
        for name in dir(ns):
            if name.startswith("__") or name in _DENIED_NAMES or _sets_global_state(name):
                continue
            obj = getattr(ns, name, None)
            if callable(obj):
                found[id(obj)] = obj
    for klass in (torch.Tensor, torch._C.TensorBase):
        for name, obj in vars(klass).items():
            if callable(obj) and not isinstance(obj, type) and name not in _DENIED_TENSOR_METHODS:
                found[id(obj)] = obj
    return found


_DENIED_TENSOR_METHODS = {"item", "tolist", "numpy", "backward", "register_hook",
                          "__bool__", "__int__", "__float__", "__index__", "data_ptr",
                          "__repr__", "__str__", "__format__", "__reduce_ex__", "__setstate__",
                          "__deepcopy__", "__hash__", "__dir__", "__array__", "storage",
                          "untyped_storage", "__len__", "__iter__", "__contains__"}


def _sets_global_state(name: str) -> bool:
    """Functions that switch process-wide state (autocast, threads, flags): running one on
    fake tensors would switch it during capture, and a graph node would switch it for good."""
    return name.startswith(("set_", "_set_")) or "autocast" in name or name.endswith("_nesting")


def is_graph_callable(fn) -> bool:
    global _graph_callables
    if _graph_callables is None:
        _graph_callables = _collect()
    return id(fn) in _graph_callables and _graph_callables[id(fn)] is fn


# ---------------------------------------------------------------- answered at capture time

SPECIAL: dict[int, tuple] = {}    # id(fn) -> (fn, handler(tx, fn, args, kwargs))


def special(*fns):
    def deco(handler):
        for fn in fns:
            if isinstance(fn, _NotImported):
                _DEFERRED[fn.path] = handler
            elif fn is not None:
                SPECIAL[id(fn)] = (fn, handler)
        return handler
    return deco


class _NotImported:
    def __init__(self, path: str):
        self.path = path


# handlers of functions in torch submodules not imported yet (importing torch.onnx to find
# ``is_in_onnx_export`` took a tenth of a second of every process's first compile):
# registered once user code has imported the module, which it must before calling them
_DEFERRED: dict[str, Callable] = {}


def _maybe(path: str):
    """The torch function at ``path``; None where this torch has none."""
    module = path.rpartition(".")[0]
    if module not in sys.modules and importlib.util.find_spec(module) is not None:
        return _NotImported(path)
    obj = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _register_imported() -> None:
    for path in [p for p in _DEFERRED if p.rpartition(".")[0] in sys.modules]:
        fn = _maybe(path)
        handler = _DEFERRED.pop(path)
        if fn is not None:
            SPECIAL[id(fn)] = (fn, handler)


@special(_maybe("torch.compiler.is_compiling"), _maybe("torch.compiler.is_dynamo_compiling"),
         _maybe("torch._utils.is_compiling"))
def _is_compiling(tx, fn, args, kwargs):
    return ConstantVariable(True)


@special(_maybe("torch.jit.is_scripting"), _maybe("torch.jit.is_tracing"),
         _maybe("torch.compiler.is_exporting"),
         _maybe("torch._jit_internal.is_scripting"))
def _is_scripting(tx, fn, args, kwargs):
    return ConstantVariable(False)


@special(_maybe("torch._C._get_tracing_state"))
def _tracing_state(tx, fn, args, kwargs):
    return ConstantVariable(None)


@special(torch.overrides.has_torch_function, torch.overrides.has_torch_function_unary,
         torch.overrides.has_torch_function_variadic, torch._C._has_torch_function,
         torch._C._has_torch_function_unary, torch._C._has_torch_function_variadic)
def _has_torch_function(tx, fn, args, kwargs):
    return ConstantVariable(False)


@special(torch._C._log_api_usage_once)
def _log_api_usage(tx, fn, args, kwargs):
    return ConstantVariable(None)    # usage telemetry (torchvision's forwards): nothing to run


@special(torch._C._len_torch_dispatch_stack, torch._C._len_torch_function_stack,
         torch._C._is_torch_function_mode_enabled,
         _maybe("torch._C._is_torch_function_all_disabled"),
         _maybe("torch._C._get_privateuse1_backend_name"),
         _maybe("torch._C._are_functorch_transforms_active"),
         _maybe("torch.distributed.is_available"), _maybe("torch.distributed.is_initialized"),
         _maybe("torch.onnx.is_in_onnx_export"), _maybe("torch.backends.cudnn.is_available"),
         _maybe("torch.backends.mkldnn.is_available"))
def _mode_stack_query(tx, fn, args, kwargs):
    """Which dispatch/function modes are active, and other queries of process-wide state
    (distributed initialised, exporting to onnx): answered now, guarded for later calls."""
    if args or kwargs:
        raise Unsupported(f"{fn.__name__}() with arguments")
    result = fn()
    tx.output.guards.add(guards.global_call_match(fn, result))
    return ConstantVariable(result)


@special(torch.is_grad_enabled)
def _is_grad_enabled(tx, fn, args, kwargs):
    return ConstantVariable(torch.is_grad_enabled())   # the entry is guarded on grad mode


@special(torch.no_grad, torch.enable_grad)
def _grad_mode(tx, fn, args, kwargs):
    manager = GradModeVariable(fn is torch.enable_grad)
    # ``@torch.no_grad`` without parentheses: the class called on the function
    return manager.call_function(tx, args, kwargs) if args else manager


@special(torch.set_grad_enabled)
def _set_grad_enabled(tx, fn, args, kwargs):
    mode = args[0].as_python_constant()
    prior = torch.is_grad_enabled()
    tx.output.set_grad_enabled(mode)
    return GradModeVariable(mode, applied_on_create=True, before_create=prior)


@special(torch.is_tensor)
def _is_tensor(tx, fn, args, kwargs):
    return ConstantVariable(isinstance(args[0], TensorVariable))


@special(torch.is_floating_point, torch.is_complex, torch.numel, torch.get_default_dtype,
         _maybe("torch.cuda.is_available"), _maybe("torch.cuda.device_count"),
         _maybe("torch.backends.mps.is_available"), torch.result_type,
         torch.promote_types, torch.can_cast, _maybe("torch.is_autocast_enabled"),
         _maybe("torch._C._is_any_autocast_enabled"), torch.is_inference_mode_enabled,
         _maybe("torch.are_deterministic_algorithms_enabled"))
def _metadata_query(tx, fn, args, kwargs):
    fake_args = [a.fake if isinstance(a, TensorVariable) else a.as_python_constant()
                 for a in args]
    return tx.wrap_constant(fn(*fake_args, **{k: v.as_python_constant()
                                               for k, v in kwargs.items()}))


@special(torch.Size)
def _size(tx, fn, args, kwargs):
    return SizeVariable(tx.unpack_iterable(args[0]) if args else [])


@special(torch.device, torch.finfo, torch.iinfo, torch.dtype)
def _fold_ctor(tx, fn, args, kwargs):
    out = fold(tx, fn, args, kwargs)
    if out is None:
        raise Unsupported(f"{fn} of non-constant arguments")
    return out


@special(torch.jit.annotate)
def _annotate(tx, fn, args, kwargs):
    """``torch.jit.annotate(T, value)`` is ``value`` outside TorchScript."""
    return bind_arguments(fn, args, kwargs)["the_value"]


@special(torch.jit.isinstance)
def _jit_isinstance(tx, fn, args, kwargs):
    """``torch.jit.isinstance(obj, List[Tensor])`` asks about types and structure, both
    known at capture: answered on a stand-in (fake tensors in the same containers)."""
    bound = bind_arguments(fn, args, kwargs)
    try:
        target = type_argument(bound["target_type"])
    except NotConstant:
        raise Unsupported("torch.jit.isinstance with a non-constant type") from None
    return ConstantVariable(fn(_stand_in(bound["obj"]), target))


def _stand_in(vt):
    """A real value with ``vt``'s type and structure: fake tensors for tensors."""
    if isinstance(vt, TensorVariable):
        return vt.fake
    if type(vt) in (ListVariable, TupleVariable):
        return (list if type(vt) is ListVariable else tuple)(_stand_in(v) for v in vt.items)
    if type(vt) is DictVariable and vt.cls is dict:
        return {_stand_in(vt.keys[k]): _stand_in(v) for k, v in vt.items.items()}
    if vt.is_python_constant():
        return vt.as_python_constant()
    raise Unsupported(f"torch.jit.isinstance of {vt}")


@special(torch._assert, _maybe("torch._assert_async"))
def _assert(tx, fn, args, kwargs):
    cond = args[0]
    if cond.is_python_constant():
        if not cond.as_python_constant():
            raise Unsupported(f"assertion failed: {args[1:]}")
        return ConstantVariable(None)
    return tx.output.call_function(torch._assert, args, kwargs)


@special(torch.autocast, _maybe("torch.amp.autocast"))
def _autocast(tx, fn, args, kwargs):
    consts = constants(args, kwargs)
    if consts is None:
        raise Unsupported("torch.autocast with non-constant arguments")
    try:
        bound = inspect.signature(torch.autocast.__init__).bind(None, *consts[0], **consts[1])
    except TypeError as e:
        raise Unsupported(f"torch.autocast: {e}") from None
    bound.apply_defaults()
    a = bound.arguments
    vals = (a["device_type"], a["dtype"], a["enabled"], a["cache_enabled"])
    return GlobalContextVariable(torch.amp.autocast_mode._enter_autocast,
                                 torch.amp.autocast_mode._exit_autocast, vals, torch.autocast)


@special(torch.inference_mode)
def _inference_mode(tx, fn, args, kwargs):
    consts = constants(args, kwargs)
    if consts is None:
        raise Unsupported("torch.inference_mode with a non-constant mode")
    mode = inspect.signature(torch.inference_mode.__init__).bind(
        None, *consts[0], **consts[1]).arguments.get("mode", True)
    return GlobalContextVariable(torch.autograd.grad_mode._enter_inference_mode,
                                 torch.autograd.grad_mode._exit_inference_mode, (mode,),
                                 torch.inference_mode)


@special(*PROFILER_RANGES)
def _profiler_range(tx, fn, args, kwargs):
    """``record_function(name)``, ``emit_nvtx()``: a no-op range (ctx_manager's docstring)."""
    consts = constants(args, kwargs)
    return ProfilerRangeVariable(fn, consts)


@special(_maybe("torch.cuda.amp.autocast"), _maybe("torch.cpu.amp.autocast"),
         _maybe("torch.autograd.grad"), _maybe("torch.autograd.backward"),
         _maybe("torch.cuda.synchronize"), _maybe("torch.cuda.current_stream"))
def _unsupported(tx, fn, args, kwargs):
    raise Unsupported(f"{fn} inside a compiled region is not supported yet")


def special_handler(fn):
    """``handler(tx, args, kwargs)`` for a torch callable answered at capture time, or None."""
    entry = SPECIAL.get(id(fn))
    if entry is None and _DEFERRED:
        _register_imported()
        entry = SPECIAL.get(id(fn))
    if entry is None or entry[0] is not fn:
        return None
    handler = entry[1]
    return lambda tx, args, kwargs: handler(tx, fn, args, kwargs)
