"""Python state read and written by compiled code: every call agrees with eager.

Each program runs in two fresh module namespaces, one eager and one compiled, and is called
several times; after every call the outputs and the Python state (globals, containers,
attributes, closure cells) of the two namespaces must be equal. The guards of a compiled entry
describe the state at entry, so a call that follows a mutation must see the new state (a stale
``len()`` or a stale key list is a silently wrong result).
"""
import textwrap

import pytest
import torch

import ember
from ember.testing import CompileCounter, same

PRELUDE = """
import torch
import ember
SEEN = []
@ember.disable
def peek(*values):      # a graph break that records the state it sees
    SEEN.append(values)
class Obj:
    def __init__(self):
        self.n = 0
        self.items = []
"""


def twins(src: str, backend=None):
    """(eager namespace, compiled namespace, counter): ``src`` executed in each, with its
    ``f`` compiled in the second."""
    spaces = []
    for _ in range(2):
        ns: dict = {"__name__": "ember_state_test"}
        exec(compile(PRELUDE + textwrap.dedent(src), "<state test>", "exec"), ns)
        spaces.append(ns)
    cnt = CompileCounter(backend)
    spaces[1]["f"] = ember.compile(spaces[1]["f"], backend=cnt)
    return spaces[0], spaces[1], cnt


def state(ns: dict, names) -> list:
    out = []
    for name in names:
        v = ns[name]
        out.append(vars(v) if hasattr(v, "__dict__") and not callable(v) else v)
    return out


def run_twins(src: str, names: list[str], calls: int = 4, args=None, graphs=None):
    eager, compiled, cnt = twins(src)
    x = torch.arange(3.0)
    for i in range(calls):
        call_args = args(eager, compiled, i) if args else ((x,), (x,))
        want = eager["f"](*call_args[0])
        got = compiled["f"](*call_args[1])
        assert same(want, got), f"call {i}: eager {want!r}, compiled {got!r}"
        assert state(eager, names) == state(compiled, names), \
            f"call {i}: state {state(eager, names)} vs {state(compiled, names)}"
    if graphs is not None:
        assert cnt.frame_count == graphs
    return cnt


# --------------------------------------------------------------------------- globals and lists

def test_len_of_module_list_after_append():
    """The reported bug: the second call saw the length the first call started from."""
    run_twins("""
        L = []
        def f(x):
            L.append(1)
            return x + len(L)
    """, ["L"])


@pytest.mark.parametrize("order", ["read_before", "read_after", "both"])
def test_global_list_read_and_write(order):
    body = {
        "read_before": "a = len(L); L.append(x.sum().item() if False else 2); return x * a",
        "read_after": "L.append(2); L.append(3); return x * len(L) + L[-1]",
        "both": "a = len(L); L.extend([a, a]); return x * a + sum(L)",
    }[order]
    run_twins(f"""
        L = [1]
        def f(x):
            {body}
    """, ["L"])


def test_list_reached_through_two_names():
    run_twins("""
        L = []
        ALIAS = L
        def f(x):
            L.append(1)
            return x + len(ALIAS) + len(L)
    """, ["L", "ALIAS"])


def test_list_in_dict_and_global():
    run_twins("""
        L = []
        D = {"l": L}
        def f(x):
            D["l"].append(len(L))
            return x * len(L) + D["l"][-1]
    """, ["L", "D"])


def test_global_rebound_then_read():
    run_twins("""
        COUNT = 0
        def f(x):
            global COUNT
            before = COUNT
            COUNT = COUNT + 1
            return x + before * 10 + COUNT
    """, ["COUNT"])


# ------------------------------------------------------------------------------------ dicts

@pytest.mark.parametrize("order", ["read_before", "read_after"])
def test_global_dict_read_and_write(order):
    body = {
        "read_before": "n = len(D); D[n] = n; return x + n + len(D)",
        "read_after": "D[len(D)] = 1; return x + len(D) + sum(D.values())",
    }[order]
    run_twins(f"""
        D = {{}}
        def f(x):
            {body}
    """, ["D"])


def test_dict_alias_through_attribute():
    run_twins("""
        O = Obj()
        O.d = {}
        D = O.d
        def f(x):
            D["k" + str(len(O.d))] = 1
            return x + len(O.d) + len(D)
    """, ["O", "D"])


# ------------------------------------------------------------------------------ attributes

@pytest.mark.parametrize("order", ["read_before", "read_after", "both"])
def test_object_attribute(order):
    body = {
        "read_before": "a = O.n; O.n = a + 1; return x + a",
        "read_after": "O.n = O.n + 2; return x + O.n",
        "both": "a = O.n; O.n += 1; O.items.append(a); return x + a + O.n + len(O.items)",
    }[order]
    run_twins(f"""
        O = Obj()
        def f(x):
            {body}
    """, ["O"])


def test_object_reached_through_two_names():
    run_twins("""
        O = Obj()
        P = O
        def f(x):
            O.n = O.n + 1
            return x + P.n + len(P.items)
    """, ["O", "P"])


def test_module_attribute_counter():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    eager, mod = Counter(), Counter()
    compiled = ember.compile(mod, backend=CompileCounter())
    x = torch.ones(2)
    for _ in range(4):
        assert same(eager(x), compiled(x))
        assert eager.calls == mod.calls


# --------------------------------------------------------------------------- closure cells

CELL_BODIES = {
    "read_before": "a = n; n = a + 1; return x + a",
    "read_after": "n = n + 1; return x + n",
}


@pytest.mark.parametrize("order", list(CELL_BODIES))
def test_closure_cell(order):
    """The cell's value feeds each return value, so the outputs check it."""
    run_twins(f"""
        def make():
            n = 0
            def f(x):
                nonlocal n; {CELL_BODIES[order]}
            return f
        f = make()
    """, [])


def test_closure_cell_holding_a_list():
    run_twins("""
        def make():
            seen = []
            def f(x):
                seen.append(len(seen))
                return x + len(seen) + sum(seen)
            return f
        f = make()
    """, [])


# ----------------------------------------------------------------- the same object, two args

def test_same_list_as_two_arguments_after_distinct_ones():
    """Captured with two distinct lists, then called with one list twice: the append through
    one name must be visible through the other, so the entry must not be reused."""
    eager, compiled, cnt = twins("""
        def f(x, a, b):
            a.append(1)
            return x + len(b)
    """)
    x = torch.ones(1)
    la, lb, ca, cb = [], [], [], []
    assert same(eager["f"](x, la, lb), compiled["f"](x, ca, cb))
    shared_e, shared_c = [], []
    assert same(eager["f"](x, shared_e, shared_e), compiled["f"](x, shared_c, shared_c))
    assert shared_e == shared_c and la == ca and lb == cb
    assert cnt.frame_count == 2


# ------------------------------------------------------------------------------- dict views

def dict_views(x, d):
    keys, values, items = d.keys(), d.values(), d.items()
    d[4] = x * 2
    d.pop(1)
    total = x
    for v in values:
        total = total + v
    return (total, 4 in keys, 1 in keys, len(values), len(items), (4, d[4]) in items,
            sorted(keys), list(keys & {2, 4, 7}), len(keys - [2]))


def test_dict_views_follow_later_mutation():
    cnt = CompileCounter()
    compiled = ember.compile(dict_views, backend=cnt)
    x = torch.ones(2)
    for _ in range(2):
        want, got = dict_views(x, {1: x, 2: x + 1}), compiled(x, {1: x, 2: x + 1})
        assert same(want, got), (want, got)
    assert cnt.frame_count == 1


def test_dict_view_returned_is_live():
    def f(x, d):
        d["b"] = x
        return d.keys(), d.items()

    d_e, d_c = {"a": 1}, {"a": 1}
    x = torch.ones(1)
    ke, ie = f(x, d_e)
    kc, ic = ember.compile(f, backend=CompileCounter())(x, d_c)
    assert list(ke) == list(kc) and type(ke) is type(kc) and type(ie) is type(ic)
    d_c["c"] = 3
    assert "c" in kc    # a real view of the caller's dict, not a snapshot


# --------------------------------------------------------------------------- random state

def random_unused(x):
    torch.rand(3)
    x.new_empty(4).uniform_()
    torch.nn.functional.dropout(x, 0.5, training=True)
    torch.randn_like(x)
    return x + 1


def random_used(x):
    noise = torch.rand_like(x)
    keep = torch.bernoulli(torch.full_like(x, 0.5))
    return x + noise * keep, torch.randn(2)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
@pytest.mark.parametrize("fn", [random_unused, random_used], ids=lambda f: f.__name__)
def test_random_state_after_call_equals_eager(fn, backend):
    compiled = ember.compile(fn, backend=backend)
    x = torch.randn(8)
    torch.manual_seed(123)
    want = fn(x)
    want_next = torch.rand(5)
    torch.manual_seed(123)
    got = compiled(x)
    got_next = torch.rand(5)
    assert same(want, got)
    assert torch.equal(want_next, got_next), "the generator moved differently from eager"


def test_fused_random_option_draws_other_numbers_from_the_same_seed():
    """fallback_random=False: Philox in the kernel, reproducible but not eager's numbers."""
    compiled = ember.compile(random_used, options={"fallback_random": False})
    x = torch.randn(8)
    torch.manual_seed(5)
    a = compiled(x)
    torch.manual_seed(5)
    b = compiled(x)
    assert same(a, b)
    torch.manual_seed(5)
    assert not torch.equal(random_used(x)[1], a[1])


# ----------------------------------------------------------- mutations across a graph break

BREAK_BODIES = {
    "list": ("L.append(len(L)); peek(len(L), list(L)); L.append(len(L) * 10); "
             "return x + len(L)"),
    "dict": ("D[len(D)] = 1; peek(dict(D)); D['after'] = len(D); return x + len(D)"),
    "attribute": ("O.n = O.n + 1; O.items.append(O.n); peek(O.n, list(O.items)); "
                  "O.n = O.n * 2; return x + O.n"),
    "global": ("global COUNT; COUNT = COUNT + 1; peek(COUNT); COUNT = COUNT + 10; "
               "return x + COUNT"),
    "two_names": ("L.append(1); peek(len(ALIAS)); ALIAS.append(2); return x + len(L)"),
    "new_object": ("o = Obj(); o.n = len(L); L.append(o.n); NEW.append(o); peek(len(NEW), "
                   "NEW[-1].n); o.n = 5; return x + len(NEW)"),
    "read_after_break": ("peek(len(L)); L.append(3); return x * len(L) + L[-1]"),
}


@pytest.mark.parametrize("kind", list(BREAK_BODIES))
def test_mutations_across_a_graph_break(kind):
    """What the code changed before the break is in place when the break runs (``peek``
    records it), and the resume function reads and changes the state from there."""
    cnt = run_twins(f"""
        L = [0]
        ALIAS = L
        D = {{}}
        O = Obj()
        COUNT = 0
        NEW = []
        def f(x):
            {BREAK_BODIES[kind]}
    """, ["SEEN", "L", "D", "O", "COUNT"] + (["NEW"] if kind != "new_object" else []))
    assert cnt.frame_count >= 2   # the break split each capture


def test_new_object_escaping_before_a_break_is_the_same_object_after():
    eager, compiled, _ = twins("""
        NEW = []
        def f(x):
            o = Obj()
            NEW.append(o)
            peek(len(NEW))
            o.n = len(NEW)
            return x + o.n
    """)
    x = torch.ones(2)
    for i in range(3):
        assert same(eager["f"](x), compiled["f"](x))
        assert [o.n for o in eager["NEW"]] == [o.n for o in compiled["NEW"]] == \
            list(range(1, i + 2))
    assert eager["SEEN"] == compiled["SEEN"]


def test_closure_cell_across_a_graph_break():
    run_twins("""
        def make():
            n = 0
            def f(x):
                nonlocal n
                n = n + 1
                peek(n)
                n = n * 2
                return x + n
            return f
        f = make()
    """, ["SEEN"])


def test_three_lists_one_mutated_then_two_of_them_the_same_object():
    """One DISTINCT guard covers the whole group of same-type objects."""
    eager, compiled, cnt = twins("""
        def f(x, a, b, c):
            a.append(1)
            return x + len(b) + 10 * len(c)
    """)
    x = torch.ones(1)
    assert same(eager["f"](x, [], [], []), compiled["f"](x, [], [], []))
    for pick in ((0, 1, 0), (0, 1, 1)):
        lists_e, lists_c = [[], []], [[], []]
        args_e = [lists_e[i] for i in pick]
        args_c = [lists_c[i] for i in pick]
        assert same(eager["f"](x, *args_e), compiled["f"](x, *args_c))
        assert lists_e == lists_c
    assert cnt.frame_count == 3


def reseeds_between_draws(x):
    y = x + torch.rand(2)
    torch.manual_seed(3)
    return y + torch.rand(2)


def test_manual_seed_inside_compiled_code_breaks_and_keeps_eager_draws():
    cnt = CompileCounter()
    compiled = ember.compile(reseeds_between_draws, backend=cnt)
    torch.manual_seed(0)
    got, got_next = compiled(torch.zeros(2)), torch.rand(3)
    torch.manual_seed(0)
    want, want_next = reseeds_between_draws(torch.zeros(2)), torch.rand(3)
    assert torch.equal(got, want) and torch.equal(got_next, want_next)
    assert cnt.frame_count == 2
    ember.reset()
    explained = ember.explain(reseeds_between_draws)(torch.zeros(2))
    assert [r.reason for r in explained.break_reasons] == [
        "call to manual_seed: torch.random.manual_seed sets the global random state; it runs "
        "in Python between graphs"]
