"""Assembler rules that exist for CPython 3.13's bytecode: the paired-locals
super-instructions (split when an edit moves a local past index 15, which their 4-bit
operands cannot name) and FOR_ITER's exit (the interpreter skips END_FOR and POP_TOP without
looking, so anything between them is refused instead of crashing it)."""
import dis
import sys
import types

import pytest

from ember.frontend import bytecode as bc

pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 13),
                                reason="3.13's super-instructions and FOR_ITER exit")


def pairs(a):
    c = a + 1
    d = a * 2
    return c - d, d - c


def test_pair_past_index_15_is_split_and_still_runs():
    code = pairs.__code__
    instructions = bc.disassemble(code)
    paired = [i for i in instructions if i.opname == "LOAD_FAST_LOAD_FAST"]
    assert [i.argval for i in paired] == [("c", "d"), ("d", "c")]
    padding = tuple(f"unused{i}" for i in range(16))
    new = bc.assemble(instructions, code, co_varnames=("a", *padding, "c", "d"))
    fn = types.FunctionType(new, pairs.__globals__)
    assert fn(3) == pairs(3)
    raw = [i.opname for i in dis.get_instructions(new)]
    assert "LOAD_FAST_LOAD_FAST" not in raw and raw.count("LOAD_FAST") >= 4
    # the first half kept the instruction object (jumps and handlers that reach it still do)
    assert all(i.opname == "LOAD_FAST" for i in paired)


def test_pair_that_still_fits_round_trips_whole():
    code = pairs.__code__
    new = bc.assemble(bc.disassemble(code), code)
    assert new.co_code == code.co_code


def loop(xs):
    total = 0
    for x in xs:
        total += x
    return total


def test_anything_between_end_for_and_its_pop_top_is_refused():
    instructions = bc.disassemble(loop.__code__)
    at = next(i for i, inst in enumerate(instructions) if inst.opname == "END_FOR")
    assert instructions[at + 1].opname == "POP_TOP"
    with pytest.raises(ValueError, match="END_FOR POP_TOP"):
        bc.assemble(instructions[:at + 1] + [bc.create_instruction("NOP")]
                    + instructions[at + 1:], loop.__code__)
    # a NOP before END_FOR (the jump still lands on END_FOR) is fine
    rebuilt = bc.assemble(instructions[:at] + [bc.create_instruction("NOP")]
                          + instructions[at:], loop.__code__)
    assert types.FunctionType(rebuilt, loop.__globals__)([1, 2, 3]) == 6
