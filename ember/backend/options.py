"""The one table of the "ember" backend's compiler options, the ``mode=`` presets of them, and
their validation.

``OPTIONS`` holds each option once: its name, type, default, the values allowed (when not
every value of its type), whether it is implemented, and what it does. Everything else reads
it: ``ember.compile(..., mode=, options=)`` resolves and checks against it
(``resolve_options``), the backend registry (``ember.backend_registry``) hands the resolved
values on, and ``compile_graph``'s keyword defaults are taken from it (``DEFAULTS``). An
option set to anything but its default before it is implemented raises
``NotImplementedError`` naming it, so no accepted option is ever silently ignored.
``resolve_options`` is the one validation of both ways in: ``ember.compile`` calls it when it
is called, the backend when torch.compile hands it a graph.

Design: these are not ``ember.config`` options, and the two do not share a definition type.
A compiler option is an argument of one ``ember.compile`` call: it has no environment
variable, is resolved from ``mode=`` and ``options=`` per compiled function, keys the graph
cache, and may be declared before it is implemented. A ``config`` option is a process-wide
setting: read from ``EMBER_<NAME>`` at import, changed by assignment or ``config.patch``,
and some of them drop every compiled entry when changed (``config.RECOMPILES``). One type
would carry fields that mean something to one kind only (environment parsing, recompile on
change, ``implemented``); what they share (a type check and allowed values) is three lines
each, with messages worded for where the value came from.

This module imports nothing of Ember, so any layer may read the table.
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompilerOption:
    type: type = dataclasses.field(kw_only=False)
    default: Any = dataclasses.field(kw_only=False)
    allowed: tuple | None = None     # the values accepted, when not every value of `type`
    implemented: bool                # False: any value but the default raises
    doc: str


# Options the "ember" backend accepts through ``ember.compile(..., options={...})``; each is
# a keyword argument of ``ember.backend.compile.compile_graph``, whose default is taken from
# here.
OPTIONS: dict[str, CompilerOption] = {
    "freezing": CompilerOption(
        bool, False, implemented=True,
        doc="inference (no grad): fold parameters and buffers as constants: batch norm into "
            "the convolution before it, constant subgraphs computed once "
            "(backend/passes/freezing.py). Guarded on each frozen tensor's identity, data pointer "
            "and version counter: a changed weight re-freezes before the next call"),
    "max_autotune": CompilerOption(
        bool, False, implemented=True,
        doc="time candidate block sizes and warps of each generated Triton kernel on its "
            "first call and keep the fastest (cached on disk); C++ kernels have none "
            "(EMBER_LOGS=perf_hints says so). Library matmuls are not tuned yet"),
    "cudagraphs": CompilerOption(
        bool, False, implemented=True,
        doc="replay a CUDA graph's kernel launches as one captured CUDA graph "
            "(backend/runtime/cudagraphs.py). A CPU graph has none to replay and ignores it "
            "(EMBER_LOGS=perf_hints says so)"),
    "debug": CompilerOption(
        bool, False, implemented=True,
        doc="log the generated wrapper and kernels of each graph, as EMBER_LOGS=output_code "
            "does, and check indices in generated Triton kernels"),
    "fallback_random": CompilerOption(
        bool, True, implemented=True,
        doc="random ops (rand, randn, bernoulli, dropout) call eager's ATen kernels in "
            "program order, so compiled code draws eager's numbers and leaves the generator "
            "where eager leaves it. False generates them inside fused kernels from a Philox "
            "counter (backend/lowering/random.py): faster, same distributions, other numbers"),
    "eager_choice": CompilerOption(
        str, "auto", allowed=("auto", "timed", "off"), implemented=True,
        doc="whether an inference graph may run eagerly (the captured graph on ATen's "
            "kernels) where that is faster than its compiled program: 'timed' times both on "
            "the first call per input sizes and keeps the faster (eager only when over 5% "
            "faster; cached on disk); 'off' always runs the compiled program; 'auto' is "
            "ember.config.eager_choice ('timed' unless EMBER_EAGER_CHOICE=off), off under "
            "Triton's interpreter. A graph with no generated kernel runs eagerly untimed "
            "(backend/runtime/eager_choice.py; EMBER_LOGS=perf_hints names each choice)"),
    "cpu_backend": CompilerOption(
        str, "cpp", allowed=("cpp", "triton"), implemented=True,
        doc="kernel language for CPU graphs: C++/OpenMP, or Triton (run by Triton's "
            "interpreter: for testing the Triton code generator without a GPU)"),
}

# each option's default, as the table states it when this module is imported
DEFAULTS: dict[str, Any] = {name: spec.default for name, spec in OPTIONS.items()}

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
    spec = OPTIONS.get(name)
    if spec is None:
        raise ValueError(f"unknown option {name!r}; known options: "
                         f"{', '.join(sorted(OPTIONS))}")
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
    resolved = {name: spec.default for name, spec in OPTIONS.items()}
    for name, value in MODES[mode].items():
        if name not in options:
            check_option(name, value, source=f"mode={mode!r}")
            resolved[name] = value
    resolved.update(options)
    return resolved
