"""Opcode handlers for values: the stack, locals, globals and cells, attributes, operators,
subscripts and slices, and building and unpacking containers.

Each registers itself with ``@handler`` into ``translator.HANDLERS``; ``translator`` imports
this module at its end (see its docstring), after the names used here exist.
"""
from __future__ import annotations

import builtins
import dis
import operator
import types
from typing import Callable

from ember.frontend.exc import Unsupported
from ember.frontend.source import GlobalSource, Source
from ember.frontend.bytecode import VERSION_SPEC
from ember.frontend.translator import HANDLERS, NULL, attr_method_form, handler, push_callable
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.builtins import apply_operator
from ember.frontend.variables.containers import ListVariable, SliceVariable, TupleVariable
from ember.frontend.variables.dicts import DictVariable, SetVariable
from ember.frontend.variables.functions import CellVariable
from ember.frontend.variables.super_call import SuperVariable
from ember.frontend.variables.tensor import TensorVariable

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
    tx.popn(-dis.stack_effect(inst.opcode))   # 3.12: the item and the iterator; 3.13: item


# -------------------------------------------------------------------------- locals/globals

@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(tx, inst):
    name = inst.argval
    if VERSION_SPEC.load_fast_of_cell_is_closure and name in tx.code.co_cellvars:
        tx.push(tx.cells[name])   # 3.13's LOAD_CLOSURE: the cell itself, for a closure
        return
    tx.push(tx.read_local(name))


def _store_local(tx, name: str, value) -> None:
    if value is NULL:
        tx.symbolic_locals.pop(name, None)
    else:
        tx.symbolic_locals[name] = value


@handler("LOAD_FAST_LOAD_FAST")
def _load_fast_load_fast(tx, inst):
    first, second = inst.argval
    tx.push(tx.read_local(first))
    tx.push(tx.read_local(second))


@handler("STORE_FAST_LOAD_FAST")
def _store_fast_load_fast(tx, inst):
    stored, loaded = inst.argval
    _store_local(tx, stored, tx.pop())
    tx.push(tx.read_local(loaded))


@handler("STORE_FAST_STORE_FAST")
def _store_fast_store_fast(tx, inst):
    first, second = inst.argval
    _store_local(tx, first, tx.pop())
    _store_local(tx, second, tx.pop())


@handler("LOAD_FAST_AND_CLEAR")
def _load_fast_and_clear(tx, inst):
    name = inst.argval
    tx.push(tx.read_local(name) if name in tx.symbolic_locals else NULL)
    tx.symbolic_locals.pop(name, None)


@handler("STORE_FAST")
def _store_fast(tx, inst):
    _store_local(tx, inst.argval, tx.pop())


@handler("DELETE_FAST")
def _delete_fast(tx, inst):
    tx.symbolic_locals.pop(inst.argval, None)


@handler("LOAD_CONST")
def _load_const(tx, inst):
    tx.push(tx.wrap_constant(inst.argval))


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
    push_callable(tx, _load_global_value(tx, inst.argval),
                  null=inst.arg is not None and bool(inst.arg & 1))


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
    push_callable(tx, tx.getattr(obj, inst.argval), null=attr_method_form(inst))


@handler("LOAD_METHOD")
def _load_method(tx, inst):
    obj = tx.pop()
    push_callable(tx, tx.getattr(obj, inst.argval))


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
    push_callable(tx, sup.var_getattr(tx, inst.argval), null=bool(inst.arg & 1))


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


# Instructions that take any value's truth themselves (the translator's handlers do).
_TRUTH_CONSUMERS = frozenset({"POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "UNARY_NOT"})


@handler("TO_BOOL")
def _to_bool(tx, inst):
    """3.13 converts to bool before a branch or ``not``. Those handlers take the truth of any
    value, so before them TO_BOOL leaves the value as it is: a tensor condition then breaks
    the graph at the branch, as on 3.11/3.12, whose emitter passes on a real bool."""
    nxt = tx.instructions[tx.ip] if tx.ip < len(tx.instructions) else None
    if nxt is not None and nxt.opname in _TRUTH_CONSUMERS:
        return
    tx.push(ConstantVariable(tx.pop().truthy(tx)))


@handler("COMPARE_OP")
def _compare_op(tx, inst):
    # 3.13's bool bit (VERSION_SPEC.compare_to_bool_bit) is left to what consumes the result,
    # a branch or ``not``, as for TO_BOOL; the graph-break emitter applies it.
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


_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


def _constant_for_format(value):
    if isinstance(value, TensorVariable):
        raise Unsupported("formatting a tensor into a string")
    return value.as_python_constant()


@handler("FORMAT_VALUE")
def _format_value(tx, inst):
    spec = tx.pop().as_python_constant() if inst.arg & 0x04 else ""
    value = _constant_for_format(tx.pop())
    conv = _CONVERSIONS[inst.arg & 0x03]
    if conv is not None:
        value = conv(value)
    tx.push(ConstantVariable(format(value, spec)))


@handler("CONVERT_VALUE")
def _convert_value(tx, inst):
    tx.push(ConstantVariable(_CONVERSIONS[inst.arg](_constant_for_format(tx.pop()))))


@handler("FORMAT_SIMPLE")
def _format_simple(tx, inst):
    tx.push(ConstantVariable(format(_constant_for_format(tx.pop()), "")))


@handler("FORMAT_WITH_SPEC")
def _format_with_spec(tx, inst):
    spec = tx.pop().as_python_constant()
    tx.push(ConstantVariable(format(_constant_for_format(tx.pop()), spec)))


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
