"""Views of values Ember realized in a layout of its own, with symbolic sizes (GPT-2's
position ids on CUDA crashed here: an expanded ``arange`` sliced ``[:, :1]``, the slice run
by ATen on the dense buffer and its result copied into eager's stride-0 layout)."""
import pytest
import torch

import ember
from ember.backend import compile_stats

pytestmark = pytest.mark.usefixtures("fresh_no_grad", "cpu_backend")


def first_position(ids):
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    return (ids + pos[:, :1]).cumsum(-1)


def positions_from_five(ids):
    # a start the symbolic length cannot be compared with: the slice runs as ATen's view
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    return ids[:, 5:] * pos[:, 5:]


def pairs_of_positions(ids):
    # unfold has no lowering: ATen's view of the dense buffer, never eager's stride-0 layout
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    return ids[:, 1:] + pos.unfold(1, 2, 1).sum(-1)


@pytest.mark.parametrize("fn", [first_position, positions_from_five, pairs_of_positions],
                         ids=lambda f: f.__name__)
def test_views_of_realized_broadcasts_at_every_size(fn, cpu_backend):
    compile_stats.reset()
    compiled = ember.compile(fn, dynamic=True, options={"cpu_backend": cpu_backend})
    for n in (7, 33, 12):
        ids = torch.randint(0, 9, (8, n))
        assert torch.equal(compiled(ids), fn(ids)), n
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


def linear_then_layer_norm(x, h, w, b):
    # a linear of a 3-d input: [B*T, C] from the matmul, its bias added after the view back
    # to [B, T, C]; with symbolic B and T that view must stay an index rewrite, not a
    # kernel that writes the biased product to memory before the norm reads it back
    y = torch.nn.functional.linear(x, w, b) + h
    return torch.nn.functional.layer_norm(y, (y.shape[-1],))


def test_split_view_of_symbolic_sizes_fuses_as_static(cpu_backend):
    w, b = torch.randn(16, 16), torch.randn(16)
    kernels = {}
    for dynamic in (False, True):
        ember.reset()
        compile_stats.reset()
        compiled = ember.compile(linear_then_layer_norm, dynamic=dynamic,
                                 options={"cpu_backend": cpu_backend})
        for n in ((5, 3), (2, 9), (4, 4)) if dynamic else ((5, 3),):
            x, h = torch.randn(*n, 16), torch.randn(*n, 16)
            torch.testing.assert_close(compiled(x, h, w, b), linear_then_layer_norm(x, h, w, b))
        kernels[dynamic] = compile_stats.generated_kernel_count
    assert compile_stats.symbolic_compiles == 1
    assert kernels[True] == kernels[False] == 1
