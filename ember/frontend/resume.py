"""Resume functions: the rest of a frame after a graph break, as a new code object.

A graph break splits a frame at one instruction: the graph captured so far runs, the
instruction runs in plain Python, and a *resume function* continues the frame from the
instruction after it (or from a branch target). The resume function is a new code object
built from the original one:

    COPY_FREE_VARS n            (when the frame has free variables: the same closure)
    RESUME 0
    LOAD_FAST ___stack0         the live stack, rebuilt from arguments (PUSH_NULL for NULLs,
    ...                         GET_ITER after a tuple for the iterator of a ``for`` loop,
                                BEFORE_WITH for the exit of an autocast/inference-mode block)
    JUMP_FORWARD  -> target
    <every instruction of the original code, unchanged, exception table included>

Its parameters are the live stack values (``___stack0``...) followed by the locals that are
live at the target and bound at the break, under their own names, so the copied body reads
them as it always did. Because the stack below the target is rebuilt exactly, the copied
exception table stays valid: an open ``with`` block finds its exit where it left it. The
target may be an exception handler: the entry then passes the block's stack (cut to the
handler's depth), the raising instruction's offset where the handler wants it (``lasti``)
and the exception, exactly what CPython pushes when it unwinds to that handler.

Cells: a frame whose locals are closed over by inner functions made its cells (MAKE_CELL)
before the break, and inner functions the entry rebuilds share them. The resume code
receives them as parameters (``___cell_scale``, after the locals) instead of making new
ones, each as a :class:`CellRef` (the cell and its name): each LOAD_DEREF/STORE_DEREF/
DELETE_DEREF/LOAD_CLOSURE of a cell becomes a LOAD_FAST of its parameter (the same
instruction object, so jumps and the exception table still point at it) followed by a
read, write or deletion of ``.value``, or a read of ``.cell``; the code has no cell
variables left. ``CellRef.value`` raises what CPython raises for an empty cell of the frame
(UnboundLocalError), so a cell still unassigned at the break, or deleted, behaves as in
eager. A frame that makes a cell after its start (3.12's inlined comprehensions) is not
split.

Where the entry lives (Ember has no frame-evaluation hook): the generated entry function of
the frame that broke calls the resume function through Ember's compile entry, an
``OptimizedFunction`` with the same backend and options, which the entry holds as a constant.
That wrapper gives the resume function its own guards and cache entries; a resume function
whose capture fails runs eagerly like any frame. The code objects themselves are cached per
(original code, instruction, stack layout, locals, raising instruction), so a break inside a
loop that resumes at the same instruction again reuses one code object, and a resume of a
resume maps back to the original code (``origin``, instruction by instruction) instead of
nesting prologues.
"""
from __future__ import annotations

import dis
import inspect
import types

from ember.frontend.bytecode import (VERSION_SPEC, Instruction, assemble, create_instruction,
                                     disassemble)
from ember.frontend.exc import Unsupported

# resume code -> (original code, per instruction of the resume: the index of the original
# instruction it is, None for the prologue's and those inserted for cells)
_ORIGIN: dict[types.CodeType, tuple[types.CodeType, tuple[int | None, ...]]] = {}
_CODES: dict[tuple, types.CodeType] = {}


def origin(code: types.CodeType) -> types.CodeType:
    """The original code of a resume code; ``code`` itself otherwise."""
    return _ORIGIN[code][0] if code in _ORIGIN else code


def is_resume_code(code: types.CodeType) -> bool:
    return code in _ORIGIN


def _original_index(code: types.CodeType, index: int) -> int:
    if code not in _ORIGIN:
        return index
    found = _ORIGIN[code][1][index]
    if found is None:
        raise Unsupported("graph break at an instruction a resume function added")
    return found


def stack_name(i: int) -> str:
    return f"___stack{i}"


def cell_param(name: str) -> str:
    """The parameter through which a resume function receives cell ``name`` of its frame."""
    return f"___cell_{name}"


def cell_params(code: types.CodeType) -> tuple[str, ...]:
    """The cell parameters of a resume code (empty for other code)."""
    return _CELL_PARAMS.get(code, ())


_CELL_PARAMS: dict[types.CodeType, tuple[str, ...]] = {}


# How the prologue rebuilds one stack item. LASTI pushes the offset (in code units) of the
# instruction that raised, for an exception handler entered with ``lasti`` (a ``with``
# block's): its RERAISE restores that position, so tracebacks point at the raising line.
# CONTEXT enters the argument's context manager again (BEFORE_WITH, the enter's result
# dropped): its ``__exit__`` is the item, for a ``with`` block whose manager the graph
# models (autocast, inference mode: ``ctx_manager.GlobalContextReentry``).
NULL, VALUE, ITERATOR, LASTI, CONTEXT = "null", "value", "iterator", "lasti", "context"


def resume_code(code: types.CodeType, target: int, stack: tuple[str, ...],
                local_names: tuple[str, ...], raised_at: int | None = None,
                iterators: tuple[tuple[str, str, object], ...] = ()) -> types.CodeType:
    """The resume code continuing ``code`` at instruction ``target`` (an index into
    ``disassemble(code)``) with a stack described by ``stack`` (per item: NULL, a VALUE
    argument, an ITERATOR over the items of a tuple argument: a ``for`` loop's, the LASTI
    of instruction ``raised_at``, or the exit of a CONTEXT argument entered again), and the
    locals ``local_names`` (parameters after the stack's arguments). An exception handler is
    resumed like any target: its stack is the block's (cut to the handler's depth) with the
    exception as the last VALUE.

    ``iterators``: locals holding an iterator, set by the prologue so that every name of one
    iterator is one object, as in the frame: ``(name, ITERATOR, None)``, an iterator over
    the items of the tuple the local's parameter receives (the local is also in
    ``local_names``); ``(name, "stack", i)``, the iterator that is stack item ``i``;
    ``(name, "local", other)``, the iterator of an earlier local."""
    original = origin(code)
    target = _original_index(code, target)
    raised = None if raised_at is None else _original_index(code, raised_at)
    key = (original, target, stack, local_names, raised, iterators)
    found = _CODES.get(key)
    if found is None:
        found = _CODES[key] = _build(original, target, stack, local_names, raised, iterators)
    return found


def _iterator_locals(stack: tuple[str, ...], iterators) -> list[Instruction]:
    """The prologue's part that sets the iterator locals (after the stack is rebuilt)."""
    out = []
    for name, kind, other in iterators:
        if kind == ITERATOR:
            out += [create_instruction("LOAD_FAST", argval=name),
                    create_instruction("GET_ITER")]
        elif kind == "stack":
            out.append(create_instruction("COPY", arg=len(stack) - other))
        else:
            out.append(create_instruction("LOAD_FAST", argval=other))
        out.append(create_instruction("STORE_FAST", argval=name))
    return out


def _build(original: types.CodeType, target: int, stack: tuple[str, ...],
           local_names: tuple[str, ...], raised_at: int | None,
           iterators=()) -> types.CodeType:
    body = disassemble(original)
    index_of = {id(inst): i for i, inst in enumerate(body)}
    resume_at = body[target]
    raised = None if raised_at is None else body[raised_at]
    prologue: list[Instruction] = []
    if original.co_freevars:
        prologue.append(create_instruction("COPY_FREE_VARS", arg=len(original.co_freevars)))
    prologue.append(create_instruction("RESUME", arg=0))
    params = []
    for i, kind in enumerate(stack):
        if kind == NULL:
            prologue.append(create_instruction("PUSH_NULL"))
            continue
        if kind == LASTI:   # a placeholder constant, set once the layout is known
            prologue.append(create_instruction("LOAD_CONST", argval=_LastiPlaceholder()))
            continue
        params.append(stack_name(i))
        prologue.append(create_instruction("LOAD_FAST", argval=stack_name(i)))
        if kind == ITERATOR:
            prologue.append(create_instruction("GET_ITER"))
        elif kind == CONTEXT:
            prologue += [create_instruction("BEFORE_WITH"), create_instruction("POP_TOP")]
    params += local_names
    cells = tuple(cell_param(c) for c in original.co_cellvars)
    params += cells
    body = _cells_as_parameters(body, original.co_cellvars)
    prologue += _iterator_locals(stack, iterators)
    prologue.append(create_instruction("JUMP_FORWARD", target=resume_at))
    aliases = [name for name, kind, _ in iterators if kind != ITERATOR]
    varnames = params + [v for v in (*original.co_varnames, *aliases) if v not in params]
    name = f"{original.co_name}_resume_at_{target}"
    flags = original.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    code = assemble(prologue + body, original, co_argcount=len(params),
                    co_posonlyargcount=0, co_kwonlyargcount=0, co_varnames=tuple(varnames),
                    co_flags=flags, co_name=name, co_cellvars=(),
                    co_qualname=f"{original.co_qualname}_resume_at_{target}")
    if LASTI in stack:
        lasti = raised.offset // 2
        code = code.replace(co_consts=tuple(lasti if isinstance(c, _LastiPlaceholder) else c
                                            for c in code.co_consts))
    # by offset (assemble wrote them back): what assembly added (a jump trampoline, the
    # second half of a split super-instruction) has no original
    by_offset = {inst.offset: index_of.get(id(inst)) for inst in prologue + body}
    _ORIGIN[code] = (original, tuple(by_offset.get(inst.offset) for inst in disassemble(code)))
    if cells:
        _CELL_PARAMS[code] = cells
    return code


class CellRef:
    """A cell of the frame a resume function continues, as the resume code receives it:
    ``value`` reads, writes and deletes the contents with the errors of the frame's own
    LOAD_DEREF/DELETE_DEREF on an empty cell; ``cell`` is the cell (LOAD_CLOSURE)."""

    __slots__ = ("cell", "name")

    def __init__(self, cell: types.CellType, name: str):
        self.cell = cell
        self.name = name

    def _unbound(self) -> UnboundLocalError:
        return UnboundLocalError(f"cannot access local variable {self.name!r} where it is "
                                 f"not associated with a value")

    @property
    def value(self):
        try:
            return self.cell.cell_contents
        except ValueError:
            raise self._unbound() from None

    @value.setter
    def value(self, value):
        self.cell.cell_contents = value

    @value.deleter
    def value(self):
        try:
            del self.cell.cell_contents
        except ValueError:
            raise self._unbound() from None

    def __repr__(self):
        return f"CellRef({self.name!r})"


# cell opcode -> (what follows a LOAD_FAST of the CellRef parameter, its attribute)
_CELL_OPS = {"LOAD_DEREF": ("LOAD_ATTR", "value"), "STORE_DEREF": ("STORE_ATTR", "value"),
             "DELETE_DEREF": ("DELETE_ATTR", "value"), "LOAD_CLOSURE": ("LOAD_ATTR", "cell"),
             "MAKE_CELL": ("POP_TOP", None)}


def _cells_as_parameters(body: list[Instruction], cellvars: tuple[str, ...]
                         ) -> list[Instruction]:
    """``body`` with its cells read from parameters: the frame's cells were made by the
    frame that broke, and inner functions it created share them. Each instruction keeps its
    identity (jumps and the exception table point at it): it becomes the LOAD_FAST of the
    CellRef, and an instruction inserted after it reads, writes or deletes ``.value`` (or
    reads ``.cell``). (The MAKE_CELLs at the start only run before any resume target: no-op
    pairs.) Any other use of a cell's slot is refused: 3.12's inlined comprehensions, which
    make a fresh cell per run."""
    if not cellvars:
        return body
    slot_ops = {dis.opname[op] for op in (*dis.haslocal, *dis.hasfree)}
    out, started = [], False
    for inst in body:
        started = started or inst.opname == "RESUME"
        paired = inst.opname in VERSION_SPEC.paired_locals
        names = inst.argval if paired else (inst.argval,)
        if inst.opname not in slot_ops or not any(n in cellvars for n in names):
            out.append(inst)
            continue
        kind = inst.opname
        if kind == "LOAD_FAST" and VERSION_SPEC.load_fast_of_cell_is_closure:
            kind = "LOAD_CLOSURE"     # 3.13 loads a cell for a closure with LOAD_FAST
        if paired or kind not in _CELL_OPS or (kind == "MAKE_CELL" and started):
            raise Unsupported(f"graph break in a frame that uses cell variable "
                              f"{inst.argval!r} with {inst.opname}")
        follow, attr = _CELL_OPS[kind]
        inst.opname = "LOAD_FAST"
        inst.arg, inst.argval = None, cell_param(inst.argval)
        out.append(inst)
        if follow is not None:
            extra = create_instruction(follow, argval=attr)
            extra.lineno, extra.positions = inst.lineno, inst.positions
            extra.exn_tab_entry = inst.exn_tab_entry
            out.append(extra)
    return out


class _LastiPlaceholder:
    """Stands for the LASTI constant until the resume code is laid out."""


def resume_function(code: types.CodeType, frame_fn: types.FunctionType,
                    made: dict[str, types.CodeType] | None = None) -> types.FunctionType:
    """A function running resume ``code`` with the globals and closure of the frame's
    function (a resume code keeps the original's free variables). ``made``: the parameters
    that receive functions the entry makes anew on each call (a nested def or lambda of the
    frame), with their code (see ``made_functions``)."""
    fn = types.FunctionType(code, frame_fn.__globals__, code.co_name, None,
                            frame_fn.__closure__)
    if made:
        fn._ember_made_functions = dict(made)
    return fn


def made_functions(fn: types.FunctionType) -> dict[str, types.CodeType]:
    """Parameters of a resume function that receive a function made by the frame that broke:
    a new object on each call, so its capture guards the code and the cells it closes over
    instead of the object (or every call would recompile)."""
    return getattr(fn, "_ember_made_functions", {})
