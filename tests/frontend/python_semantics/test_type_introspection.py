"""``type(v)``, ``v.__class__``, their ``__name__``/``__qualname__``/``__module__``/
``__mro__``/``__bases__``, ``type(v) is T`` and ``isinstance`` inside a capture answer what
eager answers, for tensors (inputs, parameters, intermediates), modules, compiled modules
and their originals, user objects and user classes. Each expression is compiled with
``fullgraph=True`` so a graph break cannot hide a wrong answer."""
import pytest
import torch

import ember


class User:
    def method(self):
        return 1


class SubLinear(torch.nn.Linear):
    pass


_VALUES = {
    "tensor": lambda: torch.randn(3),
    "parameter": lambda: torch.nn.Parameter(torch.randn(3)),
    "module": lambda: torch.nn.Linear(3, 3),
    "module_subclass": lambda: SubLinear(3, 3),
    "compiled_module": lambda: ember.compile(torch.nn.Linear(3, 3)),
    "compiled_module_original": lambda: ember.compile(torch.nn.Linear(3, 3))._orig_mod,
    "user_object": User,
    "user_class": lambda: User,
}

_EXPRESSIONS = [
    "type(v).__name__", "v.__class__.__name__", "type(v).__qualname__",
    "v.__class__.__qualname__", "type(v).__module__", "v.__class__.__module__",
    "v.__class__ is type(v)", "type(v) is torch.Tensor", "type(v) is torch.nn.Parameter",
    "v.__class__ is torch.nn.Parameter", "type(v) is torch.nn.Linear",
    "type(v) == torch.nn.Linear", "isinstance(v, torch.nn.Parameter)",
    "isinstance(v, torch.Tensor)", "isinstance(v, torch.nn.Linear)",
    "isinstance(v, torch.nn.Module)", "issubclass(type(v), torch.nn.Module)",
    "str(type(v))", "[k.__name__ for k in type(v).__mro__]",
    "[k.__name__ for k in v.__class__.__mro__]", "[k.__name__ for k in type(v).__bases__]",
    "type(v).__base__.__name__",
]


# of a class ``type(v)`` is ``type``, whose own attributes capture does not model
_TYPE_OF_A_CLASS = {"[k.__name__ for k in type(v).__mro__]",
                    "[k.__name__ for k in v.__class__.__mro__]",
                    "[k.__name__ for k in type(v).__bases__]", "type(v).__base__.__name__"}


def _check(fn, *args):
    want = fn(*args)
    got = ember.compile(fn, backend="eager", fullgraph=True)(*args)
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.parametrize("expr", _EXPRESSIONS)
@pytest.mark.parametrize("what", sorted(_VALUES))
def test_type_introspection_matches_eager(what, expr):
    if what == "user_class" and expr in _TYPE_OF_A_CLASS:
        pytest.skip("type's own __mro__/__bases__: a graph break, not a wrong answer")
    v = _VALUES[what]()
    _check(eval(f"lambda v, x: ({expr}, x + 1)"), v, torch.randn(3))


@pytest.mark.parametrize("expr", _EXPRESSIONS)
def test_type_introspection_of_intermediate_tensors(expr):
    inner = eval(f"lambda v: {expr}")
    _check(lambda x: (inner(x * 2), x + 1), torch.randn(3))


def test_class_name_in_a_format_string():
    def fn(x):
        tmp = f"{x.__class__.__name__} foo"
        if tmp.startswith("Tensor"):
            return x + 1
        return None
    x = torch.randn(3)
    torch.testing.assert_close(ember.compile(fn, backend="eager", fullgraph=True)(x), fn(x))


def test_class_attributes_of_user_classes():
    def fn(x):
        return ((User.__class__ is type, User.__class__.__name__, User.__mro__[0] is User,
                 User.__bases__, User.__dict__["method"].__name__), x + 1)
    _check(fn, torch.randn(3))


def test_compiled_submodule_type():
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sub = ember.compile(torch.nn.Linear(3, 3), backend="eager")

        def forward(self, x):
            y = self.sub(x)
            if type(self.sub).__name__ == "OptimizedModule" and not isinstance(
                    self.sub, torch.nn.Linear):
                return y * 2
            return y
    m = Outer()
    x = torch.randn(2, 3)
    torch.testing.assert_close(ember.compile(m, backend="eager", fullgraph=True)(x), m(x))


def test_compiled_module_name_and_attributes():
    cm = ember.compile(torch.nn.Linear(3, 3), backend="eager")

    def fn(x):
        return (cm._get_name(), cm._orig_mod._get_name(), cm.in_features,
                hasattr(cm, "_compiled_forward")), x + 1
    _check(fn, torch.randn(3))


def test_attribute_written_through_a_compiled_module():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 1.0

        def forward(self, x):
            return x * self.scale
    eager_m, m = Scaled(), Scaled()
    cm = ember.compile(m, backend="eager")

    def step(module, x):
        module.scale = 3.0
        return module(x) + module.scale
    x = torch.randn(3)
    got = ember.compile(lambda x: step(cm, x), backend="eager")(x)
    torch.testing.assert_close(got, step(eager_m, x))
    assert m.scale == eager_m.scale
