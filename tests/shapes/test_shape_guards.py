"""The shape environment's guards: what records one, its text and location, what it teaches
the environment, 0/1 specialisation, duck sizing, and the checker of new sizes."""
import math

import pytest
import torch

from ember.shapes import GUARD_GLOBALS, GuardFailure, ShapeEnv


def sizes_of(env, names_and_hints):
    return env.create_sizes([h for _, h in names_and_hints], [n for n, _ in names_and_hints])


def line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "line_of" not in line)


def test_a_branch_on_a_size_is_a_guard_with_its_text_and_user_line():
    env = ShapeEnv()
    (x,) = sizes_of(env, [("L['x'].size(0)", 20)])
    if x > 16:                                             # the branch
        pass
    guard = env.guards[-1]
    assert guard.kind == "evaluate" and guard.value
    assert guard.location == f"{__file__}:{line_of('# the branch')}"
    assert env.guards_as_python() == "L['x'].size(0) >= 2 and L['x'].size(0) > 16"


def test_the_guard_of_a_false_branch_is_its_negation():
    env = ShapeEnv()
    (x,) = sizes_of(env, [("L['x'].size(0)", 5)])
    assert not (x > 16) and not (x % 4 == 0)
    assert env.guard_texts()[1:] == ["L['x'].size(0) <= 16", "(L['x'].size(0) % 4) != 0"]


def test_guards_of_the_issue_example_and_their_python_evaluates():
    env = ShapeEnv()
    x0, y0 = sizes_of(env, [("L['x'].size(0)", 20), ("L['y'].size(0)", 20)])
    assert x0 is y0 or str(x0) == str(y0) == "s0"          # duck sizing: one symbol
    assert x0 > 16
    text = env.guards_as_python()
    assert text == ("L['x'].size(0) >= 2 and L['y'].size(0) == L['x'].size(0) and "
                    "L['x'].size(0) > 16")
    check = compile(text, "<guards>", "eval")

    def holds(nx, ny):
        return eval(check, dict(GUARD_GLOBALS), {"L": {"x": torch.empty(nx),
                                                        "y": torch.empty(ny)}})
    assert holds(20, 20) and holds(17, 17)
    assert not holds(16, 16) and not holds(20, 21) and not holds(1, 1)


def test_source_names_give_the_text_of_each_source():
    env = ShapeEnv()
    sizes_of(env, [(("x", 0), 8), (("y", 1), 1)])
    names = {("x", 0): "a.shape[0]", ("y", 1): "b.shape[1]"}
    assert env.guards_as_python(names) == "a.shape[0] >= 2 and b.shape[1] == 1"
    assert env.guards_as_python(lambda s: f"{s[0]}.size({s[1]})") == \
        "x.size(0) >= 2 and y.size(1) == 1"


def test_sizes_zero_and_one_are_specialised_with_a_guard():
    env = ShapeEnv()
    a, b, c = sizes_of(env, [("x0", 0), ("x1", 1), ("x2", 2)])
    assert (a, b) == (0, 1) and type(a) is int and type(b) is int
    assert isinstance(c, torch.SymInt)
    assert env.guard_texts() == ["x0 == 0", "x1 == 1", "x2 >= 2"]
    assert [g.kind for g in env.guards] == ["specialized", "specialized", "range"]
    assert env.first_failing_guard({"x0": 0, "x1": 1, "x2": 7}) is None
    assert env.first_failing_guard({"x0": 0, "x1": 2, "x2": 7}) is env.guards[1]
    assert env.first_failing_guard({"x0": 0, "x1": 1, "x2": 1}) is env.guards[2]


def test_without_specialisation_sizes_zero_and_one_are_symbols():
    env = ShapeEnv(specialize_zero_one=False)
    (a,) = sizes_of(env, [("x0", 1)])
    assert isinstance(a, torch.SymInt) and env.guard_texts() == []   # ">= 0" always holds
    assert a - 1 >= 0 and len(env.guards) == 1 and env.guard_texts() == ["x0 >= 1"]


def test_static_dims_and_declared_ranges():
    env = ShapeEnv()
    s = env.create_symint(8, "x0", dynamic=False)
    t = env.create_symint(8, "x1", min=4, max=64)
    assert s == 8 and type(s) is int and isinstance(t, torch.SymInt)
    assert env.guard_texts() == ["x0 == 8", "x1 >= 4", "x1 <= 64"]
    assert t < 100 and len(env.guards) == 3                # decided by the range
    with pytest.raises(ValueError, match="outside its range"):
        env.create_symint(2, "x2", min=4)


def test_duck_sizing_shares_a_symbol_and_can_be_turned_off():
    env = ShapeEnv()
    a, b, c = sizes_of(env, [("x0", 5), ("x1", 5), ("x2", 6)])
    assert (a == b) is True and len(env.symbols) == 2
    assert env.guard_texts() == ["x0 >= 2", "x1 == x0", "x2 >= 2"]
    assert env.first_failing_guard({"x0": 7, "x1": 8, "x2": 6}).kind == "duck"
    env = ShapeEnv(duck_shape=False)
    a, b = sizes_of(env, [("x0", 5), ("x1", 5)])
    assert len(env.symbols) == 2 and isinstance(a == b, torch.SymBool)


def test_guards_teach_ranges_and_equalities():
    env = ShapeEnv(duck_shape=False)
    x, y, z, w = sizes_of(env, [("x", 20), ("y", 20), ("z", 3), ("w", 7)])
    assert x > 16                         # range of s0 becomes [17, oo]
    n = len(env.guards)
    assert x > 10 and x >= 17 and x != 5 and len(env.guards) == n      # decided, no guard
    assert x == y                         # s1 is replaced by s0 from now on
    n = len(env.guards)
    assert str(y + 1) == "s0 + 1" and (x - y) == 0 and y > 16 and len(env.guards) == n
    assert int(z) == 3                    # int() specialises: z is the constant 3 now
    assert z * 2 == 6 and type(z * 2) is int
    assert env.guard_texts()[-3:] == ["x > 16", "x == y", "z == 3"]
    assert x + w == 27 and str(w) == "s3"     # equal to a sum: w keeps its symbol


def test_an_equal_guard_is_recorded_once():
    env = ShapeEnv()
    x, y = sizes_of(env, [("x", 6), ("y", 4)])
    for _ in range(3):
        assert x % y == 2
    assert len(env.guards) == 3


def test_checker_names_the_first_failing_guard():
    env = ShapeEnv()
    x, y = sizes_of(env, [("L['x'].size(0)", 20), ("L['y'].size(0)", 7)])
    assert x > 16 and x % y == 6 and x // 2 == 10
    assert env.first_failing_guard({"L['x'].size(0)": 20, "L['y'].size(0)": 7}) is None
    failed = env.first_failing_guard({"L['x'].size(0)": 21, "L['y'].size(0)": 7})
    assert failed is env.guards[3]
    assert env.guard_texts()[3] == "(L['x'].size(0) % L['y'].size(0)) == 6"
    assert env.first_failing_guard({"L['x'].size(0)": 27, "L['y'].size(0)": 7}) is \
        env.guards[4]
    with pytest.raises(GuardFailure, match=r"L\['x'\]\.size\(0\) > 16 \(from .*"
                                           r"test_shape_guards.py:\d+\)"):
        env.check_guards({"L['x'].size(0)": 15, "L['y'].size(0)": 7})
    with pytest.raises(KeyError, match="no size given for source"):
        env.first_failing_guard({"L['x'].size(0)": 20})


def test_format_guards_names_kind_and_location():
    env = ShapeEnv()
    x = env.create_symint(20, "x")                         # created here
    assert math.floor(x / 3) == 6
    lines = env.format_guards().splitlines()
    assert lines[0] == f"x >= 2  # range, {__file__}:{line_of('# created here')}"
    assert lines[1].startswith("math.floor(x / 3) == 6  # evaluate")


def test_negative_sizes_are_refused():
    with pytest.raises(ValueError, match="a size is >= 0"):
        ShapeEnv().create_symint(-1, "x")


def test_env_guard_int_guard_bool_and_statically_known_true():
    env = ShapeEnv()
    x, y = sizes_of(env, [("x", 6), ("y", 4)])
    assert env.statically_known_true(x * y > y) and not env.statically_known_true(x > y)
    assert env.statically_known_true(True) and len(env.guards) == 2
    assert env.guard_bool(x > y) is True and env.guard_texts()[-1] == "x > y"
    assert env.guard_int(x // y) == 1 and env.guard_texts()[-1] == "(x // y) == 1"
    assert env.guard_int(7) == 7 and len(env.guards) == 4
