"""Conformance: type information evaluated at capture.

``np.finfo``/``np.iinfo``/``torch.finfo``/``torch.iinfo`` attributes are constants (NumPy's
are NumPy scalars, which the graph must make as eager has them). Typing subscriptions
(``List[Tensor]``: typing's ``__getitem__`` calls ``sys._getframe``), ``typing.cast``,
``torch.jit.annotate`` and ``torch.jit.isinstance`` are constants too: one graph each.
A tensor's ``untyped_storage()`` answers its size as a guarded constant and breaks the graph
at other uses, never running the whole frame eagerly.
"""
import collections
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import pytest
import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)
from ember.testing import CompileCounter


def t_numpy_finfo(x):
    lo = np.finfo(np.float32).min
    return (x.clamp(min=lo) + np.finfo(np.float32).eps, x * np.finfo(np.float16).max,
            x + np.finfo(np.float64).tiny, lo, np.finfo(np.float32).eps)


def t_numpy_iinfo(x, i):
    return (i + np.iinfo(np.int8).max, x * np.iinfo(np.int16).min, i.clamp(max=np.iinfo(
        np.int32).max), int(np.iinfo(np.int64).max))


def t_torch_finfo(x):
    return (x.clamp(torch.finfo(torch.float16).min, torch.finfo(torch.float16).max),
            x + torch.finfo(x.dtype).eps, x * torch.finfo(torch.bfloat16).tiny,
            torch.iinfo(torch.int32).max - x)


def t_numpy_scalar_kinds(x, i):
    # a NumPy scalar is not the Python number: torch.tensor keeps float64, np.bool_ promotes
    return (torch.tensor(np.float64(1.5)) + x, i + np.bool_(True), x * np.float32(0.25),
            torch.full((2,), np.int64(3)), x + np.float16(2.0), i * np.uint8(3))


def t_numpy_scalar_in_containers(x):
    return torch.cat([x, x]) * np.float32(2.0), x.new_full((2,), np.float64(0.5)), \
        x.reshape(np.int64(3), 1)


TYPE_INFO = [
    (t_numpy_finfo, lambda: (torch.randn(3),)),
    (t_numpy_iinfo, lambda: (torch.randn(3), torch.randint(-5, 5, (3,), dtype=torch.int32))),
    (t_torch_finfo, lambda: (torch.randn(3),)),
    (t_numpy_scalar_kinds, lambda: (torch.randn(3),
                                    torch.randint(-5, 5, (3,), dtype=torch.int32))),
    (t_numpy_scalar_in_containers, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make", TYPE_INFO, ids=[f.__name__ for f, _ in TYPE_INFO])
def test_type_info(fn, make):
    check(fn, make())


# ----------------------------------------------------------------------------- typing

def t_jit_annotate_list(x):
    outs = torch.jit.annotate(List[torch.Tensor], [])
    for i in range(3):
        outs.append(x * i)
    d = torch.jit.annotate(Dict[str, torch.Tensor], {})
    d["a"] = x + 1
    return torch.cat(outs) + 1, d


T = typing.TypeVar("T")
Mapping = Dict[str, T]      # a generic alias with a parameter left to fill


def t_typing_subscriptions(x):
    types_ = (List[int], Dict[str, torch.Tensor], Optional[torch.Tensor], Tuple[int, ...],
              Tuple[torch.Tensor, Optional[List[int]]], Union[int, float, None],
              Callable[[int], torch.Tensor], list[int], dict[str, List[int]],
              collections.OrderedDict[str, int], typing.Sequence[torch.Tensor],
              Optional["torch.Tensor"], typing.Literal["a", "b"], tuple[int, int],
              Mapping[torch.Tensor], List[T])
    return x * 2, types_, Optional[torch.Tensor] == Union[torch.Tensor, None]


def t_typing_cast(x, y):
    x = x * 2     # an op before each type expression: a break there would make two graphs
    a = typing.cast(Optional[torch.Tensor], x)
    b = typing.cast(List[torch.Tensor], [x, y])
    c = typing.cast("torch.Tensor", y)
    return a + b[1] * c, typing.get_origin(List[int]), typing.get_args(Dict[str, int])


def t_jit_isinstance(x, y):
    x = x * 2
    pair = (x, y)
    items = [x, y]
    d = {"k": x}
    flags = (torch.jit.isinstance(items, List[torch.Tensor]),
             torch.jit.isinstance(items, List[int]),
             torch.jit.isinstance(pair, Tuple[torch.Tensor, torch.Tensor]),
             torch.jit.isinstance(pair, Tuple[torch.Tensor, int]),
             torch.jit.isinstance(d, Dict[str, torch.Tensor]),
             torch.jit.isinstance(d, Dict[int, torch.Tensor]),
             torch.jit.isinstance(None, Optional[torch.Tensor]),
             torch.jit.isinstance(x, torch.Tensor), torch.jit.isinstance(3, int))
    if torch.jit.isinstance(items, List[torch.Tensor]):
        return x + y, flags
    return x - y, flags


class TypedBlock(torch.nn.Module):
    """The torchvision pattern: annotated lists of branch outputs."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def _branches(self, x: torch.Tensor) -> List[torch.Tensor]:
        outputs = torch.jit.annotate(List[torch.Tensor], [])
        outputs.append(self.a(x))
        outputs.append(self.b(x))
        return outputs

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        outs = self._branches(x)
        aux: Optional[torch.Tensor] = typing.cast(Optional[torch.Tensor], None)
        feats = torch.jit.annotate(Dict[str, Any], {"x": torch.cat(outs, 1)})
        return feats["x"].relu(), aux


TYPING = [
    (t_jit_annotate_list, lambda: (torch.randn(3),)),
    (t_typing_subscriptions, lambda: (torch.randn(3),)),
    (t_typing_cast, lambda: (torch.randn(3), torch.randn(3))),
    (t_jit_isinstance, lambda: (torch.randn(3), torch.randn(3))),
]


@pytest.mark.parametrize("fn,make", TYPING, ids=[f.__name__ for f, _ in TYPING])
def test_typing(fn, make):
    check(fn, make(), graphs=1)


def test_typing_module_one_graph():
    check(TypedBlock(), (torch.randn(2, 4),), module=True, graphs=1)


# ----------------------------------------------------------------------------- storages

def s_storage_size_queries(x):
    y = x * 2
    s = x.untyped_storage()
    return y + s.nbytes() + s.size() + len(s), s.element_size(), s.device, bool(s)


def s_storage_identity(x):
    y = x + 1
    same = x.untyped_storage() is x.untyped_storage()
    s = x.untyped_storage()
    return y * 2, same, s is s, s is not None, s is x.untyped_storage()


def s_storage_of_a_view(x):
    y = x * 2
    shared = x[1:].untyped_storage() is x.untyped_storage()   # decided in Python
    return y + 1, shared


def s_storage_data_ptr(x):
    y = x * 2
    s = x.untyped_storage()
    at_start = s.data_ptr() == x.data_ptr()     # addresses: decided in Python
    return y + s.nbytes(), at_start, s.nbytes()


def s_storage_of_intermediate(x):
    y = x * 2
    n = y.untyped_storage().nbytes()            # the backend's allocation: in Python
    return y + n


STORAGES = [
    # (program, inputs, graphs over both input sets)
    (s_storage_size_queries, lambda: (torch.randn(4),), 1),
    (s_storage_identity, lambda: (torch.randn(4),), 1),
    (s_storage_of_a_view, lambda: (torch.randn(4),), 2),
    (s_storage_data_ptr, lambda: (torch.randn(4),), None),
    (s_storage_of_intermediate, lambda: (torch.randn(4),), 2),
]


@pytest.mark.parametrize("fn,make,graphs", STORAGES, ids=[f.__name__ for f, _, _ in STORAGES])
def test_untyped_storage(fn, make, graphs):
    from ember.frontend import graph_break
    eager_frames = []
    with graph_break.observe(lambda kind, reason: eager_frames.append(reason) if (
            kind == "break" and reason.frame_ran_eagerly) else None):
        check(fn, make(), graphs=graphs)
    assert not eager_frames, f"a frame ran eagerly: {eager_frames[0]}"


def s_storage_size_guarded(x):
    return x * 2, x.untyped_storage().nbytes()


def test_untyped_storage_size_is_guarded():
    # same shape and strides, a larger storage: the guard on its size recompiles
    cnt = CompileCounter()
    fn = ember.compile(s_storage_size_guarded, backend=cnt)
    for x in (torch.randn(4), torch.randn(8)[2:6], torch.randn(4)):
        out, n = fn(x)
        assert n == x.untyped_storage().nbytes() and torch.equal(out, x * 2)
    assert cnt.frame_count == 2
