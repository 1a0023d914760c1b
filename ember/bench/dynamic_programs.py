"""The dynamic-shapes programs of issue 31: small programs whose input sizes vary, as data.

Each :class:`DynamicProgram` is a function (or a seeded ``nn.Module``), the inputs it is
called with at several sizes (seeded, small enough to run in milliseconds on a CPU), the
``dynamic=`` policy to compile it with, optional ``mark_dynamic``/``mark_static`` marks put on
every call's inputs, and ``torch_compiles``: the number of graphs torch.compile hands its
backend over the whole sequence of calls. That number is the bar: a compiler passes a program
when every call's result equals eager's and it compiled no more graphs than torch.compile.

Why here (``ember.bench``) and not under ``tests/``: the benchmark script
(``benchmarks/dynamic_shapes.py``) and the tests both read the table, and ``ember.bench`` is
the package that measures Ember against torch.compile (DESIGN.md §4 lets it name it); the
table ships with Ember, so ``ember bench`` can run it later. This module only holds data: it
compiles nothing and imports neither Ember's compiler nor torch's.

How ``torch_compiles`` was measured (torch 2.13, CPU, in this environment): for each program,
``torch._dynamo.reset()``, then ``torch.compile(fn, backend=CompileCounter(), dynamic=policy)``
with ``torch._dynamo.testing.CompileCounter`` (it counts backend calls: one per graph, so a
graph break counts each graph), marks applied with ``torch._dynamo.mark_dynamic`` /
``mark_static`` to each call's inputs, every input tuple called in order, and
``frame_count`` read at the end; ``python benchmarks/dynamic_shapes.py --modes torch``
re-measures them and flags any program whose count differs from the table.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

CATEGORIES = ("pointwise", "reduction", "view", "cat_split", "slicing", "matmul", "attention",
              "conv", "embedding", "size_arith", "control_flow", "size_0_1", "dims",
              "model", "policy")


@dataclasses.dataclass(frozen=True)
class Mark:
    """``mark_dynamic(arg, dim, min=, max=)`` or ``mark_static(arg, dim)`` on the tensor that
    is positional argument ``arg``, applied before every call."""
    arg: int
    dim: int
    kind: str   # "dynamic" or "static"
    min: int | None = None
    max: int | None = None


@dataclasses.dataclass(frozen=True)
class DynamicProgram:
    name: str
    category: str
    make: Callable[[], Callable]                      # a fresh function or module
    build_inputs: Callable[[torch.Generator], list]   # one tuple of arguments per call
    torch_compiles: int
    dynamic: bool | None = None
    marks: tuple[Mark, ...] = ()
    rtol: float = 1e-4
    atol: float = 1e-5

    def inputs(self) -> list[tuple]:
        """The argument tuples, the same on every call (seeded by the program's name)."""
        gen = torch.Generator().manual_seed(zlib.crc32(self.name.encode()))
        return [tuple(args) for args in self.build_inputs(gen)]

    @property
    def needs(self) -> tuple[str, ...]:
        """The compiler APIs this program calls besides ``compile``: ``mark_dynamic`` etc."""
        return tuple(sorted({f"mark_{m.kind}" for m in self.marks}))


PROGRAMS: list[DynamicProgram] = []


def program(category: str, inputs: Callable, torch_compiles: int, *, dynamic=None,
            marks: tuple[Mark, ...] = (), module: bool = False, **tolerances):
    """Register the decorated function (or, with ``module=True``, the module factory)."""
    assert category in CATEGORIES, category

    def register(fn):
        make = fn if module else (lambda: fn)
        PROGRAMS.append(DynamicProgram(fn.__name__, category, make, inputs, torch_compiles,
                                       dynamic, marks, **tolerances))
        return fn
    return register


def by_name(names) -> list[DynamicProgram]:
    """The programs named (or whose category is named) in ``names``, in table order."""
    wanted = set(names)
    unknown = wanted - {p.name for p in PROGRAMS} - set(CATEGORIES)
    if unknown:
        raise KeyError(f"no dynamic program or category named {sorted(unknown)}")
    return [p for p in PROGRAMS if p.name in wanted or p.category in wanted]


def R(gen, *shape):
    # drawn on the CPU generator's device, then moved where tensors go by default (the
    # tracker's --device cuda): the same values on every device
    return torch.randn(shape, generator=gen, device="cpu").to(torch.get_default_device())


def I(gen, high, *shape):
    return torch.randint(0, high, shape, generator=gen, device="cpu").to(
        torch.get_default_device())


def rows(*ns, cols=8):
    """Inputs ``(x,)`` with ``x`` of shape ``(n, cols)`` for each ``n``."""
    return lambda g: [(R(g, n, cols),) for n in ns]


def shapes(*shape_list):
    """Inputs ``(x,)`` with ``x`` of each shape given."""
    return lambda g: [(R(g, *s),) for s in shape_list]


def pairs(*shape_pairs):
    """Inputs ``(x, y)`` for each pair of shapes."""
    return lambda g: [(R(g, *a), R(g, *b)) for a, b in shape_pairs]


# ---------------------------------------------------------------- pointwise
@program("pointwise", rows(3, 5, 7, 9, 16, 3), 2)
def pw_scale_shift(x):
    return x * 2 + 1


@program("pointwise", shapes((3, 4), (5, 6), (7, 9), (4, 11), (12, 2)), 2)
def pw_activation_chain(x):
    return torch.relu(x).sigmoid() * x.tanh()


@program("pointwise", lambda g: [(R(g, n, 8), R(g, 8)) for n in (2, 6, 10, 3, 17)], 2)
def pw_bias_broadcast(x, b):
    return x + b


@program("pointwise", pairs(((3, 5), (3, 5)), ((6, 5), (6, 5)), ((9, 7), (9, 7)),
                            ((4, 7), (4, 7)), ((12, 3), (12, 3))), 3)
def pw_where(x, y):
    return torch.where(x > 0, x, y * 0.5)


@program("pointwise", lambda g: [(R(g, n), I(g, 5, n)) for n in (4, 7, 12, 20, 33)], 2)
def pw_int_mix(x, i):
    return (x * 3).to(torch.int32) + i


@program("pointwise", pairs(((2, 3, 4), (2, 3, 4)), ((3, 5, 4), (3, 5, 4)),
                            ((4, 2, 6), (4, 2, 6)), ((5, 5, 5), (5, 5, 5)),
                            ((2, 3, 4), (2, 3, 4))), 3)
def pw_clamp_compare(x, y):
    return x.clamp(-0.5, 0.5), x > y


# ---------------------------------------------------------------- reductions
@program("reduction", shapes((3, 4), (6, 5), (8, 9), (2, 16), (10, 3)), 2)
def red_sum_all(x):
    return x.sum()


@program("reduction", shapes((3, 4), (6, 5), (8, 9), (2, 16), (10, 3)), 2)
def red_sum_dim(x):
    return x.sum(1)


@program("reduction", shapes((4, 6), (5, 10), (7, 3), (9, 9), (4, 6)), 2)
def red_center(x):
    return x - x.mean(-1, keepdim=True)


@program("reduction", shapes((4, 6), (5, 10), (7, 3), (9, 9), (4, 6)), 2)
def red_max_argmax(x):
    values, idx = x.max(0)
    return values, idx, x.argmax(1)


@program("reduction", shapes((3, 5), (3, 9), (3, 17), (3, 33), (3, 64)), 2)
def red_softmax_length(x):
    return torch.log_softmax(x, dim=-1)


@program("reduction", shapes((2, 5), (4, 9), (3, 12), (6, 20), (2, 5)), 2)
def red_cumsum(x):
    return x.cumsum(1)


@program("reduction", shapes((2, 3, 8), (4, 5, 8), (3, 7, 8), (5, 2, 8), (2, 9, 8)), 2)
def red_layer_norm(x):
    return F.layer_norm(x, x.shape[-1:])


# ---------------------------------------------------------------- views
@program("view", shapes((2, 3), (4, 5), (6, 7), (3, 11), (8, 2)), 2)
def view_flatten(x):
    return x.view(-1) * 2


@program("view", shapes((2, 3, 4), (3, 5, 4), (5, 2, 6), (4, 4, 4), (2, 6, 3)), 3)
def view_reshape_by_size(x):
    return x.reshape(x.size(0), -1) + 1


@program("view", shapes((3, 4), (5, 6), (7, 2), (9, 5), (2, 8)), 2)
def view_transpose_contiguous(x):
    return x.t().contiguous() + 1


@program("view", shapes((2, 3, 4), (3, 5, 6), (4, 2, 5), (5, 4, 3), (2, 3, 4)), 2)
def view_permute(x):
    return x.permute(2, 0, 1) * 2


@program("view", rows(3, 5, 8, 13, 2, cols=4), 2)
def view_unsqueeze_expand(x):
    return x.unsqueeze(1).expand(-1, 3, -1) + x.unsqueeze(1)


@program("view", shapes((2, 3, 8), (2, 5, 8), (3, 7, 8), (5, 2, 8), (2, 9, 8)), 3)
def view_split_heads(x):
    b, s, _ = x.shape
    return x.view(b, s, 2, 4).transpose(1, 2).contiguous()


# ---------------------------------------------------------------- cat / split
@program("cat_split", pairs(((3, 4), (5, 4)), ((6, 4), (2, 4)), ((4, 4), (7, 4)),
                            ((9, 4), (3, 4)), ((2, 4), (11, 4))), 2)
def cat_independent(x, y):
    return torch.cat([x, y])


@program("cat_split", shapes((3, 4), (5, 6), (2, 9), (7, 3), (4, 12)), 2)
def cat_self_dim1(x):
    return torch.cat([x, x * 2], 1)


@program("cat_split", shapes((3, 4), (5, 6), (2, 10), (7, 4), (4, 12)), 2)
def chunk_two(x):
    a, b = x.chunk(2, dim=1)
    return a * b


@program("cat_split", rows(3, 5, 8, 13, 2, cols=4), 3)
def split_first_rest(x):
    first, rest = torch.split(x, [1, x.size(0) - 1])
    return rest - first


@program("cat_split", pairs(((3, 4), (3, 4)), ((5, 2), (5, 2)), ((2, 7), (2, 7)),
                            ((6, 6), (6, 6)), ((4, 3), (4, 3))), 2)
def stack_three(x, y):
    return torch.stack([x, y, x + y])


# ---------------------------------------------------------------- slicing by sizes
@program("slicing", rows(4, 6, 10, 16, 7, cols=3), 2)
def slice_half(x):
    return x[: x.size(0) // 2] * 2


@program("slicing", shapes((4, 6), (5, 9), (8, 4), (10, 7), (6, 12)), 2)
def slice_inner_strided(x):
    return x[1:-1, ::2] + 1


@program("slicing", shapes((3, 5), (4, 8), (6, 4), (8, 6), (5, 11)), 2)
def slice_narrow(x):
    return x.narrow(1, 1, x.size(1) - 2).exp()


@program("slicing", shapes((3, 5), (4, 8), (6, 4), (8, 6), (5, 11)), 2)
def slice_last(x):
    return x[:, -1] + x[-1].sum()


@program("slicing", shapes((3, 5), (6, 8), (9, 4), (4, 10), (7, 7)), 2)
def slice_assign(x):
    y = x.clone()
    y[:, : y.size(1) // 2] = 0
    return y


# ---------------------------------------------------------------- matmul
@program("matmul", lambda g: [(R(g, n, 8), R(g, 8, 6)) for n in (3, 5, 9, 17, 4)], 2)
def mm_rows(x, w):
    return x @ w


@program("matmul", pairs(((3, 4), (4, 5)), ((6, 7), (7, 2)), ((5, 3), (3, 9)),
                         ((8, 2), (2, 4)), ((4, 5), (5, 6))), 2)
def mm_all_dims(x, y):
    return torch.mm(x, y)


@program("matmul", pairs(((2, 3, 4), (2, 4, 3)), ((3, 5, 4), (3, 4, 5)),
                         ((4, 6, 4), (4, 4, 6)), ((5, 2, 4), (5, 4, 2)),
                         ((2, 7, 4), (2, 4, 7))), 2)
def bmm_batch_seq(a, b):
    return torch.bmm(a, b)


@program("matmul", lambda g: [(R(g, b, s, 8), R(g, 6, 8), R(g, 6))
                              for b, s in ((2, 3), (3, 5), (4, 7), (5, 2), (2, 11))], 2)
def linear_3d(x, w, b):
    return F.linear(x, w, b)


@program("matmul", lambda g: [(R(g, 6), R(g, n, 4), R(g, 4, 6)) for n in (3, 5, 9, 17, 4)], 2)
def addmm_bias(b, x, w):
    return torch.addmm(b, x, w)


# ---------------------------------------------------------------- attention
def qkv(*seqs, b=2, h=2, d=8):
    return lambda g: [(R(g, b, h, s, d), R(g, b, h, s, d), R(g, b, h, s, d)) for s in seqs]


@program("attention", qkv(3, 5, 9, 16, 33), 2)
def attn_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


@program("attention", qkv(3, 5, 9, 16, 33), 2)
def attn_sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@program("attention", qkv(3, 5, 9, 16, 33), 2)
def attn_manual(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return scores.softmax(-1) @ v


@program("attention", qkv(3, 5, 9, 16, 33), 2)
def attn_causal_mask(q, k, v):
    s = q.size(-2)
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


# ---------------------------------------------------------------- convolution and pooling
def conv_inputs(shapes_, cin=3, cout=4, k=3):
    return lambda g: [(R(g, *s), R(g, cout, cin, k, k)) for s in shapes_]


@program("conv", conv_inputs([(1, 3, 8, 8), (2, 3, 8, 8), (5, 3, 8, 8),
                              (8, 3, 8, 8), (3, 3, 8, 8)]), 2)
def conv2d_batch(x, w):
    return F.conv2d(x, w, padding=1)


@program("conv", conv_inputs([(2, 3, 6, 6), (2, 3, 8, 10), (2, 3, 12, 7),
                              (2, 3, 9, 9), (2, 3, 16, 5)]), 2)
def conv2d_spatial(x, w):
    return F.conv2d(x, w, stride=2)


@program("conv", lambda g: [(R(g, 2, 3, n), R(g, 4, 3, 3)) for n in (8, 13, 20, 32, 9)], 2)
def conv1d_length(x, w):
    return F.conv1d(x, w, padding=1).relu()


@program("conv", shapes((2, 3, 4, 4), (2, 3, 8, 6), (3, 3, 10, 12), (4, 3, 6, 6),
                        (2, 3, 12, 8)), 3)
def max_pool_spatial(x):
    return F.max_pool2d(x, 2)


@program("conv", shapes((2, 3, 4, 4), (2, 3, 7, 6), (3, 3, 9, 12), (4, 3, 5, 5),
                        (2, 3, 11, 3)), 3)
def global_avg_pool(x):
    return F.adaptive_avg_pool2d(x, 1).flatten(1)


# ---------------------------------------------------------------- embedding
def token_inputs(*seqs, vocab=20, dim=8, batch=2):
    return lambda g: [(I(g, vocab, batch, s), R(g, vocab, dim)) for s in seqs]


@program("embedding", token_inputs(3, 7, 12, 16, 5), 2)
def embedding_lookup(ids, w):
    return F.embedding(ids, w)


@program("embedding", lambda g: [(I(g, 20, 2, s), R(g, 20, 8), R(g, 16, 8))
                                 for s in (3, 7, 12, 16, 5)], 2)
def embedding_positions(ids, w, pos):
    return F.embedding(ids, w) + pos[torch.arange(ids.size(1))]


@program("embedding", lambda g: [(I(g, 10, s),) for s in (4, 9, 13, 25, 6)], 2)
def one_hot_length(ids):
    return F.one_hot(ids, num_classes=10).float().sum(0)


# ---------------------------------------------------------------- arithmetic on sizes
@program("size_arith", rows(3, 5, 9, 17, 6, cols=4), 2)
def size_scale(x):
    return x * x.size(0)


@program("size_arith", shapes((2, 3), (4, 6), (3, 9), (7, 5), (5, 12)), 2)
def size_arange(x):
    return x + torch.arange(x.size(1))


@program("size_arith", shapes((2, 3), (4, 6), (3, 9), (7, 5), (5, 12)), 2)
def size_new_zeros(x):
    return torch.cat([x, x.new_zeros(x.size(0), 2)], 1)


@program("size_arith", shapes((2, 3, 4), (3, 5, 4), (4, 2, 4), (5, 6, 4), (2, 7, 4)), 2)
def size_view_product(x):
    return x.view(x.size(0) * x.size(1), -1).sum(1)


@program("size_arith", shapes((2, 4), (3, 9), (5, 16), (8, 25), (4, 3)), 2)
def size_math_sqrt(x):
    return x / math.sqrt(x.size(-1))


@program("size_arith", shapes((2, 4), (3, 9), (5, 16), (8, 25), (4, 3)), 2)
def size_full(x):
    return torch.full((x.size(0),), x.size(1), dtype=torch.float32) + x.sum(1)


@program("size_arith", rows(3, 5, 9, 17, 6, cols=4), 2)
def size_returned(x):
    return x * 2, x.shape[0] + 1


# ---------------------------------------------------------------- control flow on sizes
@program("control_flow", rows(4, 6, 12, 16, 5, 20, cols=3), 3)
def cf_branch_gt(x):
    if x.size(0) > 8:
        return x * 2
    return x + 1


@program("control_flow", rows(2, 3, 4, 2, cols=5), 3)
def cf_loop_range(x):
    acc = torch.zeros(x.size(1))
    for i in range(x.size(0)):
        acc = acc + x[i] * i
    return acc


@program("control_flow", shapes((3, 4), (3, 6), (3, 5), (3, 7), (3, 10), (3, 9)), 3)
def cf_even_width(x):
    if x.size(1) % 2 == 0:
        return x.view(x.size(0), -1, 2).sum(-1)
    return x.sum(-1, keepdim=True)


@program("control_flow", rows(2, 5, 9, 3, 12, cols=4), 2)
def cf_min_size(x):
    k = min(x.size(0), 4)
    return x[:k] * 2


@program("control_flow", pairs(((3, 4), (3, 4)), ((5, 4), (5, 4)), ((5, 4), (2, 4)),
                               ((8, 4), (8, 4)), ((6, 4), (3, 4))), 3)
def cf_same_shape(x, y):
    if x.shape == y.shape:
        return x + y
    return x.sum(0) + y.sum(0)


# ---------------------------------------------------------------- sizes 0 and 1
@program("size_0_1", rows(3, 0, 5, 9, 0, cols=4), 3)
def zero_rows(x):
    return x.sum(0), x * 2


@program("size_0_1", lambda g: [(R(g, n, 4), R(g, 1, 4)) for n in (1, 2, 5, 9, 1)], 2)
def one_row_broadcast(x, y):
    return x + y


@program("size_0_1", shapes((2, 1), (2, 4), (2, 7), (2, 12), (2, 1)), 2)
def one_wide_softmax(x):
    return x.softmax(-1)


@program("size_0_1", pairs(((3, 4), (0, 4)), ((3, 4), (2, 4)), ((5, 4), (6, 4)),
                           ((7, 4), (0, 4)), ((2, 4), (9, 4))), 4)
def zero_cat(x, y):
    return torch.cat([x, y]) + 1


@program("size_0_1", shapes((1, 3), (2, 3), (4, 3), (7, 3), (1, 3)), 2)
def one_squeeze(x):
    return x.squeeze(0) * 2


# ---------------------------------------------------------------- equal and independent dims
@program("dims", pairs(((3, 3), (3, 3)), ((5, 5), (5, 5)), ((8, 8), (8, 8)),
                       ((2, 2), (2, 2)), ((11, 11), (11, 11))), 2)
def dims_square(x, y):
    return x @ x.t() + y


@program("dims", pairs(((3, 4), (5, 4)), ((6, 4), (2, 4)), ((4, 4), (9, 4)),
                       ((7, 4), (3, 4)), ((2, 4), (2, 4))), 2)
def dims_independent(x, y):
    return x.sum(0) + y.sum(0)


@program("dims", pairs(((3, 4), (3, 4)), ((5, 4), (5, 4)), ((5, 4), (7, 4)),
                       ((6, 4), (2, 4)), ((9, 4), (9, 4))), 2)
def dims_equal_then_apart(x, y):
    return torch.cat([x, y]) * 2


@program("dims", pairs(((3, 1), (1, 4)), ((5, 1), (1, 2)), ((2, 1), (1, 7)),
                       ((8, 1), (1, 3)), ((4, 1), (1, 9))), 2)
def dims_outer_sum(x, y):
    return x + y


# ---------------------------------------------------------------- small models
def _seeded(build):
    torch.manual_seed(0)
    return build().eval()


@program("model", rows(2, 5, 9, 16, 3), 2, module=True)
def model_mlp():
    return _seeded(lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))


@program("model", shapes((1, 3, 8, 8), (2, 3, 8, 8), (5, 3, 8, 8), (8, 3, 8, 8),
                         (3, 3, 8, 8)), 2, module=True)
def model_cnn():
    return _seeded(lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 5)))


@program("model", lambda g: [(I(g, 30, 2, s),) for s in (3, 6, 11, 20, 4)], 2, module=True)
def model_bag_of_words():
    class BagOfWords(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(30, 8)
            self.out = nn.Linear(8, 3)

        def forward(self, ids):
            return self.out(self.emb(ids).mean(1))
    return _seeded(BagOfWords)


@program("model", shapes((2, 3, 16), (2, 6, 16), (3, 10, 16), (2, 17, 16), (4, 5, 16)), 3,
         module=True)
def model_attention_block():
    class AttentionBlock(nn.Module):
        def __init__(self, dim=16, heads=2):
            super().__init__()
            self.heads = heads
            self.norm = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.GELU(), nn.Linear(32, dim))

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, -1).unbind(2)
            att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
            return x + self.mlp(x)
    return _seeded(AttentionBlock)


# ---------------------------------------------------------------- dynamic= and marks
@program("policy", rows(3, 5, 9, 17, 6), 1, dynamic=True)
def pol_true_pointwise(x):
    return torch.sigmoid(x) * x


@program("policy", shapes((3, 4), (6, 5), (8, 9), (2, 16), (10, 3)), 1, dynamic=True)
def pol_true_reduction(x):
    return x.sum(-1) + x.amax(0).sum()


@program("policy", rows(3, 5, 9, 17, 6), 5, dynamic=False)
def pol_false_pointwise(x):
    return torch.sigmoid(x) * x


@program("policy", lambda g: [(R(g, n, 8), R(g, 8, 4)) for n in (3, 5, 9, 5, 3, 12)], 4,
         dynamic=False)
def pol_false_matmul(x, w):
    return x @ w


@program("policy", rows(3, 5, 9, 17, 6), 1, marks=(Mark(0, 0, "dynamic"),))
def pol_mark_dynamic_batch(x):
    return x.relu() + 1


@program("policy", rows(3, 5, 9, 17, 6), 1, marks=(Mark(0, 0, "dynamic", min=2, max=64),))
def pol_mark_dynamic_range(x):
    return x.softmax(-1)


@program("policy", shapes((2, 3, 16), (2, 6, 16), (2, 10, 16), (2, 17, 16), (2, 4, 16)), 1,
         marks=(Mark(0, 1, "dynamic"),))
def pol_mark_dynamic_seq(x):
    return F.layer_norm(x, (16,)) @ x.transpose(1, 2)


@program("policy", shapes((3, 4), (5, 4), (5, 6), (3, 6), (9, 4)), 2, dynamic=True,
         marks=(Mark(0, 1, "static"),))
def pol_mark_static_width(x):
    return x * 2


@program("policy", rows(3, 5, 9, 17, 6), 5, marks=(Mark(0, 0, "static"),))
def pol_mark_static_batch(x):
    return x.cos()


@program("policy", shapes((3, 4), (5, 4), (7, 4), (12, 4), (2, 4)), 1,
         marks=(Mark(0, 0, "dynamic"), Mark(0, 1, "static")))
def pol_mark_both(x):
    return x.sum(1)
