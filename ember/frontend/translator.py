"""The symbolic evaluator: runs a frame's bytecode over VariableTrackers.

One handler per opcode (``@handler("LOAD_FAST")``), registered by name, so CPython 3.11, 3.12
and 3.13 share every handler whose opcode exists in more than one; the few differences in how
an opcode behaves are read from ``bytecode.VERSION_SPEC`` (helpers below: where a call's NULL
goes, whether LOAD_ATTR has a method form). Calls to user functions are inlined by a child translator
that shares the parent's OutputGraph. Anything the evaluator cannot handle raises
:class:`Unsupported` with the user's file:line; the caller then runs the frame eagerly.

The handlers live in two modules: ``opcodes_data`` (stack, locals, globals, attributes,
operators, subscripts, containers) and ``opcodes_control`` (iteration, jumps, returns, calls,
with blocks, exception handlers, imports). They register into ``HANDLERS`` here and use this
module's ``NULL``, ``_Return`` and ``push_callable``, so this module imports them at its
end, once all of those exist: importing the translator always fills the table, and nothing
else has to remember to import the handler modules.
"""
from __future__ import annotations

import collections.abc
import inspect
import operator
import types
from typing import Any, Callable

import torch

from ember import config
from ember.frontend.bytecode import VERSION_SPEC, Instruction, disassemble
from ember.frontend import trace_rules
from ember.frontend.exc import ObservedException, Unsupported
from ember.frontend.output_graph import OutputGraph
from ember.frontend.source import Source
from ember.frontend.variables import builder
from ember.frontend.variables.base import ConstantVariable, NotConstant, VariableTracker
from ember.frontend.variables.builtins import apply_operator
from ember.frontend.variables.container_iterators import ListIteratorVariable
from ember.frontend.variables.containers import (BaseSequenceVariable, DequeVariable, ListVariable,
                                                 SizeVariable,
                                                 TupleVariable)
from ember.frontend.variables.dicts import (DictVariable, DictViewVariable, SetVariable,
                                            hashable_key)
from ember.frontend.variables.functions import (BaseUserFunctionVariable, CellRefVariable,
                                                CellVariable)
from ember.frontend.variables.exceptions import ExceptionVariable
from ember.frontend.variables.modules import NewModuleVariable, NNModuleVariable
from ember.frontend.variables.super_call import SuperVariable
from ember.frontend.variables.user_defined import DataclassDictVariable, UserDefinedObjectVariable
from ember.frontend.variables.storage import UntypedStorageVariable, same_storage
from ember.frontend.variables.symbolic import wrap_sym
from ember.frontend.variables.tensor import TensorVariable


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


def push_callable(tx, fn: VariableTracker, null: bool = True) -> None:
    """Push ``fn`` for a call, with the NULL that LOAD_GLOBAL's low bit or a method-form
    LOAD_ATTR adds where this version puts it (below the callable before 3.13, above it
    since). A method loaded with its self is pushed as the bound method with a NULL."""
    if not null:
        tx.push(fn)
    elif VERSION_SPEC.null_after_callable:
        tx.push(fn)
        tx.push(NULL)
    else:
        tx.push(NULL)
        tx.push(fn)


def split_callable(first: VariableTracker, second: VariableTracker, args: list
                   ) -> tuple[VariableTracker, list]:
    """The callable and the arguments of a CALL whose two slots below the arguments hold
    ``first, second``: NULL and the callable (in either order, by version) or a method and
    its self (every version)."""
    if first is NULL:
        return second, args
    if second is NULL:
        return first, args
    return first, [second, *args]


def attr_method_form(inst: Instruction) -> bool:
    """LOAD_ATTR with the low bit set (3.12+): load for a call, with a NULL or self."""
    return (inst.opname == "LOAD_ATTR" and "LOAD_ATTR" in VERSION_SPEC.name_flag_bits
            and inst.arg is not None and bool(inst.arg & 1))


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
        try:
            instructions = disassemble(code)
        except ValueError as e:
            raise Unsupported(f"bytecode the frontend cannot read: {e}") from None
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
        tx = self._innermost or self     # before any call: this frame's instruction
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
            return SizeVariable([wrap_sym(v) for v in value])
        if typ is dict:
            return DictVariable({k: self.wrap_constant(v) for k, v in value.items()})
        if typ in (set, frozenset):
            return SetVariable([self.wrap_constant(v) for v in value], frozen=typ is frozenset,
                               mirror=False)
        return self.wrap(value, None)

    def size_variable(self, size) -> SizeVariable:
        return SizeVariable([wrap_sym(s) for s in size])

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
        if type(vt) is DequeVariable or (type(vt) is SetVariable and not vt.frozen):
            return vt.live_iterator()   # raises as CPython's once the container changes
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
        if trace_rules.is_disabled_code(code):
            raise Unsupported(trace_rules.disabled_reason(code))
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


# Fill HANDLERS last: the handler modules import the names above from this module.
from ember.frontend import opcodes_control, opcodes_data  # noqa: E402,F401  (registration)
