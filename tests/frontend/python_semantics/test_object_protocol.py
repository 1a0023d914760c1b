"""Python's object protocol during capture: ``id()``, ``copy.copy``/``copy.deepcopy`` of plain
objects (HuggingFace configs are deep-copied inside forward), classes with their own
``__setattr__``/``__getattribute__``/``__delattr__``, property setters, and a ``KeyError``
caught by an inlined function. Outputs and Python state are compared with eager, and the
number of graphs is asserted (one graph: no break).
"""
import copy
import textwrap

import torch

import ember
from ember.testing import CompileCounter, same
from conformance_util import _seed_rng, check  # noqa: F401


class Cfg:
    def __init__(self, scale=2):
        self.scale = scale
        self.names = ["a", "b"]
        self.table = {"shift": 1.5}


class Aliased:
    """Remaps names on read and write, as transformers' PreTrainedConfig does."""
    attribute_map = {"hidden": "d_model"}

    def __init__(self):
        self.d_model = 4

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def explained_no_break(fn, *args):
    explained = ember.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


# -- copy ------------------------------------------------------------------------------------

def ob_deepcopy(x, cfg):
    c = copy.deepcopy(cfg)
    c.scale = 3                 # the copy changes, the original does not
    c.names.append("c")
    c.table["shift"] = 0.5
    return x * c.scale + c.table["shift"] + len(c.names) + cfg.scale + len(cfg.names)


def ob_copy(x, cfg):
    c = copy.copy(cfg)
    c.scale = 5
    c.names.append("shared")    # a shallow copy shares the list
    return x * c.scale + cfg.scale + len(cfg.names)


def ob_deepcopy_returned(x, cfg):
    c = copy.deepcopy(cfg)
    c.names.append("c")
    return x + 1, c


def test_deepcopy_of_a_plain_object():
    check(ob_deepcopy, (torch.randn(3), Cfg()), graphs=1)
    check(ob_copy, (torch.randn(3), Cfg()), graphs=1)
    explained_no_break(ob_deepcopy, torch.randn(3), Cfg())


def test_deepcopy_result_escapes():
    cfg = Cfg()
    compiled = ember.compile(ob_deepcopy_returned, backend=CompileCounter())
    for _ in range(2):
        out, c = compiled(torch.ones(2), cfg)
        assert type(c) is Cfg and c is not cfg
        assert c.names == ["a", "b", "c"] and c.names is not cfg.names
        assert c.table == cfg.table and c.table is not cfg.table
        assert cfg.names == ["a", "b"]
    assert same(out, torch.ones(2) + 1)


def test_deepcopy_sees_changed_attributes():
    cfg = Cfg()
    cnt = CompileCounter()
    compiled = ember.compile(ob_deepcopy, backend=cnt)
    x = torch.randn(3)
    for change in (lambda: None, lambda: setattr(cfg, "scale", 7),
                   lambda: cfg.names.append("z"), lambda: setattr(cfg, "extra", 1)):
        change()
        assert same(compiled(x, cfg), ob_deepcopy(x, cfg))


def test_deepcopy_of_aliased_config():
    def fn(x, cfg):
        c = copy.deepcopy(cfg)
        c.hidden = 8            # written through the alias
        return x * c.d_model + cfg.hidden
    check(fn, (torch.randn(3), Aliased()), graphs=1)


# -- id() ------------------------------------------------------------------------------------

def ob_identity_cache(x, a, b):
    cache = {}
    for obj in (a, b, a):
        key = id(obj)
        if key not in cache:
            cache[key] = len(cache)
    same_ab = id(a) == id(b)
    return x + len(cache) + same_ab + (id(a) != id(b))


def test_id_as_identity_key():
    cfg = Cfg()
    check(ob_identity_cache, (torch.randn(3), cfg, Cfg()), graphs=1)
    check(ob_identity_cache, (torch.randn(3), cfg, cfg), graphs=None)


def test_id_escaping_the_frame_is_the_real_id():
    def fn(x, obj):
        made = Cfg()
        return x + 1, id(obj), id(made), made
    compiled = ember.compile(fn, backend=CompileCounter())
    for obj in (Cfg(), Cfg()):
        _, got, made_id, made = compiled(torch.ones(1), obj)
        assert got == id(obj)
        assert made_id == id(made)


# -- the attribute protocol ---------------------------------------------------------------------

def twins(src):
    spaces = []
    for _ in range(2):
        ns = {"__name__": "ember_object_protocol_test"}
        exec(compile("import torch\n" + textwrap.dedent(src), "<protocol test>", "exec"), ns)
        spaces.append(ns)
    cnt = CompileCounter()
    spaces[1]["f"] = ember.compile(spaces[1]["f"], backend=cnt)
    return spaces[0], spaces[1], cnt


def run_twins(src, names, graphs=1, calls=3):
    eager, compiled, cnt = twins(src)
    x = torch.arange(3.0)
    for i in range(calls):
        want, got = eager["f"](x), compiled["f"](x)
        assert same(want, got), f"call {i}: eager {want}, compiled {got}"
        for name in names:
            assert vars(eager[name]) == vars(compiled[name]), name
    if graphs is not None:
        assert cnt.frame_count == graphs


def test_custom_setattr_on_outside_and_new_objects():
    """Was a silent wrong result: ``c.alias = 5`` stored ``alias`` instead of running the
    class's ``__setattr__``, and a later read saw the old value."""
    run_twins("""
        class C:
            def __init__(self):
                self.a = 1
            def __setattr__(self, k, v):
                if k == "alias":
                    k = "a"
                object.__setattr__(self, k, v)
        c = C()
        def f(x):
            c.alias = 5
            d = C()
            d.alias = 7
            return x + c.a + d.a
    """, ["c"])


def test_custom_getattribute_on_new_object():
    run_twins("""
        class C:
            def __init__(self):
                self.d_model = 4
            def __getattribute__(self, k):
                if k == "hidden":
                    k = "d_model"
                return object.__getattribute__(self, k)
        def f(x):
            d = C()
            d.d_model = 6
            return x * d.hidden
    """, [])


def test_delattr_on_new_object():
    run_twins("""
        class C:
            def __init__(self):
                self.a = 1
                self.b = 2
        def f(x):
            d = C()
            delattr(d, "a")
            del d.b
            d.c = 3
            return x + d.c + hasattr(d, "a") + len(vars(d))
    """, [])


def test_delattr_on_outside_object_breaks_and_stays_correct():
    run_twins("""
        class C:
            pass
        c = C()
        def f(x):
            c.tmp = 1
            y = x + c.tmp
            del c.tmp
            return y * 2 + hasattr(c, "tmp")
    """, ["c"], graphs=None)


def test_property_setter_on_new_object():
    run_twins("""
        class C:
            def __init__(self):
                self._v = 1
            @property
            def v(self):
                return self._v
            @v.setter
            def v(self, value):
                self._v = value * 10
        def f(x):
            d = C()
            d.v = 2
            return x + d.v + d._v
    """, [])


# -- exceptions caught inside an inlined function -------------------------------------------

def _lookup(table, key):
    try:
        return table[key]
    except KeyError:
        table[key] = len(table)
        return -1


def ob_caught_key_error(x, table):
    a = _lookup(table, "missing")
    b = _lookup(table, "missing")
    return x + a + b


def _lookup_wrong_handler(table, key):
    try:
        return table[key]
    except IndexError:
        return 0


def ob_uncaught_key_error(x, table):
    y = x * 2
    return y + _lookup_wrong_handler(table, "missing")


def test_key_error_caught_by_inlined_function():
    check(ob_caught_key_error, (torch.randn(3), {"k": 1}), graphs=1)
    explained_no_break(ob_caught_key_error, torch.randn(3), {"k": 1})


def test_key_error_not_caught_propagates():
    check(ob_uncaught_key_error, (torch.randn(3), {"k": 1}), graphs=None, raises=KeyError)


def ob_aliased_write_then_read(x, cfg):
    cfg.hidden = 8              # cfg.d_model = 8, replayed after the graph
    return x * cfg.hidden + cfg.d_model


def test_aliased_write_then_read_on_outside_object():
    check(ob_aliased_write_then_read, (torch.randn(3), Aliased()), graphs=1)


def ob_copy_containers(x, d, lst):
    e = copy.copy(d)                # dict.copy, unbound, from copy's dispatch table
    e["k"] = 3
    m = copy.copy(lst)
    list.append(m, 4)
    return x + len(d) + len(e) + len(m) + len(lst), e, m


class _MyDict(dict):
    def copy(self):
        return "own copy"


def ob_unbound_method_on_subclass(x, d):
    return x + len(dict.copy(d))    # dict's copy, not the subclass's: breaks, stays right


def test_copy_of_containers_and_unbound_methods():
    check(ob_copy_containers, (torch.randn(3), {"a": 1}, [1, 2]), graphs=1)
    check(ob_unbound_method_on_subclass, (torch.randn(3), _MyDict(a=1)), graphs=None)


def test_id_looked_up_in_a_dict_of_real_ids():
    """A cache keyed by id() that outlives the call: its keys are real ids, so a lookup's
    answer depends on the object (capture must not answer 'absent' by its own keys)."""
    run_twins("""
        class C:
            pass
        CACHE = {}
        A, B = C(), C()
        def f(x):
            hits = 0
            for obj in (A, B, A):
                if id(obj) in CACHE:
                    hits += 1
                else:
                    CACHE[id(obj)] = len(CACHE)
            return x + hits + len(CACHE)
    """, [], graphs=None)


# -- attributes found absent ---------------------------------------------------------------------

class _Plain:
    pass


def ob_hasattr(x, o):
    if hasattr(o, "extra"):
        return x + 1
    return x - 1


def ob_getattr_default(x, o):
    return x + getattr(o, "extra", 5) + getattr(Aliased(), "nothing", 2)


def _read_or_default(o):
    try:
        return o.extra
    except AttributeError:
        return 7


def ob_attribute_error_caught(x, o):
    return x + _read_or_default(o)


def test_absent_attribute_is_guarded():
    """Was a silent wrong result: hasattr/getattr-with-default of an attribute an object
    lacked were not guarded, so the object gaining it later reused the old answer."""
    for fn in (ob_hasattr, ob_getattr_default, ob_attribute_error_caught):
        cnt = CompileCounter()
        compiled = ember.compile(fn, backend=cnt)
        o, x = _Plain(), torch.randn(3)
        assert same(compiled(x, o), fn(x, o))
        o.extra = 1
        assert same(compiled(x, o), fn(x, o)), fn.__name__
        assert cnt.frame_count == 2, fn.__name__
    explained_no_break(ob_attribute_error_caught, torch.randn(3), _Plain())


class _SetOnFirstUse(torch.nn.Module):
    def forward(self, x):
        if not hasattr(self, "scale"):
            self.scale = 3.0        # set on the first call only
        return x * self.scale + hasattr(self, "missing")


def test_module_attribute_set_on_first_use():
    eager, compiled_module = _SetOnFirstUse(), _SetOnFirstUse()
    cnt = CompileCounter()
    compiled = ember.compile(compiled_module, backend=cnt)
    x = torch.randn(3)
    for _ in range(3):
        assert same(compiled(x), eager(x))
        assert vars(compiled_module).get("scale") == vars(eager).get("scale")
    assert cnt.frame_count == 2     # without the attribute, then with it
