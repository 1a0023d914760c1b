"""The symbolic evaluator: runs a frame's bytecode over VariableTrackers.

One handler per opcode (``@handler("LOAD_FAST")``), registered by name, so CPython 3.11 and
3.12 share every handler whose opcode exists in both; the few differences in how an opcode
behaves are in ``_VERSION`` below. Calls to user functions are inlined by a child translator
that shares the parent's OutputGraph. Anything the evaluator cannot handle raises
:class:`Unsupported` with the user's file:line; the caller then runs the frame eagerly.
"""
from __future__ import annotations

import builtins
import collections.abc
import dis
import inspect
import operator
import sys
import types
from typing import Any, Callable

import torch

from ember import config
from ember.frontend.bytecode import Instruction, disassemble
from ember.frontend import registry
from ember.frontend.exc import ObservedException, Unsupported
from ember.frontend.output_graph import OutputGraph
from ember.frontend.source import AttrSource, GlobalSource, Source
from ember.frontend.variables import builder
from ember.frontend.variables.base import ConstantVariable, NotConstant, VariableTracker
from ember.frontend.variables.builtins import apply_operator
from ember.frontend.variables.container_iterators import ListIteratorVariable
from ember.frontend.variables.containers import (BaseSequenceVariable, ListVariable, SizeVariable,
                                                 SliceVariable, TupleVariable)
from ember.frontend.variables.dicts import (DictVariable, DictViewVariable, SetVariable,
                                            hashable_key)
from ember.frontend.variables.functions import (BaseUserFunctionVariable, CellRefVariable,
                                                CellVariable,
                                                HandlerFunctionVariable,
                                                NestedUserFunctionVariable)
from ember.frontend.variables.objects import (DataclassDictVariable, ExceptionVariable,
                                              NewModuleVariable,
                                              NNModuleVariable, SuperVariable,
                                              UserDefinedObjectVariable)
from ember.frontend.variables.storage import UntypedStorageVariable, same_storage
from ember.frontend.variables.tensor import TensorVariable

PY312 = sys.version_info >= (3, 12)

# How opcodes that exist in both versions differ.
_VERSION = {
    # After FOR_ITER is exhausted: 3.12 jumps to END_FOR's successor with the iterator popped.
    "for_iter_skips_end_for": PY312,
}

_BINARY_OPS: dict[str, Callable] = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
    "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_,
    "**": operator.pow, ">>": operator.rshift, "-": operator.sub, "/": operator.truediv,
    "^": operator.xor, "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv,
    "<<=": operator.ilshift, "@=": operator.imatmul, "*=": operator.imul,
    "%=": operator.imod, "|=": operator.ior, "**=": operator.ipow, ">>=": operator.irshift,
    "-=": operator.isub, "/=": operator.itruediv, "^=": operator.ixor,
}
_COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
                ">": operator.gt, ">=": operator.ge}

HANDLERS: dict[str, Callable[["InstructionTranslator", Instruction], None]] = {}


def handler(*opnames: str):
    def deco(fn):
        for name in opnames:
            HANDLERS[name] = fn
        return fn
    return deco


class _Null(VariableTracker):
    """The NULL that CPython pushes below a callable (PUSH_NULL, LOAD_GLOBAL's low bit)."""

    def __repr__(self):
        return "NULL"


NULL = _Null()


class _LazyLocal:
    """A frame argument not yet read: wrapped (and guarded) on first use."""
    __slots__ = ("value", "source")

    def __init__(self, value, source):
        self.value = value
        self.source = source


class _Return(Exception):
    pass


_DISASSEMBLED: dict = {}      # code -> (instructions, index by id): read, never changed


def _disassembled(code):
    """``disassemble(code)`` once per code object: a model inlines each block's forward many
    times (resnet50: 325 inlines of a dozen functions)."""
    found = _DISASSEMBLED.get(code)
    if found is None:
        if len(_DISASSEMBLED) >= 1024:
            _DISASSEMBLED.clear()
        instructions = disassemble(code)
        found = _DISASSEMBLED[code] = (instructions,
                                       {id(inst): i for i, inst in enumerate(instructions)})
    return found


class InstructionTranslator:
    """Evaluates one code object. The root translator owns the OutputGraph; inlined calls
    run in child translators (``parent`` set) that share it."""

    def __init__(self, code: types.CodeType, f_globals: dict, symbolic_locals: dict,
                 cells: dict[str, CellVariable], output: OutputGraph,
                 parent: "InstructionTranslator | None" = None):
        self.code = code
        self.f_globals = f_globals
        self.symbolic_locals: dict[str, Any] = symbolic_locals
        self.cells = cells
        self.output = output
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.instructions, self.index_of = _disassembled(code)
        self.stack: list[VariableTracker] = []
        self.ip = 0
        self.kw_names: tuple = ()
        self.current: Instruction | None = None
        self.return_value: VariableTracker | None = None
        self.is_generator = bool(code.co_flags & inspect.CO_GENERATOR)
        self.yielded: list[VariableTracker] = []
        self.root = self if parent is None else parent.root
        # graph breaks (top frame only): stop before the break_at-th instruction started
        self.steps = 0
        self.break_at: int | None = None
        self.break_index: int | None = None
        self.handling = 0       # exception handlers entered (PUSH_EXC_INFO) and not left

    # -- driving -------------------------------------------------------------------------------
    def run(self) -> VariableTracker | None:
        """The frame's return value; None when the top frame stopped at ``break_at``."""
        if self.parent is None:
            self.output.location = self.root_location
        while True:
            inst = self.instructions[self.ip]
            if self.parent is None:
                self.steps += 1
                if self.steps == self.break_at:
                    self.break_index = self.ip   # stop before running it: the graph breaks
                    return None
            self.ip += 1
            self.current = inst
            fn = HANDLERS.get(inst.opname)
            try:
                if fn is None:
                    raise Unsupported(f"opcode {inst.opname}")
                fn(self, inst)
            except _Return:
                break
            except ObservedException as e:
                if self.parent is not None and self._enter_handler(e):
                    continue
                self._annotate(e)
                raise
            except NotConstant as e:
                error = Unsupported(f"a value that must be a Python constant is not: "
                                    f"{e.args[0]}")
                self._annotate(error)
                raise error from None
            except Unsupported as e:
                self._annotate(e)
                raise
        if self.is_generator:
            return ListIteratorVariable(self.yielded)
        return self.return_value

    def _enter_handler(self, e: ObservedException) -> bool:
        """Jump to this frame's handler of the instruction that raised ``e``, as the
        interpreter does: the stack cut to the handler's depth, then the exception. Only in
        inlined frames: the top frame's handlers run in resume functions."""
        entry = self.current.exn_tab_entry if self.current is not None else None
        if entry is None:
            return False
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(ConstantVariable(self.current.offset))
        self.push(ExceptionVariable(e.exc_type, e.exc_args))
        self.ip = self.index_of[id(entry.target)]
        return True

    def _annotate(self, e: Unsupported) -> None:
        """Where the error happened (innermost frame) and which top-frame step it broke."""
        if e.where is None:
            e.locate(self.location(), self.stack_locations(), self.code.co_filename,
                     self.lineno())
            e.inlined = self.parent is not None
        if self.parent is None and e.break_step is None:
            e.break_step = self.steps

    def lineno(self) -> int:
        inst = self.current
        return inst.lineno if inst is not None and inst.lineno is not None else \
            self.code.co_firstlineno

    def location(self) -> str:
        return f"{self.code.co_filename}:{self.lineno()} in {self.code.co_name}"

    def stack_locations(self) -> list[str]:
        """file:line of this frame and every frame that inlined it, outermost first."""
        out = []
        tx = self
        while tx is not None:
            out.append(tx.location())
            tx = tx.parent
        return out[::-1]

    def root_location(self) -> str:
        frames = []
        tx = self._innermost
        while tx is not None:
            frames.append(tx.location())
            tx = tx.parent
        return "\n".join(reversed(frames))

    _innermost: "InstructionTranslator | None" = None

    # -- stack ---------------------------------------------------------------------------------
    def push(self, vt: VariableTracker) -> None:
        self.stack.append(vt)

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> list[VariableTracker]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, inst: Instruction) -> None:
        self.ip = self.index_of[id(inst.target)]

    # -- values --------------------------------------------------------------------------------
    def wrap(self, value, source: Source | None) -> VariableTracker:
        return builder.wrap(self, value, source)

    def wrap_constant(self, value) -> VariableTracker:
        """A Python value produced at capture time (no source, no guards)."""
        typ = type(value)
        if typ is tuple:
            return TupleVariable([self.wrap_constant(v) for v in value])
        if typ is list:
            return ListVariable([self.wrap_constant(v) for v in value])
        if typ is torch.Size:
            return SizeVariable([ConstantVariable(v) for v in value])
        if typ is dict:
            return DictVariable({k: self.wrap_constant(v) for k, v in value.items()})
        if typ in (set, frozenset):
            return SetVariable([self.wrap_constant(v) for v in value], frozen=typ is frozenset)
        return self.wrap(value, None)

    def size_variable(self, size) -> SizeVariable:
        return SizeVariable([ConstantVariable(s) for s in size])

    def cell_for(self, cell, source, cell_source=None) -> CellVariable:
        """The one tracker of a real cell (its contents read from ``source``)."""
        memo = self.output.cells_by_id
        vt = memo.get(id(cell))
        if vt is None:
            vt = memo[id(cell)] = CellVariable(real_cell=cell, source=source)
        if vt.cell_source is None:
            vt.cell_source = cell_source
        return vt

    def read_local(self, name: str) -> VariableTracker:
        try:
            value = self.symbolic_locals[name]
        except KeyError:
            raise Unsupported(f"local variable {name!r} referenced before assignment") from None
        if isinstance(value, _LazyLocal):
            value = self.symbolic_locals[name] = self.wrap(value.value, value.source)
        return value

    # -- semantics shared by handlers and trackers ---------------------------------------------
    def call(self, fn: VariableTracker, args: list, kwargs: dict) -> VariableTracker:
        self.root._innermost = self
        return fn.call_function(self, args, kwargs)

    def getattr(self, obj: VariableTracker, name: str) -> VariableTracker:
        return obj.var_getattr(self, name)

    def store_attr(self, obj: VariableTracker, name: str, value: VariableTracker) -> None:
        if isinstance(obj, (UserDefinedObjectVariable, DataclassDictVariable,
                            NewModuleVariable)):
            obj.store_attr(self, name, value)
        elif isinstance(obj, CellRefVariable) and name == "value":
            obj.cell.set(self, value)     # a resume function's cell (see resume.py)
        elif isinstance(obj, CellVariable) and name == "cell_contents":
            obj.set(self, value)
        elif isinstance(obj, TensorVariable) and name == "requires_grad":
            # ``t.requires_grad = b`` is ``t.requires_grad_(b)``, with the same leaf check
            obj.call_method(self, "requires_grad_", [value], {})
        elif isinstance(obj, NNModuleVariable):
            if isinstance(value, TensorVariable) and name in obj.value._parameters:
                raise Unsupported(f"assigning to parameter {name!r}")
            # a compiled module's writes go to its original, whose reads see them
            self.output.side_effects.store_attr(getattr(obj, "inner", obj), name, value)
        else:
            raise Unsupported(f"setting attribute {name!r} on {obj}")

    def del_attr(self, obj: VariableTracker, name: str) -> None:
        if isinstance(obj, UserDefinedObjectVariable):
            obj.del_attr(self, name)
        elif isinstance(obj, CellRefVariable) and name == "value":
            obj.cell.delete(self)         # a resume function's cell (see resume.py)
        elif isinstance(obj, CellVariable) and name == "cell_contents":
            obj.delete(self)
        else:
            raise Unsupported(f"deleting attribute {name!r} of {obj}")

    def store_subscr(self, obj, key, value) -> VariableTracker:
        if isinstance(obj, TensorVariable):
            self.output.call_function(operator.setitem, [obj, key, value], {})
        elif isinstance(obj, (ListVariable, DictVariable)):
            obj.call_method(self, "__setitem__", [key, value], {})
        else:
            obj.call_method(self, "__setitem__", [key, value], {})
        return ConstantVariable(None)

    def check_mutation(self, container: VariableTracker) -> None:
        self.output.side_effects.mutate(container)

    def unpack_iterable(self, vt: VariableTracker) -> list[VariableTracker]:
        if isinstance(vt, UserDefinedObjectVariable):
            cls = vt.python_type()
            if getattr(cls, "__iter__", None) in (None, collections.abc.Sequence.__iter__) \
                    and hasattr(cls, "__getitem__") and hasattr(cls, "__len__"):
                # the sequence protocol: items 0..len-1 (__getitem__ raises IndexError at len)
                n = vt.call_method(self, "__len__", [], {}).as_python_constant()
                return [vt.call_method(self, "__getitem__", [ConstantVariable(i)], {})
                        for i in range(n)]
            it = vt.call_method(self, "__iter__", [], {})
            if it is vt:
                raise Unsupported(f"iterating over {vt}")
            return self.unpack_iterable(it)
        return vt.unpack(self)

    def get_iter(self, vt: VariableTracker) -> VariableTracker:
        if isinstance(vt, ListIteratorVariable):
            return vt
        if isinstance(vt, (DictVariable, DictViewVariable)):   # live: sees the dict's changes
            return vt.call_method(self, "__iter__", [], {})
        if type(vt) is ListVariable:   # live: an index into the list as it is at each step
            return vt.live_iterator()
        return ListIteratorVariable(self.unpack_iterable(vt))

    def is_same_object(self, a: VariableTracker, b: VariableTracker) -> bool:
        if a is b:
            return True
        if isinstance(a, UntypedStorageVariable) or isinstance(b, UntypedStorageVariable):
            return same_storage(a, b)
        if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
            return a.value is b.value
        if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
            return a.fake is b.fake
        va, vb = getattr(a, "value", None), getattr(b, "value", None)
        if va is not None and vb is not None and not isinstance(a, ConstantVariable) \
                and not isinstance(b, ConstantVariable):
            return va is vb
        return False

    def values_equal(self, a: VariableTracker, b: VariableTracker) -> bool:
        if self.is_same_object(a, b):
            return True
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
                raise Unsupported("comparing tensors by value (data-dependent)")
            return False
        return apply_operator(self, operator.eq, [a, b]).truthy(self)

    def contains(self, container: VariableTracker, item: VariableTracker) -> VariableTracker:
        if isinstance(container, TensorVariable):
            raise Unsupported("`in` on a tensor (data-dependent)")
        if isinstance(container, ConstantVariable):
            try:
                return ConstantVariable(item.as_python_constant() in container.value)
            except NotConstant:
                raise Unsupported(f"`in` on a constant with {item}") from None
        if isinstance(container, BaseSequenceVariable):
            return ConstantVariable(any(self.values_equal(x, item) for x in container.items))
        if isinstance(container, (DictVariable, SetVariable)):
            return ConstantVariable(hashable_key(item, container.items) in container.items)
        return container.call_method(self, "__contains__", [item], {})

    def sorted_items(self, items, key, reverse) -> list:
        if key is not None and not (key.is_python_constant() and key.as_python_constant()
                                    is None):
            keys = [key.call_function(self, [item], {}).as_python_constant() for item in items]
        else:
            keys = [item.as_python_constant() for item in items]
        order = sorted(range(len(items)), key=lambda i: keys[i], reverse=reverse)
        return [items[i] for i in order]

    def zero_arg_super(self) -> VariableTracker:
        if "__class__" not in self.cells or not self.code.co_argcount:
            raise Unsupported("super() without arguments outside a method")
        cls = self.cells["__class__"].get(self).as_python_constant()
        first = self.code.co_varnames[0]
        obj = self.cells[first].get(self) if first in self.cells else self.read_local(first)
        return SuperVariable(cls, obj)

    # -- inlining ------------------------------------------------------------------------------
    def inline_function(self, fn: BaseUserFunctionVariable, args, kwargs) -> VariableTracker:
        code = fn.get_code()
        if registry.is_disabled_code(code):
            raise Unsupported(f"call to {code.co_name}, which ember.disable excludes")
        if self.depth >= config.inline_depth_limit:
            raise Unsupported(f"inlining deeper than inline_depth_limit "
                              f"({config.inline_depth_limit})")
        if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                            inspect.CO_ITERABLE_COROUTINE):
            raise Unsupported(f"async function {code.co_name}")
        bound = fn.bind(self, args, kwargs)
        closure = fn.closure_cells(self)
        cells = dict(zip(code.co_freevars, closure))
        child = InstructionTranslator(code, fn.get_globals(), bound, cells, self.output,
                                      parent=self)
        self.root._innermost = child
        try:
            return child.run()
        finally:
            self.root._innermost = self


# ------------------------------------------------------------------------------- no-ops

@handler("NOP", "RESUME", "PRECALL", "EXTENDED_ARG", "CACHE", "COPY_FREE_VARS")
def _nop(tx, inst):
    pass


@handler("POP_TOP")
def _pop_top(tx, inst):
    tx.pop()


@handler("PUSH_NULL")
def _push_null(tx, inst):
    tx.push(NULL)


@handler("COPY")
def _copy(tx, inst):
    tx.push(tx.stack[-inst.arg])


@handler("SWAP")
def _swap(tx, inst):
    tx.stack[-1], tx.stack[-inst.arg] = tx.stack[-inst.arg], tx.stack[-1]


@handler("END_FOR")
def _end_for(tx, inst):
    tx.popn(2)


# -------------------------------------------------------------------------- locals/globals

@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(tx, inst):
    tx.push(tx.read_local(inst.argval))


@handler("LOAD_FAST_AND_CLEAR")
def _load_fast_and_clear(tx, inst):
    name = inst.argval
    tx.push(tx.read_local(name) if name in tx.symbolic_locals else NULL)
    tx.symbolic_locals.pop(name, None)


@handler("STORE_FAST")
def _store_fast(tx, inst):
    value = tx.pop()
    if value is NULL:
        tx.symbolic_locals.pop(inst.argval, None)
    else:
        tx.symbolic_locals[inst.argval] = value


@handler("DELETE_FAST")
def _delete_fast(tx, inst):
    tx.symbolic_locals.pop(inst.argval, None)


@handler("LOAD_CONST")
def _load_const(tx, inst):
    tx.push(tx.wrap_constant(inst.argval))


@handler("RETURN_CONST")
def _return_const(tx, inst):
    tx.return_value = tx.wrap_constant(inst.argval)
    raise _Return


@handler("RETURN_VALUE")
def _return_value(tx, inst):
    tx.return_value = tx.pop()
    raise _Return


def _load_global_value(tx, name: str) -> VariableTracker:
    if tx.f_globals is tx.root.f_globals:
        stored = tx.output.side_effects.global_stores.get(name)
        if stored is not None:
            return stored
    if name in tx.f_globals:
        return tx.wrap(tx.f_globals[name], _global_source(tx, name))
    b = tx.f_globals.get("__builtins__", builtins)
    b = b.__dict__ if isinstance(b, types.ModuleType) else b
    if name in b:
        return tx.wrap(b[name], None)
    raise Unsupported(f"NameError: name {name!r} is not defined")


def _global_source(tx, name: str) -> Source | None:
    if tx.f_globals is tx.root.f_globals:
        return GlobalSource(name)
    # a global of another module, read by an inlined function: reach it through that
    # module's dict (kept alive by the entry as a constant)
    from ember.frontend.source import ConstantSource, GetItemSource
    slot = tx.output.global_dicts
    key = id(tx.f_globals)
    if key not in slot:
        slot[key] = (f"___globals{len(slot)}", tx.f_globals)
    return GetItemSource(ConstantSource(slot[key][0]), name)


@handler("LOAD_GLOBAL")
def _load_global(tx, inst):
    if inst.arg is not None and inst.arg & 1:
        tx.push(NULL)
    tx.push(_load_global_value(tx, inst.argval))


@handler("STORE_GLOBAL")
def _store_global(tx, inst):
    if tx.f_globals is not tx.root.f_globals:
        raise Unsupported("assigning a global of another module")
    tx.output.side_effects.store_global(inst.argval, tx.pop())


@handler("MAKE_CELL")
def _make_cell(tx, inst):
    name = inst.argval
    contents = tx.read_local(name) if name in tx.symbolic_locals else None
    tx.cells[name] = CellVariable(contents)


@handler("LOAD_DEREF")
def _load_deref(tx, inst):
    tx.push(tx.cells[inst.argval].get(tx))


@handler("DELETE_DEREF")
def _delete_deref(tx, inst):
    tx.cells[inst.argval].delete(tx)


@handler("LOAD_CLOSURE")
def _load_closure(tx, inst):
    tx.push(tx.cells[inst.argval])


@handler("STORE_DEREF")
def _store_deref(tx, inst):
    tx.cells[inst.argval].set(tx, tx.pop())


# ------------------------------------------------------------------------------- attributes

@handler("LOAD_ATTR")
def _load_attr(tx, inst):
    obj = tx.pop()
    method_form = PY312 and inst.arg is not None and inst.arg & 1
    value = tx.getattr(obj, inst.argval)
    if method_form:
        tx.push(NULL)
    tx.push(value)


@handler("LOAD_METHOD")
def _load_method(tx, inst):
    obj = tx.pop()
    tx.push(NULL)
    tx.push(tx.getattr(obj, inst.argval))


@handler("STORE_ATTR")
def _store_attr(tx, inst):
    obj = tx.pop()
    value = tx.pop()
    tx.store_attr(obj, inst.argval, value)


@handler("DELETE_ATTR")
def _delete_attr(tx, inst):
    tx.del_attr(tx.pop(), inst.argval)


@handler("LOAD_SUPER_ATTR")
def _load_super_attr(tx, inst):
    obj = tx.pop()
    cls = tx.pop()
    tx.pop()   # the global `super`
    sup = SuperVariable(cls.as_python_constant(), obj)
    value = sup.var_getattr(tx, inst.argval)
    if inst.arg & 1:
        tx.push(NULL)
    tx.push(value)


# ------------------------------------------------------------------------------- operators

@handler("BINARY_OP")
def _binary_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    op = _BINARY_OPS[dis._nb_ops[inst.arg][1]]
    tx.push(apply_operator(tx, op, [a, b]))


def _unary(op):
    def run(tx, inst):
        tx.push(apply_operator(tx, op, [tx.pop()]))
    return run


HANDLERS["UNARY_NEGATIVE"] = _unary(operator.neg)
HANDLERS["UNARY_POSITIVE"] = _unary(operator.pos)
HANDLERS["UNARY_INVERT"] = _unary(operator.invert)


@handler("UNARY_NOT")
def _unary_not(tx, inst):
    tx.push(ConstantVariable(not tx.pop().truthy(tx)))


@handler("COMPARE_OP")
def _compare_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(apply_operator(tx, _COMPARE_OPS[inst.argval], [a, b]))


@handler("IS_OP")
def _is_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    same = tx.is_same_object(a, b)
    tx.push(ConstantVariable(same != bool(inst.arg)))


@handler("CONTAINS_OP")
def _contains_op(tx, inst):
    container = tx.pop()
    item = tx.pop()
    result = tx.contains(container, item).as_python_constant()
    tx.push(ConstantVariable(result != bool(inst.arg)))


@handler("BINARY_SUBSCR")
def _binary_subscr(tx, inst):
    index = tx.pop()
    obj = tx.pop()
    tx.push(apply_operator(tx, operator.getitem, [obj, index]))


@handler("STORE_SUBSCR")
def _store_subscr(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    tx.store_subscr(obj, key, value)


@handler("DELETE_SUBSCR")
def _delete_subscr(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    if isinstance(obj, (ListVariable, DictVariable)):
        obj.call_method(tx, "__delitem__", [key], {})
    else:
        raise Unsupported(f"del on {obj}")


def _make_slice(parts: list[VariableTracker]) -> VariableTracker:
    if all(p.is_python_constant() for p in parts):
        return ConstantVariable(slice(*[p.as_python_constant() for p in parts]))
    while len(parts) < 3:
        parts.append(ConstantVariable(None))
    return SliceVariable(*parts)


@handler("BUILD_SLICE")
def _build_slice(tx, inst):
    tx.push(_make_slice(tx.popn(inst.arg)))


@handler("BINARY_SLICE")
def _binary_slice(tx, inst):
    end = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    tx.push(apply_operator(tx, operator.getitem, [obj, _make_slice([start, end])]))


@handler("STORE_SLICE")
def _store_slice(tx, inst):
    end = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    tx.store_subscr(obj, _make_slice([start, end]), value)


@handler("CALL_INTRINSIC_1")
def _call_intrinsic_1(tx, inst):
    kind = inst.argrepr if hasattr(inst, "argrepr") else ""
    if kind == "INTRINSIC_LIST_TO_TUPLE" or inst.arg == 6:
        tx.push(TupleVariable(tx.pop().items))
    elif kind == "INTRINSIC_UNARY_POSITIVE" or inst.arg == 5:
        tx.push(apply_operator(tx, operator.pos, [tx.pop()]))
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {kind or inst.arg}")


# ------------------------------------------------------------------------------- containers

@handler("BUILD_TUPLE")
def _build_tuple(tx, inst):
    tx.push(TupleVariable(tx.popn(inst.arg)))


@handler("BUILD_LIST")
def _build_list(tx, inst):
    tx.push(ListVariable(tx.popn(inst.arg)))


@handler("BUILD_SET")
def _build_set(tx, inst):
    tx.push(SetVariable(tx.popn(inst.arg)))


@handler("BUILD_MAP")
def _build_map(tx, inst):
    items = tx.popn(2 * inst.arg)
    d = DictVariable({})
    for k, v in zip(items[::2], items[1::2]):
        d.setitem(k, v)
    tx.push(d)


@handler("BUILD_CONST_KEY_MAP")
def _build_const_key_map(tx, inst):
    keys = tx.pop().unpack(tx)
    values = tx.popn(inst.arg)
    d = DictVariable({})
    for k, v in zip(keys, values):
        d.setitem(k, v)
    tx.push(d)


@handler("BUILD_STRING")
def _build_string(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(ConstantVariable("".join(p.as_python_constant() for p in parts)))


@handler("FORMAT_VALUE")
def _format_value(tx, inst):
    spec = tx.pop().as_python_constant() if inst.arg & 0x04 else ""
    value = tx.pop()
    if isinstance(value, TensorVariable):
        raise Unsupported("formatting a tensor into a string")
    value = value.as_python_constant()
    conv = inst.arg & 0x03
    if conv == 1:
        value = str(value)
    elif conv == 2:
        value = repr(value)
    elif conv == 3:
        value = ascii(value)
    tx.push(ConstantVariable(format(value, spec)))


@handler("LIST_APPEND")
def _list_append(tx, inst):
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "append", [value], {})


@handler("SET_ADD")
def _set_add(tx, inst):
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "add", [value], {})


@handler("MAP_ADD")
def _map_add(tx, inst):
    value = tx.pop()
    key = tx.pop()
    tx.stack[-inst.arg].setitem(key, value)


@handler("LIST_EXTEND")
def _list_extend(tx, inst):
    seq = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "extend", [seq], {})


@handler("SET_UPDATE")
def _set_update(tx, inst):
    seq = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "update", [seq], {})


@handler("DICT_UPDATE", "DICT_MERGE")
def _dict_update(tx, inst):
    other = tx.pop()
    target = tx.stack[-inst.arg]
    if isinstance(other, DictVariable):
        for k, v in other.items.items():
            target.setitem(other.keys[k], v)
    else:
        target.call_method(tx, "update", [other], {})


@handler("LIST_TO_TUPLE")
def _list_to_tuple(tx, inst):
    tx.push(TupleVariable(tx.pop().items))


@handler("UNPACK_SEQUENCE")
def _unpack_sequence(tx, inst):
    items = tx.unpack_iterable(tx.pop())
    if len(items) != inst.arg:
        raise Unsupported(f"unpacking {len(items)} values into {inst.arg}")
    for item in reversed(items):
        tx.push(item)


@handler("UNPACK_EX")
def _unpack_ex(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = tx.unpack_iterable(tx.pop())
    if len(items) < before + after:
        raise Unsupported("not enough values to unpack")
    middle = ListVariable(items[before:len(items) - after])
    for item in reversed(items[len(items) - after:]):
        tx.push(item)
    tx.push(middle)
    for item in reversed(items[:before]):
        tx.push(item)


# ------------------------------------------------------------------------------ iteration

@handler("GET_ITER")
def _get_iter(tx, inst):
    vt = tx.pop()
    loop_iterator = getattr(vt, "loop_iterator", None)     # a module's generators
    tx.push(loop_iterator(tx) if loop_iterator is not None else tx.get_iter(vt))


@handler("FOR_ITER")
def _for_iter(tx, inst):
    it = tx.stack[-1]
    if not isinstance(it, ListIteratorVariable):
        raise Unsupported(f"iterating over {it}")
    item = it.next(tx)
    if item is not None:
        tx.push(item)
        return
    tx.pop()
    tx.jump(inst)
    if _VERSION["for_iter_skips_end_for"] and tx.instructions[tx.ip].opname == "END_FOR":
        tx.ip += 1


# ----------------------------------------------------------------------------- control flow

@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE",
         "JUMP")
def _jump(tx, inst):
    tx.jump(inst)


def _conditional_jump(jump_if: Callable[[InstructionTranslator, VariableTracker], bool],
                      pop_always: bool = True):
    def run(tx, inst):
        value = tx.stack[-1]
        if jump_if(tx, value):
            if pop_always:
                tx.pop()
            tx.jump(inst)
        else:
            tx.pop()
    return run


def _is_none(tx, vt):
    return isinstance(vt, ConstantVariable) and vt.value is None


for _prefix in ("POP_JUMP_IF_", "POP_JUMP_FORWARD_IF_", "POP_JUMP_BACKWARD_IF_"):
    HANDLERS[_prefix + "TRUE"] = _conditional_jump(lambda tx, v: v.truthy(tx))
    HANDLERS[_prefix + "FALSE"] = _conditional_jump(lambda tx, v: not v.truthy(tx))
    HANDLERS[_prefix + "NONE"] = _conditional_jump(_is_none)
    HANDLERS[_prefix + "NOT_NONE"] = _conditional_jump(lambda tx, v: not _is_none(tx, v))
HANDLERS["JUMP_IF_TRUE_OR_POP"] = _conditional_jump(lambda tx, v: v.truthy(tx), False)
HANDLERS["JUMP_IF_FALSE_OR_POP"] = _conditional_jump(lambda tx, v: not v.truthy(tx), False)


# ----------------------------------------------------------------------------------- calls

@handler("KW_NAMES")
def _kw_names(tx, inst):
    tx.kw_names = inst.argval if isinstance(inst.argval, tuple) else \
        tx.code.co_consts[inst.arg]


@handler("CALL")
def _call(tx, inst):
    argc = inst.arg
    args = tx.popn(argc)
    second = tx.pop()
    first = tx.pop()
    if first is NULL:
        fn = second
    else:
        fn, args = first, [second, *args]
    kwargs = {}
    if tx.kw_names:
        n = len(tx.kw_names)
        kwargs = dict(zip(tx.kw_names, args[len(args) - n:]))
        args = args[:len(args) - n]
        tx.kw_names = ()
    tx.push(call_function(tx, fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def _call_function_ex(tx, inst):
    kwargs_vt = tx.pop() if inst.arg & 1 else None
    args_vt = tx.pop()
    fn = tx.pop()
    if tx.stack and tx.stack[-1] is NULL:
        tx.pop()
    args = tx.unpack_iterable(args_vt)
    kwargs = {}
    if kwargs_vt is not None:
        if not isinstance(kwargs_vt, DictVariable):
            raise Unsupported(f"**kwargs from {kwargs_vt}")
        kwargs = {k: v for k, v in kwargs_vt.items.items()}
    tx.push(call_function(tx, fn, args, kwargs))


def call_function(tx, fn: VariableTracker, args: list, kwargs: dict) -> VariableTracker:
    if getattr(fn, "value", None) is super:
        if not args:
            return tx.zero_arg_super()
        return SuperVariable(args[0].as_python_constant(), args[1])
    return tx.call(fn, args, kwargs)


@handler("MAKE_FUNCTION")
def _make_function(tx, inst):
    code = tx.pop().as_python_constant()
    flags = inst.arg
    closure = tx.pop().items if flags & 0x08 else None
    if flags & 0x04:
        tx.pop()   # annotations do not affect behaviour
    kwdefaults = None
    if flags & 0x02:
        kw = tx.pop()
        kwdefaults = {k: v for k, v in kw.items.items()}
    defaults = tx.pop().items if flags & 0x01 else None
    tx.push(NestedUserFunctionVariable(code, tx.f_globals, code.co_qualname, defaults,
                                       kwdefaults, closure))


@handler("RETURN_GENERATOR")
def _return_generator(tx, inst):
    if not tx.is_generator:
        raise Unsupported("RETURN_GENERATOR outside a generator")
    tx.push(ConstantVariable(None))


@handler("YIELD_VALUE")
def _yield_value(tx, inst):
    if tx.parent is None:
        raise Unsupported("compiling a generator function")
    tx.yielded.append(tx.pop())
    tx.push(ConstantVariable(None))   # the value sent back in


# ------------------------------------------------------------------------------ with blocks

@handler("BEFORE_WITH")
def _before_with(tx, inst):
    mgr = tx.pop()
    exit_fn = tx.getattr(mgr, "__exit__")
    enter_fn = tx.getattr(mgr, "__enter__")
    tx.push(exit_fn)
    tx.push(tx.call(enter_fn, [], {}))


# ------------------------------------------------------------------- exception handlers
# Capture never raises, so it reaches a handler only in a resume function that starts at
# one (the instruction at a graph break raised): the exception is then an argument. While
# a handler runs, its exception is "being handled" (sys.exc_info, implicit chaining of a
# new exception, bare `raise`), which the code around a graph break could not reproduce:
# a break there is refused (``graph_break.check_breakable``), except at the RERAISE that
# ends the handler.

class _PrevException(VariableTracker):
    """What PUSH_EXC_INFO saves: the exception being handled before the handler began (in
    a compiled frame, the caller's, which POP_EXCEPT restores)."""

    def rebuild(self, cg):
        return f"{cg.const(sys.exc_info)}()[1]"

    def __repr__(self):
        return "PrevException"


@handler("WITH_EXCEPT_START")
def _with_except_start(tx, inst):
    """A ``with`` block's handler calls ``__exit__(type, exception, traceback)`` (reached in
    a resume function that starts at the handler: the exception is an argument, read from
    its source with its traceback). ``__exit__`` is captured like any call, inside the
    handler (a break in it is refused: the frame runs eagerly)."""
    exc, exit_fn = tx.stack[-1], tx.stack[-4]
    value = getattr(exc, "value", None)
    if exc.source is None or not isinstance(value, BaseException):
        raise Unsupported("WITH_EXCEPT_START without the exception's source")
    tb = tx.wrap(value.__traceback__, AttrSource(exc.source, "__traceback__"))
    tx.push(tx.call(exit_fn, [tx.wrap(type(value), None), exc, tb], {}))


@handler("PUSH_EXC_INFO")
def _push_exc_info(tx, inst):
    exc = tx.pop()
    tx.push(_PrevException())
    tx.push(exc)
    tx.handling += 1


@handler("POP_EXCEPT")
def _pop_except(tx, inst):
    prev = tx.pop()
    if isinstance(prev, _PrevException):
        tx.handling -= 1
    elif tx.handling:
        raise Unsupported("POP_EXCEPT of a value PUSH_EXC_INFO did not push")
    # else: a handler's cleanup entered from outside (its PUSH_EXC_INFO ran in an earlier
    # resume function, which passed the value it saved): what it restores is what the
    # caller is handling now, unchanged


@handler("RERAISE")
def _reraise(tx, inst):
    raise Unsupported("re-raising the exception at the end of an except or finally block")


@handler("CHECK_EXC_MATCH")
def _check_exc_match(tx, inst):
    classes = tx.pop().as_python_constant()
    exc_type = tx.stack[-1].python_type()     # guarded: the argument's type
    if not issubclass(exc_type, BaseException):
        raise Unsupported(f"CHECK_EXC_MATCH on {tx.stack[-1]}")
    tx.push(ConstantVariable(issubclass(exc_type, classes)))


# ------------------------------------------------------------------------------ imports

@handler("IMPORT_NAME")
def _import_name(tx, inst):
    fromlist = tx.pop().as_python_constant()
    level = tx.pop().as_python_constant()
    name = inst.argval
    if level != 0 or name not in sys.modules:
        raise Unsupported(f"import of {name!r} inside a compiled region")
    module = sys.modules[name] if fromlist else sys.modules[name.partition(".")[0]]
    tx.push(tx.wrap(module, None))


@handler("IMPORT_FROM")
def _import_from(tx, inst):
    tx.push(tx.getattr(tx.stack[-1], inst.argval))


@handler("LOAD_BUILD_CLASS")
def _load_build_class(tx, inst):
    tx.push(HandlerFunctionVariable(builtins.__build_class__, _build_class))


def _build_class(tx, args, kwargs) -> VariableTracker:
    """A class statement: the class is made once, at capture time, from its body (a body
    that closes over the frame's variables, a metaclass or keywords are not supported)."""
    body, name, *bases = args
    if kwargs or not isinstance(body, NestedUserFunctionVariable) or body.closure:
        raise Unsupported("a class statement with keywords, a metaclass or a body that "
                          "closes over local variables")
    bases = [b.as_python_constant() for b in bases]
    fn = types.FunctionType(body.code, body.f_globals, name.as_python_constant())
    return tx.wrap(builtins.__build_class__(fn, name.as_python_constant(), *bases), None)


@handler("LOAD_ASSERTION_ERROR")
def _load_assertion_error(tx, inst):
    tx.push(tx.wrap(AssertionError, None))


@handler("RAISE_VARARGS")
def _raise(tx, inst):
    raise Unsupported("raising an exception inside a compiled region")
