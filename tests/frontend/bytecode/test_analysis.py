"""ember.frontend.analysis: stack depth, jump targets, liveness, NOP / dead-code removal.

Like test_bytecode.py, runs without torch by stubbing the ``ember`` packages by path.
"""
from __future__ import annotations

import dis
import importlib
import pathlib
import sys
import types

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[3]


from bytecode_loader import _import_frontend  # noqa: E402

bc, analysis = _import_frontend()


def _nested_codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested_codes(const)


def _first(instructions, opname, argval=None):
    return next(i for i in instructions
                if i.opname == opname and (argval is None or i.argval == argval))


def _rebuild(fn, instructions):
    code = bc.assemble(instructions, fn.__code__)
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


# ---------------------------------------------------------------------------------------------
# stack
# ---------------------------------------------------------------------------------------------

def test_stack_effect_wraps_dis():
    load = bc.create_instruction("LOAD_CONST", argval=1)
    assert analysis.stack_effect(load) == 1
    pop = bc.create_instruction("POP_TOP")
    assert analysis.stack_effect(pop) == -1
    build = bc.create_instruction("BUILD_TUPLE", arg=3)
    assert analysis.stack_effect(build) == dis.stack_effect(dis.opmap["BUILD_TUPLE"], 3) == -2
    # Flag bits matter: LOAD_GLOBAL with the push-NULL bit pushes two values.
    assert analysis.stack_effect(bc.create_load_global("x", True)) == 2
    assert analysis.stack_effect(bc.create_load_global("x", False)) == 1


@pytest.mark.parametrize("module_name", ["argparse", "asyncio.tasks", "json.decoder", "typing"])
def test_stack_depth_matches_compiler(module_name):
    path = importlib.import_module(module_name).__file__
    with open(path, encoding="utf-8") as f:
        top = compile(f.read(), path, "exec")
    for code in _nested_codes(top):
        assert analysis.stack_depth(bc.disassemble(code)) == code.co_stacksize, code.co_qualname


def test_stack_depth_counts_exception_handlers():
    def f(x):
        try:
            return x()
        except Exception:
            return None

    instructions = bc.disassemble(f.__code__)
    entry = next(i.exn_tab_entry for i in instructions if i.exn_tab_entry is not None)
    assert analysis.stack_depth(instructions) >= entry.depth + 1 + int(entry.lasti)
    assert analysis.stack_depth(instructions) == f.__code__.co_stacksize
    assert analysis.stack_depth([]) == 0


# ---------------------------------------------------------------------------------------------
# jump targets
# ---------------------------------------------------------------------------------------------

def test_jump_targets():
    def f(xs):
        n = 0
        for x in xs:
            try:
                n += x
            except TypeError:
                n = -1
        return n

    instructions = bc.disassemble(f.__code__)
    loop = _first(instructions, "FOR_ITER")
    targets = analysis.jump_targets(instructions)
    assert loop in targets
    handlers = {i.exn_tab_entry.target for i in instructions if i.exn_tab_entry is not None}
    assert handlers <= targets
    assert not handlers <= analysis.jump_targets(instructions, handlers=False)


# ---------------------------------------------------------------------------------------------
# liveness
# ---------------------------------------------------------------------------------------------

def _branches(a, b, c):
    x = a + 1
    if b:
        y = x
    else:
        y = c
    return y


def test_livevars_straight_line_and_branches():
    instructions = bc.disassemble(_branches.__code__)
    assert analysis.livevars_at(instructions, instructions[0]) == {"a", "b", "c"}
    load_b = _first(instructions, "LOAD_FAST", "b")
    assert analysis.livevars_at(instructions, load_b) == {"b", "c", "x"}
    load_y = [i for i in instructions if i.opname == "LOAD_FAST" and i.argval == "y"][-1]
    assert analysis.livevars_at(instructions, load_y) == {"y"}


def _loop(n):
    total = 0
    i = 0
    while i < n:
        step = i * 2
        total += step
        i += 1
    return total


def test_livevars_loop_carries_values_around_the_back_edge():
    instructions = bc.disassemble(_loop.__code__)
    store_step = _first(instructions, "STORE_FAST", "step")
    live = analysis.livevars_at(instructions, store_step)
    assert {"total", "i", "n"} <= live and "step" not in live


def _handler_only(x):
    saved = x * 2
    try:
        x = 1 / x
    except ZeroDivisionError:
        return saved
    return x


def test_livevars_include_values_used_by_exception_handlers():
    instructions = bc.disassemble(_handler_only.__code__)
    divide = next(i for i in instructions if i.opname == "BINARY_OP"
                  and bc.binary_op_symbol(i.arg) == "/")
    assert "saved" in analysis.livevars_at(instructions, divide)


# ---------------------------------------------------------------------------------------------
# clean-up passes
# ---------------------------------------------------------------------------------------------

def _nops_everywhere(instructions):
    out = []
    for i, inst in enumerate(instructions):
        if i > 0:
            nop = bc.create_instruction("NOP")
            nop.exn_tab_entry = inst.exn_tab_entry
            out.append(nop)
        out.append(inst)
    return out


def _try_loop(xs):
    out = []
    for x in xs:
        try:
            out.append(10 // x)
        except ZeroDivisionError:
            out.append(None)
            continue
        finally:
            out.append("f")
    return out


def test_remove_nops_retargets_jumps_and_handlers():
    instructions = _nops_everywhere(bc.disassemble(_try_loop.__code__))
    # Point jumps and handlers at the NOPs in front of their targets.
    before = {id(inst): prev for prev, inst in zip(instructions, instructions[1:])}
    for inst in instructions:
        if inst.target is not None and before[id(inst.target)].opname == "NOP":
            inst.target = before[id(inst.target)]
    cleaned = analysis.remove_nops(instructions)
    assert all(i.opname != "NOP" for i in cleaned)
    members = {id(i) for i in cleaned}
    assert all(id(i.target) in members for i in cleaned if i.target is not None)
    rebuilt = _rebuild(_try_loop, cleaned)
    assert rebuilt([1, 0, 5]) == _try_loop([1, 0, 5])


def test_remove_dead_code():
    def f(x):
        return x + 1

    instructions = bc.disassemble(f.__code__)
    dead = [bc.create_instruction("LOAD_CONST", argval="unreachable"),
            bc.create_instruction("RETURN_VALUE")]
    cleaned = analysis.remove_dead_code(instructions + dead)
    assert [i.opname for i in cleaned] == [i.opname for i in instructions]
    assert all(i in analysis.reachable(instructions) for i in instructions)
    assert _rebuild(f, cleaned)(2) == 3
