"""Which callables compiled code must not trace: ``ember.disable`` and ``ember.allow_in_graph``.

The public API (``ember.api``) registers functions here; the frontend reads the registries
while capturing. Keeping them in the frontend means the evaluator never imports the API.
"""
from __future__ import annotations

import inspect
import sys
import types
import weakref
from typing import Any, Callable

_disabled: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_disabled_codes: set[types.CodeType] = set()
_disabled_reasons: dict[types.CodeType, str] = {}    # why Ember itself disabled a function
# functions the graph breaks at (they run in Python), with the reason a break gives
_runs_in_python: dict[int, tuple[Any, str]] = {}
_allowed_in_graph: dict[int, Any] = {}   # id -> callable (held, so the id stays unique)


def unwrap_compiled(fn: Any) -> Any:
    """The user function behind an Ember-compiled callable (itself otherwise)."""
    return fn.__wrapped__ if getattr(type(fn), "_ember_wrapper", None) == "function" else fn


def disable(fn: Callable) -> Callable:
    target = unwrap_compiled(fn)
    code = getattr(inspect.unwrap(target), "__code__", None)
    if code is not None:
        _disabled_codes.add(code)
    try:
        _disabled[target] = True
    except TypeError:
        pass
    return target


def is_disabled(fn: Any) -> bool:
    _register_fsdp2_once_imported()
    try:
        if _disabled.get(fn):
            return True
    except TypeError:
        pass
    # torch.classes namespaces (and other proxies) raise RuntimeError, not AttributeError,
    # for a missing attribute: they are not functions, so not disabled ones
    try:
        fn = getattr(fn, "__func__", fn)
        return getattr(fn, "__code__", None) in _disabled_codes
    except Exception:
        return False


def is_disabled_code(code: types.CodeType) -> bool:
    _register_fsdp2_once_imported()
    return code in _disabled_codes


def disabled_reason(code: types.CodeType) -> str:
    """Why a call to a disabled function breaks the graph."""
    return _disabled_reasons.get(code, f"call to {code.co_name}, which ember.disable excludes")


def disabled_call_reason(fn: Any) -> str:
    """Why a call to the disabled callable ``fn`` breaks the graph."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return _disabled_reasons.get(code, "which ember.disable excludes from compilation")


def allow_in_graph(fn: Callable) -> Callable:
    if not callable(fn):
        raise TypeError(f"allow_in_graph expects a callable, got {type(fn).__name__}")
    _allowed_in_graph[id(fn)] = fn
    return fn


def is_allowed_in_graph(fn: Any) -> bool:
    return _allowed_in_graph.get(id(fn)) is fn


def run_in_python(fn: Callable, reason: str) -> None:
    """Calls to ``fn`` break the graph and run in Python (with ``reason``), not traced."""
    _runs_in_python[id(fn)] = (fn, reason)


def python_only_reason(fn: Any) -> str | None:
    """The break reason of a function that runs in Python, also when it is reached through
    wrappers (torch wraps some of its functions in ``torch._disable_dynamo`` on demand)."""
    for candidate in (fn, _unwrapped(fn)):
        entry = _runs_in_python.get(id(candidate))
        if entry is not None and entry[0] is candidate:
            return entry[1]
    return None


def _unwrapped(fn: Any) -> Any:
    try:
        return inspect.unwrap(fn) if callable(fn) else fn
    except ValueError:      # a __wrapped__ cycle
        return fn


def _register_random_state_setters() -> None:
    """Setting torch's random state is a step of the program between graphs: eager's order of
    random draws around it is kept by breaking there (tracing into it reaches device-specific
    internals that cannot be captured)."""
    import torch
    setters = [torch.manual_seed, torch.seed, torch.set_rng_state, torch.random.manual_seed,
               torch.random.seed, torch.random.set_rng_state]
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state",
                 "set_rng_state_all"):
        fn = getattr(torch.cuda, name, None)
        if fn is not None:
            setters.append(fn)
    for fn in setters:
        run_in_python(fn, f"{getattr(fn, '__module__', 'torch')}.{fn.__name__} sets the "
                          f"global random state; it runs in Python between graphs")


_register_random_state_setters()


def _register_ddp() -> None:
    """DistributedDataParallel's bookkeeping around its module's forward (the reducer's
    per-iteration state, buffer broadcast, ``require_backward_grad_sync`` under
    ``no_sync()``, unused-parameter search) runs in Python on every call, as in eager and
    as under torch.compile: no flag of it is ever baked into a graph. The module it wraps is
    captured between the two."""
    import torch
    if not torch.distributed.is_available():
        return
    from torch.nn.parallel import DistributedDataParallel as DDP
    for name in ("_pre_forward", "_post_forward"):
        fn = vars(DDP)[name]
        disable(fn)    # runs as it is, not captured as a frame of its own
        _disabled_reasons[fn.__code__] = (f"DistributedDataParallel.{name} keeps DDP's "
                                          f"per-call state; it runs in Python between graphs")


_register_ddp()


_FSDP2_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"
_fsdp2_registered = False


def _register_fsdp2_once_imported() -> None:
    """FSDP2's module hooks (all-gather of a module's parameters before its forward, reshard
    after it, the registration of its backward hooks) run in Python between graphs, as torch
    itself excludes them from tracing: a gathered parameter or a training-state flag is never
    baked into a graph. Registered at capture time once the user has imported FSDP2 (importing
    it with Ember would cost most of a second)."""
    global _fsdp2_registered
    if _fsdp2_registered or _FSDP2_STATE not in sys.modules:
        return
    _fsdp2_registered = True
    state_cls = sys.modules[_FSDP2_STATE].FSDPState
    for name in ("_pre_forward", "_post_forward"):
        fn = vars(state_cls).get(name)
        if fn is None:      # another torch version: nothing of it to exclude
            continue
        # torch wraps them in one closure (``_dynamo_disable``) shared by all its FSDP hooks:
        # its code and the hook's own are both excluded
        for code in {fn.__code__, inspect.unwrap(fn).__code__}:
            _disabled_codes.add(code)
            _disabled_reasons[code] = ("FSDP2's forward hooks gather and reshard parameters; "
                                       "they run in Python between graphs")
