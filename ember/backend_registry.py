"""The registry of compile backends: the names the user can pass as ``ember.compile(...,
backend=NAME)`` ("ember", "eager", "aot_eager", and any ``register_backend`` adds), the
built-in ones, and their lookup.

Named for what it holds, not ``backends.py``: beside the ``ember/backend/`` package (the
"ember" backend's compiler) that name read as part of it. It stays outside that package:
``ember.compile`` looks backends up here without importing the compiler, which
``ember_backend`` imports only when it compiles a graph (``import ember`` stays cheap).

A backend is any callable ``backend(gm: torch.fx.GraphModule, example_inputs: list) ->
Callable`` (the same contract as torch.compile's, so the two worlds interoperate). The
"ember" backend also takes its options as keywords: ``ember_backend(gm, example_inputs,
**options)``; the frontend passes them to it alone. Behind torch.compile it gets what
torch.compile hands every backend instead, ``mode=`` and ``options=`` (when set), and
resolves them itself.

The "ember" backend's options (their table, ``mode=`` presets and validation) are
``ember.backend.options``.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ember.backend.options import resolve_options

Backend = Callable[[torch.fx.GraphModule, list], Callable]

_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str):
    def deco(fn: Backend) -> Backend:
        _BACKENDS[name] = fn
        return fn
    return deco


@register_backend("eager")
def eager_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run the captured FX graph as it is (isolates the frontend)."""
    return gm.forward


@register_backend("aot_eager")
def aot_eager_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """ATen tracing, functionalization and decomposition, then run eagerly (isolates aot)."""
    from ember.aot import aot_eager
    return aot_eager(gm, example_inputs)


@register_backend("ember")
def ember_backend(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = None,
                  options: dict | None = None, **resolved: Any) -> Callable:
    """The Ember compiler: ATen tracing, loop IR, fusion, generated C++ kernels (CPU).

    ``resolved``: every option's value, as ``ember.compile`` passes them. ``mode`` and
    ``options``: what torch's own frontend passes a backend registered under its entry
    point, resolved and checked here as ``ember.compile`` resolves and checks them."""
    if resolved and (mode is not None or options is not None):
        raise TypeError(f"ember backend: got mode=/options= and resolved options "
                        f"({', '.join(sorted(resolved))}) together; pass one or the other")
    if not resolved:   # torch.compile's call (or a plain backend(gm, example_inputs))
        resolved = resolve_options(mode, options)
    for value in example_inputs:
        if not isinstance(value, (torch.Tensor, int, float, bool, torch.SymInt)):
            raise NotImplementedError(
                f"ember backend: graph input of type {type(value).__name__} is not supported")
    from ember.backend.dynamic import compile_dynamic, is_symbolic
    if is_symbolic(example_inputs):    # symbolic sizes: one program for all, or per size
        from ember.backend.options import DEFAULTS, check_option
        for name, value in resolved.items():
            check_option(name, value)
        # (compile_graph's keywords: those not given keep their defaults)
        return compile_dynamic(gm, example_inputs, {**DEFAULTS, **resolved})
    from ember.backend.compile import compile_graph
    return compile_graph(gm, example_inputs, **resolved)


def lookup_backend(backend: str | Backend) -> Backend:
    if callable(backend):
        return backend
    if isinstance(backend, str):
        if backend in _BACKENDS:
            return _BACKENDS[backend]
        raise ValueError(f"unknown backend {backend!r}; known backends: "
                         f"{', '.join(sorted(_BACKENDS))}, or pass a callable "
                         f"backend(gm, example_inputs)")
    raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")


def list_backends() -> list[str]:
    return sorted(_BACKENDS)
