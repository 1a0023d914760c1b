"""Guards: the facts a compiled entry relies on, checked before it runs.

A :class:`Guard` is a check on the value at a :class:`Source`. The guards of one entry are
compiled together into straight-line Python inside the entry function (see ``codegen.py``):
each source's value is computed once into a local (``___s3 = ___s1._modules['fc']``) and
shared by every guard and graph input below it, so walking a module tree costs one dict read
per level. A second function built from the same guards returns the first failing guard's
description; ``EMBER_LOGS=recompiles`` prints it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ember.frontend.source import Source


@dataclasses.dataclass(eq=False)
class Guard:
    """``check(v, const)`` returns a boolean Python expression over the value expression ``v``;
    ``const(obj)`` interns an object the expression refers to and returns its name. A guard
    over several objects lists the ``others``: their values (locals shared with every other
    guard, computed once) come as ``check(v, const, *others)``."""
    source: Source | None
    kind: str
    check: Callable[..., str]
    detail: str = ""
    key: tuple = ()
    others: tuple = ()

    def describe(self) -> str:
        where = self.source.name() if self.source is not None else "global state"
        return f"{self.kind} {where}{': ' + self.detail if self.detail else ''}"


_SIMPLE_CONSTANTS = (bool, int, float, str, bytes, type(None), complex)


def constant_match(source: Source, value: Any) -> Guard:
    def check(v, const):
        if isinstance(value, (bool, type(None))):
            return f"{v} is {value!r}"
        if isinstance(value, float) and value != value:
            return f"type({v}) is float and {v} != {v}"
        return f"type({v}) is {const(type(value))} and {v} == {const(value)}"
    return Guard(source, "CONSTANT_MATCH", check, repr(value)[:60], ("const", source))


def id_match(source: Source, obj: Any) -> Guard:
    # Keeps obj alive; an id() check could be fooled by a freed object's reused address.
    return Guard(source, "ID_MATCH", lambda v, const: f"{v} is {const(obj)}",
                 _short_repr(obj), ("id", source))


def type_match(source: Source, typ: type) -> Guard:
    return Guard(source, "TYPE_MATCH", lambda v, const: f"type({v}) is {const(typ)}",
                 typ.__qualname__, ("type", source))


def len_match(source: Source, typ: type, n: int) -> Guard:
    return Guard(source, "LEN_MATCH",
                 lambda v, const: f"type({v}) is {const(typ)} and len({v}) == {n}",
                 f"{typ.__name__} of length {n}", ("len", source))


def dict_keys_match(source: Source, typ: type, keys: list) -> Guard:
    return Guard(source, "DICT_KEYS",
                 lambda v, const: f"type({v}) is {const(typ)} and list({v}) == {const(keys)}",
                 f"keys {keys!r}"[:80], ("keys", source))


def hasattr_match(source: Source, attr: str, present: bool) -> Guard:
    neg = "" if present else "not "
    return Guard(source, "HASATTR", lambda v, const: f"{neg}hasattr({v}, {attr!r})",
                 f"{neg}hasattr {attr}", ("hasattr", source, attr))


def not_in_instance_dict(source: Source, attr: str) -> Guard:
    """``attr`` was read from the object's class: an instance attribute of that name set
    later would shadow it."""
    return Guard(source, "NOT_IN_INSTANCE_DICT",
                 lambda v, const: f"{attr!r} not in {v}.__dict__",
                 f"{attr} from the class", ("not_in_instance_dict", source, attr))


def no_hooks(source: Source) -> Guard:
    """A module called from compiled code has no forward hooks (hooks are not traced yet)."""
    return Guard(source, "NO_HOOKS",
                 lambda v, const: f"not ({v}._forward_hooks or {v}._forward_pre_hooks)",
                 "", ("hooks", source))


def tensor_match(source: Source, example: torch.Tensor) -> Guard:
    """Type, dtype, device, sizes, strides and requires_grad of a tensor input."""
    typ, dtype, device = type(example), example.dtype, example.device
    shape, stride, rg = tuple(example.shape), example.stride(), example.requires_grad

    def check(v, const):
        return (f"type({v}) is {const(typ)} and {v}.dtype is {const(dtype)} and "
                f"{v}.device == {const(device)} and {v}.shape == {shape!r} and "
                f"{v}.stride() == {stride!r} and {v}.requires_grad is {rg}")
    return Guard(source, "TENSOR_MATCH", check,
                 f"{typ.__name__} {str(dtype)[6:]}{list(shape)} stride={stride} "
                 f"device={device} requires_grad={rg}", ("tensor", source))


def tensor_match_dynamic(source: Source, example: torch.Tensor, fake) -> Guard:
    """``tensor_match`` for an input with symbolic dims (``fake`` its symbolic fake): type,
    dtype, device, rank, requires_grad, the static dims' sizes, and the strides as the
    expressions of the sizes capture assumed (the same contiguity pattern: a contiguous
    input stays contiguous at any size). A stride with a symbol of its own (a strided view)
    is read by the graph and checked by the shape guards only. ``size()`` and ``stride()``
    are read once into locals (``TensorMetaSource``) that the shape guards share."""
    from ember.frontend.source import TensorMetaSource
    from ember.shapes import to_python
    typ, dtype, device = type(example), example.dtype, example.device
    rg, ndim = example.requires_grad, example.dim()
    sizes = list(fake.shape)
    dim_of = {}                 # size symbol -> the first dim whose size it is
    for d, s in enumerate(sizes):
        if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol:
            dim_of.setdefault(s.node.expr, d)
    strides = []                # (dim, text with "{sz}" for the sizes' local)
    for d, st in enumerate(fake.stride()):
        if not isinstance(st, torch.SymInt):
            strides.append((d, str(st)))
            continue
        try:
            strides.append((d, to_python(st.node.expr, lambda s: f"{{sz}}[{dim_of[s]}]")))
        except KeyError:
            pass
    static = [(d, s) for d, s in enumerate(sizes) if not isinstance(s, torch.SymInt)]

    def check(v, const, sz, st):
        parts = [f"type({v}) is {const(typ)}", f"{v}.dtype is {const(dtype)}",
                 f"{v}.device == {const(device)}", f"len({sz}) == {ndim}"]
        parts += [f"{sz}[{d}] == {n}" for d, n in static]
        if len(strides) == ndim:
            items = ", ".join(t.replace("{sz}", sz) for _, t in strides)
            parts.append(f"{st} == ({items}{',' if ndim == 1 else ''})")
        else:
            parts += [f"{st}[{d}] == {t.replace('{sz}', sz)}" for d, t in strides]
        parts.append(f"{v}.requires_grad is {rg}")
        return " and ".join(parts)
    shown = [str(s.node.expr) if isinstance(s, torch.SymInt) else str(s) for s in sizes]
    return Guard(source, "TENSOR_MATCH", check,
                 f"{typ.__name__} {str(dtype)[6:]}[{', '.join(shown)}] "
                 f"device={device} requires_grad={rg}", ("tensor", source),
                 (TensorMetaSource(source, "size"), TensorMetaSource(source, "stride")))


def call_result_match(source: Source, method, args: tuple, result) -> Guard:
    """A read-only builtin method of the object still answers the same (e.g. a registry
    dict's ``get(key)``)."""
    return Guard(source, "CALL_RESULT",
                 lambda v, const: f"{const(method)}({v}, *{const(args)}) == {const(result)}",
                 f"{getattr(method, '__qualname__', method)}{args!r}"[:80],
                 ("call", source, method, args))


def same_object(source: Source, other: Source) -> Guard:
    return Guard(source, "ALIAS", lambda v, const, o: f"{v} is {o}",
                 f"is {other.name()}", ("alias", source, other), (other,))


def all_distinct(sources: list[Source]) -> Guard:
    """The objects at ``sources`` are pairwise different objects."""
    first, others = sources[0], tuple(sources[1:])

    def check(v, const, *values):
        if len(values) == 1:
            return f"{v} is not {values[0]}"
        ids = ", ".join(f"id({x})" for x in (v, *values))
        return f"len({{{ids}}}) == {len(sources)}"
    return Guard(first, "DISTINCT", check,
                 "is not " + ", ".join(s.name() for s in others)[:60],
                 ("distinct", *sources), others)


def global_call_match(fn, result) -> Guard:
    """A query of global state (``torch._C._len_torch_dispatch_stack()``) answers the same."""
    name = getattr(fn, "__name__", repr(fn))
    return Guard(None, "GLOBAL_STATE", lambda v, const: f"{const(fn)}() == {result!r}",
                 f"{name}() == {result!r}", ("global_call", name))


def state_read_match(what: str, read, result, identity: bool = False) -> Guard:
    """A read of torch's process-wide state (``torch.backends.cudnn.enabled``, a process
    group) gives the same value, or with ``identity`` the same object."""
    op = "is" if identity else "=="
    return Guard(None, "GLOBAL_STATE", lambda v, const: f"{const(read)}() {op} {const(result)}",
                 f"{what} {op} {_short_repr(result)}", ("global_state", what))


def grad_mode(enabled: bool) -> Guard:
    return Guard(None, "GRAD_MODE",
                 lambda v, const: f"{const(torch.is_grad_enabled)}() is {enabled}",
                 f"torch.is_grad_enabled() is {enabled}", ("grad_mode",))


_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")


def autocast_state() -> tuple:
    """(device type, dtype, cache enabled) of each device type autocast is on for now."""
    if not torch._C._is_any_autocast_enabled():
        return ()
    cache = torch.is_autocast_cache_enabled()
    return tuple((d, torch.get_autocast_dtype(d), cache) for d in _AUTOCAST_DEVICES
                 if torch.is_autocast_enabled(d))


def autocast_match(state: tuple) -> Guard:
    """Autocast is on (and casts to the same dtypes) for the same devices as at capture:
    the graph's ops and result dtypes depend on it."""
    if not state:
        return Guard(None, "AUTOCAST",
                     lambda v, const: f"not {const(torch._C._is_any_autocast_enabled)}()",
                     "autocast off", ("autocast",))
    return Guard(None, "AUTOCAST",
                 lambda v, const: f"{const(autocast_state)}() == {const(state)}",
                 f"autocast {state}", ("autocast",))


def _short_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = object.__repr__(obj)
    return text if len(text) < 60 else text[:57] + "..."


class GuardSet:
    """The guards of one capture, deduplicated by (kind, source)."""

    def __init__(self):
        self.guards: list[Guard] = []
        self._keys: set = set()

    def add(self, guard: Guard) -> None:
        key = guard.key
        if key:
            try:
                hash(key)
            except TypeError:     # an unhashable constant (a slice before 3.12): by text
                key = repr(key)
            if key in self._keys:
                return
            self._keys.add(key)
        self.guards.append(guard)

    def __iter__(self):
        return iter(self.guards)

    def __len__(self):
        return len(self.guards)
