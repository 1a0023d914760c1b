"""A frame that runs eagerly still compiles what it calls: its code, with every call routed.

Ember has no frame-evaluation hook, so when a compiled function's frame cannot be captured
(``Unsupported``: a break where the graph cannot split, a construct capture refuses) and
runs in Python, the modules and functions it calls would run in Python too: one unsupported
line in a wrapper would cost the compilation of the whole model it wraps.

Decision: the eager frame runs a rewritten copy of its code object in which the callable of
each call site passes through ``route(callable)`` just before the call; ``route`` (built by
``ember.api``) returns the callable itself or Ember's compile entry for it. Why a rewritten
copy and not a scoped patch of ``nn.Module.__call__``: a class attribute is process-wide, so
other threads, a concurrent capture (which compares ``__call__`` with nn.Module's by
identity) and torch.fx's own patch of it would all see the router; the copy's routing is
local to the frame by construction (threads, re-entry and exceptions need nothing), and it
also reaches plain functions. Only the frame's own call sites are routed: what a callee
calls is the callee's capture's business (inlined there, or routed again when the callee
runs eagerly itself).

Call sites rewritten (the others run as written):

* ``LOAD_GLOBAL`` with its push-NULL bit (``helper(x)``, a global ``model(x)``);
* method-form attribute loads (``self.model(x)``: 3.11 ``LOAD_METHOD``, 3.12/3.13 ``LOAD_ATTR``
  with the method bit), turned into a plain attribute load: the bound method is made, as
  ``route`` needs one callable;
* an explicit ``PUSH_NULL`` (``layer(x)`` in a loop, ``self.module(*inputs, **kw)``): on 3.13
  it follows the callable, which is routed where it sits on the stack; on 3.11/3.12 it comes
  first, and the callable's end is found by following the stack over straight-line code to
  the call (a site with a jump in between, as in a conditional expression, is left alone).

On 3.11/3.12 the stack at a call is ``NULL, callable, args`` and ``NULL, callable`` becomes
``NULL, NULL, route, callable`` -> ``CALL 1`` -> ``NULL, routed``; on 3.13 (``callable,
NULL|self, args``) ``callable`` becomes ``route, NULL, callable`` -> ``CALL 1``. The inserted
instructions carry the line and exception handler of the instruction they follow, so
tracebacks and ``try`` blocks behave as in the original.
"""
from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Callable

from ember.frontend import bytecode as bc
from ember.frontend.analysis import depths_on_entry, stack_effect

_OLD_NULL_FIRST = not bc.VERSION_SPEC.null_after_callable      # 3.11/3.12
_CALLS = {"PRECALL", "CALL", "CALL_KW", "CALL_FUNCTION_EX"}
_NOT_REWRITTEN = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR


def routed_code(code: types.CodeType, route: Callable) -> types.CodeType | None:
    """``code`` with the callable of each call site passed through ``route``; None when it
    has no call site to route, is a coroutine's, or holds opcodes its copy cannot."""
    if code.co_flags & _NOT_REWRITTEN:
        return None
    try:
        insts = bc.disassemble(code)
    except ValueError:   # run-time opcodes (see disassemble): the frame runs as written
        return None
    out: list[bc.Instruction] = []
    routed = 0
    ends = _callable_ends(insts) if _OLD_NULL_FIRST else set()
    depths = depths_on_entry(insts)
    for i, inst in enumerate(insts):
        name = inst.opname
        if name == "PUSH_NULL" and not _OLD_NULL_FIRST and (depths[i] or 0) > 0:
            out += _route_top(inst, route)         # 3.13: the callable is on top
            out.append(inst)
            routed += 1
            continue
        out.append(inst)
        if name == "LOAD_GLOBAL" and inst.arg & 1:
            if _OLD_NULL_FIRST:
                out += _route_above_null(inst, route)
            else:
                inst.arg &= ~1
                out += [*_route_top(inst, route), _like(inst, "PUSH_NULL")]
            routed += 1
        elif _is_method_load(inst):
            if name == "LOAD_METHOD":
                inst.opname = "LOAD_ATTR"
            else:
                inst.arg &= ~1
            if _OLD_NULL_FIRST:   # attr -> NULL, attr
                out += [_like(inst, "PUSH_NULL"), _like(inst, "SWAP", arg=2),
                        *_route_above_null(inst, route)]
            else:
                out += [*_route_top(inst, route), _like(inst, "PUSH_NULL")]
            routed += 1
        elif id(inst) in ends:
            out += _route_above_null(inst, route)
            routed += 1
    if not routed:
        return None
    return bc.assemble(out, code)


def _is_method_load(inst: bc.Instruction) -> bool:
    return inst.opname == "LOAD_METHOD" or (inst.opname == "LOAD_ATTR"
                                           and bc.VERSION_SPEC.load_method[1]
                                           and bool(inst.arg & 1))


def _like(anchor: bc.Instruction, opname: str, **operand) -> bc.Instruction:
    """A new instruction at ``anchor``'s line, under its exception handler."""
    inst = bc.create_instruction(opname, **operand)
    inst.lineno, inst.positions = anchor.lineno, anchor.positions
    inst.exn_tab_entry = anchor.exn_tab_entry
    return inst


def _call_one(anchor: bc.Instruction) -> list[bc.Instruction]:
    return [dataclasses.replace(i, lineno=anchor.lineno, positions=anchor.positions,
                                exn_tab_entry=anchor.exn_tab_entry)
            for i in bc.create_call(1)]


def _route_top(anchor: bc.Instruction, route: Callable) -> list[bc.Instruction]:
    """3.13: ``c`` -> ``route(c)``."""
    return [_like(anchor, "LOAD_CONST", argval=route), _like(anchor, "SWAP", arg=2),
            _like(anchor, "PUSH_NULL"), _like(anchor, "SWAP", arg=2), *_call_one(anchor)]


def _route_above_null(anchor: bc.Instruction, route: Callable) -> list[bc.Instruction]:
    """3.11/3.12: ``NULL, c`` -> ``NULL, route(c)``."""
    return [_like(anchor, "PUSH_NULL"), _like(anchor, "SWAP", arg=2),
            _like(anchor, "LOAD_CONST", argval=route), _like(anchor, "SWAP", arg=2),
            *_call_one(anchor)]


def _callable_ends(insts: list[bc.Instruction]) -> set[int]:
    """3.11/3.12: for each explicit ``PUSH_NULL`` whose call is reached by straight-line
    code, the instruction that completes the callable above it (ids)."""
    ends = set()
    for i, inst in enumerate(insts):
        if inst.opname != "PUSH_NULL":
            continue
        depth, end = 1, None       # the NULL
        for later in insts[i + 1:]:
            if later.opname in _CALLS and depth == 2 + _call_operands(later):
                if end is not None:     # its own call: the callable is complete at ``end``
                    ends.add(id(end))
                break
            if bc.is_jump(later) or bc.is_scope_exit(later):
                break
            depth += stack_effect(later)
            if depth < 2:
                break
            if depth == 2:
                end = later
    return ends


def _call_operands(inst: bc.Instruction) -> int:
    """Values above the callable that a call consumes."""
    if inst.opname == "CALL_FUNCTION_EX":
        return 1 + (inst.arg & 1)
    return inst.arg
