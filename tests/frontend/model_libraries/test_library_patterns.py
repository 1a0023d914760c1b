"""Patterns seen in widely used model libraries (torchvision, transformers, timm): each is
captured in one graph and computes what eager computes; the context managers of autocast and
inference mode stay inside the graph."""
import functools
import operator

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode, is_in_torch_dispatch_mode

import ember
from conformance_util import _seed_rng, check  # noqa: F401
from ember.testing import CompileCounter, same


def lp_log_api_usage(x):
    torch._C._log_api_usage_once("ember.test")
    return x + 1


@functools.lru_cache
def _table(n):
    return tuple(range(n))


def lp_lru_cache(x):
    return x * len(_table(4)) + _table(3)[-1]


def lp_mode_queries(x):
    if _get_current_dispatch_mode() is None and not is_in_torch_dispatch_mode():
        x = x + 1
    if torch._C._len_torch_function_stack() == 0:
        x = x * 2
    return x


class DeviceCache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = torch.ones(3)
        return x + self.cache[key]


def _hw(x):
    h, w = x.shape[-2:]
    return h * w


def lp_shape_unpack_in_helper(x):
    return x * _hw(x)


def lp_min_max(x, d):
    a = max(3, 4, 2) + min([5, 1])
    b = max([1, 5, 3], key=lambda v: -v) + len(min(d, key=d.get))
    c = max([], default=7) + max(x.shape, key=lambda s: s % 3)
    return x * (a + b + c), sorted(d, key=lambda k: d[k], reverse=True)


def lp_getters(x):
    first = operator.itemgetter(1)((x, x + 1))
    shape = operator.attrgetter("shape")(x)
    both = operator.itemgetter(0, 2)([x, 1, 2])
    return first * shape[0] + both[1]


_SECOND = operator.itemgetter(1)


def lp_global_getter(x):
    return _SECOND((x, x * 3))


def lp_one_hot(labels, x):
    return F.one_hot(labels, 5).float() * x


def lp_class_statement(x):
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

        def total(self):
            return self.a + self.b
    return Pair(x, x * 2).total()


def lp_requires_grad_assignment(x, w):
    y = x[:, None]            # wav2vec2's feature encoder, for gradient checkpointing
    y.requires_grad = True
    return (y * w).sum(), y.requires_grad


def lp_requires_grad_of_a_non_leaf(x, w):
    y = x * w
    y.requires_grad = False    # eager raises: only leaves' flags change
    return y


@torch.jit.script
def _relative_position(query_size: int, key_size: int, device: torch.device):
    q_ids = torch.arange(query_size, dtype=torch.long, device=device)
    k_ids = torch.arange(key_size, dtype=torch.long, device=device)
    return q_ids[:, None] - k_ids[None, :]


@torch.jit.script
def _scaled_size_sqrt(x: torch.Tensor, scale_factor: int):
    return torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * scale_factor)


def lp_jit_script_functions(x):
    # transformers' DeBERTa-v2 (some versions): relative positions and the attention scale
    # are torch.jit.script functions; capture inlines the Python they were compiled from
    rel = _relative_position(x.shape[0], x.shape[1], x.device)
    return x * rel / _scaled_size_sqrt(x, 2)


@pytest.mark.parametrize("fn, inputs", [
    (lp_jit_script_functions, (torch.randn(5, 6),)),
    (lp_requires_grad_assignment, (torch.randn(4, 3), torch.randn(3, requires_grad=True))),
    (lp_log_api_usage, (torch.randn(3),)),
    (lp_lru_cache, (torch.randn(3),)),
    (lp_mode_queries, (torch.randn(3),)),
    (lp_shape_unpack_in_helper, (torch.randn(2, 3, 4),)),
    (lp_min_max, (torch.randn(2, 4), {"a": 3, "b": 1, "c": 2})),
    (lp_getters, (torch.randn(3),)),
    (lp_global_getter, (torch.randn(3),)),
    (lp_one_hot, (torch.tensor([1, 2, 0]), torch.randn(3, 5))),
    (lp_class_statement, (torch.randn(3),)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_pattern_compiles_in_one_graph(fn, inputs):
    check(fn, inputs, graphs=1)


def test_requires_grad_assignment_gives_eager_gradients_through_the_ember_backend():
    x, w = torch.randn(4, 3), torch.randn(3)
    w1, w2 = w.clone().requires_grad_(), w.clone().requires_grad_()
    ember.reset()
    out, flag = ember.compile(lp_requires_grad_assignment, backend="ember")(x, w1)
    expected, eager_flag = lp_requires_grad_assignment(x, w2)
    out.backward()
    expected.backward()
    assert same(expected, out) and flag is eager_flag is True
    assert same(w2.grad, w1.grad)


def test_requires_grad_of_a_non_leaf_raises_as_in_eager():
    check(lp_requires_grad_of_a_non_leaf, (torch.randn(3), torch.randn(3, requires_grad=True)),
          graphs=None, raises=RuntimeError)


def test_per_device_cache_filled_on_first_use():
    module = DeviceCache()
    cnt = CompileCounter()
    compiled = ember.compile(module, backend=cnt)
    eager = DeviceCache()
    x = torch.randn(3)
    for _ in range(3):
        assert same(compiled(x), eager(x))
    assert list(module.cache) == ["cpu"] and same(module.cache["cpu"], torch.ones(3))
    # first call: fills the cache (and keeps its tensor); later calls: the filled cache
    assert cnt.frame_count == 2


def test_one_hot_still_raises_on_a_bad_class():
    compiled = ember.compile(lp_one_hot, backend=CompileCounter())
    compiled(torch.tensor([1, 2, 0]), torch.randn(3, 5))
    with pytest.raises(RuntimeError):
        compiled(torch.tensor([1, 9, 0]), torch.randn(3, 5))


class Hooked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(3, 3)
        self.inner.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
        self.inner.register_forward_hook(lambda mod, args, out: out * 2)
        self.inner.register_forward_hook(lambda mod, args, kwargs, out: out - args[0],
                                         with_kwargs=True)
        self.inner.register_forward_hook(lambda mod, args, out: None)

    def forward(self, x):
        return self.inner(x).relu()


def test_forward_hooks_on_a_submodule_are_traced():
    check(Hooked(), (torch.randn(2, 3),), module=True, graphs=1)


def test_a_hook_added_later_recompiles():
    module = Hooked()
    cnt = CompileCounter()
    compiled = ember.compile(module, backend=cnt)
    x = torch.randn(2, 3)
    assert same(compiled(x), module(x))
    handle = module.inner.register_forward_hook(lambda mod, args, out: out + 100)
    assert same(compiled(x), module(x))
    handle.remove()
    assert same(compiled(x), module(x))
    assert cnt.frame_count == 2


# -- context managers inside the graph ---------------------------------------------------------

def lp_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        z = y.relu()
    return z, (z.float() + 1).dtype, y.dtype


def lp_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
    return y + 1, y.is_inference()


def lp_grad_modes(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
    return a + b, a.requires_grad, b.requires_grad


@pytest.mark.parametrize("fn, inputs", [
    (lp_autocast, (torch.randn(4, 4), torch.randn(4, 4))),
    (lp_inference_mode, (torch.randn(4),)),
    (lp_grad_modes, (torch.randn(3, requires_grad=True),)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_context_manager_stays_in_the_graph(fn, inputs):
    check(fn, inputs, graphs=1, rtol=1e-2, atol=1e-2)
    assert not torch.is_autocast_enabled("cpu") and not torch.is_inference_mode_enabled()


def test_autocast_through_the_ember_backend():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    want = lp_autocast(x, w)
    got = ember.compile(lp_autocast, backend="ember")(x, w)
    assert got[0].dtype == want[0].dtype == torch.bfloat16
    assert same(got[0].float(), want[0].float(), rtol=1e-2, atol=1e-2)


def test_capture_failing_inside_autocast_leaves_no_state_behind():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            try:
                y = y + len(str(y.sum().item()))
            finally:
                pass
        return y
    x = torch.randn(4, 4)
    assert same(ember.compile(f, backend=CompileCounter())(x), f(x))
    assert not torch.is_autocast_enabled("cpu")
