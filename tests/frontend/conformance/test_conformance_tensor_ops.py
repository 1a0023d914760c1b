"""Conformance: torch functions, Tensor methods, torch.nn.functional, each in one graph."""
import pytest
import torch
import torch.nn.functional as F

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def r(*shape):
    return torch.randn(*shape)


# (name, fn, inputs factory, extra check kwargs)
TORCH_FUNCTIONS = [
    ("add", lambda x, y: torch.add(x, y, alpha=2), lambda: (r(3, 4), r(3, 4))),
    ("cat", lambda x, y: torch.cat([x, y], dim=1), lambda: (r(2, 3), r(2, 2))),
    ("cat_tuple_neg_dim", lambda x, y: torch.cat((x, y, x), -1), lambda: (r(2, 3), r(2, 2))),
    ("stack", lambda x, y: torch.stack([x, y, x * 2], dim=0), lambda: (r(3), r(3))),
    ("where", lambda x, y: torch.where(x > y, x, y), lambda: (r(3, 4), r(3, 4))),
    ("where_scalar", lambda x: torch.where(x > 0, x, 0.0), lambda: (r(5),)),
    ("matmul", lambda a, b: torch.matmul(a, b), lambda: (r(2, 3, 4), r(4, 5))),
    ("bmm", lambda a, b: torch.bmm(a, b), lambda: (r(2, 3, 4), r(2, 4, 5))),
    ("sum_dim_keepdim", lambda x: torch.sum(x, dim=1, keepdim=True), lambda: (r(3, 4),)),
    ("sum_dims_tuple", lambda x: torch.sum(x, dim=(0, 2)), lambda: (r(2, 3, 4),)),
    ("softmax", lambda x: torch.softmax(x, dim=-1), lambda: (r(3, 4),)),
    ("relu", lambda x: torch.relu(x), lambda: (r(3, 4),)),
    ("sigmoid_tanh", lambda x: torch.sigmoid(x) + torch.tanh(x), lambda: (r(3, 4),)),
    ("exp_log_sqrt", lambda x: torch.exp(x) + torch.log(x) + torch.sqrt(x),
     lambda: (torch.rand(6) + 0.1,)),
    ("ones_zeros", lambda x: x + torch.ones(3, 4) - torch.zeros(3, 4), lambda: (r(3, 4),)),
    ("ones_like_zeros_like", lambda x: torch.ones_like(x) * 2 + torch.zeros_like(x),
     lambda: (r(2, 2),)),
    ("arange", lambda x: x * torch.arange(4), lambda: (r(3, 4),)),
    ("arange_start_step_dtype", lambda x: x + torch.arange(1, 9, 2, dtype=torch.float32),
     lambda: (r(4),)),
    ("full", lambda x: x + torch.full((3, 4), 2.5), lambda: (r(3, 4),)),
    ("full_int_dtype", lambda x: torch.full((2,), 7, dtype=torch.int64) + x,
     lambda: (torch.randint(0, 9, (2,)),)),
    ("factory_only", lambda: torch.ones(2, 3) * 3, lambda: ()),
    ("einsum_matmul", lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: (r(3, 4), r(4, 5))),
    ("einsum_batched", lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b),
     lambda: (r(2, 2, 3, 4), r(2, 2, 5, 4))),
    ("mean_var", lambda x: (torch.mean(x, dim=0), torch.var(x, dim=1)), lambda: (r(4, 5),)),
    ("max_min_binary", lambda x, y: (torch.maximum(x, y), torch.minimum(x, y)),
     lambda: (r(4), r(4))),
    ("clamp_fn", lambda x: torch.clamp(x, min=-0.5, max=0.5), lambda: (r(6),)),
    ("argmax_topk", lambda x: (torch.argmax(x, dim=1), torch.topk(x, 2, dim=1).values),
     lambda: (r(3, 5),)),
    ("cumsum", lambda x: torch.cumsum(x, dim=0), lambda: (r(5),)),
    ("flatten_fn", lambda x: torch.flatten(x, 1), lambda: (r(2, 3, 4),)),
    ("transpose_fn", lambda x: torch.transpose(x, 0, 1).contiguous(), lambda: (r(2, 3),)),
    ("tensor_from_python_list", lambda x: x + torch.tensor([1.0, 2.0, 3.0]), lambda: (r(3),)),
    ("gather", lambda x, i: torch.gather(x, 1, i),
     lambda: (r(3, 4), torch.randint(0, 4, (3, 2)))),
    ("tril_triu", lambda x: torch.tril(x) + torch.triu(x, diagonal=1), lambda: (r(4, 4),)),
]


@pytest.mark.parametrize("fn,make", [(f, m) for _, f, m in TORCH_FUNCTIONS],
                         ids=[n for n, _, _ in TORCH_FUNCTIONS])
def test_torch_function(fn, make):
    check(fn, make())


def _max_dim(x):
    values, indices = x.max(dim=1)
    return values, indices


def _setitem_clone(x, y):
    z = x.clone()
    z[0] = 1.0
    z[:, 1] = y[:, 0]
    z[1:, 2] = 0.0
    z[..., -1] += 2
    return z


TENSOR_METHODS = [
    ("view", lambda x: x.view(4, 3), lambda: (r(3, 4),)),
    ("view_minus_one", lambda x: x.view(-1) + x.view(2, -1).sum(1).repeat(6), lambda: (r(3, 4),)),
    ("reshape", lambda x: x.t().reshape(2, 6), lambda: (r(3, 4),)),
    ("permute", lambda x: x.permute(2, 0, 1) * 2, lambda: (r(2, 3, 4),)),
    ("transpose", lambda x: x.transpose(-1, -2) + 1, lambda: (r(2, 3, 4),)),
    ("unsqueeze_squeeze", lambda x: (x.unsqueeze(0).unsqueeze(-1), x[None].squeeze(0),
                                     x.unsqueeze(1).squeeze()), lambda: (r(3, 4),)),
    ("flatten", lambda x: x.flatten() * 2, lambda: (r(2, 3, 4),)),
    ("chunk", lambda x: tuple(c * (i + 1) for i, c in enumerate(x.chunk(3, dim=1))),
     lambda: (r(2, 6),)),
    ("split_size", lambda x: x.split(2, dim=0), lambda: (r(5, 2),)),
    ("split_sections", lambda x: [p.sum() for p in x.split([1, 3], dim=1)],
     lambda: (r(2, 4),)),
    ("mean", lambda x: (x.mean(), x.mean(dim=-1, keepdim=True)), lambda: (r(3, 4),)),
    ("max_dim_values_indices", _max_dim, lambda: (r(3, 5),)),
    ("max_dim_namedtuple_attrs", lambda x: x.max(dim=0).values + x.max(0).indices,
     lambda: (r(3, 5),)),
    ("max_min_all", lambda x: x.max() - x.min(), lambda: (r(3, 5),)),
    ("clamp", lambda x: (x.clamp(-0.3, 0.3), x.clamp(min=0), x.clamp_min(0.1)),
     lambda: (r(6),)),
    ("masked_fill", lambda x: x.masked_fill(x < 0, float("-inf")).softmax(-1),
     lambda: (r(3, 4),)),
    ("contiguous", lambda x: x.transpose(0, 1).contiguous().view(-1), lambda: (r(3, 4),)),
    ("to_dtype", lambda x: (x.to(torch.float64), x.to(dtype=torch.int32), x.to(torch.float16)),
     lambda: (r(5),)),
    ("float_long_int_bool", lambda x: (x.float(), x.long() + 1, x.int(), x.bool()),
     lambda: (torch.randint(-3, 3, (5,)),)),
    ("type_as", lambda x, y: x.type_as(y) + y, lambda: (torch.randint(0, 5, (4,)), r(4))),
    ("expand", lambda x: x.expand(3, 4) + 0, lambda: (r(1, 4),)),
    ("expand_as_minus_one", lambda x, y: x.expand(-1, 4) * y.expand_as(y),
     lambda: (r(3, 1), r(3, 4))),
    ("repeat", lambda x: x.repeat(2, 3), lambda: (r(2, 2),)),
    ("index_int", lambda x: (x[0], x[-1], x[1, 2]), lambda: (r(3, 4),)),
    ("index_slices", lambda x: (x[1:], x[:, ::2], x[::-1 + 2, 1:3], x[-2:]),
     lambda: (r(4, 5),)),
    ("index_none_ellipsis", lambda x: (x[None], x[..., 0], x[:, None, 1], x[..., None, :]),
     lambda: (r(2, 3, 4),)),
    ("index_tensor", lambda x, i: (x[i], x[:, i], x[i, i]),
     lambda: (r(4, 4), torch.tensor([0, 2, 3]))),
    ("setitem_on_clone", _setitem_clone, lambda: (r(3, 4), r(3, 4))),
    ("chained_methods", lambda x: x.relu().sum(dim=0).neg().exp().mean(), lambda: (r(3, 4),)),
    ("sort_argsort", lambda x: (x.sort(dim=-1).values, x.argsort(dim=0)), lambda: (r(3, 4),)),
    ("new_ones_new_zeros", lambda x: x.new_ones(2, 2) + x.new_zeros((2, 2)) + x[:2, :2],
     lambda: (r(3, 3),)),
    ("pow_sqrt_rsqrt", lambda x: x.pow(2).sqrt() + x.abs().add(1).rsqrt(), lambda: (r(4),)),
]


@pytest.mark.parametrize("fn,make", [(f, m) for _, f, m in TENSOR_METHODS],
                         ids=[n for n, _, _ in TENSOR_METHODS])
def test_tensor_method(fn, make):
    check(fn, make())


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _interp(x):
    return (F.interpolate(x, scale_factor=2, mode="nearest"),
            F.interpolate(x, size=(5, 3), mode="bilinear", align_corners=False))


FUNCTIONAL = [
    ("relu", lambda x: F.relu(x), lambda: (r(3, 4),), {}),
    ("gelu", lambda x: (F.gelu(x), F.gelu(x, approximate="tanh")), lambda: (r(3, 4),), {}),
    ("silu_leaky_relu", lambda x: F.silu(x) + F.leaky_relu(x, 0.2), lambda: (r(3, 4),), {}),
    ("softmax_log_softmax", lambda x: (F.softmax(x, dim=-1), F.log_softmax(x, dim=1)),
     lambda: (r(3, 4),), {}),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (4,), w, b, eps=1e-5),
     lambda: (r(2, 3, 4), r(4), r(4)), {}),
    ("linear", lambda x, w, b: F.linear(x, w, b), lambda: (r(2, 3), r(5, 3), r(5)), {}),
    ("linear_no_bias", lambda x, w: F.linear(x, w), lambda: (r(2, 3), r(5, 3)), {}),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1),
     lambda: (r(1, 2, 5, 5), r(3, 2, 3, 3), r(3)), {"atol": 1e-5}),
    ("dropout_eval", lambda x: F.dropout(x, p=0.5, training=False) * 2, lambda: (r(3, 4),), {}),
    ("embedding", lambda i, w: F.embedding(i, w), lambda: (torch.tensor([[0, 2], [4, 1]]),
                                                            r(5, 3)), {}),
    ("sdpa_causal", _sdpa, lambda: (r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 2, 4, 8)),
     {"atol": 1e-5}),
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t), lambda: (r(4, 5),
                                                                   torch.tensor([0, 3, 1, 4])),
     {}),
    ("cross_entropy_label_smoothing",
     lambda x, t: F.cross_entropy(x, t, reduction="sum", label_smoothing=0.1),
     lambda: (r(4, 5), torch.tensor([0, 3, 1, 4])), {}),
    ("pad", lambda x: (F.pad(x, (1, 2)), F.pad(x, (1, 1, 0, 1), value=3.0)),
     lambda: (r(2, 3, 4),), {}),
    ("interpolate", _interp, lambda: (r(1, 2, 3, 3),), {"atol": 1e-5}),
    ("mse_loss_normalize", lambda x, y: F.mse_loss(x, y) + F.normalize(x, dim=-1).sum(),
     lambda: (r(3, 4), r(3, 4)), {}),
    ("max_avg_pool", lambda x: (F.max_pool2d(x, 2), F.avg_pool2d(x, 2),
                                F.adaptive_avg_pool2d(x, 1)), lambda: (r(1, 2, 4, 4),), {}),
]


@pytest.mark.parametrize("fn,make,kw", [(f, m, k) for _, f, m, k in FUNCTIONAL],
                         ids=[n for n, _, _, _ in FUNCTIONAL])
def test_functional(fn, make, kw):
    check(fn, make(), **kw)


def test_add_relu_op_count():
    check(lambda x, y: torch.relu(torch.add(x, y)), (r(3), r(3)), ops=2)


def test_sum_keepdim_op_count():
    check(lambda x: x.sum(dim=0, keepdim=True), (r(3, 4),), ops=1)


def test_direct_aten_op_calls_are_graph_nodes():
    def f(x, y):
        return torch.ops.aten.add.Tensor(x, y) * torch.ops.aten.relu(y)
    check(f, (torch.randn(3, 4), torch.randn(3, 4)))
