"""Opcode handlers for control: iteration, jumps, returns, calls and function creation,
generators, with blocks, exception handlers, imports, class bodies and raise.

Each registers itself with ``@handler`` into ``translator.HANDLERS``; ``translator`` imports
this module at its end (see its docstring), after the names used here exist.
"""
from __future__ import annotations

import builtins
import sys
import types
from typing import Callable

from ember.frontend.exc import Unsupported
from ember.frontend.source import AttrSource
from ember.frontend.bytecode import VERSION_SPEC
from ember.frontend.translator import (HANDLERS, NULL, InstructionTranslator, _Return, handler,
                                       split_callable)
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.container_iterators import ListIteratorVariable
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.functions import NestedUserFunctionVariable
from ember.frontend.variables.handlers import HandlerFunctionVariable
from ember.frontend.variables.super_call import SuperVariable

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
    # 3.12+ jump past the loop's END_FOR (3.13: and the POP_TOP after it), iterator popped
    for skipped in VERSION_SPEC.for_iter_exit_skips:
        if tx.instructions[tx.ip].opname == skipped:
            tx.ip += 1


# ----------------------------------------------------------------------------- control flow

@handler("RETURN_CONST")
def _return_const(tx, inst):
    tx.return_value = tx.wrap_constant(inst.argval)
    raise _Return


@handler("RETURN_VALUE")
def _return_value(tx, inst):
    tx.return_value = tx.pop()
    raise _Return


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


@handler("CALL_KW")
def _call_kw(tx, inst):
    """3.13: the keyword names are a tuple on top of the arguments (KW_NAMES before)."""
    tx.kw_names = tx.pop().as_python_constant()
    _call(tx, inst)


@handler("CALL")
def _call(tx, inst):
    argc = inst.arg
    args = tx.popn(argc)
    second = tx.pop()
    first = tx.pop()
    fn, args = split_callable(first, second, args)
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
    if VERSION_SPEC.null_after_callable:   # 3.13: callable, NULL, args[, kwargs]
        tx.pop()
        fn = tx.pop()
    else:
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
    flags = inst.arg or 0     # 3.13: no operand; SET_FUNCTION_ATTRIBUTE adds each part
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


@handler("SET_FUNCTION_ATTRIBUTE")
def _set_function_attribute(tx, inst):
    fn = tx.pop()
    value = tx.pop()
    if not isinstance(fn, NestedUserFunctionVariable):
        raise Unsupported(f"SET_FUNCTION_ATTRIBUTE on {fn}")
    if inst.arg == 0x01:
        fn.defaults = value.items
    elif inst.arg == 0x02:
        fn.kwdefaults = {k: v for k, v in value.items.items()}
    elif inst.arg == 0x08:
        fn.closure = value.items
    elif inst.arg != 0x04:    # annotations do not affect behaviour
        raise Unsupported(f"SET_FUNCTION_ATTRIBUTE {inst.arg}")
    tx.push(fn)


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
