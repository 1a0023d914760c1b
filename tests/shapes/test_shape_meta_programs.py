"""Meta-tensor programs over symbolic sizes: run once with SymInt sizes on the meta device,
their result shapes (and strides) are expressions that give eager's shapes at other sizes
for which the recorded guards hold; sizes that break a guard are named by the checker."""
import pytest
import sympy
import torch
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher

from ember.shapes import ShapeEnv


def symbolic_run(fn, hint_shapes, **env_options):
    """``fn`` on meta tensors whose dims are symbols (sources ``(arg, dim)``)."""
    env = ShapeEnv(**env_options)
    args = [torch.empty(env.create_sizes(shape, [(i, d) for d in range(len(shape))]),
                        device="meta") for i, shape in enumerate(hint_shapes)]
    with enable_python_dispatcher():
        out = fn(*args)
    return env, out


def concrete(value, env, sizes):
    if isinstance(value, int):
        return value
    expr = value.node.expr
    values = {s: sizes[env.source_of(s)] for s in expr.free_symbols}
    return int(expr.xreplace({s: sympy.Integer(v) for s, v in values.items()}))


def source_sizes(shapes):
    return {(i, d): n for i, shape in enumerate(shapes) for d, n in enumerate(shape)}


def check_program(fn, hint_shapes, other_shapes, strides=True, failing=()):
    env, out = symbolic_run(fn, hint_shapes)
    outs = out if isinstance(out, (tuple, list)) else [out]
    for shapes in [hint_shapes, *other_shapes]:
        sizes = source_sizes(shapes)
        assert env.first_failing_guard(sizes) is None, (shapes, env.format_guards())
        eager = fn(*[torch.randn(shape) for shape in shapes])
        eagers = eager if isinstance(eager, (tuple, list)) else [eager]
        assert len(eagers) == len(outs)
        for sym, real in zip(outs, eagers):
            assert [concrete(n, env, sizes) for n in sym.shape] == list(real.shape), shapes
            if strides:
                assert [concrete(n, env, sizes) for n in sym.stride()] == \
                    list(real.stride()), shapes
    for shapes in failing:
        assert env.first_failing_guard(source_sizes(shapes)) is not None, shapes
    return env


PROGRAMS = {
    "view(-1)": (lambda x: x.view(-1), [(6, 5)], [[(3, 7)], [(2, 2)]]),
    "reshape(s1, -1)": (lambda x: x.reshape(x.shape[1], -1), [(6, 5)], [[(9, 4)]]),
    "reshape(-1, s0 * s1)": (lambda x: x.reshape(-1, x.shape[1] * x.shape[2]),
                             [(3, 4, 5)], [[(2, 7, 3)]]),
    "flatten, unsqueeze, expand": (
        lambda x: x.flatten(1).unsqueeze(0).expand(3, -1, -1), [(4, 3, 5)], [[(2, 6, 7)]]),
    "cat dim 0": (lambda x, y: torch.cat([x, y]), [(4, 3), (6, 3)], [[(2, 9), (8, 9)]]),
    "cat dim 1": (lambda x, y: torch.cat([x, y, x], 1), [(4, 3), (4, 5)],
                  [[(2, 7), (2, 9)]]),
    "matmul": (lambda a, b: a @ b, [(4, 3), (3, 5)], [[(7, 2), (2, 9)], [(2, 6), (6, 8)]]),
    "batched matmul": (lambda a, b: torch.matmul(a, b), [(2, 4, 3), (3, 5)],
                       [[(6, 7, 9), (9, 2)]]),
    "linear": (lambda x, w: F.linear(x, w), [(4, 3), (5, 3)], [[(7, 2), (9, 2)]]),
    "broadcasting": (lambda x, y: x * y + 1, [(4, 1), (1, 3)], [[(7, 1), (1, 9)]]),
    "broadcasting, equal dims": (lambda x, y: x - y, [(4, 3), (3,)], [[(7, 9), (9,)]]),
    # distinct hints but where sizes must be equal: duck sizing would tie them otherwise
    "conv2d": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), [(2, 3, 9, 8), (4, 3, 5, 5)],
               [[(3, 6, 16, 7), (2, 6, 3, 3)], [(2, 2, 5, 6), (3, 2, 2, 2)]]),
    "arange(s)": (lambda x: torch.arange(x.shape[0], device=x.device) * 2, [(5,)],
                  [[(2,)], [(11,)]]),
    "x[:, :s // 2]": (lambda x: x[:, :x.shape[1] // 2], [(3, 8)], [[(5, 4)], [(2, 11)]]),
    "x[1:, ::2]": (lambda x: x[1:, ::2], [(4, 7)], [[(2, 2)], [(9, 10)]]),
    "sum and mean": (lambda x: (x.sum(1), x.mean((0, 2), keepdim=True)), [(3, 4, 5)],
                     [[(6, 2, 7)]]),
    "permute, transpose, contiguous": (
        lambda x: x.permute(2, 0, 1).contiguous().transpose(0, 1), [(3, 4, 5)],
        [[(6, 2, 7)]]),
    "layer_norm, softmax": (lambda x: F.softmax(F.layer_norm(x, x.shape[-1:]), -1),
                            [(3, 4, 5)], [[(6, 2, 7)]]),
    "interpolate (float sizes)": (lambda x: F.interpolate(x, scale_factor=1.5), [(2, 3, 5, 6)],
                                  [[(3, 4, 7, 9)]]),
    "max_pool2d, avg_pool2d ceil_mode": (
        lambda x: (F.max_pool2d(x, 2), F.avg_pool2d(x, 3, stride=2, ceil_mode=True)),
        [(2, 3, 7, 9)], [[(3, 4, 11, 12)]]),
    "conv1d, dilation": (lambda x, w: F.conv1d(x, w, padding=2, dilation=2),
                         [(2, 3, 9), (4, 3, 5)], [[(3, 6, 16), (2, 6, 5)]]),
    "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                  [(2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4)],
                  [[(3, 2, 6, 4), (3, 2, 9, 4), (3, 2, 9, 4)]]),
    "batch_norm, chunk": (lambda x: F.batch_norm(x, None, None, training=True).chunk(2, 1),
                          [(4, 6, 5)], [[(2, 8, 7)]]),
    "new tensor from sizes": (lambda x: torch.zeros(x.shape[0] * 2, x.shape[1] + 1,
                                                    device=x.device), [(3, 4)], [[(8, 2)]]),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_symbolic_shapes_give_eager_shapes_at_other_sizes(name):
    fn, hints, others = PROGRAMS[name]
    check_program(fn, hints, others)


def test_a_program_is_traced_once_and_serves_every_size_its_guards_admit():
    # the size of a split depends on the number of chunks: guarded, so a size giving
    # another chunk count fails the checker instead of getting a wrong shape
    env = check_program(lambda x: torch.split(x, 4)[-1], [(10,)], [[(11,)], [(12,)]],
                        failing=[[(13,)], [(7,)]])
    assert env.guards


def test_branching_on_a_size_guards_the_branch_taken():
    def fn(x):
        return x[:16] if x.shape[0] > 16 else x * 2
    env = check_program(fn, [(20,)], [[(17,)], [(40,)]], failing=[[(16,)], [(3,)]])
    assert "(0, 0) > 16" in env.guards_as_python()


def test_sizes_one_are_specialised_and_broadcast_as_eager():
    env = check_program(lambda x, y: x + y, [(1, 4), (3, 1)], [[(1, 7), (5, 1)]],
                        failing=[[(2, 4), (3, 1)]])
    assert "(0, 0) == 1" in env.guards_as_python()


def test_matmul_with_mismatched_sizes_raises_like_eager():
    env, _ = symbolic_run(lambda a, b: a, [(4, 3), (5, 6)])
    a = torch.empty(env.create_sizes([4, 3], ["a0", "a1"]), device="meta")
    b = torch.empty(env.create_sizes([5, 6], ["b0", "b1"]), device="meta")
    with enable_python_dispatcher(), pytest.raises(RuntimeError, match="same reduction dim"):
        a @ b
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.randn(4, 3) @ torch.randn(5, 6)


def test_channels_last_strides():
    env, out = symbolic_run(lambda x: x.contiguous(memory_format=torch.channels_last),
                            [(2, 3, 5, 6)])
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert not out.is_contiguous()
    sizes = source_sizes([(4, 7, 3, 9)])
    real = torch.randn(4, 7, 3, 9).contiguous(memory_format=torch.channels_last)
    assert env.first_failing_guard(sizes) is None
    assert [concrete(n, env, sizes) for n in out.stride()] == list(real.stride())


LAYOUTS = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.transpose(1, 2),
    "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
    "sliced": lambda x: x[:, :, 1:],
    "every other": lambda x: x[:, ::2],
    "expanded": lambda x: x[:, :1].expand(-1, 3, -1, -1),
    "permuted": lambda x: x.permute(3, 1, 0, 2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_geometry_questions_of_the_node_answer_as_eager(layout):
    # what c10 may ask a node about a tensor's sizes and strides, asked directly
    from torch._prims_common import (are_strides_like_channels_last_or_false,
                                     is_non_overlapping_and_dense_or_false)
    env, sym = symbolic_run(LAYOUTS[layout], [(2, 4, 5, 6)])
    node = sym.shape[0].node
    sizes, strides = list(sym.shape), list(sym.stride())
    for shape in [(2, 4, 5, 6), (3, 6, 7, 2)]:
        real = LAYOUTS[layout](torch.empty(shape))
        assert env.first_failing_guard(source_sizes([shape])) is None

        def answer(method):
            value = getattr(node, method)(sizes, strides).expr
            return bool(value.xreplace({s: source_sizes([shape])[env.source_of(s)]
                                        for s in value.free_symbols}))
        assert answer("is_contiguous") == real.is_contiguous()
        assert answer("is_channels_last_contiguous_2d") == \
            real.is_contiguous(memory_format=torch.channels_last)
        assert answer("is_non_overlapping_and_dense") == \
            is_non_overlapping_and_dense_or_false(real)
        assert answer("is_channels_last_strides_2d") == \
            are_strides_like_channels_last_or_false(real.shape, real.stride())
