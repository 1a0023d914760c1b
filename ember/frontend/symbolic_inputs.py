"""Symbolic sizes in one capture: which input dims are symbols, the graph's size inputs, and
the shape guards the entry checks.

One :class:`SymbolicInputs` per :class:`~ember.frontend.output_graph.OutputGraph` owns the
capture's :class:`~ember.shapes.ShapeEnv`. An input tensor whose dims the policy makes
dynamic (``dynamic.py``) gets a symbolic fake (``ember.fake``'s ``from_real(...,
dynamic_dims=...)``); its size sources are ``TensorProperty(<frontend Source>, "size", d)``,
printed ``L['x'].size(0)``. An int argument the policy makes dynamic is a symbol whose
source is the argument itself (``L['n']``).

The backend contract (torch.compile's, so one backend path serves both frontends):

* every free symbol of the tensor inputs' sizes, strides and storage offsets, and of the
  sizes graph calls take, is a placeholder of its own named like the symbol (``s0``),
  before the tensor placeholders; its example input is the ``torch.SymInt`` (``.node.expr``
  the symbol, ``.node.hint`` its value) and the entry passes the plain int read from the
  input (``x.size(0)``);
* a size the graph needs (``x.view(-1, s0 // 2)``) is computed from those placeholders by
  ``operator`` nodes (``floordiv = s0 // 2``), never by ``x.size(0)`` calls in the graph;
* tensor placeholders keep the real tensor as their example input and carry the symbolic
  fake in ``meta["val"]``. A capture without symbols gives exactly the static graph.

Guards: each of the env's guards (duck equalities, ``>= 2`` lower bounds, relations the
program branched on, ``mark_dynamic`` bounds) becomes one frontend guard whose text reads
the inputs' sizes; static dims' sizes and the stride pattern are checked by the tensor's
own guard (``guards.tensor_match_dynamic``), so the env's guards that pin a static size
are left out. The entry reads each input's ``size()`` and ``stride()`` once
(``TensorMetaSource``) and checks all shape guards in one condition (``merged_guard``);
the diagnostic twin checks them one by one, so a recompile names the relation that failed.
The env's guards are collected after the backend compiled the graph: a backend deciding
on a size guards through the same env.
"""
from __future__ import annotations

import math
import operator
import weakref

import sympy
import torch
import torch.fx

from ember import logs
from ember.frontend import dynamic, guards as guards_mod
from ember.frontend.exc import Unsupported
from ember.frontend.source import Source, TensorMetaSource
from ember.shapes import ShapeEnv, to_python
from ember.shapes.functions import FloorDiv, Mod, TruncToInt
from ember.shapes.geometry import TensorProperty
from ember.shapes.printer import split_fraction


def property_source(prop) -> Source:
    """What the entry loads to read ``prop`` (a ``TensorProperty``, or the Source of an int
    argument): the tensor's ``size()``/``stride()`` (read once per call, indexed by every
    use), the tensor itself, or the int."""
    if not isinstance(prop, TensorProperty):
        return prop
    if prop.prop in ("size", "stride"):
        return TensorMetaSource(prop.tensor, prop.prop)
    return prop.tensor


def property_text(loaded: str, prop) -> str:
    """Python text reading ``prop`` from ``loaded``, the local of ``property_source(prop)``."""
    if not isinstance(prop, TensorProperty):
        return loaded
    if prop.prop in ("size", "stride"):
        return f"{loaded}[{prop.dim}]"
    if prop.prop == "storage_offset":
        return f"{loaded}.storage_offset()"
    return f"{loaded}.untyped_storage().nbytes()"


_BINARY = {FloorDiv: operator.floordiv, Mod: operator.mod, sympy.Eq: operator.eq,
           sympy.Ne: operator.ne, sympy.Lt: operator.lt, sympy.Le: operator.le,
           sympy.Gt: operator.gt, sympy.Ge: operator.ge}
_UNARY = {sympy.floor: math.floor, sympy.ceiling: math.ceil, TruncToInt: torch.sym_int,
          sympy.Abs: abs, sympy.Not: operator.not_}


class SymbolicInputs:
    def __init__(self, output, policy: bool | None, code, make_input, seen=None):
        self.output = output
        self.seen = seen                 # dynamic.SeenSizes of the compiled function
        self.make_input = make_input     # output_graph.GraphInput (which imports this module)
        self.policy = policy
        self.code = code
        self.env = ShapeEnv()
        # weakly: the env lives on in every fake tensor and SymInt of the graph a backend
        # may keep, and must not keep the capture's state (tracked objects) alive
        self.env.location = _location_of(weakref.ref(output))
        self.symbol_inputs: list = []                  # GraphInputs of symbols, in order
        self._by_symbol: dict = {}
        self._nodes: dict = {}                         # sympy expr -> FX node
        self.dynamic_dims: list[dynamic.DynamicDim] = []
        self.symbolic_tensors: list = []               # (source, fake, its DynamicDims)
        self.symbolic_ints: list = []                  # (DynamicDim, its SymInt)

    # -- inputs --------------------------------------------------------------------------------
    def fake_for(self, value: torch.Tensor, source):
        """A symbolic fake for input ``value`` if the policy makes some of its dims dynamic,
        else None."""
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return None
        dims = dynamic.choose_dims(self.policy, self.seen, self.code, source, value,
                                   self._module_owned(source))
        if not dims:
            return None
        fake = self.output.fake_mode.from_real(
            value, dynamic_dims={d.dim: (d.min, d.max, d.duck) for d in dims}, source=source)
        self.dynamic_dims += dims
        self.symbolic_tensors.append((source, fake, dims))
        for d in dims:
            if d.reason.startswith("automatic"):
                logs.log("recompiles", "%s: %s is dynamic from now on (%s)",
                         self.output.frame_name, f"{d.source}.size({d.dim})", d.reason)
        return fake

    def int_input(self, value: int, source):
        """A SymInt for the frame's int argument ``value`` if the policy makes it dynamic
        (``dynamic.choose_int``), else None; its type is guarded here, its value by the
        shape guards (``>= 2``, or ``== 0``/``== 1``: specialised)."""
        chosen = dynamic.choose_int(self.policy, self.seen, self.code, source, value)
        if chosen is None or value < 0:
            return None
        self.output.guards.add(guards_mod.type_match(source, int))
        sym = self.env.create_symint(value, source, duck=chosen.duck)
        if isinstance(sym, torch.SymInt):
            self.dynamic_dims.append(chosen)
            self.symbolic_ints.append((chosen, sym))
        return sym

    def _module_owned(self, source) -> bool:
        if source.is_under_module():
            return True
        modules = {vt.source for value, vt in self.output.tracked.values()
                   if isinstance(value, torch.nn.Module) and vt.source is not None}
        src = source.base
        while src is not None:
            if src in modules:
                return True
            src = src.base
        return False

    def _drop_specialized_symbols(self) -> None:
        """A size placeholder whose symbol capture later pinned to a number (a guard
        ``s0 - 1 == 1`` from broadcasting) is no graph input: its uses read the number, and
        the graph is the static one (torch's frontend hands over the same; a backend
        cannot compile an input whose "symbol" is 2 for every size symbolically)."""
        for sym, inp in list(self._by_symbol.items()):
            value = self.env.replace(sym)
            if not value.is_Integer:
                continue
            new = int(value)
            for user in list(inp.node.users):
                user.args, user.kwargs = torch.fx.node.map_arg(
                    (user.args, user.kwargs), lambda n: new if n is inp.node else n)
            self.output.graph.erase_node(inp.node)
            del self._by_symbol[sym]
            self.symbol_inputs.remove(inp)
            self._nodes = {k: n for k, n in self._nodes.items() if n is not inp.node}

    def symbol_node(self, sym: sympy.Symbol) -> torch.fx.Node:
        """The placeholder of size symbol ``sym`` (made on first use, before the tensors')."""
        found = self._by_symbol.get(sym)
        if found is not None:
            return found.node
        graph = self.output.graph
        if self.symbol_inputs:
            where = graph.inserting_after(self.symbol_inputs[-1].node)
        else:
            where = graph.inserting_before(next(iter(graph.nodes), None))
        with where:
            node = graph.placeholder(sym.name)
        value = self.env.wrap(sym, int)
        prop = self.env.source_of(sym)
        node.meta["val"] = value
        node.meta["source"] = prop
        source = prop.tensor if isinstance(prop, TensorProperty) else prop   # an int argument
        inp = self.make_input(node, source, value, size_of=prop)
        self.symbol_inputs.append(inp)
        self._by_symbol[sym] = inp
        return node

    def lift_input_symbols(self) -> None:
        """A placeholder for every symbol of the symbolic inputs' geometry."""
        found = set()
        for _, fake, _ in self.symbolic_tensors:
            for s in (*fake.shape, *fake.stride(), fake.storage_offset()):
                if isinstance(s, torch.SymInt):
                    found |= s.node.expr.free_symbols
        for sym in sorted(found, key=_index):
            if sym in self.env.symbols:
                self.symbol_node(sym)
        self._drop_specialized_symbols()
        # in symbol order (s0, s1, ...), whatever order capture needed them in
        self.symbol_inputs[:] = [inp for _, inp in sorted(self._by_symbol.items(),
                                                          key=lambda item: _index(item[0]))]
        if self.output.inputs:
            anchor = self.output.inputs[0].node
            for inp in self.symbol_inputs:
                anchor.prepend(inp.node)

    # -- sizes in the graph --------------------------------------------------------------------
    def node_for(self, value):
        """An FX argument computing the symbolic number ``value`` from the size placeholders
        (a plain number when it is one)."""
        node = self.expr_node(value.node.expr)
        if isinstance(value, torch.SymFloat):
            # a float whatever the expression computes (``floor``, a size: Python ints)
            key = ("float", value.node.expr)
            found = self._nodes.get(key)
            if found is None:
                # (``torch.sym_float``: ``float()`` would pin a backend's symbolic trace
                # to the value seen)
                found = self._nodes[key] = self._call(torch.sym_float, node) if isinstance(
                    node, torch.fx.Node) else float(node)
                if isinstance(found, torch.fx.Node):
                    found.meta["val"] = value
            node = found
        return node

    def expr_node(self, expr):
        expr = self.env.replace(expr)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:
            return float(expr)
        node = self._nodes.get(expr)
        if node is None:
            node = self._build(expr)
            if isinstance(node, torch.fx.Node) and "val" not in node.meta:
                node.meta["val"] = self.env.wrap(expr, _pytype(expr))
            self._nodes[expr] = node
        return node

    def _call(self, fn, *args):
        return self.output.graph.call_function(fn, tuple(args))

    def _build(self, e):
        go = self.expr_node
        if e.is_Symbol:
            if e not in self.env.symbols:
                error = Unsupported(f"size {e} has no input it is read from")
                error.symbolic_sizes = True
                raise error
            return self.symbol_node(e)
        if isinstance(e, sympy.Add):
            terms = sorted(sympy.Add.make_args(e), key=lambda t: t.is_Number)
            out = go(terms[0])
            for t in terms[1:]:
                coeff, _ = t.as_coeff_Mul()
                out = self._call(operator.sub, out, go(-t)) if coeff.is_negative else \
                    self._call(operator.add, out, go(t))
            return out
        if isinstance(e, sympy.Mul):
            num, den = split_fraction(e)
            out = go(num[0]) if num else 1
            for f in num[1:]:
                out = self._call(operator.mul, out, go(f))
            for d in den:
                out = self._call(operator.truediv, out, go(d))
            return out
        if isinstance(e, sympy.Pow):
            if e.exp == sympy.Rational(1, 2):
                return self._call(torch._sym_sqrt, go(e.base))    # (math.sqrt: a guard)
            if e.exp.is_Integer and e.exp.is_negative:
                return self._call(operator.truediv, 1, go(e.base ** -e.exp))
            return self._call(operator.pow, go(e.base), go(e.exp))
        if isinstance(e, (sympy.Max, sympy.Min)):
            fn = torch.sym_max if isinstance(e, sympy.Max) else torch.sym_min
            out = go(e.args[0])
            for a in e.args[1:]:
                out = self._call(fn, out, go(a))
            return out
        if isinstance(e, (sympy.And, sympy.Or)):
            fn = operator.and_ if isinstance(e, sympy.And) else operator.or_
            out = go(e.args[0])
            for a in e.args[1:]:
                out = self._call(fn, out, go(a))
            return out
        for cls, fn in _BINARY.items():
            if isinstance(e, cls):
                return self._call(fn, go(e.args[0]), go(e.args[1]))
        for cls, fn in _UNARY.items():
            if isinstance(e, cls):
                return self._call(fn, go(e.args[0]))
        error = Unsupported(f"size expression {e} cannot be computed in the graph")
        error.symbolic_sizes = True
        raise error

    # -- the entry -----------------------------------------------------------------------------
    def entry_text(self, expr, load, const) -> str:
        """Python text computing ``expr`` in the entry (``load(source)``: the local holding a
        source's value; ``const(obj)``: a name for an object)."""
        def name(sym):
            prop = self.env.source_of(sym)
            return property_text(load(property_source(prop)), prop)
        text = to_python(self.env.replace(expr), name)
        return _with_math(text, const)

    def shape_guards(self) -> list[guards_mod.Guard]:
        """The env's guards as frontend guards (see the module docstring)."""
        env = self.env
        covered = {source for source, _, _ in self.symbolic_tensors}
        out = []
        tensors: list = []          # the sources the guards load (sizes, strides, tensors)

        def token(prop):
            src = property_source(prop)
            if src not in tensors:
                tensors.append(src)
            return property_text(f"\0{tensors.index(src)}\0", prop)
        texts = env.guard_texts(token)
        readable = env.guard_texts(str)
        for i, (g, text, shown) in enumerate(zip(env.guards, texts, readable)):
            if g.kind == "specialized" and self._pins_covered_size(g, covered):
                continue
            used = [t for j, t in enumerate(tensors) if f"\0{j}\0" in text]
            if not used:
                continue
            out.append(_shape_guard(i, text, shown, g, used, tensors))
        return out

    def _pins_covered_size(self, g, covered) -> bool:
        for sym in g.expr.free_symbols:
            prop = self.env.source_symbols.get(sym)
            if isinstance(prop, TensorProperty) and prop.prop == "size" and \
                    prop.tensor in covered:
                return True
        return False

    def live_dynamic_dims(self) -> list:
        """The dynamic dims still symbolic at the end of capture (not specialised)."""
        return [d for _, fake, dims in self.symbolic_tensors for d in dims
                if isinstance(fake.shape[d.dim], torch.SymInt)
                and not fake.shape[d.dim].node.expr.is_Integer] + [
            d for d, sym in self.symbolic_ints if not sym.node.expr.is_Integer]

    def check_marks(self) -> None:
        """A ``mark_dynamic`` dim the program specialised is an error (as in torch)."""
        for source, fake, dims in self.symbolic_tensors:
            for d in dims:
                size = fake.shape[d.dim]
                if not d.strict or not isinstance(size, torch.SymInt) or \
                        not size.node.expr.is_Integer:
                    continue
                where = [g.location for g in self.env.guards if g.kind == "evaluate"
                         and isinstance(g.expr, sympy.Eq)
                         and size.node._expr.free_symbols & g.expr.free_symbols]
                raise dynamic.ConstraintViolation(
                    f"ember.mark_dynamic({d.source}, {d.dim}): the program specialised this "
                    f"dim to the constant {int(size.node.expr)}"
                    f"{' at ' + where[0] if where else ''}; remove the mark, or use "
                    f"ember.maybe_mark_dynamic to allow it")


def _location_of(output_ref):
    def location() -> str:
        output = output_ref()
        where = output.location() if output is not None else ""
        return where.splitlines()[-1] if where else "<unknown>"
    return location


def _index(sym) -> int:
    return int(sym.name[1:])


def _pytype(expr) -> type:
    if isinstance(expr, (sympy.Rel, sympy.logic.boolalg.BooleanFunction)):
        return bool
    return int if expr.is_integer else float


def _with_math(text: str, const) -> str:
    return text.replace("math.", f"{const(math)}.") if "math." in text else text


def _shape_guard(index: int, text: str, shown: str, g, used: list, tensors: list):
    first, others = used[0], tuple(used[1:])
    order = [tensors.index(t) for t in used]

    def check(v, const, *values):
        out = text
        for j, local in zip(order, (v, *values)):
            out = out.replace(f"\0{j}\0", local)
        return _with_math(out, const)
    return guards_mod.Guard(first, "SHAPE", check, f"{shown}  ({g.kind}, from {g.location})",
                            ("shape", index), others)


def merged_guard(guards: list[guards_mod.Guard]) -> guards_mod.Guard:
    """One guard checking all of ``guards`` in one ``if`` (the entry's fast path; the
    diagnostic twin checks them one by one to name the one that failed)."""
    sources: list = []
    for g in guards:
        for src in (g.source, *g.others):
            if src not in sources:
                sources.append(src)

    def check(v, const, *values):
        local = dict(zip(sources, (v, *values)))
        return " and ".join(f"({g.check(local[g.source], const, *[local[o] for o in g.others])})"
                            for g in guards)
    return guards_mod.Guard(sources[0], "SHAPE", check, f"{len(guards)} shape guards", (),
                            tuple(sources[1:]))


__all__ = ["SymbolicInputs", "property_text", "property_source", "merged_guard"]
