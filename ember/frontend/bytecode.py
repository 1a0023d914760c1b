"""Decode code objects into editable instructions and assemble them back (CPython 3.11-3.13).

The frontend reads a frame's bytecode, rewrites it (prologue calling the compiled graph, resume
functions after a graph break) and needs a valid code object back. This module is the only place
that knows the binary layout of ``co_code``, ``co_linetable`` and ``co_exceptiontable``.

Decisions
---------
* **Instructions are objects with identity.** Jumps and exception-table entries point at
  ``Instruction`` objects, not offsets, so a pass may insert, delete or move instructions freely;
  offsets are recomputed by :func:`assemble`. ``Instruction`` therefore uses ``eq=False``.
* **CACHE and EXTENDED_ARG are not instructions.** :func:`disassemble` drops inline caches and
  folds EXTENDED_ARG prefixes into ``arg``; :func:`assemble` re-creates both. A jump target that
  points at an EXTENDED_ARG prefix resolves to the instruction the prefix belongs to, and
  assembled jumps point at the first prefix again (as CPython's compiler does).
* **``argval`` is authoritative for table operands.** For names, constants and local/cell/free
  variables the assembler keeps ``arg`` when it still indexes the right table slot (so round
  trips are byte-identical, including duplicate-looking constants such as ``0`` and ``0.0``)
  and otherwise looks the value up, appending it to the table when it is new. Flag bits that
  share the operand (LOAD_GLOBAL's push-NULL bit, 3.12 LOAD_ATTR's method bit, COMPARE_OP's low
  bits) are kept from ``arg``.
* **Exception handling is per instruction.** Each instruction carries the
  ``ExceptionTableEntry`` that covers it (or ``None``); the assembler regroups consecutive
  instructions with the same handler into table rows, exactly as CPython's compiler does. The
  ``start``/``end`` fields of an entry describe the original range and are informational only
  after edits.
* **Jump direction is derived from layout.** Relative jumps encode a direction in the opcode
  (3.11: ``POP_JUMP_FORWARD_IF_TRUE`` vs ``POP_JUMP_BACKWARD_IF_TRUE``; 3.12: only
  ``JUMP_BACKWARD`` goes backwards). The assembler picks the variant that matches where the
  target ended up; in 3.12 a conditional jump that must go backwards is routed through a
  ``JUMP_BACKWARD`` trampoline appended after the last instruction.
* **Location table.** Positions are written with CPython's own choice of entry forms (short,
  one-line, no-column, long, none) and merging of equal consecutive locations, so unedited code
  round-trips to the identical ``co_linetable``. An instruction whose ``positions`` disagree
  with ``lineno`` (someone set only ``lineno``) is written with the line only.
* **EXTENDED_ARG sizes only grow** while iterating to a fixpoint, which guarantees termination;
  CPython shrinks too, so in rare pathological layouts our code may carry a redundant
  ``EXTENDED_ARG 0``.  It is still valid.
* **Version differences live in ``_VersionSpec`` tables** (one per minor version), selected once
  at import; code below (and the translator, the graph-break emitters, resume functions) asks
  the table, never ``sys.version_info``. A new version means a row here and the version in
  ``support.SUPPORTED_PYTHONS``, which decides where ``ember.compile`` captures at all.
* **Super-instructions stay whole** (3.13's LOAD_FAST_LOAD_FAST, STORE_FAST_LOAD_FAST,
  STORE_FAST_STORE_FAST: ``argval`` is the pair of names), so unedited code round-trips and an
  instruction index means the same in the code and in its disassembly. Their operand packs two
  4-bit local indices; when an edit moves a local past index 15 (a resume function's new
  parameters come first), :func:`assemble` splits the pair into its two plain instructions
  (the first keeps the object's identity, so jumps and handlers still land on it).

:func:`assemble` writes the final ``arg`` and ``offset`` back into the instructions it was given
(and may flip a jump's ``opname`` to the right direction): after assembly the list describes the
code object that was produced.
"""
from __future__ import annotations

import dataclasses
import dis
import io
import sys
import types
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ember.frontend.support import SUPPORTED_PYTHONS

__all__ = [
    "Instruction", "ExceptionTableEntry", "disassemble", "assemble", "create_instruction",
    "create_load_global", "create_call", "create_load_method", "create_call_method",
    "create_jump", "create_compare_op", "code_to_dis_text", "is_jump", "is_unconditional_jump",
    "is_return", "is_scope_exit", "is_backward_jump_opname", "binary_op_symbol", "compare_op_of",
    "parse_exception_table", "encode_exception_table", "instructions_to_text", "BINARY_OPS",
    "VERSION_SPEC",
]


# ---------------------------------------------------------------------------------------------
# Per-version tables
# ---------------------------------------------------------------------------------------------

# COMPARE_OP low bits in 3.12+: which outcomes of the comparison the specialised form must test
# (CPython's compare_masks); bit values LESS=2, GREATER=4, EQUAL=8, UNORDERED=1.
_COMPARE_MASKS = {"<": 2, "<=": 2 | 8, "==": 8, "!=": 1 | 2 | 4, ">": 4, ">=": 4 | 8}


@dataclass(frozen=True)
class _VersionSpec:
    version: tuple[int, int]
    # Name-table operands that carry flag bits below the index: opname -> number of flag bits.
    name_flag_bits: dict[str, int]
    # COMPARE_OP operand = cmp_index << compare_shift | low bits.
    compare_shift: int
    compare_uses_masks: bool       # default low bits come from _COMPARE_MASKS
    compare_keep_bits: int         # low bits that are independent of the comparison (3.13)
    forward_jumps: frozenset[str]  # relative jumps whose operand counts forwards
    backward_jumps: frozenset[str]  # relative jumps whose operand counts backwards
    # Same jump with the opposite direction, for when layout changes which way a jump goes.
    flip_direction: dict[str, str]
    # Forward-only conditional jumps that may be routed through a backward trampoline.
    trampoline_conditional: frozenset[str]
    unconditional_jumps: frozenset[str]
    returns: frozenset[str]
    scope_exits: frozenset[str]    # returns + raises: no fall-through
    call_sequence: tuple[str, ...]  # opnames that call with n positional args
    load_method: tuple[str, int]   # (opname, flag bits or-ed into the operand)
    # dis.stack_effect values that do not describe the real stack (see analysis.stack_effect).
    stack_effect_overrides: dict[str, int]
    # 3.12's compiler writes one location entry for a run of equal locations; 3.11 one per
    # instruction. Either decodes the same; matching it keeps round trips byte-identical.
    merge_equal_locations: bool
    # Where the NULL (or self) of a call sits: below the callable (3.11/3.12: LOAD_GLOBAL and
    # method-form LOAD_ATTR push NULL first) or above it (3.13: ``callable, self_or_null``).
    null_after_callable: bool = False
    # What FOR_ITER skips at its target when the iterator is exhausted (it pops the iterator).
    for_iter_exit_skips: tuple[str, ...] = ()
    # Super-instructions whose operand packs two locals (first << 4 | second): their halves.
    paired_locals: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # 3.13 has no LOAD_CLOSURE: LOAD_FAST of a cell variable pushes the cell itself.
    load_fast_of_cell_is_closure: bool = False
    # COMPARE_OP bit asking for the result converted to bool (3.13 folds TO_BOOL into it).
    compare_to_bool_bit: int = 0
    # Opcodes the compiler sizes the stack for as the pair they replace (3.13 forms
    # RETURN_CONST from LOAD_CONST + RETURN_VALUE after computing co_stacksize).
    sized_as_push: frozenset[str] = frozenset()


_SPEC_311 = _VersionSpec(
    version=(3, 11),
    name_flag_bits={"LOAD_GLOBAL": 1},
    compare_shift=0, compare_uses_masks=False, compare_keep_bits=0,
    forward_jumps=frozenset({
        "JUMP_FORWARD", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE",
        "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE", "JUMP_IF_TRUE_OR_POP",
        "JUMP_IF_FALSE_OR_POP", "FOR_ITER", "SEND"}),
    backward_jumps=frozenset({
        "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE"}),
    flip_direction={
        "JUMP_FORWARD": "JUMP_BACKWARD", "JUMP_BACKWARD": "JUMP_FORWARD",
        "JUMP_BACKWARD_NO_INTERRUPT": "JUMP_FORWARD",
        **{f"POP_JUMP_FORWARD_IF_{c}": f"POP_JUMP_BACKWARD_IF_{c}"
           for c in ("TRUE", "FALSE", "NONE", "NOT_NONE")},
        **{f"POP_JUMP_BACKWARD_IF_{c}": f"POP_JUMP_FORWARD_IF_{c}"
           for c in ("TRUE", "FALSE", "NONE", "NOT_NONE")}},
    trampoline_conditional=frozenset(),
    unconditional_jumps=frozenset({"JUMP_FORWARD", "JUMP_BACKWARD",
                                   "JUMP_BACKWARD_NO_INTERRUPT"}),
    returns=frozenset({"RETURN_VALUE"}),
    scope_exits=frozenset({"RETURN_VALUE", "RAISE_VARARGS", "RERAISE"}),
    call_sequence=("PRECALL", "CALL"),
    load_method=("LOAD_METHOD", 0),
    # RETURN_GENERATOR "pushes" the value sent on first resume, which the POP_TOP after it pops.
    stack_effect_overrides={"RETURN_GENERATOR": 1},
    merge_equal_locations=False,
)

_SPEC_312 = _VersionSpec(
    version=(3, 12),
    name_flag_bits={"LOAD_GLOBAL": 1, "LOAD_ATTR": 1, "LOAD_SUPER_ATTR": 2},
    compare_shift=4, compare_uses_masks=True, compare_keep_bits=0,
    forward_jumps=frozenset({
        "JUMP_FORWARD", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE",
        "POP_JUMP_IF_NOT_NONE", "FOR_ITER", "SEND"}),
    backward_jumps=frozenset({"JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"}),
    flip_direction={"JUMP_FORWARD": "JUMP_BACKWARD", "JUMP_BACKWARD": "JUMP_FORWARD",
                    "JUMP_BACKWARD_NO_INTERRUPT": "JUMP_FORWARD"},
    trampoline_conditional=frozenset({"POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE",
                                      "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE"}),
    unconditional_jumps=frozenset({"JUMP_FORWARD", "JUMP_BACKWARD",
                                   "JUMP_BACKWARD_NO_INTERRUPT"}),
    returns=frozenset({"RETURN_VALUE", "RETURN_CONST"}),
    scope_exits=frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"}),
    call_sequence=("CALL",),
    load_method=("LOAD_ATTR", 1),
    stack_effect_overrides={"RETURN_GENERATOR": 1},
    merge_equal_locations=True,
    for_iter_exit_skips=("END_FOR",),
)

# 3.13: CALL_KW replaces KW_NAMES, the NULL of a call moves above the callable, TO_BOOL and the
# COMPARE_OP bool bit make conditional jumps take exact bools, FORMAT_VALUE splits into
# CONVERT_VALUE/FORMAT_SIMPLE/FORMAT_WITH_SPEC, MAKE_FUNCTION's flags become
# SET_FUNCTION_ATTRIBUTE, LOAD_CLOSURE becomes LOAD_FAST, and locals pair up in
# super-instructions. Jumps, tables and location entries are as in 3.12.
_SPEC_313 = dataclasses.replace(
    _SPEC_312,
    version=(3, 13),
    compare_shift=5, compare_keep_bits=16, compare_to_bool_bit=16,
    null_after_callable=True,
    for_iter_exit_skips=("END_FOR", "POP_TOP"),
    paired_locals={"LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
                   "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST"),
                   "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST")},
    load_fast_of_cell_is_closure=True,
    sized_as_push=frozenset({"RETURN_CONST"}),
)

_SPECS = {s.version: s for s in (_SPEC_311, _SPEC_312, _SPEC_313)}
# The versions ember.compile captures on (see support.py) are exactly those with a table.
if set(_SPECS) != set(SUPPORTED_PYTHONS):
    raise ImportError(f"bytecode tables for {sorted(_SPECS)} but support.SUPPORTED_PYTHONS "
                      f"says {sorted(SUPPORTED_PYTHONS)}: update both together")


def _select_spec() -> _VersionSpec:
    here = sys.version_info[:2]
    if here in _SPECS:
        return _SPECS[here]
    if here < min(_SPECS):
        raise ImportError(f"ember's bytecode layer needs CPython >= 3.11, not {here}")
    # Newer than any table: use the newest and let the round-trip tests show what broke
    # (ember.compile never captures here: see support.py).
    return _SPECS[max(_SPECS)]


VERSION_SPEC = _select_spec()

# Opcodes that take an operand: from HAVE_ARGUMENT up, except (3.13) WITH_EXCEPT_START.
_HAS_ARG = frozenset(getattr(dis, "hasarg", range(dis.HAVE_ARGUMENT, 256)))


def has_arg(opcode: int) -> bool:
    return opcode in _HAS_ARG


_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_CACHE = dis.opmap["CACHE"]
_JUMP_OPNAMES = frozenset(VERSION_SPEC.forward_jumps | VERSION_SPEC.backward_jumps
                          | {dis.opname[op] for op in dis.hasjabs})
# Opcodes >= 256 are the compiler's pseudo-instructions; they never appear in co_code.
_CONST_OPS = frozenset(dis.opname[op] for op in dis.hasconst if op < 256)
_NAME_OPS = frozenset(dis.opname[op] for op in dis.hasname if op < 256)
_LOCAL_OPS = frozenset(dis.opname[op] for op in dis.haslocal if op < 256)
_FREE_OPS = frozenset(dis.opname[op] for op in dis.hasfree if op < 256)


def _cache_count(opname: str) -> int:
    """Inline CACHE units that follow an instruction (list by opcode <=3.12, dict by name 3.13)."""
    table = dis._inline_cache_entries
    if isinstance(table, dict):
        return table.get(opname, 0)
    return table[dis.opmap[opname]]


# BINARY_OP operand -> (name, symbol), e.g. 0 -> ("NB_ADD", "+").
BINARY_OPS: list[tuple[str, str]] = list(getattr(dis, "_nb_ops", ()))


def binary_op_symbol(arg: int) -> str:
    """The operator of ``BINARY_OP arg``: '+', '+=', '@', ..."""
    return BINARY_OPS[arg][1]


# ---------------------------------------------------------------------------------------------
# Instructions
# ---------------------------------------------------------------------------------------------

class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


@dataclass(eq=False)
class Instruction:
    """One bytecode instruction. ``arg`` is the raw operand (flag bits included); ``argval``
    its decoded meaning (name, constant, variable, comparison string, or the operand)."""
    opname: str
    arg: int | None = None
    argval: Any = None
    offset: int | None = None
    lineno: int | None = None
    positions: dis.Positions | None = None
    target: Instruction | None = None
    exn_tab_entry: ExceptionTableEntry | None = None

    @property
    def opcode(self) -> int:
        return dis.opmap[self.opname]

    def __repr__(self) -> str:
        parts = [self.opname]
        if self.target is not None:
            parts.append(f"-> {self.target.opname}@{self.target.offset}")
        elif self.arg is not None or self.argval is not None:
            text = repr(self.argval) if self.argval is not None else str(self.arg)
            parts.append(text if len(text) <= 40 else text[:37] + "...")
        where = f"@{self.offset}" if self.offset is not None else ""
        line = f" L{self.lineno}" if self.lineno is not None else ""
        return f"<{' '.join(parts)}{where}{line}>"


@dataclass(eq=False)
class ExceptionTableEntry:
    """A handler row: instructions ``start``..``end`` (inclusive) jump to ``target`` on an
    exception, with the stack cut to ``depth`` (+ the offset of the raising instruction pushed
    first when ``lasti``)."""
    start: Instruction
    end: Instruction
    target: Instruction
    depth: int
    lasti: bool

    def __repr__(self) -> str:
        return (f"<ExceptionTableEntry {self.start.offset}..{self.end.offset} -> "
                f"{self.target.offset} depth={self.depth}{' lasti' if self.lasti else ''}>")


def is_jump(inst: Instruction) -> bool:
    return inst.opname in _JUMP_OPNAMES


def is_unconditional_jump(inst: Instruction) -> bool:
    return inst.opname in VERSION_SPEC.unconditional_jumps


def is_return(inst: Instruction) -> bool:
    return inst.opname in VERSION_SPEC.returns


def is_scope_exit(inst: Instruction) -> bool:
    """Returns and raises: control never falls through to the next instruction."""
    return inst.opname in VERSION_SPEC.scope_exits


def is_backward_jump_opname(opname: str) -> bool:
    return opname in VERSION_SPEC.backward_jumps


def compare_op_of(arg: int) -> str:
    """The comparison ('<', '==', ...) that a COMPARE_OP operand encodes in this version."""
    return dis.cmp_op[arg >> VERSION_SPEC.compare_shift]


def _compare_arg(op: str, old_arg: int | None) -> int:
    spec = VERSION_SPEC
    index = dis.cmp_op.index(op)
    if old_arg is not None and old_arg >> spec.compare_shift == index:
        return old_arg
    low = _COMPARE_MASKS[op] if spec.compare_uses_masks else 0
    if old_arg is not None:
        low |= old_arg & spec.compare_keep_bits
    return (index << spec.compare_shift) | low


def _needs_argval(opname: str) -> bool:
    return (opname in _CONST_OPS or opname in _NAME_OPS or opname in _LOCAL_OPS
            or opname in _FREE_OPS or opname == "COMPARE_OP")


def create_instruction(opname: str, *, arg: int | None = None, argval: Any = _UNSET,
                       target: Instruction | None = None) -> Instruction:
    """A new instruction. Operands that index a table (names, constants, variables) and
    COMPARE_OP are given by ``argval``; ``arg`` then only supplies flag bits (the index part is
    recomputed by :func:`assemble`). Other operands are given by ``arg``."""
    if opname not in dis.opmap:
        raise ValueError(f"unknown opcode {opname!r} for Python {sys.version_info[:2]}")
    if _needs_argval(opname):
        if argval is _UNSET:
            raise ValueError(f"{opname} needs argval (the name/constant/variable/comparison)")
    elif argval is _UNSET:
        argval = arg
    if target is not None and opname not in _JUMP_OPNAMES:
        raise ValueError(f"{opname} is not a jump but was given a target")
    return Instruction(opname, arg, argval, target=target)


def create_load_global(name: str, push_null: bool) -> Instruction:
    return create_instruction("LOAD_GLOBAL", arg=int(push_null), argval=name)


def create_call(nargs: int) -> list[Instruction]:
    """Call with ``nargs`` positional args; stack: NULL|self, callable..., args (see 3.11/3.12)."""
    return [create_instruction(name, arg=nargs) for name in VERSION_SPEC.call_sequence]


def create_load_method(name: str) -> Instruction:
    opname, flags = VERSION_SPEC.load_method
    return create_instruction(opname, arg=flags, argval=name)


def create_call_method(nargs: int) -> list[Instruction]:
    """Call a method loaded by :func:`create_load_method` with ``nargs`` arguments."""
    return create_call(nargs)


def create_jump(target: Instruction, forward: bool | None = None) -> Instruction:
    """Unconditional jump. ``forward=None`` lets :func:`assemble` pick the direction."""
    return create_instruction("JUMP_BACKWARD" if forward is False else "JUMP_FORWARD",
                              target=target)


def create_compare_op(op: str) -> Instruction:
    return create_instruction("COMPARE_OP", argval=op)


# ---------------------------------------------------------------------------------------------
# Disassembly
# ---------------------------------------------------------------------------------------------

def disassemble(code: types.CodeType) -> list[Instruction]:
    """Instructions of ``code`` with jumps and exception handlers resolved to instructions."""
    instructions: list[Instruction] = []
    jump_offsets: list[int] = []
    for raw in dis.get_instructions(code):
        if raw.opname in ("EXTENDED_ARG", "CACHE"):
            continue   # folded into the next instruction's arg / re-created by assemble
        if raw.opname == "ENTER_EXECUTOR" or raw.opname.startswith("INSTRUMENTED_"):
            # run-time rewrites (3.12+'s optimizer, monitoring) that co_code normally hides:
            # their operands mean nothing in a copy, so refuse rather than copy them
            raise ValueError(f"{code.co_qualname}: {raw.opname} at offset {raw.offset}")
        positions = raw.positions
        argval = raw.argval
        if raw.opname in _CONST_OPS:
            argval = code.co_consts[raw.arg]   # 3.11's dis leaves KW_NAMES undecoded
        inst = Instruction(raw.opname, raw.arg, argval, raw.offset,
                           positions.lineno if positions is not None else None, positions)
        instructions.append(inst)
        jump_offsets.append(raw.argval if raw.opname in _JUMP_OPNAMES else -1)

    offsets = [inst.offset for inst in instructions]

    def at_or_after(offset: int) -> Instruction:
        # Targets may name an EXTENDED_ARG prefix: the instruction it belongs to comes next.
        return instructions[bisect_left(offsets, offset)]

    for inst, target_offset in zip(instructions, jump_offsets):
        if target_offset >= 0:
            inst.target = at_or_after(target_offset)

    for start, end, target, depth, lasti in parse_exception_table(code.co_exceptiontable):
        first = bisect_left(offsets, start)
        last = bisect_left(offsets, end) - 1
        entry = ExceptionTableEntry(instructions[first], instructions[last],
                                    at_or_after(target), depth, lasti)
        for inst in instructions[first:last + 1]:
            inst.exn_tab_entry = entry
    return instructions


# ---------------------------------------------------------------------------------------------
# Exception table (3.11+): rows of 4 varints, 6 bits a byte, most significant chunk first,
# bit 6 = more bytes follow, bit 7 marks the first byte of a row. Units are code units (2 bytes).
# ---------------------------------------------------------------------------------------------

def parse_exception_table(table: bytes) -> list[tuple[int, int, int, int, bool]]:
    """Rows ``(start, end, target, depth, lasti)`` with byte offsets, ``end`` exclusive."""
    rows = []
    pos = 0

    def varint() -> int:
        nonlocal pos
        byte = table[pos]
        pos += 1
        value = byte & 63
        while byte & 64:
            byte = table[pos]
            pos += 1
            value = (value << 6) | (byte & 63)
        return value

    while pos < len(table):
        start = varint() * 2
        end = start + varint() * 2
        target = varint() * 2
        depth_lasti = varint()
        rows.append((start, end, target, depth_lasti >> 1, bool(depth_lasti & 1)))
    return rows


def _encode_exception_varint(out: bytearray, value: int, first: bool) -> None:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    for i, chunk in enumerate(chunks):
        byte = chunk | (64 if i < len(chunks) - 1 else 0)
        if first and i == 0:
            byte |= 128
        out.append(byte)


def encode_exception_table(rows: Iterable[tuple[int, int, int, int, bool]]) -> bytes:
    out = bytearray()
    for start, end, target, depth, lasti in rows:
        _encode_exception_varint(out, start // 2, first=True)
        _encode_exception_varint(out, (end - start) // 2, first=False)
        _encode_exception_varint(out, target // 2, first=False)
        _encode_exception_varint(out, (depth << 1) | int(lasti), first=False)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Location table (3.11+, Objects/locations.md): entries of 1..8 code units. First byte:
# 0x80 | code << 3 | (units - 1). Codes 0-9 short form, 10-12 one-line form (line delta 0-2),
# 13 line only, 14 long form, 15 no location. Varints here are little-endian 6-bit chunks.
# ---------------------------------------------------------------------------------------------

_NO_LOCATION = (-1, -1, -1, -1)


def _write_varint(out: bytearray, value: int) -> None:
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)


def _write_signed_varint(out: bytearray, value: int) -> None:
    _write_varint(out, ((-value) << 1) | 1 if value < 0 else value << 1)


class _LineTableWriter:
    """CPython's encoder (write_location_info_entry) so unedited code round-trips exactly."""

    def __init__(self, firstlineno: int):
        self.out = bytearray()
        self.line = firstlineno

    def add(self, location: tuple[int, int, int, int], units: int) -> None:
        while units > 8:
            self._entry(location, 8)
            units -= 8
        if units:
            self._entry(location, units)

    def _first(self, code: int, units: int) -> None:
        self.out.append(0x80 | (code << 3) | (units - 1))

    def _entry(self, location: tuple[int, int, int, int], units: int) -> None:
        line, end_line, col, end_col = location
        out = self.out
        if line < 0:
            self._first(15, units)
            return
        delta = line - self.line
        if col < 0 or end_col < 0:
            if end_line == line or end_line < 0:
                self._first(13, units)
                _write_signed_varint(out, delta)
                self.line = line
                return
        elif end_line == line:
            if delta == 0 and col < 80 and 0 <= end_col - col < 16:
                self._first(col >> 3, units)
                out.append(((col & 7) << 4) | (end_col - col))
                return
            if 0 <= delta < 3 and col < 128 and end_col < 128:
                self._first(10 + delta, units)
                out.append(col)
                out.append(end_col)
                self.line = line
                return
        self._first(14, units)
        _write_signed_varint(out, delta)
        _write_varint(out, max(end_line, line) - line)
        _write_varint(out, col + 1)
        _write_varint(out, end_col + 1)
        self.line = line


def _location(inst: Instruction) -> tuple[int, int, int, int]:
    pos = inst.positions
    if pos is not None and pos.lineno == inst.lineno:
        if pos.lineno is None:
            return _NO_LOCATION
        return (pos.lineno, -1 if pos.end_lineno is None else pos.end_lineno,
                -1 if pos.col_offset is None else pos.col_offset,
                -1 if pos.end_col_offset is None else pos.end_col_offset)
    if inst.lineno is not None:
        return (inst.lineno, inst.lineno, -1, -1)
    return _NO_LOCATION


# ---------------------------------------------------------------------------------------------
# Assembly
# ---------------------------------------------------------------------------------------------

def _same_const(a: Any, b: Any) -> bool:
    # 0 == 0.0 == False and -0.0 == 0.0, but they are different constants.
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b) and repr(a) == repr(b)
    except Exception:
        return False


class _Tables:
    """co_names / co_consts / localsplus of the code being built; appends what is new."""

    def __init__(self, template: types.CodeType, replace: dict[str, Any]):
        get = lambda field: list(replace.get(field, getattr(template, field)))  # noqa: E731
        self.names: list[str] = get("co_names")
        self.consts: list[Any] = get("co_consts")
        self.varnames: list[str] = get("co_varnames")
        self.cellvars: list[str] = get("co_cellvars")
        self.freevars: list[str] = get("co_freevars")
        self._localsplus: list[str] | None = None

    @property
    def localsplus(self) -> list[str]:
        # 3.11+ numbers fast locals, then cells that are not also arguments, then free vars.
        if self._localsplus is None:
            own = set(self.varnames)
            self._localsplus = (self.varnames + [c for c in self.cellvars if c not in own]
                                + self.freevars)
        return self._localsplus

    def register(self, inst: Instruction) -> None:
        """Make sure the value ``inst`` refers to has a slot (pass 1: tables only grow)."""
        name, value = inst.opname, inst.argval
        if name in VERSION_SPEC.paired_locals:
            for half, local in zip(VERSION_SPEC.paired_locals[name], _pair_of(inst)):
                self.register(Instruction(half, None, local))
            return
        if name in _NAME_OPS:
            if value not in self.names:
                self.names.append(value)
        elif name in _CONST_OPS:
            if not any(_same_const(value, c) for c in self.consts):
                self.consts.append(value)
        elif name in _LOCAL_OPS:
            if value not in self.localsplus:
                self.varnames.append(value)
                self._localsplus = None
        elif name in _FREE_OPS:
            if value not in self.localsplus:
                raise ValueError(f"{inst}: {value!r} is not a cell or free variable of the code")

    def operand(self, inst: Instruction) -> int:
        """Final operand: keep ``arg`` when it still names ``argval``, else look it up."""
        name, value, arg = inst.opname, inst.argval, inst.arg
        if name == "COMPARE_OP":
            return _compare_arg(value, arg)
        if name in VERSION_SPEC.paired_locals:
            first, second = (self.localsplus.index(v) for v in _pair_of(inst))
            if first > 15 or second > 15:
                raise ValueError(f"{inst}: locals past index 15 do not fit the paired operand")
            return (first << 4) | second
        if name in _NAME_OPS:
            table, same = self.names, (lambda a, b: a == b)
        elif name in _CONST_OPS:
            table, same = self.consts, _same_const
        elif name in _LOCAL_OPS or name in _FREE_OPS:
            table, same = self.localsplus, (lambda a, b: a == b)
        else:
            if arg is None:
                if has_arg(dis.opmap[name]):
                    raise ValueError(f"{inst} takes an operand but has arg=None")
                return 0
            return arg
        shift = VERSION_SPEC.name_flag_bits.get(name, 0)
        flags = (arg & ((1 << shift) - 1)) if arg is not None else 0
        if arg is not None:
            index = arg >> shift
            if index < len(table) and same(table[index], value):
                return arg
        index = next(i for i, entry in enumerate(table) if same(entry, value))
        return (index << shift) | flags


def _pair_of(inst: Instruction) -> tuple[str, str]:
    value = inst.argval
    if not (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, str) for v in value)):
        raise ValueError(f"{inst}: argval must be the pair of local names")
    return value


def _split_wide_pairs(insts: list[Instruction], tables: _Tables) -> list[Instruction]:
    """Super-instructions whose locals no longer fit 4 bits, as their two plain halves (the
    first half is the same object: jumps and handlers that reach it still do)."""
    pairs = VERSION_SPEC.paired_locals
    if not pairs or not any(inst.opname in pairs for inst in insts):
        return insts
    out = []
    for inst in insts:
        if inst.opname in pairs:
            names = _pair_of(inst)
            if any(tables.localsplus.index(v) > 15 for v in names):
                first_op, second_op = pairs[inst.opname]
                second = Instruction(second_op, None, names[1], lineno=inst.lineno,
                                     positions=inst.positions,
                                     exn_tab_entry=inst.exn_tab_entry)
                inst.opname, inst.arg, inst.argval = first_op, None, names[0]
                out += [inst, second]
                continue
        out.append(inst)
    return out


def _check_for_iter_exits(insts: list[Instruction]) -> None:
    """An exhausted FOR_ITER skips a fixed number of code units at its target (3.12: END_FOR;
    3.13: END_FOR and POP_TOP) without looking: anything else there would run out of step
    with the stack and can crash the interpreter, so it is an error here."""
    skips = VERSION_SPEC.for_iter_exit_skips
    if not skips:
        return
    position = {id(inst): i for i, inst in enumerate(insts)}
    for inst in insts:
        if inst.opname != "FOR_ITER":
            continue
        at = position[id(inst.target)]
        found = tuple(i.opname for i in insts[at:at + len(skips)])
        if found != skips:
            raise ValueError(f"{inst}: its exit must be {' '.join(skips)}, not "
                             f"{' '.join(found)}")


def _extended_args_needed(arg: int) -> int:
    return 0 if arg <= 0xFF else 1 if arg <= 0xFFFF else 2 if arg <= 0xFFFFFF else 3


def _fix_jump_directions(instructions: list[Instruction]) -> list[Instruction]:
    """Give each relative jump the opcode matching where its target now lies."""
    spec = VERSION_SPEC
    position = {id(inst): i for i, inst in enumerate(instructions)}
    trampolines: list[Instruction] = []
    for i, inst in enumerate(instructions):
        if inst.opname not in _JUMP_OPNAMES:
            continue
        if inst.target is None or id(inst.target) not in position:
            raise ValueError(f"{inst}: jump target is missing from the instruction list")
        backward = position[id(inst.target)] <= i
        if backward == (inst.opname in spec.backward_jumps):
            continue
        if inst.opname in spec.flip_direction:
            inst.opname = spec.flip_direction[inst.opname]
        elif backward and inst.opname in spec.trampoline_conditional:
            # No backward conditional jump in this version: jump forward to a JUMP_BACKWARD.
            hop = Instruction("JUMP_BACKWARD", target=inst.target, lineno=inst.lineno,
                              positions=inst.positions, exn_tab_entry=inst.exn_tab_entry)
            trampolines.append(hop)
            inst.target = hop
        else:
            raise ValueError(f"{inst}: cannot jump {'back' if backward else 'for'}wards")
    if trampolines and not (is_scope_exit(instructions[-1])
                            or is_unconditional_jump(instructions[-1])):
        raise ValueError("the last instruction falls through; cannot append jump trampolines")
    return instructions + trampolines


def assemble(instructions: Sequence[Instruction], template: types.CodeType,
             **replace: Any) -> types.CodeType:
    """A code object running ``instructions``; other fields from ``template`` and ``replace``
    (``co_name=...``, ``co_varnames=...``). New names, constants and locals are appended to the
    template's tables; ``co_stacksize`` is computed unless given."""
    from ember.frontend.analysis import stack_depth   # analysis imports this module

    insts = _fix_jump_directions(list(instructions))
    if not insts:
        raise ValueError("cannot assemble an empty instruction list")
    tables = _Tables(template, replace)
    for inst in insts:
        if _needs_argval(inst.opname) and inst.opname != "COMPARE_OP":
            tables.register(inst)
    insts = _split_wide_pairs(insts, tables)
    _check_for_iter_exits(insts)
    opcodes = [dis.opmap[inst.opname] for inst in insts]
    caches = [_cache_count(inst.opname) for inst in insts]
    jumps = [inst.opname in _JUMP_OPNAMES for inst in insts]
    args = [0 if jump else tables.operand(inst) for inst, jump in zip(insts, jumps)]
    prefixes = [_extended_args_needed(a) for a in args]
    position = {id(inst): i for i, inst in enumerate(insts)}

    # Lay out, compute jump operands, grow EXTENDED_ARG prefixes until nothing changes.
    while True:
        starts, offset = [], 0
        for n_prefix, n_cache in zip(prefixes, caches):
            starts.append(offset)
            offset += 2 * (n_prefix + 1 + n_cache)
        grew = False
        for i, inst in enumerate(insts):
            if not jumps[i]:
                continue
            after = starts[i] + 2 * (prefixes[i] + 1 + caches[i])
            target = starts[position[id(inst.target)]]
            if inst.opname in VERSION_SPEC.backward_jumps:
                args[i] = (after - target) // 2
            elif inst.opname in VERSION_SPEC.forward_jumps:
                args[i] = (target - after) // 2
            else:   # absolute jump (none in 3.11/3.12; kept for completeness)
                args[i] = target // 2
            needed = _extended_args_needed(args[i])
            if needed > prefixes[i]:
                prefixes[i] = needed
                grew = True
        if not grew:
            break

    code = bytearray()
    lines = _LineTableWriter(replace.get("co_firstlineno", template.co_firstlineno))
    pending_location, pending_units = None, 0
    for i, inst in enumerate(insts):
        arg = args[i]
        for shift in range(prefixes[i], 0, -1):
            code += bytes((_EXTENDED_ARG, (arg >> (8 * shift)) & 0xFF))
        inst.offset = len(code)
        inst.arg = arg if has_arg(opcodes[i]) else None
        code += bytes((opcodes[i], arg & 0xFF))
        code += bytes((_CACHE, 0)) * caches[i]
        location = _location(inst)
        if location != pending_location or not VERSION_SPEC.merge_equal_locations:
            if pending_units:
                lines.add(pending_location, pending_units)
            pending_location, pending_units = location, 0
        pending_units += prefixes[i] + 1 + caches[i]
    lines.add(pending_location, pending_units)

    fields: dict[str, Any] = dict(
        co_code=bytes(code), co_names=tuple(tables.names), co_consts=tuple(tables.consts),
        co_varnames=tuple(tables.varnames), co_nlocals=len(tables.varnames),
        co_linetable=bytes(lines.out),
        co_exceptiontable=encode_exception_table(_exception_rows(insts, starts, prefixes,
                                                                 caches, position)))
    fields.update(replace)
    for key in ("co_names", "co_consts", "co_varnames"):
        fields[key] = tuple(getattr(tables, key[3:]))
    fields["co_nlocals"] = len(tables.varnames)
    if "co_stacksize" not in replace:
        fields["co_stacksize"] = stack_depth(insts)
    return template.replace(**fields)


def _exception_rows(insts: list[Instruction], starts: list[int], prefixes: list[int],
                    caches: list[int], position: dict[int, int]):
    """Group consecutive instructions with the same handler into table rows."""
    rows: list[list] = []
    previous_key = None
    for i, inst in enumerate(insts):
        entry = inst.exn_tab_entry
        key = None if entry is None else (id(entry.target), entry.depth, bool(entry.lasti))
        end = starts[i] + 2 * (prefixes[i] + 1 + caches[i])
        if key is not None and key == previous_key:
            rows[-1][1] = end
        elif key is not None:
            if id(entry.target) not in position:
                raise ValueError(f"{inst}: exception handler is missing from the instructions")
            rows.append([starts[i], end, starts[position[id(entry.target)]], entry.depth,
                         bool(entry.lasti)])
        previous_key = key
    return [tuple(row) for row in rows]


# ---------------------------------------------------------------------------------------------
# Debugging
# ---------------------------------------------------------------------------------------------

def code_to_dis_text(code: types.CodeType) -> str:
    """``dis`` listing of ``code`` and every code object nested in it, with a header each."""
    out = io.StringIO()

    def dump(co: types.CodeType) -> None:
        out.write(f"# {co.co_qualname} ({co.co_filename}:{co.co_firstlineno}) "
                  f"stacksize={co.co_stacksize} flags={dis.pretty_flags(co.co_flags)}\n")
        dis.dis(co, file=out, depth=0)
        out.write("\n")
        for const in co.co_consts:
            if isinstance(const, types.CodeType):
                dump(const)

    dump(code)
    return out.getvalue()


def instructions_to_text(instructions: Iterable[Instruction]) -> str:
    """One line per instruction, for logs of code that is not assembled yet."""
    return "\n".join(repr(inst) for inst in instructions)
