"""The shape environment: size symbols, their hints and ranges, and the guards on them.

    env = ShapeEnv()
    s0 = env.create_symint(8, "L['x'].size(0)")       # torch.SymInt over symbol s0, hint 8
    torch.empty(s0, 3, device="meta")                 # meta kernels compute with it
    if s0 > 4: ...                                    # guard "L['x'].size(0) > 4", recorded
    env.guards_as_python()                            # text a compiled entry checks
    env.first_failing_guard({"L['x'].size(0)": 3})    # the guard a new size breaks, or None

Decisions
---------
* **One symbol per input size**, named ``s0, s1, ...`` in creation order, created with
  ``integer=True, positive=True`` (without them sympy keeps ``floor(s0)`` and ``Abs(s0)``).
  Each symbol keeps its *hint* (the value seen when it was created) and its *sources*: the
  keys (strings, or the frontend's Source objects) of the places the size was read from.
* **0/1 specialisation.** A size 0 or 1 becomes the constant itself, with a guard
  ``source == 0`` / ``== 1``: broadcasting, contiguity and empty-tensor paths differ for them,
  so one program cannot serve them and sizes >= 2 alike. Every symbol therefore has the
  range ``[2, oo]`` (narrowed by ``min``/``max``), which decides most of the questions meta
  kernels ask (``s0 == 1``? ``s0 == 0``? ``s0 * s1 == 0``?) without a guard; its lower bound
  is itself a guard (``source >= 2``) so a later size 0 or 1 fails the entry.
* **Duck sizing** (``duck_shape=True``, the default): a new dynamic size equal to the hint of
  an existing symbol reuses that symbol, with the guard ``new_source == first_source``.
  Input dims of equal size are usually equal by construction (a batch dim, a hidden size);
  sharing the symbol saves guards and keeps later equalities static.
* **Evaluating is guarding.** :meth:`ShapeEnv.evaluate` answers a question about symbols
  (``bool(s0 > 16)``, ``int(s0 * 2)``) from the ranges when they decide it, without a guard;
  otherwise from the hints, and records a :class:`Guard`: the expression oriented to be true
  at the hints, its value, and the user's ``file:line`` (the first stack frame outside
  ``ember/`` and ``torch/``). Guards refine what is known: ``s0 > 16`` raises ``s0``'s
  lower bound to 17; ``s1 == s0`` replaces ``s1`` by ``s0`` in every later expression;
  ``s0 == 5`` (from ``int(s0)``) replaces ``s0`` by 5 (a symbol equal to a compound
  expression is not replaced). Equal guards are recorded once.
* **Simplification** is sympy's automatic one plus the rules of ``functions.py`` and, in
  :meth:`simplify`, ``Max``/``Min`` whose order the ranges decide. No ``sympy.simplify``:
  it is slow and its results are not predictable.
* **Guards as Python.** :meth:`guards_as_python` writes every guard (specialisations, duck
  equalities, lower bounds, recorded guards, in creation order) as one ``and`` expression
  over the sources' text; :meth:`first_failing_guard` evaluates the same text, guard by
  guard, at new concrete sizes, so what is checked is what is printed.
"""
from __future__ import annotations

import builtins
import dataclasses
import functools
import os
import sys
from typing import Any, Hashable, Mapping, Sequence

import sympy

from ember.shapes import printer
from ember.shapes.functions import FloorDiv, Mod
from ember.shapes.node import SymNode
from ember.shapes.ranges import ValueRange, bound, static_truth

_EMBER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@functools.lru_cache(maxsize=None)
def _torch_dir() -> str:
    import torch
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def user_location() -> str:
    """``file:line`` of the innermost stack frame outside ``ember/`` and ``torch/``."""
    torch_dir = _torch_dir()
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith((_EMBER_DIR, torch_dir)):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


@dataclasses.dataclass
class Guard:
    """A fact about sizes the compiled program relies on.

    ``expr`` is a sympy boolean over size symbols, true at the hints; ``kind`` says why it
    exists: ``"specialized"`` (a size 0/1 or static dim), ``"duck"`` (two sources share a
    symbol), ``"range"`` (a symbol's declared bounds), ``"evaluate"`` (user or torch code
    branched on a size, or converted one to a Python number)."""
    expr: sympy.Basic
    kind: str
    location: str
    value: Any = True            # for "evaluate": what the evaluated expression was

    def python(self, names) -> str:
        return printer.to_python(self.expr, names)


class GuardFailure(RuntimeError):
    """Raised by :meth:`ShapeEnv.check_guards`: the first guard new sizes break."""

    def __init__(self, guard: Guard, text: str):
        super().__init__(f"size guard failed: {text} (from {guard.location})")
        self.guard = guard
        self.text = text


@dataclasses.dataclass
class _SymbolInfo:
    hint: int
    sources: list
    range: ValueRange


class ShapeEnv:
    """Size symbols, their hints, ranges and replacements, and the guards recorded on them."""

    def __init__(self, *, duck_shape: bool = True, specialize_zero_one: bool = True):
        self.duck_shape = duck_shape
        self.specialize_zero_one = specialize_zero_one
        self.symbols: dict[sympy.Symbol, _SymbolInfo] = {}
        self.guards: list[Guard] = []
        self._guard_exprs: set = set()
        # static_value's answers, cleared when a range or replacement changes (code
        # generation asks the same few questions of every kernel: BERT's symbolic Triton
        # program spent 33 s on them)
        self._static_values: dict = {}
        self.replacements: dict[sympy.Symbol, sympy.Expr] = {}
        self._by_hint: dict[int, sympy.Symbol] = {}
        # place-holders for the sources of specialised and duck-sized sizes, see
        # _source_symbol; they occur only in guards
        self.source_symbols: dict[sympy.Symbol, Hashable] = {}
        # where a guard comes from: by default the innermost stack frame outside Ember and
        # torch; a capture that evaluates the user's code symbolically sets its own
        self.location = user_location

    # -- creating sizes ---------------------------------------------------------------------

    def create_symbol(self, hint: int, source: Hashable, *, dynamic: bool = True,
                      min: int | None = None, max: int | None = None,
                      duck: bool = True) -> sympy.Expr:
        """The sympy expression for a size read from ``source`` whose value now is ``hint``:
        a new (or, with duck sizing, shared) symbol, or ``Integer(hint)`` for a static size
        or a specialised 0/1, with the guard that justifies it. ``duck=False``: a symbol of
        its own, never shared (strides and offsets equal to a size only by coincidence)."""
        hint = int(hint)
        if hint < 0:
            raise ValueError(f"a size is >= 0, got {hint} for {source}")
        location = self.location()
        if not dynamic or (self.specialize_zero_one and hint in (0, 1)):
            value = sympy.Integer(hint)
            self._add_guard(sympy.Eq(self._source_symbol(source), value), "specialized",
                            location)
            return value
        lower = 2 if self.specialize_zero_one else 0
        lower = lower if min is None else builtins.max(lower, int(min))
        upper = sympy.oo if max is None else sympy.Integer(int(max))
        if not lower <= hint <= upper:
            raise ValueError(f"size {hint} of {source} is outside its range [{lower}, {upper}]")
        duck = duck and self.duck_shape and min is None and max is None
        if duck and hint in self._by_hint:
            sym = self._by_hint[hint]
            self.symbols[sym].sources.append(source)
            self._add_guard(sympy.Eq(self._source_symbol(source), sym), "duck", location)
            return sym
        sign = {"positive": True} if lower > 0 else {"nonnegative": True}
        sym = sympy.Symbol(f"s{len(self.symbols)}", integer=True, **sign)
        self.symbols[sym] = _SymbolInfo(hint, [source], ValueRange.of(lower, upper))
        if duck:
            self._by_hint.setdefault(hint, sym)
        self._add_guard(sympy.Ge(sym, lower), "range", location)
        if upper != sympy.oo:
            self._add_guard(sympy.Le(sym, upper), "range", location)
        return sym

    def _source_symbol(self, source) -> sympy.Symbol:
        """A symbol standing for one source's size in the guard of a size that got no
        symbol of its own (specialised, or duck-sized onto another source's symbol)."""
        sym = sympy.Symbol(f"src{len(self.source_symbols)}", integer=True, nonnegative=True)
        self.source_symbols[sym] = source
        return sym

    def create_symint(self, hint: int, source: Hashable, **kwargs):
        """:meth:`create_symbol` wrapped for torch: a ``torch.SymInt`` or a plain int."""
        return self.wrap(self.create_symbol(hint, source, **kwargs), int)

    def create_sizes(self, sizes: Sequence[int], sources: Sequence[Hashable], **kwargs) -> list:
        """``create_symint`` for each dim of a shape (``sources[i]`` reads dim ``i``)."""
        if len(sizes) != len(sources):
            raise ValueError(f"{len(sizes)} sizes but {len(sources)} sources")
        return [self.create_symint(h, s, **kwargs) for h, s in zip(sizes, sources)]

    def wrap(self, expr, pytype: type = int):
        """A ``torch.SymInt``/``SymFloat``/``SymBool`` over ``expr``, or the Python constant
        if ``expr`` is a number."""
        return SymNode(sympy.sympify(expr), self, pytype).wrapped()

    # -- what is known ----------------------------------------------------------------------

    def source_of(self, sym: sympy.Symbol):
        return self.symbols[sym].sources[0]

    def hint_of(self, sym: sympy.Symbol) -> int:
        return self.symbols[sym].hint

    def range_of(self, sym: sympy.Symbol) -> ValueRange | None:
        info = self.symbols.get(sym)
        return info.range if info is not None else None

    def replace(self, expr):
        """``expr`` with the replacements learnt from equality guards applied."""
        expr = sympy.sympify(expr)
        if not self.replacements or not expr.free_symbols & self.replacements.keys():
            return expr
        return expr.xreplace(self.replacements)

    def simplify(self, expr):
        """Replacements applied, and what the ranges decide folded: ``Max``/``Min`` of
        ordered arguments, ``a % b -> a`` and ``a // b -> 0`` where ``0 <= a < b``."""
        expr = self.replace(expr)
        if not expr.has(sympy.Max, sympy.Min, FloorDiv, Mod):
            return expr

        def known(fact) -> bool:
            return static_truth(fact, self.range_of) is True

        def fold(e):
            if isinstance(e, (sympy.Max, sympy.Min)):
                bigger = isinstance(e, sympy.Max)
                for a in e.args:
                    if all(known(sympy.Ge(a, b) if bigger else sympy.Le(a, b))
                           for b in e.args if b is not a):
                        return a
            elif isinstance(e, (FloorDiv, Mod)):
                a, b = e.args
                if known(sympy.Ge(a, 0)) and known(sympy.Lt(a, b)):
                    return a if isinstance(e, Mod) else sympy.Integer(0)
            return e
        return expr.replace(lambda e: isinstance(e, (sympy.Max, sympy.Min, FloorDiv, Mod)),
                            fold)

    def bound(self, expr) -> ValueRange:
        return bound(self.replace(expr), self.range_of)

    def static_value(self, expr):
        """The value of ``expr`` if it is the same for every value in the ranges, else
        ``None``: numbers, and booleans the ranges decide."""
        if expr not in self._static_values:
            self._static_values[expr] = self._static_value(expr)
        return self._static_values[expr]

    def _static_value(self, expr):
        expr = self.simplify(expr)
        if expr.is_Number:
            return expr
        if _is_boolean(expr):
            truth = static_truth(expr, self.range_of)
            return None if truth is None else sympy.true if truth else sympy.false
        r = self.bound(expr)
        return r.lower if r.is_singleton() and r.lower.is_finite else None

    def statically_known_true(self, value) -> bool:
        """True if ``value`` (a SymBool, bool or sympy boolean) holds for every value in the
        ranges; never records a guard."""
        return self.static_value(_expr_of(value)) is sympy.true

    def hint_value(self, expr):
        """The value of ``expr`` at the hints (a sympy number or boolean)."""
        expr = self.replace(expr)
        return expr.xreplace({s: sympy.Integer(i.hint) for s, i in self.symbols.items()
                              if s in expr.free_symbols})

    # -- guarding ---------------------------------------------------------------------------

    def evaluate(self, expr):
        """The value of ``expr`` at the hints as a sympy number or boolean. Records a guard
        unless the ranges decide the value."""
        expr = self.replace(sympy.sympify(expr))
        known = self.static_value(expr)
        if known is not None:
            return known
        value = self.hint_value(expr)
        if _is_boolean(expr):
            if value not in (sympy.true, sympy.false):
                raise RuntimeError(f"cannot evaluate {expr} at the hints (got {value})")
            fact = _canonical(expr if value is sympy.true else sympy.Not(expr))
        else:
            if not value.is_Number and value.is_number:     # sqrt(6): the nearest double
                value = sympy.Float(float(value.evalf(30)))
            if not value.is_Number:
                raise RuntimeError(f"cannot evaluate {expr} at the hints (got {value})")
            fact = sympy.Eq(expr, value)
        self._add_guard(fact, "evaluate", self.location(), value=value)
        return value

    def guard_int(self, value) -> int:
        """``int(value)`` for a SymInt or sympy expression, guarding on it."""
        return int(self.evaluate(_expr_of(value)))

    def guard_bool(self, value) -> bool:
        """``bool(value)`` for a SymBool or sympy boolean, guarding on it."""
        return bool(self.evaluate(_expr_of(value)))

    def guard_float(self, value) -> float:
        return float(self.evaluate(_expr_of(value)))

    def _add_guard(self, fact, kind: str, location: str, value=True):
        if fact in self._guard_exprs or fact is sympy.true:
            return
        self._guard_exprs.add(fact)
        self.guards.append(Guard(fact, kind, location, value))
        if kind == "evaluate":
            self._learn(fact)

    def _learn(self, fact):
        """Narrow ranges and add replacements from a guard that now holds."""
        if isinstance(fact, sympy.And):
            for a in fact.args:
                self._learn(a)
            return
        if not isinstance(fact, sympy.Rel) or isinstance(fact, sympy.Ne):
            return
        diff = self.replace(fact.lhs - fact.rhs)
        syms = diff.free_symbols
        if isinstance(fact, sympy.Eq):
            self._learn_equality(diff)
            return
        if len(syms) != 1:
            return
        (sym,) = syms
        coeff = diff.coeff(sym)
        const = diff - coeff * sym
        if coeff not in (1, -1) or not const.is_Integer:
            return
        # fact is "coeff*sym + const OP 0", OP one of > >= < <=
        strict = isinstance(fact, (sympy.StrictGreaterThan, sympy.StrictLessThan))
        greater = isinstance(fact, (sympy.StrictGreaterThan, sympy.GreaterThan))
        if coeff == -1:
            greater = not greater
        limit = -const * coeff            # sym OP' limit
        r = self.symbols[sym].range
        if greater:
            new = ValueRange(sympy.Max(r.lower, limit + 1 if strict else limit), r.upper)
        else:
            new = ValueRange(r.lower, sympy.Min(r.upper, limit - 1 if strict else limit))
        self.symbols[sym].range = new
        self._static_values.clear()

    def _learn_equality(self, diff):
        """``diff == 0`` holds: if it says a symbol equals another symbol or a number, the
        newer symbol is replaced by it everywhere. (A symbol equal to a compound expression
        is not replaced: the expression's bounds would lose the symbol's own range.)"""
        for sym in sorted(diff.free_symbols & self.symbols.keys(), key=self._creation_index,
                          reverse=True):
            coeff = diff.coeff(sym)
            value = -(diff - coeff * sym) * coeff
            if coeff not in (1, -1) or not (value.is_Symbol or value.is_Integer):
                continue
            self.replacements = {s: e.xreplace({sym: value})
                                 for s, e in self.replacements.items()}
            self.replacements[sym] = value
            if value.is_Symbol:
                self.symbols[value].range = self.symbols[value].range.intersect(
                    self.symbols[sym].range)
            self._static_values.clear()
            return

    def _creation_index(self, sym) -> int:
        return int(sym.name[1:])

    # -- guards as Python -------------------------------------------------------------------

    def _names(self, source_names):
        """A function symbol -> text: its first source's text (``source_names`` maps a
        source to its text, or is a function of it; by default ``str(source)``)."""
        if source_names is None:
            text_of = str
        elif callable(source_names):
            text_of = source_names
        else:
            text_of = source_names.__getitem__

        def name(sym):
            if sym in self.source_symbols:
                return text_of(self.source_symbols[sym])
            return text_of(self.symbols[sym].sources[0])
        return name

    def guard_texts(self, source_names=None) -> list[str]:
        """Each guard as a Python expression over the sources' text."""
        names = self._names(source_names)
        return [g.python(names) for g in self.guards]

    def guards_as_python(self, source_names=None) -> str:
        """All guards as one Python expression (``True`` if there are none); it needs the
        globals in ``printer.GUARD_GLOBALS``."""
        texts = self.guard_texts(source_names)
        return " and ".join(texts) if texts else "True"

    def first_failing_guard(self, sizes: Mapping) -> Guard | None:
        """The first guard that the concrete ``sizes`` (source -> int, for every source)
        break, or ``None`` if all hold. Evaluates each guard's Python text."""
        keys = list(sizes)
        variables = {f"_v{i}": int(sizes[k]) for i, k in enumerate(keys)}
        index = {k: f"_v{i}" for i, k in enumerate(keys)}

        def text_of(source):
            try:
                return index[source]
            except KeyError:
                raise KeyError(f"no size given for source {source!r}") from None
        for guard, text in zip(self.guards, self.guard_texts(text_of)):
            if not eval(text, dict(printer.GUARD_GLOBALS), dict(variables)):
                return guard
        return None

    def check_guards(self, sizes: Mapping) -> None:
        """Raise :class:`GuardFailure` naming the first guard ``sizes`` break."""
        failed = self.first_failing_guard(sizes)
        if failed is not None:
            raise GuardFailure(failed, failed.python(self._names(None)))

    def format_guards(self, source_names=None) -> str:
        """One line per guard: its text, its kind and where it came from (for logs)."""
        return "\n".join(f"{text}  # {g.kind}, {g.location}"
                         for g, text in zip(self.guards, self.guard_texts(source_names)))


def _expr_of(value):
    node = getattr(value, "node", None)      # torch.SymInt/SymFloat/SymBool
    return node.expr if node is not None else sympy.sympify(value)


def _is_boolean(expr) -> bool:
    # not isinstance(expr, Boolean): a sympy Symbol is a Boolean too
    return isinstance(expr, (sympy.Rel, sympy.logic.boolalg.BooleanFunction,
                             sympy.logic.boolalg.BooleanAtom))


def _canonical(fact):
    """``s0 - 12 >= 0`` as ``s0 >= 12``: constants to the right of a comparison."""
    if not isinstance(fact, sympy.Rel):
        return fact
    diff = fact.lhs - fact.rhs
    const, rest = diff.as_coeff_Add()
    if const == 0 or rest == 0:
        return fact
    out = type(fact)(rest, -const)
    return out if isinstance(out, sympy.Rel) else fact


__all__ = ["ShapeEnv", "Guard", "GuardFailure", "user_location"]
