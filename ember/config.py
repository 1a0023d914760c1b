"""Typed compiler options with EMBER_* environment overrides.

Every option is a module attribute with a type and a default. ``EMBER_<NAME>`` in the
environment overrides the default when Ember is imported; ``config.patch(name=value)`` changes
options for a block or a function (tests use it). Unknown names raise, so a typo never turns
into a silently ignored setting.

Assigning an option (``ember.config.layout_optimization = "off"``) checks its type. A change
of an option that compiled code depends on (``RECOMPILES``) drops every compiled entry, as
``ember.reset()`` does: the next call compiles under the new value instead of running code
compiled under the old one.

These are process-wide settings. The options of one ``ember.compile`` call (``mode=``,
``options=``) are another table, ``ember.backend.options``, whose docstring says why the two
do not share a definition type.
"""
from __future__ import annotations

import contextlib
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Option:
    name: str
    type: type
    default: Any
    doc: str
    choices: tuple = ()     # the values a str option takes; empty: any


_OPTIONS: dict[str, Option] = {}


def _option(name: str, type_: type, default: Any, doc: str, choices: tuple = ()) -> Any:
    _OPTIONS[name] = Option(name, type_, default, doc, choices)
    raw = os.environ.get("EMBER_" + name.upper())
    if raw is None:
        return default
    value = _parse(name, type_, raw)
    if choices and value not in choices:
        raise ValueError(f"EMBER_{name.upper()}={raw!r}: expected one of {', '.join(choices)}")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def parse_bool(variable: str, raw: str) -> bool:
    """The one reading of a boolean environment variable: 1/0, true/false, yes/no, on/off
    (any case; empty is false); anything else raises, naming ``variable``."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{variable}={raw!r}: expected a boolean (1/0, true/false, yes/no, "
                     f"on/off)")


def env_flag(variable: str, default: bool) -> bool:
    """Boolean environment variable ``variable`` read now (``parse_bool``), or ``default``
    when it is unset. For switches read at each use (``EMBER_GRAPH_CACHE``)."""
    raw = os.environ.get(variable)
    return default if raw is None else parse_bool(variable, raw)


def _parse(name: str, type_: type, raw: str) -> Any:
    if type_ is bool:
        return parse_bool(f"EMBER_{name.upper()}", raw)
    try:
        return type_(raw)
    except ValueError:
        raise ValueError(f"EMBER_{name.upper()}={raw!r}: expected {type_.__name__}") from None


cache_size_limit: int = _option(
    "cache_size_limit", int, 8,
    "compiled entries kept per code object; past it the frame runs eagerly")
inline_depth_limit: int = _option(
    "inline_depth_limit", int, 64, "deepest chain of inlined user-function calls")
debug_dir: str = _option(
    "debug_dir", str, "", "when set, each compiled frame's stages are written below it")
suppress_errors: bool = _option(
    "suppress_errors", bool, True,
    "an internal compiler error falls back to eager (logged) instead of raising")
layout_optimization: str = _option(
    "layout_optimization", str, "auto",
    "channels-last convolutions: 'auto' (CUDA inference graphs in half precision), "
    "'channels_last' (always, every convolution: on CUDA, auto keeps depthwise ones NCHW "
    "unless eager's input is channels-last), 'off' (never); see ember/backend/passes/layout.py",
    choices=("auto", "channels_last", "off"))
half_fast_math: bool = _option(
    "half_fast_math", bool, True,
    "GPU Triton kernels compute sin, cos and division of float16/bfloat16 values with CUDA's "
    "approximate intrinsics (errors ~1e-6, far below half precision's); False: precise")
kept_buffers_mb: int = _option(
    "kept_buffers_mb", int, 64,
    "a CPU graph keeps up to this many MB of its intermediate buffers between calls instead "
    "of allocating them (and page-faulting their memory in) on every call; 0 keeps none. "
    "Kept memory stays held between calls (a training step's forward holds its backward's)")
matmul_padding: str = _option(
    "matmul_padding", str, "auto",
    "mm/addmm whose result rows are not 16-byte aligned (a vocabulary of 50257 columns) run "
    "on a weight padded to aligned columns, the result sliced back (cuBLAS is ~6x slower "
    "on unaligned rows): 'auto' (CUDA float16/bfloat16 results of 1M elements or more), "
    "'always' (any device, dtype and size), 'off'; see ember/backend/lowering/matmul.py",
    choices=("auto", "always", "off"))
cache_size_mb: int = _option(
    "cache_size_mb", int, 2048,
    "the on-disk cache (EMBER_CACHE_DIR) is kept under this many MB: past it, the least "
    "recently used entries are deleted (ember/backend/runtime/disk_cache.py)")
_POSITIVE = ("cache_size_mb",)
if cache_size_mb <= 0:
    raise ValueError(f"EMBER_CACHE_SIZE_MB={cache_size_mb}: expected a positive number of MB")
fallback_on_lowering_error: bool = _option(
    "fallback_on_lowering_error", bool, True,
    "a lowering that raises anything but NotImplementedError (a bug in the lowering) logs a "
    "warning naming the op and runs the op's ATen kernel; False raises instead, and "
    "suppress_errors decides whether that reaches the caller (the tests set both False)")
eager_choice: str = _option(
    "eager_choice", str, "timed",
    "what ember.compile's eager_choice='auto' (its default) does: 'timed' (the first call "
    "of a compiled inference graph per input sizes times its compiled program against the "
    "captured graph run eagerly and keeps the faster, cached on disk), 'off' (the compiled "
    "program always); see ember/backend/runtime/eager_choice.py",
    choices=("timed", "off"))
profile_kernels: bool = _option(
    "profile_kernels", bool, False,
    "each generated kernel's call runs inside torch.profiler.record_function(<kernel name>), "
    "so torch.profiler's tables time Ember's kernels one by one (C++ kernels otherwise show "
    "only as the whole compiled call); costs about a microsecond a kernel while no profiler "
    "runs")
split_ddp_graphs: bool = _option(
    "split_ddp_graphs", bool, True,
    "a graph captured for a DistributedDataParallel module is cut where DDP's gradient "
    "buckets end, each piece compiled on its own, so each bucket's all-reduce starts while "
    "the rest of the backward runs (EMBER_LOGS=ddp says where; ember/frontend/ddp_split.py)")


def options() -> dict[str, Option]:
    return dict(_OPTIONS)


def _check(name: str, value: Any) -> None:
    opt = _OPTIONS.get(name)
    if opt is None:
        raise ValueError(f"unknown ember config option {name!r}; known: {sorted(_OPTIONS)}")
    if not isinstance(value, opt.type):
        raise TypeError(f"ember config option {name!r} expects {opt.type.__name__}, "
                        f"got {type(value).__name__}")
    if opt.choices and value not in opt.choices:
        raise ValueError(f"ember config option {name!r} is {value!r}: expected one of "
                         f"{', '.join(map(repr, opt.choices))}")
    if name in _POSITIVE and value <= 0:
        raise ValueError(f"ember config option {name!r} is {value!r}: expected a positive "
                         "number")


class patch(contextlib.ContextDecorator):
    """``with config.patch(cache_size_limit=2): ...`` or as a decorator."""

    def __init__(self, **changes: Any):
        for name, value in changes.items():
            _check(name, value)
        self.changes = changes
        self.saved: list[dict[str, Any]] = []

    def __enter__(self):
        module = sys.modules[__name__]
        self.saved.append({k: getattr(module, k) for k in self.changes})
        for k, v in self.changes.items():
            setattr(module, k, v)
        return self

    def __exit__(self, *exc):
        module = sys.modules[__name__]
        for k, v in self.saved.pop().items():
            setattr(module, k, v)
        return False


# options the compiled code depends on; the others (limits, error policy, debug output) act
# when they are read
RECOMPILES = ("layout_optimization", "half_fast_math", "inline_depth_limit",
              "kept_buffers_mb", "matmul_padding", "split_ddp_graphs", "eager_choice",
              "profile_kernels")
on_recompile_option: list[Callable[[str], None]] = []    # ember.api's reset of entries


class _ConfigModule(types.ModuleType):
    """This module, with assignments to options checked and code-shaping changes seen."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _OPTIONS:
            super().__setattr__(name, value)
            return
        _check(name, value)
        changed = getattr(self, name) != value
        super().__setattr__(name, value)
        if changed and name in RECOMPILES:
            for hook in on_recompile_option:
                hook(name)


sys.modules[__name__].__class__ = _ConfigModule
