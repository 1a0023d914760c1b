"""Graph breaks: how the entry runs the instruction capture stopped at, and what it reports.

When capture meets something it cannot put in the graph (a ``print``, ``.item()`` feeding
Python, a branch on a tensor's value, an unknown C function, a call that breaks inside an
inlined function), ``convert.py`` captures the frame again up to that instruction of the top
frame, and the generated entry then

1. calls the graph compiled so far;
2. rebuilds the live stack values and locals (from their Sources or graph outputs);
3. applies the mutations of Python state captured before the break;
4. runs the instruction in plain Python (this module: one emitter per opcode);
5. calls the resume function for the rest of the frame (``resume.py``).

Inside a ``try`` or ``with`` block (any context manager) the instruction runs under a
``try`` in the entry, and its exception resumes the frame at the handler it reaches in
eager, so ``except`` clauses, ``finally`` bodies and ``__exit__`` run exactly once, in the
resume function (``convert._break_tail``).

A frame whose locals are closed over by inner functions passes its cells to the resume
function (``resume.py``), also when unassigned at the break; an iterator held in locals
and on the stack is passed once, as its remaining items (``convert._live_locals``); one
over a dict or list (or enumerate/zip/chain/... of one) as a real iterator over the real
dict, list, set or deque at the same position, made after the mutations are replayed, so
the rest of the loop sees the container as eager does (``container_iterators.Resumed*``).

Inside an autocast or inference-mode block (which the graph models), the graph closes the
block at the break, the entry runs the instruction inside a real one, and the resume
function's prologue enters it again (``resume.CONTEXT``), so its own graph models it.

A break is refused, and the whole frame runs eagerly with the reason, where splitting the
frame could change what the program does: inside such a block entered other than by a
``with`` of the frame itself, inside an exception handler (a resume function that starts at
one is captured, but outside it the exception would not be the one being handled; the
RERAISE that ends it is the exception; a ``with`` block's handler calls ``__exit__``
during capture, and a break inside that call is refused too), in a frame that makes a cell
after its start (3.12's inlined comprehensions), in a generator, with an iterator that is
live both by a name and inside another value, or at an instruction without an emitter here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import linecache
import operator
from typing import Callable

import torch

from ember import logs, metrics
from ember.frontend.exc import Unsupported


# ----------------------------------------------------------------------------- reasons

@dataclasses.dataclass
class BreakReason:
    """Why capture stopped, and where in the user's code."""
    reason: str
    filename: str
    lineno: int
    user_stack: list[str]
    frame_ran_eagerly: bool = False   # the break was not safe: the whole frame ran eagerly

    @property
    def location(self) -> str:
        return f"{self.filename}:{self.lineno}"

    @property
    def source_line(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        what = "frame ran eagerly" if self.frame_ran_eagerly else "graph break"
        return f"{what}: {self.reason}\n  at {self.location}\n    {self.source_line}"

    @classmethod
    def from_error(cls, e: Unsupported, frame_ran_eagerly: bool = False) -> "BreakReason":
        return cls(e.msg, e.filename or "<unknown>", e.lineno or 0, list(e.user_stack),
                   frame_ran_eagerly)


_observers: list[Callable[[str, object], None]] = []


@contextlib.contextmanager
def observe(callback: Callable[[str, object], None]):
    """Call ``callback(kind, payload)`` for each event while the block runs: ``("break",
    BreakReason)`` and ``("graph", GraphModule)`` (``ember.explain`` collects these)."""
    _observers.append(callback)
    try:
        yield
    finally:
        _observers.remove(callback)


def notify(kind: str, payload) -> None:
    for callback in list(_observers):
        callback(kind, payload)


def record(reason: BreakReason, frame_name: str) -> None:
    """Count, log (``EMBER_LOGS=graph_breaks``, with the user's stack) and report a break."""
    if not reason.frame_ran_eagerly:
        metrics.counters["frontend"]["graph_breaks"] += 1
    if logs.enabled("graph_breaks"):
        stack = "\n".join(f"    {loc}\n      {_line_of(loc)}" for loc in reason.user_stack)
        logs.log("graph_breaks", "%s in %s: %s\n  user stack (most recent last):\n%s",
                 "frame runs eagerly" if reason.frame_ran_eagerly else "graph break",
                 frame_name, reason.reason, stack)
    notify("break", reason)


def _line_of(location: str) -> str:
    """The source line of ``file:line in name``."""
    place = location.rsplit(" in ", 1)[0]
    filename, _, line = place.rpartition(":")
    return linecache.getline(filename, int(line)).strip() if line.isdigit() else ""


# --------------------------------------------------------------------------- emitters

@dataclasses.dataclass
class Outcome:
    """One way the instruction continues: resume at instruction ``target`` (None: the
    instruction left the frame) with ``pushed`` expressions on the stack (None pushes NULL),
    taken when ``when`` holds (None: otherwise)."""
    target: int | None
    pushed: list[str | None]
    when: str | None = None


@dataclasses.dataclass
class Emitted:
    lines: list[str]
    outcomes: list[Outcome]


# emitter(ctx, inst, operand expressions) -> Emitted; inputs(tx, inst) = operands consumed
_EMITTERS: dict[str, tuple[Callable, Callable]] = {}


def emitter(*opnames: str, inputs: int | Callable):
    def deco(fn):
        count = inputs if callable(inputs) else (lambda tx, inst: inputs)
        for name in opnames:
            _EMITTERS[name] = (count, fn)
        return fn
    return deco


@dataclasses.dataclass
class EmitContext:
    """What an emitter may use: the translator, the codegen, the stack operands (trackers),
    the index of the next instruction, and how to call a function through Ember's compile
    entry (``call_compiled``, a constant name, or None to call directly)."""
    tx: object
    cg: object
    operands: list
    next_index: int
    call_compiled: str | None

    def result(self) -> str:
        return self.cg.fresh("___r")

    def target_index(self, inst) -> int:
        return self.tx.index_of[id(inst.target)]

    def next(self, *pushed) -> list[Outcome]:
        return [Outcome(self.next_index, list(pushed))]


def _rebuild(ctx: EmitContext, vt) -> str:
    return ctx.cg.reconstruct(vt)


def _call_inputs(tx, inst) -> int:
    return inst.arg + 2 + (inst.opname == "CALL_KW")   # CALL_KW: + the names tuple


def _call_ex_inputs(tx, inst) -> int:
    from ember.frontend.bytecode import VERSION_SPEC
    n = 2 + (inst.arg & 1)                  # callable, args[, kwargs]
    if VERSION_SPEC.null_after_callable:    # 3.13: callable, NULL, args[, kwargs]
        return n + 1
    from ember.frontend.translator import NULL
    return n + (len(tx.stack) > n and tx.stack[-n - 1] is NULL)


def _call_text(ctx: EmitContext, fn_expr: str, parts: list[str]) -> str:
    if ctx.call_compiled is not None:
        return f"{ctx.call_compiled}({', '.join([fn_expr, *parts])})"
    return f"{fn_expr}({', '.join(parts)})"


def _frame_readers() -> dict:
    """Callables that read the frame that calls them when given at most this many positional
    arguments: run at a break, they would see the generated entry's frame (its locals, its
    globals, no ``__class__`` cell), not the user's."""
    import inspect
    import sys
    return {locals: 0, globals: 0, vars: 0, dir: 0, super: 0, eval: 1, exec: 1,
            sys._getframe: 1, inspect.currentframe: 0}


def _refuse_frame_reader(fn, nargs: int | None) -> None:
    """Unsupported (the frame runs eagerly) for a call that reads its caller's frame."""
    value = getattr(fn, "value", None)
    try:
        limit = _frame_readers().get(value)
    except TypeError:        # an unhashable value: not one of them
        return
    if limit is not None and (nargs is None or nargs <= limit):
        raise Unsupported(f"{getattr(value, '__name__', value)}() reads the calling frame, "
                          f"which is not the user's outside the graph")


@emitter("CALL", "CALL_KW", inputs=_call_inputs)
def _emit_call(ctx: EmitContext, inst) -> Emitted:
    from ember.frontend.translator import split_callable
    first, second, *args = ctx.operands
    if inst.opname == "CALL_KW":
        names = args.pop().as_python_constant()
    else:
        names = ctx.tx.kw_names
    fn, args = split_callable(first, second, args)
    _refuse_frame_reader(fn, len(args) - len(names))
    positional = args[:len(args) - len(names)]
    parts = [_rebuild(ctx, a) for a in positional]
    parts += [f"**{{{k!r}: {_rebuild(ctx, v)}}}" for k, v in
              zip(names, args[len(args) - len(names):])]
    r = ctx.result()
    return Emitted([f"{r} = {_call_text(ctx, _rebuild(ctx, fn), parts)}"], ctx.next(r))


@emitter("CALL_FUNCTION_EX", inputs=_call_ex_inputs)
def _emit_call_ex(ctx: EmitContext, inst) -> Emitted:
    from ember.frontend.translator import NULL
    ops = [v for v in ctx.operands if v is not NULL]
    fn, args, kwargs = ops[0], ops[1], ops[2] if inst.arg & 1 else None
    _refuse_frame_reader(fn, None)
    parts = [f"*{_rebuild(ctx, args)}"]
    if kwargs is not None:
        parts.append(f"**{_rebuild(ctx, kwargs)}")
    r = ctx.result()
    return Emitted([f"{r} = {_call_text(ctx, _rebuild(ctx, fn), parts)}"], ctx.next(r))


def _operator_emitter(op_of: Callable):
    def emit(ctx: EmitContext, inst) -> Emitted:
        r = ctx.result()
        args = ", ".join(_rebuild(ctx, v) for v in ctx.operands)
        return Emitted([f"{r} = {ctx.cg.const(op_of(inst))}({args})"], ctx.next(r))
    return emit


def _binary_op(inst):
    import dis
    from ember.frontend.opcodes_data import _BINARY_OPS
    return _BINARY_OPS[dis._nb_ops[inst.arg][1]]


def _compare_op(inst):
    from ember.frontend.opcodes_data import _COMPARE_OPS
    return _COMPARE_OPS[inst.argval]


_EMITTERS["BINARY_OP"] = (lambda tx, inst: 2, _operator_emitter(_binary_op))
@emitter("COMPARE_OP", inputs=2)
def _emit_compare(ctx: EmitContext, inst) -> Emitted:
    from ember.frontend.bytecode import VERSION_SPEC
    emitted = _operator_emitter(_compare_op)(ctx, inst)
    if inst.arg & VERSION_SPEC.compare_to_bool_bit:   # 3.13: the branch after takes a bool
        r = emitted.outcomes[0].pushed[0]
        emitted.lines.append(f"{r} = bool({r})")
    return emitted


@emitter("TO_BOOL", inputs=1)
def _emit_to_bool(ctx: EmitContext, inst) -> Emitted:
    r = ctx.result()
    return Emitted([f"{r} = bool({_rebuild(ctx, ctx.operands[0])})"], ctx.next(r))
_EMITTERS["BINARY_SUBSCR"] = (lambda tx, inst: 2, _operator_emitter(lambda i: operator.getitem))
_EMITTERS["UNARY_NEGATIVE"] = (lambda tx, inst: 1, _operator_emitter(lambda i: operator.neg))
_EMITTERS["UNARY_POSITIVE"] = (lambda tx, inst: 1, _operator_emitter(lambda i: operator.pos))
_EMITTERS["UNARY_INVERT"] = (lambda tx, inst: 1, _operator_emitter(lambda i: operator.invert))
_EMITTERS["UNARY_NOT"] = (lambda tx, inst: 1, _operator_emitter(lambda i: operator.not_))
_EMITTERS["GET_ITER"] = (lambda tx, inst: 1, _operator_emitter(lambda i: iter))
_EMITTERS["IS_OP"] = (lambda tx, inst: 2, _operator_emitter(
    lambda i: operator.is_not if i.arg else operator.is_))


@emitter("CONTAINS_OP", inputs=2)
def _emit_contains(ctx: EmitContext, inst) -> Emitted:
    item, container = (_rebuild(ctx, v) for v in ctx.operands)
    r = ctx.result()
    negate = "not " if inst.arg else ""
    return Emitted([f"{r} = {item} {negate}in {container}"], ctx.next(r))


@emitter("STORE_SUBSCR", inputs=3)
def _emit_store_subscr(ctx: EmitContext, inst) -> Emitted:
    value, obj, key = (_rebuild(ctx, v) for v in ctx.operands)
    return Emitted([f"{obj}[{key}] = {value}"], ctx.next())


@emitter("DELETE_SUBSCR", inputs=2)
def _emit_delete_subscr(ctx: EmitContext, inst) -> Emitted:
    obj, key = (_rebuild(ctx, v) for v in ctx.operands)
    return Emitted([f"del {obj}[{key}]"], ctx.next())


@emitter("STORE_ATTR", inputs=2)
def _emit_store_attr(ctx: EmitContext, inst) -> Emitted:
    value, obj = (_rebuild(ctx, v) for v in ctx.operands)
    return Emitted([f"setattr({obj}, {inst.argval!r}, {value})"], ctx.next())


@emitter("DELETE_ATTR", inputs=1)
def _emit_delete_attr(ctx: EmitContext, inst) -> Emitted:
    return Emitted([f"delattr({_rebuild(ctx, ctx.operands[0])}, {inst.argval!r})"],
                   ctx.next())


@emitter("LOAD_ATTR", "LOAD_METHOD", inputs=1)
def _emit_load_attr(ctx: EmitContext, inst) -> Emitted:
    from ember.frontend.bytecode import VERSION_SPEC
    from ember.frontend.translator import attr_method_form
    r = ctx.result()
    lines = [f"{r} = getattr({_rebuild(ctx, ctx.operands[0])}, {inst.argval!r})"]
    if not (inst.opname == "LOAD_METHOD" or attr_method_form(inst)):
        return Emitted(lines, ctx.next(r))
    # a bound method with a NULL calls the same as the unbound method and its self
    pushed = (r, None) if VERSION_SPEC.null_after_callable else (None, r)
    return Emitted(lines, ctx.next(*pushed))


_CONVERSIONS = {0: "", 1: "str", 2: "repr", 3: "ascii"}


@emitter("FORMAT_VALUE", inputs=lambda tx, inst: 2 if inst.arg & 0x04 else 1)
def _emit_format_value(ctx: EmitContext, inst) -> Emitted:
    value = _rebuild(ctx, ctx.operands[0])
    spec = _rebuild(ctx, ctx.operands[1]) if inst.arg & 0x04 else "''"
    convert = _CONVERSIONS[inst.arg & 0x03]
    r = ctx.result()
    return Emitted([f"{r} = format({convert}({value}), {spec})"], ctx.next(r))


@emitter("CONVERT_VALUE", inputs=1)
def _emit_convert_value(ctx: EmitContext, inst) -> Emitted:
    r = ctx.result()
    return Emitted([f"{r} = {_CONVERSIONS[inst.arg]}({_rebuild(ctx, ctx.operands[0])})"],
                   ctx.next(r))


@emitter("FORMAT_SIMPLE", "FORMAT_WITH_SPEC",
         inputs=lambda tx, inst: 2 if inst.opname == "FORMAT_WITH_SPEC" else 1)
def _emit_format(ctx: EmitContext, inst) -> Emitted:
    parts = [_rebuild(ctx, v) for v in ctx.operands]
    r = ctx.result()
    return Emitted([f"{r} = format({', '.join(parts)})"], ctx.next(r))


@emitter("UNPACK_SEQUENCE", inputs=1)
def _emit_unpack(ctx: EmitContext, inst) -> Emitted:
    names = [ctx.result() for _ in range(inst.arg)]
    target = ", ".join(names) + ("," if len(names) == 1 else "")
    return Emitted([f"{target} = {_rebuild(ctx, ctx.operands[0])}"],
                   ctx.next(*reversed(names)))


@emitter("RAISE_VARARGS", inputs=lambda tx, inst: inst.arg)
def _emit_raise(ctx: EmitContext, inst) -> Emitted:
    if inst.arg == 0:
        raise Unsupported("a bare `raise` (re-raise) at a graph break")
    parts = [_rebuild(ctx, v) for v in ctx.operands]
    line = f"raise {parts[0]}" + (f" from {parts[1]}" if len(parts) == 2 else "")
    return Emitted([line], [])


@emitter("RERAISE", inputs=1)
def _emit_reraise(ctx: EmitContext, inst) -> Emitted:
    # the end of a handler (or `finally`): the same exception object, raised again
    return Emitted([f"raise {_rebuild(ctx, ctx.operands[0])}"], [])


def _branch(jump_if_true: bool, keep_on_jump: bool):
    def emit(ctx: EmitContext, inst) -> Emitted:
        value = _rebuild(ctx, ctx.operands[0])
        cond = ctx.cg.fresh("___cond")
        test = cond if jump_if_true else f"not {cond}"
        jump = Outcome(ctx.target_index(inst), [value] if keep_on_jump else [], when=test)
        return Emitted([f"{cond} = bool({value})"], [jump, Outcome(ctx.next_index, [])])
    return emit


for _prefix in ("POP_JUMP_IF_", "POP_JUMP_FORWARD_IF_", "POP_JUMP_BACKWARD_IF_"):
    _EMITTERS[_prefix + "TRUE"] = (lambda tx, inst: 1, _branch(True, False))
    _EMITTERS[_prefix + "FALSE"] = (lambda tx, inst: 1, _branch(False, False))
_EMITTERS["JUMP_IF_TRUE_OR_POP"] = (lambda tx, inst: 1, _branch(True, True))
_EMITTERS["JUMP_IF_FALSE_OR_POP"] = (lambda tx, inst: 1, _branch(False, True))


def emitter_for(opname: str) -> tuple[Callable, Callable] | None:
    return _EMITTERS.get(opname)


# ------------------------------------------------------------------------ safety checks

def check_blocks(tx, inst) -> None:
    """Unsupported unless every ``with`` block open around ``inst`` keeps an exit that the
    resume function can call for real: a grad-mode exit, the Python ``__exit__`` of a
    user object whose ``__enter__`` ran (inlined, its effects replayed), the exit of an
    autocast/inference-mode block, which the graph closes and the resume enters again, or
    a no-op block's (a profiler range's)."""
    from ember.frontend.variables.functions import UserMethodVariable
    from ember.frontend.variables.ctx_manager import (
        CtxMethodVariable, GlobalContextVariable, GradModeExitVariable, GradModeVariable,
        NoOpContextVariable, ProfilerRangeExitVariable)
    entry = inst.exn_tab_entry
    while entry is not None:
        handler = entry.target
        i = tx.index_of[id(handler)]
        if handler.opname != "PUSH_EXC_INFO":
            break
        if tx.instructions[i + 1].opname == "WITH_EXCEPT_START":
            exit_fn = tx.stack[entry.depth - 1] if 0 < entry.depth <= len(tx.stack) else None
            grad = (isinstance(exit_fn, (GradModeExitVariable, ProfilerRangeExitVariable))
                    or isinstance(exit_fn, CtxMethodVariable)
                    and isinstance(exit_fn.ctx, (GradModeVariable, GlobalContextVariable,
                                                 NoOpContextVariable)))
            if not (grad or isinstance(exit_fn, UserMethodVariable)):
                raise Unsupported(f"graph break inside a `with` block of {exit_fn} (its "
                                  f"exit cannot run outside the graph)")
        cleanup = handler.exn_tab_entry    # the handler's own cleanup block re-raises into
        if cleanup is None:                # the block around this one
            break
        entry = cleanup.target.exn_tab_entry


def check_breakable(tx, inst) -> None:
    if tx.is_generator:
        raise Unsupported("graph break in a generator")
    if tx.handling and inst.opname != "RERAISE":
        raise Unsupported("graph break inside an exception handler (its exception would "
                          "not be the one being handled)")


def grad_mode_line(cg, mode: bool) -> str:
    return f"{cg.const(torch._C._set_grad_enabled)}({mode})"
