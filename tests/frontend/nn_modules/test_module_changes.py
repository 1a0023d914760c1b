"""A module changed after compiling runs its new code: a ``forward`` assigned to the
instance, parameters or buffers registered, deleted or re-registered (their order), and a
class's own ``__call__`` (which must run instead of ``forward``). Each test compiles, calls,
changes the module, calls again, and compares every call with eager."""
import types

import pytest
import torch

import ember
from ember.testing import CompileCounter


class Net(torch.nn.Module):
    """Its forward depends on the order of its parameters and buffers."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.full((3,), 1.0))
        self.b = torch.nn.Parameter(torch.full((3,), 2.0))
        self.register_buffer("c", torch.full((3,), 3.0))
        self.register_buffer("d", torch.full((3,), 4.0))

    def forward(self, x):
        for i, p in enumerate(self.parameters()):
            x = x * (i + 2) + p
        for i, (name, b) in enumerate(self.named_buffers()):
            x = x * (i + 2) - b
        return x


def _other_forward(self, x):
    return x - self.a


def _reorder(m):
    a = m.a
    del m.a
    m.a = a                                   # now after b
    c = m.c
    del m._buffers["c"]
    m.register_buffer("c", c)                 # now after d


_CHANGES = {
    "method": lambda m: setattr(m, "forward", types.MethodType(_other_forward, m)),
    "lambda": lambda m: setattr(m, "forward", lambda x: x * 5),
    "function": lambda m: setattr(m, "forward", torch.sin),
    "reorder": _reorder,
    "new_parameter": lambda m: m.register_parameter("e", torch.nn.Parameter(torch.ones(3))),
    "new_buffer": lambda m: m.register_buffer("e", torch.ones(3) * 9),
    "deleted_buffer": lambda m: delattr(m, "c"),
}


def _wrap_in_function(m, backend):
    compiled = ember.compile(lambda x: m(x) + 1, backend=backend)
    return compiled, lambda x: m(x) + 1


@pytest.mark.parametrize("change", sorted(_CHANGES))
@pytest.mark.parametrize("where", ["compiled_module", "called_from_compiled_function"])
def test_change_after_compiling_is_seen(change, where):
    m = Net()
    x = torch.randn(3)
    if where == "compiled_module":
        compiled, eager = ember.compile(m, backend="eager"), m
    else:
        compiled, eager = _wrap_in_function(m, "eager")
    torch.testing.assert_close(compiled(x), eager(x))
    _CHANGES[change](m)
    torch.testing.assert_close(compiled(x), eager(x))
    torch.testing.assert_close(compiled(x), eager(x))


def test_forward_assigned_then_deleted():
    m = Net()
    x = torch.randn(3)
    compiled = ember.compile(m, backend="eager")
    outer, eager_outer = _wrap_in_function(m, "eager")
    for change in (lambda: setattr(m, "forward", types.MethodType(_other_forward, m)),
                   lambda: delattr(m, "forward"), lambda: None):
        change()
        torch.testing.assert_close(compiled(x), m(x))
        torch.testing.assert_close(outer(x), eager_outer(x))


def test_unchanged_module_does_not_recompile():
    m = Net()
    counter = CompileCounter()
    compiled = ember.compile(m, backend=counter)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), m(x))
    assert counter.frame_count == 1


def test_module_list_grown_after_compiling():
    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x + self.layers[-1].bias + len(list(self.children()))
    m = Stack()
    x = torch.randn(2, 3)
    compiled = ember.compile(m, backend="eager")
    torch.testing.assert_close(compiled(x), m(x))
    m.layers.append(torch.nn.Linear(3, 3))
    torch.testing.assert_close(compiled(x), m(x))


class Scaled(torch.nn.Module):
    """A class that overrides ``__call__``: calling it must run that, not ``forward``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.full((3,), 3.0))

    def forward(self, x):
        return x * self.k

    def __call__(self, x):
        return super().__call__(x) * 5


class PlainCall(torch.nn.Module):
    def forward(self, x):
        return x + 100

    def __call__(self, x):
        return self.forward(x) * 2 - 1


class Outer(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) + 1


class ScaledImpl(torch.nn.Module):
    """Overrides ``_call_impl``: nn.Module.__call__ calls it (it calls the hooks and
    forward through super())."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x)

    def _call_impl(self, *args, **kwargs):
        return super()._call_impl(*args, **kwargs) * 2 + 1


class ImplAndCall(ScaledImpl):
    def __call__(self, *args, **kwargs):      # super().__call__ goes through _call_impl
        return super().__call__(*args, **kwargs) - 5


class WrappedImpl(torch.nn.Module):
    """Eager never calls this override: nn.Module.__call__ is the base's function."""

    def forward(self, x):
        return x + 1

    def _wrapped_call_impl(self, *args, **kwargs):
        return args[0] * 100


class CallIsCallImpl(torch.nn.Module):
    """``__call__`` is nn.Module._call_impl itself: the class's _call_impl is not called."""
    __call__ = torch.nn.Module._call_impl

    def forward(self, x):
        return x + 1

    def _call_impl(self, *args, **kwargs):
        return args[0] * 100


def _instance_impl():
    m = torch.nn.Linear(3, 3)
    m._call_impl = lambda *args, **kwargs: args[0] * 7   # an instance attribute
    return m


# classes and instances with their own _call_impl (nn.Module.__call__ calls it)
_CALL_IMPLS = {"impl_class": ScaledImpl, "impl_with_call": ImplAndCall,
               "wrapped_impl": WrappedImpl, "impl_instance": _instance_impl,
               "call_is_call_impl": CallIsCallImpl,
               "submodule_call_is_call_impl": lambda: Outer(CallIsCallImpl()),
               "submodule_impl_class": lambda: Outer(ScaledImpl()),
               "submodule_impl_with_call": lambda: Outer(ImplAndCall()),
               "submodule_impl_instance": lambda: Outer(_instance_impl())}


@pytest.mark.parametrize("make", [Scaled, PlainCall, lambda: Outer(Scaled()),
                                  lambda: Outer(PlainCall()), *_CALL_IMPLS.values()],
                         ids=["super_call", "plain_call", "submodule_super_call",
                              "submodule_plain_call", *_CALL_IMPLS])
@pytest.mark.parametrize("fullgraph", [False, True])
def test_custom_call_runs(make, fullgraph):
    m = make()
    x = torch.randn(3)
    compiled = ember.compile(m, backend="eager", fullgraph=fullgraph)
    torch.testing.assert_close(compiled(x), m(x))
    fn = ember.compile(lambda x: m(x) - 2, backend="eager", fullgraph=fullgraph)
    torch.testing.assert_close(fn(x), m(x) - 2)


def test_custom_call_hooks_run_once():
    m = Scaled()
    calls = []
    m.register_forward_hook(lambda mod, args, out: calls.append(1))
    x = torch.randn(3)
    expected = m(x)
    assert len(calls) == 1
    torch.testing.assert_close(ember.compile(m, backend="eager")(x), expected)
    assert len(calls) == 2


def test_custom_call_through_a_graph_break():
    class Breaking(Scaled):
        def forward(self, x):
            print("", end="")            # a graph break inside the inlined call
            return x * self.k
    m = Outer(Breaking())
    x = torch.randn(3)
    torch.testing.assert_close(ember.compile(m, backend="eager")(x), m(x))


def test_overridden_call_impl_hooks_run_once():
    m = ScaledImpl()
    calls = []
    m.register_forward_hook(lambda mod, args, out: calls.append(1) or out + 10)
    x = torch.randn(2, 3)
    expected = m(x)
    torch.testing.assert_close(ember.compile(m, backend="eager")(x), expected)
    torch.testing.assert_close(ember.compile(Outer(m), backend="eager")(x), expected + 1)
    assert len(calls) == 3


def test_call_impl_set_on_instance_after_compiling():
    m = torch.nn.Linear(3, 3)
    outer = Outer(m)
    compiled = ember.compile(outer, backend="eager")
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x), outer(x))
    m._call_impl = lambda *args, **kwargs: args[0] * 7
    torch.testing.assert_close(compiled(x), outer(x))


class Containers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.extra = torch.nn.ModuleList()
        self.named = torch.nn.ModuleDict({"a": torch.nn.Identity()})
        self.params = torch.nn.ParameterDict({"p": torch.nn.Parameter(torch.ones(3))})

    def forward(self, x):
        if self.extra:
            x = x + 1
        x = x * (len(self.extra) + len(self.named) + len(self.params) + 1)
        if "b" in self.named:
            x = x - 3
        for key in self.params:
            x = x + self.params[key]
        return x


@pytest.mark.parametrize("change", [
    lambda m: m.extra.append(torch.nn.Identity()),
    lambda m: m.named.update({"b": torch.nn.Identity()}),
    lambda m: m.params.update({"q": torch.nn.Parameter(torch.ones(3) * 5)}),
], ids=["module_list_append", "module_dict_add", "parameter_dict_add"])
def test_container_length_and_keys_after_compiling(change):
    m = Containers()
    x = torch.randn(3)
    compiled = ember.compile(m, backend="eager")
    torch.testing.assert_close(compiled(x), m(x))
    change(m)
    torch.testing.assert_close(compiled(x), m(x))
