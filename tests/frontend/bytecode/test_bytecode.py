"""ember.frontend.bytecode: disassemble/assemble round trips, rebuilt functions, edits.

Runs without torch (CPython 3.12 CI has none): ``ember/__init__`` imports torch, so when torch is
missing the ``ember`` and ``ember.frontend`` packages are stubbed by path before importing the
bytecode modules, which themselves need only the standard library.
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
SPEC = bc.VERSION_SPEC


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def _nested_codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested_codes(const)


def _module_codes(module_name):
    module = importlib.import_module(module_name)
    path = module.__file__
    with open(path, encoding="utf-8") as f:
        top = compile(f.read(), path, "exec")
    return list(_nested_codes(top))


def _rebuild(fn, instructions=None, **replace):
    code = fn.__code__
    if instructions is None:
        instructions = bc.disassemble(code)
    new_code = bc.assemble(instructions, code, **replace)
    new_fn = types.FunctionType(new_code, fn.__globals__, fn.__name__, fn.__defaults__,
                                fn.__closure__)
    new_fn.__kwdefaults__ = fn.__kwdefaults__
    return new_fn


def _outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - comparing whatever the function raises
        return ("raise", type(e), str(e))


def _prologue_index(instructions):
    """Index just after RESUME: the earliest place user-visible code may be inserted."""
    return next(i for i, inst in enumerate(instructions) if inst.opname == "RESUME") + 1


# ---------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------

STDLIB_MODULES = ["json.decoder", "json.encoder", "json.scanner", "textwrap", "collections",
                  "functools", "argparse", "inspect", "dataclasses", "enum", "typing",
                  "contextlib", "asyncio.tasks"]
TORCH_MODULES = ["torch.nn.modules.linear", "torch.nn.modules.conv",
                 "torch.nn.modules.activation", "torch.nn.modules.container",
                 "torch.nn.functional", "torch.nn.modules.module"]


def _check_round_trip(code):
    instructions = bc.disassemble(code)
    assert all(inst.opname not in ("CACHE", "EXTENDED_ARG") for inst in instructions)
    members = {id(inst) for inst in instructions}
    for inst in instructions:
        if inst.target is not None:
            assert id(inst.target) in members
        if inst.exn_tab_entry is not None:
            assert id(inst.exn_tab_entry.target) in members
    new = bc.assemble(instructions, code)
    # No normalisation is needed: the encoders follow CPython's compiler byte for byte.
    assert new.co_code == code.co_code, code.co_qualname
    assert new.co_linetable == code.co_linetable, code.co_qualname
    assert list(new.co_positions()) == list(code.co_positions())
    assert new.co_exceptiontable == code.co_exceptiontable, code.co_qualname
    assert new.co_stacksize == code.co_stacksize, code.co_qualname
    assert new.co_consts == code.co_consts and new.co_names == code.co_names
    assert new.co_varnames == code.co_varnames


@pytest.mark.parametrize("module_name", STDLIB_MODULES)
def test_round_trip_stdlib(module_name):
    codes = _module_codes(module_name)
    assert len(codes) > 3
    for code in codes:
        _check_round_trip(code)


@pytest.mark.parametrize("module_name", TORCH_MODULES)
def test_round_trip_torch_nn(module_name):
    pytest.importorskip("torch")
    for code in _module_codes(module_name):
        _check_round_trip(code)


def test_round_trip_extended_args_in_original():
    # > 256 constants and a long body: the compiler's own EXTENDED_ARG prefixes and long jumps.
    body = "\n".join(f"    x = x + {i}.5 if x > {i} else x - {i}" for i in range(400))
    src = f"def big(x):\n{body}\n    return x\n"
    namespace = {}
    exec(compile(src, "<big>", "exec"), namespace)
    code = namespace["big"].__code__
    assert any(i.opname == "EXTENDED_ARG" for i in dis.get_instructions(code))
    _check_round_trip(code)
    assert _rebuild(namespace["big"])(3.0) == namespace["big"](3.0)


def test_disassemble_resolves_jumps_and_handlers():
    def f(xs):
        total = 0
        for x in xs:
            try:
                total += 1 / x
            except ZeroDivisionError:
                continue
        return total

    instructions = bc.disassemble(f.__code__)
    loop = next(i for i in instructions if i.opname == "FOR_ITER")
    back = [i for i in instructions if i.opname == "JUMP_BACKWARD"]
    assert any(j.target is loop for j in back)
    covered = [i for i in instructions if i.exn_tab_entry is not None]
    assert covered
    divide = next(i for i in instructions if i.opname == "BINARY_OP"
                  and bc.binary_op_symbol(i.arg) == "/")
    handler = divide.exn_tab_entry.target
    assert handler.opname == "PUSH_EXC_INFO"


# ---------------------------------------------------------------------------------------------
# rebuilt functions behave like the originals
# ---------------------------------------------------------------------------------------------

GLOBAL_SCALE = 3


def fn_try_except_finally(x):
    log = []
    try:
        log.append("try")
        if x < 0:
            raise ValueError("negative")
        y = 10 // x
    except ZeroDivisionError:
        log.append("zero")
        y = -1
    except ValueError as e:
        log.append(str(e))
        raise
    else:
        log.append("else")
    finally:
        log.append("finally")
    return y, log


class _Ctx:
    def __init__(self, log, swallow):
        self.log, self.swallow = log, swallow

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append(f"exit {exc[0].__name__ if exc[0] else None}")
        return self.swallow


def fn_with(x, swallow):
    log = []
    with _Ctx(log, swallow) as c:
        log.append(type(c).__name__)
        if x:
            raise KeyError(x)
    log.append("after")
    return log


def fn_loops(n):
    out = []
    i = 0
    while True:
        i += 1
        if i % 2:
            continue
        if i > n:
            break
        for j in range(i):
            if j == 3:
                break
            out.append((i, j))
        else:
            out.append("no-break")
    return out


def fn_closure(k):
    total = k

    def add(v):
        nonlocal total
        total += v
        return total

    add(1)
    return add(2), (lambda: total * GLOBAL_SCALE)()


def fn_comprehensions(xs):
    squares = [x * x for x in xs if x % 2]
    table = {x: str(x) for x in xs}
    pairs = {(a, b) for a in xs for b in xs if a < b}
    gen = sum(x for x in xs)
    return squares, table, sorted(pairs), gen


def _kw(a, b=2, *args, c, d=4, **kwargs):
    return a, b, args, c, d, sorted(kwargs.items())


def fn_calls(x):
    r1 = _kw(x, c=5)
    r2 = _kw(x, 1, 2, 3, c=x, e=9, **{"f": 1})
    r3 = _kw(*[x, x], **{"c": 0})
    return r1, r2, r3, "-".join(map(str, [x, x]))


def fn_fstrings(name, value):
    return f"{name!r}: {value:>8.3f} {value!s:^5} {{literal}} {name.upper()=}"


def fn_generator(n):
    for i in range(n):
        sent = yield i
        if sent:
            yield from range(sent)
    return "done"


def fn_nested_try(xs):
    out = []
    for x in xs:
        try:
            try:
                out.append(1 / x)
            finally:
                out.append("inner")
        except TypeError:
            out.append("type")
            continue
        except ZeroDivisionError as e:
            out.append(type(e).__name__)
    return out


def fn_match(value):
    match value:
        case [a, b]:
            return ("pair", a, b)
        case {"k": v}:
            return ("map", v)
        case int(n) if n > 3:
            return ("big", n)
        case _:
            return ("other",)


BEHAVIOUR_CASES = [
    (fn_try_except_finally, [(2,), (0,), (-1,), ("s",)]),
    (fn_with, [(0, False), (1, False), (1, True)]),
    (fn_loops, [(0,), (5,), (12,)]),
    (fn_closure, [(1,), (10,)]),
    (fn_comprehensions, [([1, 2, 3, 4],), ([],)]),
    (fn_calls, [(1,), ("a",)]),
    (fn_fstrings, [("x", 3.14159), ("y", 2)]),
    (fn_nested_try, [([1, 0, "a", 2],)]),
    (fn_match, [([1, 2],), ({"k": 3},), (7,), (1,)]),
]


@pytest.mark.parametrize("fn,arg_sets", BEHAVIOUR_CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_rebuilt_function_behaves_the_same(fn, arg_sets):
    rebuilt = _rebuild(fn)
    assert rebuilt.__code__.co_code == fn.__code__.co_code
    for args in arg_sets:
        assert _outcome(rebuilt, *args) == _outcome(fn, *args)


def test_rebuilt_generator():
    rebuilt = _rebuild(fn_generator)

    def drive(gen_fn):
        g = gen_fn(4)
        out = [next(g), g.send(2), next(g), next(g), next(g)]
        with pytest.raises(StopIteration) as stop:
            while True:
                out.append(next(g))
        return out, stop.value.value

    assert drive(rebuilt) == drive(fn_generator)


# ---------------------------------------------------------------------------------------------
# edits
# ---------------------------------------------------------------------------------------------

def _with_nops(instructions, count, every=4):
    """Insert ``count`` NOPs before every ``every``-th instruction (inside handlers' ranges too)."""
    out = []
    for i, inst in enumerate(instructions):
        # (not between a loop's END_FOR and its POP_TOP, which 3.13's FOR_ITER skips blindly)
        fused = inst.opname == "POP_TOP" and instructions[i - 1].opname == "END_FOR"
        if i >= _prologue_index(instructions) and i % every == 0 and not fused:
            for _ in range(count):
                nop = bc.create_instruction("NOP")
                nop.lineno, nop.positions = inst.lineno, inst.positions
                nop.exn_tab_entry = inst.exn_tab_entry
                out.append(nop)
        out.append(inst)
    return out


@pytest.mark.parametrize("fn,arg_sets", BEHAVIOUR_CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_many_nops_force_extended_args(fn, arg_sets):
    instructions = _with_nops(bc.disassemble(fn.__code__), count=90)
    rebuilt = _rebuild(fn, instructions)
    raw = list(dis.get_instructions(rebuilt.__code__))
    if any(i.target is not None for i in instructions):
        assert any(i.opname == "EXTENDED_ARG" for i in raw)
    for args in arg_sets:
        assert _outcome(rebuilt, *args) == _outcome(fn, *args)
    # Exception table offsets were remapped: each row still starts on a real instruction.
    starts = {i.offset for i in raw}
    for start, end, target, _, _ in bc.parse_exception_table(rebuilt.__code__.co_exceptiontable):
        assert start in starts and target in starts and end > start


def test_nops_without_handler_leave_try_ranges_split_but_correct():
    # NOPs that are not covered by the handler split a try range in two rows.
    instructions = []
    for inst in bc.disassemble(fn_try_except_finally.__code__):
        if inst.exn_tab_entry is not None and inst.opname == "LOAD_FAST":
            instructions.append(bc.create_instruction("NOP"))
        instructions.append(inst)
    rebuilt = _rebuild(fn_try_except_finally, instructions)
    for x in (2, 0, -1, "s"):
        assert _outcome(rebuilt, x) == _outcome(fn_try_except_finally, x)


_calls_seen = []


def _record(*args):
    _calls_seen.append(args)
    return len(_calls_seen)


def test_prologue_with_new_names_consts_and_locals():
    fn = fn_try_except_finally
    instructions = bc.disassemble(fn.__code__)
    marker = object()
    prologue = [
        bc.create_load_global("_record", push_null=True),
        bc.create_instruction("LOAD_CONST", argval=marker),
        bc.create_instruction("LOAD_CONST", argval="first"),
        *bc.create_call(2),
        bc.create_instruction("STORE_FAST", argval="__ember_tmp"),
        bc.create_load_global("GLOBAL_SCALE", push_null=False),
        bc.create_instruction("POP_TOP"),
    ]
    at = _prologue_index(instructions)
    rebuilt = _rebuild(fn, instructions[:at] + prologue + instructions[at:])
    code = rebuilt.__code__
    assert code.co_varnames[-1] == "__ember_tmp" and code.co_nlocals == len(code.co_varnames)
    assert "_record" in code.co_names and marker in code.co_consts
    _calls_seen.clear()
    for x in (2, 0, -1):
        assert _outcome(rebuilt, x) == _outcome(fn, x)
    assert _calls_seen == [(marker, "first")] * 3


def test_prologue_in_closure_shifts_cell_indices():
    # A new local moves cells and free variables in the unified localsplus numbering.
    instructions = bc.disassemble(fn_closure.__code__)
    at = _prologue_index(instructions)
    prologue = [bc.create_instruction("LOAD_CONST", argval=1),
                bc.create_instruction("STORE_FAST", argval="__extra")]
    rebuilt = _rebuild(fn_closure, instructions[:at] + prologue + instructions[at:])
    assert rebuilt(5) == fn_closure(5)


def test_load_method_and_call_method():
    def template(xs):
        return xs

    instructions = bc.disassemble(template.__code__)
    at = _prologue_index(instructions)
    body = [bc.create_instruction("LOAD_FAST", argval="xs"), bc.create_load_method("append"),
            bc.create_instruction("LOAD_CONST", argval=42), *bc.create_call_method(1),
            bc.create_instruction("POP_TOP")]
    rebuilt = _rebuild(template, instructions[:at] + body + instructions[at:])
    assert rebuilt([1]) == [1, 42]


def _binary_op_arg(name):
    return next(i for i, (op, _) in enumerate(bc.BINARY_OPS) if op == name)


def _conditional_jump_opname(condition):
    # POP_JUMP_FORWARD_IF_TRUE in 3.11, POP_JUMP_IF_TRUE in 3.12: either gets fixed by assemble.
    return next(n for n in sorted(SPEC.forward_jumps) if n.startswith("POP_JUMP")
                and n.endswith(f"_IF_{condition}"))


def _countdown_instructions(jump_opname):
    """acc = 0; do { acc += n; n -= 1 } while (n); return acc  -- a backward conditional jump."""
    def template(n):
        acc = 0
        return acc

    mk = bc.create_instruction
    head = bc.disassemble(template.__code__)[:1]   # RESUME
    top = mk("LOAD_FAST", argval="acc")
    body = [
        mk("LOAD_CONST", argval=0), mk("STORE_FAST", argval="acc"),
        top, mk("LOAD_FAST", argval="n"), mk("BINARY_OP", arg=_binary_op_arg("NB_INPLACE_ADD")),
        mk("STORE_FAST", argval="acc"),
        mk("LOAD_FAST", argval="n"), mk("LOAD_CONST", argval=1),
        mk("BINARY_OP", arg=_binary_op_arg("NB_INPLACE_SUBTRACT")), mk("STORE_FAST", argval="n"),
        mk("LOAD_FAST", argval="n"),
        # 3.13's conditional jumps take an exact bool
        *([mk("TO_BOOL")] if "TO_BOOL" in dis.opmap else []), mk(jump_opname, target=top),
        mk("LOAD_FAST", argval="acc"), mk("RETURN_VALUE"),
    ]
    return template, head + body


def test_backward_conditional_jump_gets_direction_fixed():
    template, instructions = _countdown_instructions(_conditional_jump_opname("TRUE"))
    rebuilt = _rebuild(template, instructions)
    assert rebuilt(4) == 10 and rebuilt(1) == 1
    names = [i.opname for i in dis.get_instructions(rebuilt.__code__)]
    assert "JUMP_BACKWARD" in names or any("BACKWARD_IF_TRUE" in n for n in names)


def test_unconditional_jump_direction_follows_layout():
    def template(x):
        if x:
            return 1
        return 2

    instructions = bc.disassemble(template.__code__)
    ret2 = instructions[-2:]   # LOAD_CONST 2; RETURN_VALUE (or RETURN_CONST 2 ...)
    if instructions[-1].opname == "RETURN_CONST":
        ret2 = instructions[-1:]
    # Move the "return 2" block to the front (behind a jump over it) and jump back to it.
    rest = [i for i in instructions if i not in ret2]
    resume, tail = rest[:1], rest[1:]
    cond = next(i for i in tail if i.target is not None)
    cond.target = bc.create_jump(ret2[0])   # new stub placed where the block used to be
    skip = bc.create_jump(tail[0], forward=True)
    new = resume + [skip] + ret2 + tail + [cond.target]
    rebuilt = _rebuild(template, new)
    assert rebuilt(1) == 1 and rebuilt(0) == 2
    assert cond.target.opname == "JUMP_BACKWARD"


def test_compare_op_created_from_string():
    def template(a, b):
        return a

    instructions = bc.disassemble(template.__code__)
    at = _prologue_index(instructions)
    for op in ("<", "<=", "==", "!=", ">", ">="):
        body = [bc.create_instruction("LOAD_FAST", argval="a"),
                bc.create_instruction("LOAD_FAST", argval="b"),
                bc.create_compare_op(op), bc.create_instruction("RETURN_VALUE")]
        rebuilt = _rebuild(template, instructions[:at] + body)
        for a, b in ((1, 2), (2, 2), (3, 2)):
            assert rebuilt(a, b) == eval(f"a {op} b")
        compare = next(i for i in dis.get_instructions(rebuilt.__code__)
                       if i.opname == "COMPARE_OP")
        assert bc.compare_op_of(compare.arg) == op


def test_stale_arg_is_recomputed_and_flags_kept():
    def template():
        return len

    instructions = bc.disassemble(template.__code__)
    load = next(i for i in instructions if i.opname == "LOAD_GLOBAL")
    load.argval = "GLOBAL_SCALE"     # arg still indexes "len"
    rebuilt = _rebuild(template, instructions)
    assert rebuilt() == GLOBAL_SCALE
    new_load = next(i for i in dis.get_instructions(rebuilt.__code__) if i.opname == "LOAD_GLOBAL")
    assert new_load.arg & 1 == load.arg & 1 == 0


def test_lineno_only_instructions_and_replace_fields():
    def template():
        return 5

    instructions = bc.disassemble(template.__code__)
    first_line = template.__code__.co_firstlineno
    for inst in instructions[1:]:
        inst.lineno = first_line + 40   # positions now disagree: written as line only
    code = bc.assemble(instructions, template.__code__, co_name="renamed",
                       co_qualname="renamed")
    assert code.co_name == "renamed"
    lines = {line for _, _, line in code.co_lines() if line is not None}
    assert first_line + 40 in lines
    assert eval(code) == 5


def test_create_instruction_validation():
    with pytest.raises(ValueError):
        bc.create_instruction("LOAD_GLOBAL", arg=0)        # table operand needs argval
    with pytest.raises(ValueError):
        bc.create_instruction("NOT_AN_OPCODE")
    inst = bc.create_instruction("BUILD_TUPLE", arg=3)
    assert inst.argval == 3 and inst.opcode == dis.opmap["BUILD_TUPLE"]
    assert [i.opname for i in bc.create_call(2)] == list(SPEC.call_sequence)
    assert "LOAD_GLOBAL" in repr(bc.create_load_global("x", True))


# ---------------------------------------------------------------------------------------------
# tables and small pieces
# ---------------------------------------------------------------------------------------------

def test_version_tables_agree_with_dis():
    real_jumps = {dis.opname[op] for op in dis.hasjrel if op < 256}
    assert SPEC.forward_jumps | SPEC.backward_jumps == real_jumps
    assert not SPEC.forward_jumps & SPEC.backward_jumps
    for name in (set(SPEC.flip_direction) | set(SPEC.flip_direction.values())
                 | SPEC.scope_exits | set(SPEC.call_sequence) | {SPEC.load_method[0]}):
        assert name in dis.opmap, name


def test_predicates_and_binary_ops():
    assert bc.binary_op_symbol(_binary_op_arg("NB_ADD")) == "+"
    assert bc.binary_op_symbol(_binary_op_arg("NB_INPLACE_MATRIX_MULTIPLY")) == "@="
    jump = bc.create_jump(bc.create_instruction("NOP"))
    assert bc.is_jump(jump) and bc.is_unconditional_jump(jump)
    assert bc.is_return(bc.create_instruction("RETURN_VALUE"))
    assert not bc.is_jump(bc.create_instruction("NOP"))
    assert bc.is_backward_jump_opname("JUMP_BACKWARD")


def test_exception_table_codec():
    rows = [(0, 2, 4, 0, False), (6, 200, 4000, 3, True), (70000, 300000, 5000000, 70, False)]
    assert bc.parse_exception_table(bc.encode_exception_table(rows)) == rows
    for code in _module_codes("contextlib"):
        table = code.co_exceptiontable
        assert bc.encode_exception_table(bc.parse_exception_table(table)) == table


def test_code_to_dis_text_includes_nested_code():
    text = bc.code_to_dis_text(fn_closure.__code__)
    assert "fn_closure" in text and "add" in text and "<lambda>" in text
    assert "RETURN_VALUE" in text or "RETURN_CONST" in text
    assert "LOAD_FAST" in bc.instructions_to_text(bc.disassemble(fn_closure.__code__))
