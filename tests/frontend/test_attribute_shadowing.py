"""An attribute read from an object's class is guarded against an instance attribute of the
same name set later (it would shadow the class's): the compiled code follows eager."""
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
