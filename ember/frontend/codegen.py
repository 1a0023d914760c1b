"""The entry function: guards, graph call and output reconstruction as generated Python.

For each capture Ember writes one function with the frame's own signature::

    def forward(self, x):
        try:
            ___s0 = x
            if not (type(___s0) is ___c0 and ___s0.dtype is ___c1 ...): return ___MISS
            ___s1 = self._modules['fc']
            if not (___s1 is ___c2): return ___MISS
            ...
        except Exception:
            return ___MISS
        ___out = ___graph(___s0, ___s1._parameters['weight'], ...)
        return (___out[0], ___s0)

Generated Python source (rather than hand-assembled bytecode) keeps the function readable in
``EMBER_DEBUG_DIR`` dumps and the same on every CPython version. Objects the code refers to
(expected types, modules, the compiled graph) are free variables of the function, bound by a
factory, so the user's globals are never touched. Each source's value is computed once into a
local (``___sN``) and shared by all guards and graph inputs under it.
"""
from __future__ import annotations

import inspect
import itertools
import types
from typing import Any, Callable

import torch

from ember.frontend.guards import Guard
from ember.frontend.source import ConstantSource, LocalSource, Source

_LITERAL_TYPES = (int, str, bool, type(None), bytes)


def signature_of(code: types.CodeType) -> str:
    """The parameter list of ``code`` as source text (no defaults; those are set after)."""
    names = code.co_varnames
    npos, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    parts = list(names[:npos])
    if nposonly:
        parts.insert(nposonly, "/")
    kwonly = list(names[npos:npos + nkw])
    idx = npos + nkw
    if code.co_flags & inspect.CO_VARARGS:
        parts.append("*" + names[idx])
        idx += 1
    elif kwonly:
        parts.append("*")
    parts += kwonly
    if code.co_flags & inspect.CO_VARKEYWORDS:
        parts.append("**" + names[idx])
    return ", ".join(parts)


def arg_names(code: types.CodeType) -> list[str]:
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return list(code.co_varnames[:n])


class EntryCodegen:
    """Builds the source of one entry function and the objects it refers to."""

    def __init__(self, fn: types.FunctionType):
        self.fn = fn
        self.consts: dict[str, Any] = {}
        self._const_ids: dict[int, str] = {}
        self._counter = itertools.count()
        self._source_locals: dict[Source, str] = {}
        self.lines: list[str] = []            # where load() emits assignments
        # graph outputs, in the order reconstruction asked for them: id(node) -> index
        self.graph_outputs: dict[int, int] = {}
        self.output_nodes: list[torch.fx.Node] = []
        self._reconstructed: dict[int, str] = {}
        # iterators over dicts passed to a resume function (convert._remaining_items)
        self.iterator_names: dict[int, str] = {}
        self.iterator_lines: list[str] = []
        self.made_iterators: set[int] = set()   # container_iterators.claim_iterator

    # -- names ---------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self._counter)}"

    def const(self, obj: Any) -> str:
        key = id(obj)
        name = self._const_ids.get(key)
        if name is None:
            name = f"___c{len(self.consts)}"
            self.consts[name] = obj
            self._const_ids[key] = name
        return name

    def load(self, source: Source) -> str:
        """A local holding the source's value, computed once (parents first)."""
        name = self._source_locals.get(source)
        if name is not None:
            return name
        if isinstance(source, ConstantSource):
            return source.slot
        if isinstance(source, LocalSource):
            return source.local      # a parameter of the entry function: no copy needed
        base = source.base
        expr = source.render(self.load(base)) if base is not None else source.expr()
        name = self.fresh("___s")
        self.lines.append(f"{name} = {expr}")
        self._source_locals[source] = name
        return name

    # -- guards ----------------------------------------------------------------------------------
    def guard_lines(self, guards: list[Guard], on_fail: Callable[[Guard], str]) -> list[str]:
        saved, self.lines = self.lines, []
        for guard in guards:
            v = self.load(guard.source) if guard.source is not None else ""
            others = [self.load(s) for s in guard.others]
            self.lines.append(f"if not ({guard.check(v, self.const, *others)}): "
                              f"{on_fail(guard)}")
        out, self.lines = self.lines, saved
        return out

    # -- reconstruction ------------------------------------------------------------------------
    def reconstruct(self, vt) -> str:
        """An expression for the value ``vt`` stands for, after the graph has run (each
        tracker's ``reconstruct``; a value rebuilt into a temporary is rebuilt once)."""
        memo = self._reconstructed.get(id(vt))
        return memo if memo is not None else vt.reconstruct(self)

    def literal(self, value) -> str:
        """Python source for a constant: a literal when it has one, else a held object."""
        if type(value) in _LITERAL_TYPES or (type(value) is float and value == value
                                             and value not in (float("inf"), float("-inf"))):
            return repr(value)
        return self.const(value)

    def graph_output(self, node: torch.fx.Node) -> int:
        """The index of ``node`` among the graph's outputs (added on first use)."""
        idx = self.graph_outputs.get(id(node))
        if idx is None:
            idx = self.graph_outputs[id(node)] = len(self.output_nodes)
            self.output_nodes.append(node)
        return idx

    def items(self, items) -> str:
        """Rebuilt items as the inside of a tuple display (``a, b`` or ``a,``)."""
        parts = [self.reconstruct(v) for v in items]
        return ", ".join(parts) + ("," if len(parts) == 1 else "")

    def temp(self, vt, text: str) -> str:
        """Build ``vt`` once into a temporary (mutable values keep one identity)."""
        name = self.fresh("___t")
        self.lines.append(f"{name} = {text}")
        self._reconstructed[id(vt)] = name
        return name

    # -- assembly ----------------------------------------------------------------------------
    def build(self, guard_lines: list[str], body: list[str], name: str) -> tuple[str, Callable]:
        """Source text of the entry function and the function itself."""
        code = self.fn.__code__
        params = signature_of(code)
        inner = [f"    def {name}({params}):", "        try:"]
        inner += [f"            {line}" for line in guard_lines] or ["            pass"]
        inner += ["        except Exception:", "            return ___MISS"]
        inner += [f"        {line}" for line in body]
        free = ["___G", "___closure", "___builtins", "___MISS", *self.consts]
        src = "\n".join([f"def ___make_{name}({', '.join(free)}):", *inner,
                         f"    return {name}", ""])
        return src, self._instantiate(src, name, free)

    def _instantiate(self, src: str, name: str, free: list[str]) -> Callable:
        namespace: dict[str, Any] = {}
        exec(compile(src, f"<ember entry {self.fn.__qualname__}>", "exec"), namespace)
        fn = self.fn
        values = {"___G": fn.__globals__, "___closure": fn.__closure__ or (),
                  "___builtins": fn.__globals__.get("__builtins__", __builtins__),
                  **self.consts}
        if isinstance(values["___builtins"], types.ModuleType):
            values["___builtins"] = values["___builtins"].__dict__
        values["___MISS"] = self.miss
        made = namespace[f"___make_{name}"](*[values[k] for k in free])
        made.__defaults__ = fn.__defaults__
        made.__kwdefaults__ = fn.__kwdefaults__
        return made

    miss: Any = None
    # sympy expression of sizes -> entry text computing it from the inputs (convert.py)
    shape_text: Any = None

    def size_expression(self, value) -> str:
        """Text computing the symbolic number ``value`` from the inputs' sizes (a float for a
        ``SymFloat``: ``math.floor`` and sizes are ints in Python)."""
        text = self.shape_text(value.node.expr)
        return f"float({text})" if isinstance(value, torch.SymFloat) else f"({text})"


def new_function(code, f_globals, name, defaults, kwdefaults, closure=()):
    """Rebuild a function the compiled code defined (a nested def or lambda, with the cells
    it closes over)."""
    fn = types.FunctionType(code, f_globals, name, defaults or None, closure or None)
    fn.__kwdefaults__ = kwdefaults or None
    return fn


def new_object(cls, attrs: dict):
    """Rebuild an object the compiled code created: instance of cls with these attributes."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj
