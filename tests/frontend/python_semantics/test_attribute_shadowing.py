"""An attribute read from an object's class is guarded against an instance attribute of the
same name set later (it would shadow the class's): the compiled code follows eager."""
import pytest
import torch

import ember


class Scaler:
    factor = 2.0

    def apply(self, x):
        return x * self.factor


def test_instance_method_shadowing_a_class_method_is_seen():
    obj = Scaler()
    x = torch.ones(3)

    def fn(x):
        return obj.apply(x)
    compiled = ember.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(x), fn(x))
    obj.apply = lambda x: x * 7                    # shadows Scaler.apply
    torch.testing.assert_close(compiled(x), fn(x))
    del obj.apply                                  # the class's again
    torch.testing.assert_close(compiled(x), fn(x))


def test_instance_value_shadowing_a_class_value_is_seen():
    obj = Scaler()
    x = torch.ones(3)

    def fn(x):
        return obj.apply(x) + obj.factor
    compiled = ember.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(x), fn(x))
    obj.factor = 5.0
    torch.testing.assert_close(compiled(x), fn(x))


# -- nn.Module: Python's lookup order (class data descriptors, the instance __dict__, class
# attributes, and only then nn.Module.__getattr__'s parameters, buffers and submodules) ------

class MethodAndSubmodule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._modules["helper"] = torch.nn.Linear(3, 3)    # hidden by the method

    def helper(self, x):
        return x * 100

    def forward(self, x):
        return self.helper(x)


class PropertyAndBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._buffers["scale"] = torch.full((3,), 7.0)       # hidden by the property

    @property
    def scale(self):
        return 3.0

    def forward(self, x):
        return x * self.scale


class ClassValueAndParameter(torch.nn.Module):
    bias = 0.5                                                # hides the parameter

    def __init__(self):
        super().__init__()
        self._parameters["bias"] = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x + self.bias


class InstanceAndClassValue(torch.nn.Module):
    k = 2.0

    def __init__(self):
        super().__init__()
        self.k = 5.0

    def forward(self, x):
        return x * self.k


@pytest.mark.parametrize("make", [MethodAndSubmodule, PropertyAndBuffer, ClassValueAndParameter,
                                  InstanceAndClassValue])
def test_module_attribute_found_where_python_finds_it(make):
    m = make()
    x = torch.randn(2, 3)
    torch.testing.assert_close(ember.compile(m, backend="eager")(x), m(x))
    outer = ember.compile(lambda x: m(x) + 1, backend="eager")
    torch.testing.assert_close(outer(x), m(x) + 1)


def test_module_method_shadowed_by_instance_attribute_later():
    m = MethodAndSubmodule()
    x = torch.randn(2, 3)
    compiled = ember.compile(m, backend="eager")
    torch.testing.assert_close(compiled(x), m(x))
    m.__dict__["helper"] = lambda x: x - 1                    # now the instance's
    torch.testing.assert_close(compiled(x), m(x))
    del m.__dict__["helper"]
    torch.testing.assert_close(compiled(x), m(x))


class OwnGetattr(torch.nn.Module):
    """A class ``__getattr__``: called (instead of nn.Module's) when normal lookup fails."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("offset", torch.ones(3))

    def __getattr__(self, name):
        if name.startswith("scaled_"):
            return 10.0
        return super().__getattr__(name)

    def forward(self, x):
        return self.lin(x) * self.scaled_x + self.offset + getattr(self, "missing", 2.0)


def test_module_own_getattr_is_called():
    m = OwnGetattr()
    x = torch.randn(2, 3)
    torch.testing.assert_close(ember.compile(m, backend="eager", fullgraph=True)(x), m(x))
