"""Backend registry: names the user can pass as ``ember.compile(..., backend=NAME)``, and
the options of the "ember" backend.

A backend is any callable ``backend(gm: torch.fx.GraphModule, example_inputs: list) ->
Callable`` (the same contract as torch.compile's, so the two worlds interoperate). The
"ember" backend also takes its options as keywords: ``ember_backend(gm, example_inputs,
**options)``; the frontend passes them to it alone. Behind torch.compile it gets what
torch.compile hands every backend instead, ``mode=`` and ``options=`` (when set), and
resolves them itself.

Options: ``EMBER_OPTIONS`` is the one table of them (type, default, allowed values,
whether implemented, doc). ``mode=`` is a preset of options (``MODES``); explicit
``options=`` override the mode's. ``resolve_options`` validates both and returns every
option's value; an option set to anything but its default before it is implemented raises
``NotImplementedError`` naming it, so no accepted option is ever silently ignored. It is the
one validation of both ways in: ``ember.compile`` calls it when it is called, the backend
when torch.compile hands it a graph.
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Callable

import torch

Backend = Callable[[torch.fx.GraphModule, list], Callable]

_BACKENDS: dict[str, Backend] = {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmberOption:
    type: type = dataclasses.field(kw_only=False)
    default: Any = dataclasses.field(kw_only=False)
    allowed: tuple | None = None     # the values accepted, when not every value of `type`
    implemented: bool                # False: any value but the default raises
    doc: str


# Options the "ember" backend accepts through ``ember.compile(..., options={...})``; each is
# a keyword argument of ``ember.backend.compile.compile_graph`` with the same default.
EMBER_OPTIONS: dict[str, EmberOption] = {
    "freezing": EmberOption(
        bool, False, implemented=True,
        doc="inference (no grad): fold parameters and buffers as constants: batch norm into "
            "the convolution before it, constant subgraphs computed once "
            "(backend/freezing.py). Guarded on each frozen tensor's identity, data pointer "
            "and version counter: a changed weight re-freezes before the next call"),
    "max_autotune": EmberOption(
        bool, False, implemented=True,
        doc="time candidate block sizes and warps of each generated Triton kernel on its "
            "first call and keep the fastest (cached on disk); C++ kernels have none "
            "(EMBER_LOGS=perf_hints says so). Library matmuls are not tuned yet"),
    "cudagraphs": EmberOption(
        bool, False, implemented=True,
        doc="replay a CUDA graph's kernel launches as one captured CUDA graph "
            "(backend/cudagraphs.py). A CPU graph has none to replay and ignores it "
            "(EMBER_LOGS=perf_hints says so)"),
    "debug": EmberOption(
        bool, False, implemented=True,
        doc="log the generated wrapper and kernels of each graph, as EMBER_LOGS=output_code "
            "does, and check indices in generated Triton kernels"),
    "fallback_random": EmberOption(
        bool, True, implemented=True,
        doc="random ops (rand, randn, bernoulli, dropout) call eager's ATen kernels in "
            "program order, so compiled code draws eager's numbers and leaves the generator "
            "where eager leaves it. False generates them inside fused kernels from a Philox "
            "counter (backend/lowering/random.py): faster, same distributions, other numbers"),
    "cpu_backend": EmberOption(
        str, "cpp", allowed=("cpp", "triton"), implemented=True,
        doc="kernel language for CPU graphs: C++/OpenMP, or Triton (run by Triton's "
            "interpreter: for testing the Triton code generator without a GPU)"),
}

# mode= -> the options it sets (explicit options override them).
MODES: dict[str | None, dict[str, Any]] = {
    None: {},
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": {"max_autotune": True, "cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}


def check_option(name: str, value: Any, source: str = "") -> None:
    """Raise if ``value`` is not a valid, implemented value of option ``name``.

    ``source`` says where the value came from, for the message (e.g. ``mode='max-autotune'``).
    """
    spec = EMBER_OPTIONS.get(name)
    if spec is None:
        raise ValueError(f"unknown option {name!r}; known options: "
                         f"{', '.join(sorted(EMBER_OPTIONS))}")
    if not isinstance(value, spec.type):
        raise TypeError(f"option {name!r} expects {spec.type.__name__}, "
                        f"got {type(value).__name__}")
    if spec.allowed is not None and value not in spec.allowed:
        raise ValueError(f"option {name!r} must be one of "
                         f"{', '.join(repr(v) for v in spec.allowed)}, got {value!r}")
    if not spec.implemented and value != spec.default:
        came_from = f" (set by {source})" if source else ""
        raise NotImplementedError(
            f"ember.compile option {name!r} is not implemented yet{came_from}; leave it at "
            f"its default ({spec.default!r})")


def check_mode_and_options(mode: str | None, options: Any) -> None:
    """Raise for an unknown ``mode`` or an ``options`` that is not a dict (the checks that
    hold whatever the backend; ``resolve_options`` checks the options themselves)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known modes: "
                         f"{', '.join(m for m in MODES if m)}")
    if options is not None and not isinstance(options, collections.abc.Mapping):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")


def resolve_options(mode: str | None, options: dict | None) -> dict[str, Any]:
    """Every ember option's value for ``mode`` and ``options``: defaults, then the mode's
    settings, then the explicit options. Raises for an unknown mode or option, options that
    are not a dict, a value of the wrong type or not allowed, and an unimplemented option
    set."""
    check_mode_and_options(mode, options)
    options = dict(options or {})
    for name, value in options.items():
        check_option(name, value)
    resolved = {name: spec.default for name, spec in EMBER_OPTIONS.items()}
    for name, value in MODES[mode].items():
        if name not in options:
            check_option(name, value, source=f"mode={mode!r}")
            resolved[name] = value
    resolved.update(options)
    return resolved


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
        if not isinstance(value, (torch.Tensor, int, float, bool)) or isinstance(
                value, torch.SymInt) or (isinstance(value, torch.Tensor) and any(
                    isinstance(s, torch.SymInt) for s in value.shape)):
            raise NotImplementedError(
                f"ember backend: graph input of type {type(value).__name__} (symbolic "
                f"shapes are not supported yet; use dynamic=False)")
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
