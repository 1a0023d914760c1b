"""Flow analyses over ``bytecode.Instruction`` lists: stack depth, jump targets, liveness.

The control-flow graph is implicit: an instruction's successors are the next instruction
(unless it is an unconditional jump, a return or a raise), its jump ``target``, and the handler
of its ``exn_tab_entry`` (any instruction covered by a handler may raise into it).

Decisions
---------
* ``stack_depth`` mirrors CPython's compiler (``stackdepth`` in compile.c / flowgraph.c): per
  instruction it takes the larger of ``depth + effect`` along the fall-through and the jump, and
  a handler starts at ``entry.depth + 1`` (the exception) ``+ 1`` when ``lasti`` (the offset of
  the raising instruction). Only reachable instructions count, as in CPython. With the same
  rules the computed size equals the compiler's ``co_stacksize`` on unedited code.
* ``livevars_at`` is a classic backward may-liveness fixpoint over instructions. Reads are
  LOAD_FAST-style opcodes (and DELETE_FAST, which fails on an unbound local, so it needs the
  value); writes are STORE_FAST. An edge into an exception handler does not kill anything: the
  raising instruction may not have stored yet. Cell and free variables are not tracked
  (resume functions pass cells through the closure), and "live" means *may* be read: the local
  can still be unbound on some paths (3.12's LOAD_FAST_AND_CLEAR reads possibly-unbound
  comprehension variables to restore them afterwards).
"""
from __future__ import annotations

import dis
from typing import Iterable, Sequence

from ember.frontend.bytecode import (VERSION_SPEC, Instruction, has_arg, is_jump, is_scope_exit,
                                     is_unconditional_jump)

__all__ = ["stack_effect", "stack_depth", "jump_targets", "livevars_at", "remove_nops",
           "remove_dead_code", "reachable"]

# Locals these opcodes read / write (3.13's super-instructions do one of each half, in order).
_LOCAL_READS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST"})
_LOCAL_WRITES = frozenset({"STORE_FAST"})


def _local_effects(inst: Instruction) -> list[tuple[bool, str]]:
    """(is_read, name) for each local ``inst`` reads or writes, in execution order."""
    halves = VERSION_SPEC.paired_locals.get(inst.opname)
    if halves is not None:
        return [(half in _LOCAL_READS, name) for half, name in zip(halves, inst.argval)
                if half in _LOCAL_READS or half in _LOCAL_WRITES]
    if inst.opname in _LOCAL_READS:
        return [(True, inst.argval)]
    if inst.opname in _LOCAL_WRITES:
        return [(False, inst.argval)]
    return []


def stack_effect(inst: Instruction, jump: bool = False) -> int:
    """Net stack change of ``inst`` (``jump``: along its jump rather than its fall-through)."""
    override = VERSION_SPEC.stack_effect_overrides.get(inst.opname)
    if override is not None:
        return override
    opcode = inst.opcode
    if not has_arg(opcode):
        return dis.stack_effect(opcode, None, jump=jump)
    return dis.stack_effect(opcode, inst.arg if inst.arg is not None else 0, jump=jump)


def _falls_through(inst: Instruction) -> bool:
    return not (is_unconditional_jump(inst) or is_scope_exit(inst))


def _handler_depth(inst: Instruction) -> int:
    entry = inst.exn_tab_entry
    return entry.depth + 1 + int(bool(entry.lasti))


def stack_depth(instructions: Sequence[Instruction]) -> int:
    """Maximum stack depth over every reachable path, exception handlers included."""
    return _depths(instructions)[1] if instructions else 0


def depths_on_entry(instructions: Sequence[Instruction]) -> list[int | None]:
    """The stack depth on entry to each instruction (None: unreachable)."""
    return _depths(instructions)[0] if instructions else []


def _depths(instructions: Sequence[Instruction]) -> tuple[list[int | None], int]:
    position = {id(inst): i for i, inst in enumerate(instructions)}
    start_depth: list[int | None] = [None] * len(instructions)
    work: list[tuple[int, int]] = [(0, 0)]
    max_depth = 0

    def push(inst: Instruction, depth: int) -> None:
        nonlocal max_depth
        max_depth = max(max_depth, depth)
        work.append((position[id(inst)], depth))

    while work:
        i, depth = work.pop()
        while i < len(instructions):
            seen = start_depth[i]
            if seen is not None and seen >= depth:
                break
            start_depth[i] = depth
            inst = instructions[i]
            if inst.exn_tab_entry is not None:
                push(inst.exn_tab_entry.target, _handler_depth(inst))
            if is_jump(inst):
                push(inst.target, depth + stack_effect(inst, jump=True))
            if inst.opname in VERSION_SPEC.sized_as_push:
                max_depth = max(max_depth, depth + 1)
            depth += stack_effect(inst, jump=False)
            if depth < 0:
                raise ValueError(f"stack underflow at {inst}")
            max_depth = max(max_depth, depth)
            if not _falls_through(inst):
                break
            i += 1
    return start_depth, max_depth


def jump_targets(instructions: Iterable[Instruction], handlers: bool = True) -> set[Instruction]:
    """Instructions some jump (and, with ``handlers``, some exception entry) goes to."""
    targets: set[Instruction] = set()
    for inst in instructions:
        if inst.target is not None:
            targets.add(inst.target)
        if handlers and inst.exn_tab_entry is not None:
            targets.add(inst.exn_tab_entry.target)
    return targets


def _successors(instructions: Sequence[Instruction], position: dict[int, int], i: int):
    """(normal successors, exceptional successors) of instruction ``i`` as indices."""
    inst = instructions[i]
    normal = []
    if _falls_through(inst) and i + 1 < len(instructions):
        normal.append(i + 1)
    if inst.target is not None:
        normal.append(position[id(inst.target)])
    exceptional = []
    if inst.exn_tab_entry is not None:
        exceptional.append(position[id(inst.exn_tab_entry.target)])
    return normal, exceptional


def livevars_at(instructions: Sequence[Instruction], inst: Instruction) -> set[str]:
    """Locals that may be read before being written on some path starting at ``inst``."""
    position = {id(x): i for i, x in enumerate(instructions)}
    succs = [_successors(instructions, position, i) for i in range(len(instructions))]
    live_in: list[frozenset[str]] = [frozenset()] * len(instructions)
    changed = True
    while changed:
        changed = False
        for i in range(len(instructions) - 1, -1, -1):
            current = instructions[i]
            normal, exceptional = succs[i]
            out: set[str] = set()
            for j in normal:
                out |= live_in[j]
            # backwards through the instruction's own reads and writes; the handler may be
            # entered before any of its writes happened, so its live locals stay live
            effects = _local_effects(current)
            for is_read, name in reversed(effects):
                if is_read:
                    out.add(name)
                else:
                    out.discard(name)
            for j in exceptional:
                out |= live_in[j]
            new = frozenset(out)
            if new != live_in[i]:
                live_in[i] = new
                changed = True
    return set(live_in[position[id(inst)]])


def reachable(instructions: Sequence[Instruction]) -> set[Instruction]:
    """Instructions reachable from the first one (through jumps, fall-through and handlers)."""
    if not instructions:
        return set()
    position = {id(x): i for i, x in enumerate(instructions)}
    seen = {0}
    work = [0]
    while work:
        i = work.pop()
        normal, exceptional = _successors(instructions, position, i)
        for j in normal + exceptional:
            if j not in seen:
                seen.add(j)
                work.append(j)
    return {instructions[i] for i in seen}


def remove_dead_code(instructions: Sequence[Instruction]) -> list[Instruction]:
    """Drop instructions no path reaches (jumps never target dead code, so nothing dangles)."""
    live = reachable(instructions)
    return [inst for inst in instructions if inst in live]


def remove_nops(instructions: Sequence[Instruction]) -> list[Instruction]:
    """Drop NOPs, moving jumps and handlers that pointed at one to the next kept instruction.

    NOPs carry line numbers for tracing; removing them only changes line events.
    """
    kept: list[Instruction] = []
    redirect: dict[int, Instruction] = {}
    pending: list[Instruction] = []
    for inst in instructions:
        if inst.opname == "NOP":
            pending.append(inst)
            continue
        for nop in pending:
            redirect[id(nop)] = inst
        pending.clear()
        kept.append(inst)
    if pending:   # trailing NOPs: keep them, nothing follows to redirect to
        kept.extend(pending)
    for inst in kept:
        if inst.target is not None and id(inst.target) in redirect:
            inst.target = redirect[id(inst.target)]
        entry = inst.exn_tab_entry
        if entry is not None and id(entry.target) in redirect:
            entry.target = redirect[id(entry.target)]
    return kept
