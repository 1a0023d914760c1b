"""Which dims of an input tensor are captured symbolic: ``dynamic=``, marks, automatic dynamic.

    ember.compile(fn)                 # dynamic=None: static first; dims whose size changed
                                      # between captures of a frame are symbolic from then on
    ember.compile(fn, dynamic=True)   # every dim of every input tensor symbolic
    ember.compile(fn, dynamic=False)  # static, except dims marked with mark_dynamic
    ember.mark_dynamic(x, 0, min=2, max=64); ember.mark_static(x, 1)

Decisions
---------
* **Marks live on the tensor object** (as torch's do): ``_ember_dynamic_dims`` (dim ->
  (min, max)), ``_ember_maybe_dynamic_dims`` and ``_ember_static_dims`` (sets of dims). A mark
  is read when a capture first sees the tensor; marks are not guarded (changing them does not
  recompile an entry that still accepts the tensor).
* **Precedence:** ``mark_static`` beats everything; then ``mark_dynamic`` /
  ``maybe_mark_dynamic`` (also under ``dynamic=False``: an explicit request on one tensor
  beats the default of the whole function); then the policy (``dynamic=True``: every dim;
  ``None``: automatic).
* **Int arguments** of the frame (``n`` in ``f(x, n)``, and the sizes a resume function
  receives after a graph break) follow the policy too: symbolic under ``dynamic=True``, and
  with ``None`` once captures of the frame saw the value change; else a constant, guarded.
* **Automatic dynamic** remembers, per frame (code object) and source (``L['x']``), the sizes
  the last capture saw and which dims ever changed. A capture that sees another size of a
  dim of the same rank makes that dim symbolic, and it stays so for the frame. A change of
  rank starts over (all static). The memory (:class:`SeenSizes`) belongs to one
  ``ember.compile(...)`` result, shared with the resume functions and calls it compiles on
  its own: compiling the same function again starts static, so separate compiles (and
  tests) do not influence each other. ``ember.reset()`` forgets it.
* **Duck sizing** (equal sizes share one symbol, with an equality guard) only under
  ``dynamic=True``, as torch does: a dim made dynamic because its size changed, or marked,
  gets a symbol of its own (two inputs equal at one call are often unequal at the next).
* **Module-owned tensors stay static** (parameters, buffers, other tensors reached through a
  module's attributes) and so do ``nn.Parameter`` objects anywhere: their sizes are fixed
  by the model, and a symbolic weight would only cost guards.
* A ``mark_dynamic`` dim that the program then specialises (``int(x.size(0))`` used as a
  constant, ``if x.size(0) == 5``) is an error at capture time (:class:`ConstraintViolation`),
  as in torch; ``maybe_mark_dynamic`` specialises silently. Sizes 0 and 1 are always
  specialised (``ember.shapes``), also when marked.
"""
from __future__ import annotations

import dataclasses
import threading
import types
import weakref

import torch

_DYNAMIC_ATTR = "_ember_dynamic_dims"
_MAYBE_ATTR = "_ember_maybe_dynamic_dims"
_STATIC_ATTR = "_ember_static_dims"


class ConstraintViolation(RuntimeError):
    """A dim marked with ``mark_dynamic`` cannot be dynamic: the program specialised it."""


def _check_dim(t, dim, api: str) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ember.{api} expects a tensor, got {type(t).__name__}")
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"ember.{api}: dim must be an int, got {d!r}")
        if t.dim() == 0 or not -t.dim() <= d < t.dim():
            raise IndexError(f"ember.{api}: dim {d} is out of range for a tensor of "
                             f"{t.dim()} dims")
        out.append(d % t.dim())
    return out


def _marks(t, attr: str, factory):
    found = t.__dict__.get(attr)
    if found is None:
        found = factory()
        setattr(t, attr, found)
    return found


def mark_dynamic(t: torch.Tensor, dim, min: int | None = None, max: int | None = None) -> None:
    """Capture ``t``'s dim ``dim`` (an int or a list of them) symbolic from the first
    compile on; ``min``/``max`` bound the sizes the compiled code accepts (guarded). An
    error at capture if the program specialises the dim."""
    dims = _check_dim(t, dim, "mark_dynamic")
    for name, bound in (("min", min), ("max", max)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise TypeError(f"ember.mark_dynamic: {name} must be an int or None, got {bound!r}")
    if min is not None and max is not None and min > max:
        raise ValueError(f"ember.mark_dynamic: min={min} is larger than max={max}")
    if min is not None and min < 0:
        raise ValueError(f"ember.mark_dynamic: min={min} is negative")
    static = t.__dict__.get(_STATIC_ATTR, set())
    for d in dims:
        if d in static:
            raise ValueError(f"ember.mark_dynamic: dim {d} is already marked static")
        _marks(t, _DYNAMIC_ATTR, dict)[d] = (min, max)


def maybe_mark_dynamic(t: torch.Tensor, dim) -> None:
    """Like :func:`mark_dynamic`, but the program may specialise the dim without error."""
    for d in _check_dim(t, dim, "maybe_mark_dynamic"):
        _marks(t, _MAYBE_ATTR, set).add(d)


def mark_static(t: torch.Tensor, dim) -> None:
    """Never capture ``t``'s dim ``dim`` symbolic (also under ``dynamic=True``): each size
    of it compiles its own entry."""
    dims = _check_dim(t, dim, "mark_static")
    marked = t.__dict__.get(_DYNAMIC_ATTR, {})
    for d in dims:
        if d in marked:
            raise ValueError(f"ember.mark_static: dim {d} is already marked dynamic")
        _marks(t, _STATIC_ATTR, set).add(d)


@dataclasses.dataclass(frozen=True)
class DynamicDim:
    """One symbolic dim of an input, and why it is symbolic."""
    source: str          # the input's source name, ``L['x']``
    dim: int | None      # None: the input is an int, not a tensor
    reason: str          # "dynamic=True", "automatic dynamic (...)", "mark_dynamic", ...
    min: int | None = None
    max: int | None = None
    strict: bool = False  # mark_dynamic: specialising it is an error
    duck: bool = False    # may share a symbol with an equal size (dynamic=True only)

    def __str__(self) -> str:
        if self.dim is None:            # an int argument
            return f"{self.source}: {self.reason}"
        bounds = ""
        if self.min is not None or self.max is not None:
            bounds = f" in [{self.min if self.min is not None else 2}, " \
                     f"{self.max if self.max is not None else 'inf'}]"
        return f"{self.source}.size({self.dim}){bounds}: {self.reason}"


@dataclasses.dataclass
class _SeenInput:
    shape: tuple
    changed: set


class SeenSizes:
    """What the captures of the frames of one compiled function saw: code object -> source
    name -> the last sizes and the dims that ever changed."""

    def __init__(self):
        self._frames: "weakref.WeakKeyDictionary[types.CodeType, dict]" = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()

    def record(self, code, name: str, shape: tuple) -> set:
        """Remember ``shape`` for (code, name); the dims that ever changed, this time
        included."""
        with self._lock:
            per_frame = self._frames.get(code)
            if per_frame is None:
                per_frame = self._frames[code] = {}
            seen = per_frame.get(name)
            if seen is None or len(seen.shape) != len(shape):
                per_frame[name] = _SeenInput(shape, set())
                return set()
            seen.changed |= {d for d, (a, b) in enumerate(zip(seen.shape, shape)) if a != b}
            seen.shape = shape
            return set(seen.changed)


def _record(seen: SeenSizes | None, code, name: str, shape: tuple) -> set:
    if seen is None or code is None:
        return set()
    return seen.record(code, name, shape)


def choose_dims(policy: bool | None, seen: SeenSizes | None, code: types.CodeType | None,
                source, t: torch.Tensor, module_owned: bool) -> list[DynamicDim]:
    """The dims of input ``t`` (read from ``source``) to capture symbolic, with reasons;
    records ``t``'s sizes for automatic dynamic."""
    if t.dim() == 0:
        return []
    name = source.name()
    static = t.__dict__.get(_STATIC_ATTR, ())
    marked = t.__dict__.get(_DYNAMIC_ATTR, {})
    maybe = t.__dict__.get(_MAYBE_ATTR, ())
    if module_owned or isinstance(t, torch.nn.Parameter):
        return []
    changed = _record(seen, code, name, tuple(t.shape)) if policy is None else set()
    out = []
    for d in range(t.dim()):
        if d in static:
            continue
        if d in marked:
            lo, hi = marked[d]
            size = t.shape[d]
            if (lo is not None and size < lo) or (hi is not None and size > hi):
                raise ConstraintViolation(
                    f"ember.mark_dynamic({name}, {d}, min={lo}, max={hi}): its size {size} is "
                    f"outside these bounds")
            out.append(DynamicDim(name, d, "mark_dynamic", lo, hi, strict=True))
        elif d in maybe:
            out.append(DynamicDim(name, d, "maybe_mark_dynamic"))
        elif policy is True:
            out.append(DynamicDim(name, d, "dynamic=True", duck=True))
        elif d in changed:
            out.append(DynamicDim(name, d, "automatic dynamic: its size changed between "
                                           "captures of the frame"))
    return out


def choose_int(policy: bool | None, seen: SeenSizes | None, code: types.CodeType | None,
               source, value: int) -> DynamicDim | None:
    """Whether int argument ``value`` of the frame (read from ``source``) is captured as a
    symbol: under ``dynamic=True``, or once captures of the frame saw it change (the sizes a
    resume function receives after a graph break, a length passed in)."""
    if policy is False:
        return None
    name = source.name()
    if policy is True:     # a symbol of its own: equal to a size only by coincidence
        return DynamicDim(name, None, "dynamic=True")
    if _record(seen, code, name, (value,)):
        return DynamicDim(name, None, "automatic dynamic: its value changed between "
                                      "captures of the frame")
    return None


__all__ = ["mark_dynamic", "maybe_mark_dynamic", "mark_static", "ConstraintViolation",
           "DynamicDim", "SeenSizes", "choose_dims", "choose_int"]
