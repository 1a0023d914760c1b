"""Resume functions: the rest of a frame after a graph break, as a new code object.

A graph break splits a frame at one instruction: the graph captured so far runs, the
instruction runs in plain Python, and a *resume function* continues the frame from the
instruction after it (or from a branch target). The resume function is a new code object
built from the original one:

    COPY_FREE_VARS n            (when the frame has free variables: the same closure)
    RESUME 0
    LOAD_FAST ___stack0         the live stack, rebuilt from arguments (PUSH_NULL for NULLs,
    ...                         GET_ITER after a tuple for the iterator of a ``for`` loop)
    JUMP_FORWARD  -> target
    <every instruction of the original code, unchanged, exception table included>

Its parameters are the live stack values (``___stack0``...) followed by the locals that are
live at the target and bound at the break, under their own names, so the copied body reads
them as it always did. Because the stack below the target is rebuilt exactly, the copied
exception table stays valid: an open ``with`` block finds its exit where it left it.

Where the entry lives (Ember has no frame-evaluation hook): the generated entry function of
the frame that broke calls the resume function through Ember's compile entry, an
``OptimizedFunction`` with the same backend and options, which the entry holds as a constant.
That wrapper gives the resume function its own guards and cache entries; a resume function
whose capture fails runs eagerly like any frame. The code objects themselves are cached per
(original code, instruction, stack layout, locals), so a break inside a loop that resumes at
the same instruction again reuses one code object, and a resume of a resume maps back to the
original code (``origin``) instead of nesting prologues.
"""
from __future__ import annotations

import inspect
import types

from ember.frontend.bytecode import Instruction, assemble, create_instruction, disassemble

# resume code -> (original code, index of the original's first instruction in the resume)
_ORIGIN: dict[types.CodeType, tuple[types.CodeType, int]] = {}
_CODES: dict[tuple, types.CodeType] = {}


def origin(code: types.CodeType) -> tuple[types.CodeType, int]:
    """(original code, offset of its instructions) for a resume code; (code, 0) otherwise."""
    return _ORIGIN.get(code, (code, 0))


def stack_name(i: int) -> str:
    return f"___stack{i}"


# How the prologue rebuilds one stack item.
NULL, VALUE, ITERATOR = "null", "value", "iterator"


def resume_code(code: types.CodeType, target: int, stack: tuple[str, ...],
                local_names: tuple[str, ...]) -> types.CodeType:
    """The resume code continuing ``code`` at instruction ``target`` (an index into
    ``disassemble(code)``) with a stack described by ``stack`` (per item: NULL, a VALUE
    argument, or an ITERATOR over the items of a tuple argument: a ``for`` loop's), and the
    locals ``local_names`` (parameters after the stack's arguments)."""
    original, shift = origin(code)
    key = (original, target - shift, stack, local_names)
    found = _CODES.get(key)
    if found is None:
        found = _CODES[key] = _build(original, target - shift, stack, local_names)
    return found


def _build(original: types.CodeType, target: int, stack: tuple[str, ...],
           local_names: tuple[str, ...]) -> types.CodeType:
    body = disassemble(original)
    prologue: list[Instruction] = []
    if original.co_freevars:
        prologue.append(create_instruction("COPY_FREE_VARS", arg=len(original.co_freevars)))
    prologue.append(create_instruction("RESUME", arg=0))
    params = []
    for i, kind in enumerate(stack):
        if kind == NULL:
            prologue.append(create_instruction("PUSH_NULL"))
            continue
        params.append(stack_name(i))
        prologue.append(create_instruction("LOAD_FAST", argval=stack_name(i)))
        if kind == ITERATOR:
            prologue.append(create_instruction("GET_ITER"))
    params += local_names
    prologue.append(create_instruction("JUMP_FORWARD", target=body[target]))
    varnames = params + [v for v in original.co_varnames if v not in params]
    name = f"{original.co_name}_resume_at_{target}"
    flags = original.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    code = assemble(prologue + body, original, co_argcount=len(params),
                    co_posonlyargcount=0, co_kwonlyargcount=0, co_varnames=tuple(varnames),
                    co_flags=flags, co_name=name,
                    co_qualname=f"{original.co_qualname}_resume_at_{target}")
    _ORIGIN[code] = (original, len(prologue))
    return code


def resume_function(code: types.CodeType, frame_fn: types.FunctionType) -> types.FunctionType:
    """A function running resume ``code`` with the globals and closure of the frame's
    function (a resume code keeps the original's free variables)."""
    return types.FunctionType(code, frame_fn.__globals__, code.co_name, None,
                              frame_fn.__closure__)
