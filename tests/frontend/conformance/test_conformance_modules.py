"""Conformance: nn.Module programs, compiled as modules and passed as arguments."""
import pytest
import torch
from torch import nn

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 3, bias=False)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.fc2(self.drop(self.act(self.fc1(x))))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(self.pool(y).flatten(1))


class NormBlock(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.proj(self.ln(x))


class DirectParams(nn.Module):
    """Parameters and buffers used directly in forward."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.bias = nn.Parameter(torch.zeros(4))
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.register_buffer("mask", torch.tensor([1.0, 0.0, 1.0, 1.0]), persistent=False)
        self.alpha = 2.0          # plain Python attribute

    def forward(self, x):
        return (x @ self.weight.t() + self.bias) * self.scale * self.mask * self.alpha


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 4))

    def forward(self, x):
        return self.body(x) + self.body[0](x).sum(-1, keepdim=True) + self.body[-1].bias


class Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        for i, layer in enumerate(self.layers[:2]):
            x = x + layer.weight[i]
        return self.layers[-1](x) * len(self.layers)


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        out = {}
        for name, head in self.heads.items():
            out[name] = head(x)
        keys = list(self.heads.keys())
        total = sum(h.weight.sum() for h in self.heads.values())
        return out, keys, total + self.heads["b"](x).mean(), "a" in self.heads


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = NormBlock()
        self.block2 = NormBlock()
        self.mlp = MLP()

    def forward(self, x):
        return self.mlp(self.block2(self.block1(x)))


class TrainingFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            y = y * 2
        return y


class BaseModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class DerivedModule(BaseModule):
    def forward(self, x):
        return super().forward(x) * 2 + self.helper(x)

    def helper(self, x):
        return x.sum(-1, keepdim=True)


class KwargsModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, y=None, *, scale=1.0):
        out = self.lin(x) * scale
        if y is not None:
            out = out + y
        return out


class AttentionBlock(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


def _eval(m):
    return m.eval()


MODULES = [
    ("mlp_eval_dropout", lambda: _eval(MLP()), lambda: (torch.randn(2, 4),)),
    ("convnet_bn_eval", lambda: _eval(ConvNet()), lambda: (torch.randn(2, 2, 5, 5),)),
    ("convnet_bn_train", lambda: ConvNet().train(), lambda: (torch.randn(2, 2, 5, 5),)),
    ("layernorm_block", lambda: NormBlock(), lambda: (torch.randn(2, 3, 4),)),
    ("direct_params_buffers", lambda: DirectParams(), lambda: (torch.randn(3, 4),)),
    ("sequential", lambda: Seq(), lambda: (torch.randn(2, 4),)),
    ("modulelist", lambda: Layers(), lambda: (torch.randn(2, 4),)),
    ("moduledict", lambda: Heads(), lambda: (torch.randn(2, 4),)),
    ("nested_modules", lambda: _eval(Nested()), lambda: (torch.randn(2, 4),)),
    ("training_flag_eval", lambda: _eval(TrainingFlag()), lambda: (torch.randn(2, 4),)),
    ("training_flag_train", lambda: TrainingFlag().train(), lambda: (torch.randn(2, 4),)),
    ("super_forward", lambda: DerivedModule(), lambda: (torch.randn(2, 4),)),
    ("forward_kwargs", lambda: KwargsModule(), lambda: (torch.randn(2, 4), torch.randn(2, 4))),
    ("attention_block", lambda: AttentionBlock(), lambda: (torch.randn(2, 5, 8),)),
    ("plain_sequential", lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.LayerNorm(4)),
     lambda: (torch.randn(3, 4),)),
]


@pytest.mark.parametrize("make_mod,make_in", [(m, i) for _, m, i in MODULES],
                         ids=[n for n, _, _ in MODULES])
def test_compiled_module(make_mod, make_in):
    check(make_mod(), make_in(), module=True, atol=1e-5)


@pytest.mark.parametrize("make_mod,make_in", [(m, i) for _, m, i in MODULES[:4]],
                         ids=[n for n, _, _ in MODULES[:4]])
def test_compiled_module_backward(make_mod, make_in):
    check(make_mod(), make_in(), module=True, backward=True, atol=1e-5)


def test_module_as_argument():
    def fn(mod, x):
        return mod(x) * 2
    check(fn, (_eval(MLP()), torch.randn(2, 4)))


def test_module_submodules_as_argument():
    def fn(mod, x):
        for layer in mod.layers:
            x = layer(x)
        return x + mod.layers[0].bias, len(mod.layers)
    check(fn, (Layers(), torch.randn(2, 4)))


def test_module_parameters_iteration_in_function():
    def fn(mod, x):
        reg = sum(p.pow(2).sum() for p in mod.parameters())
        names = [n for n, _ in mod.named_parameters()]
        return mod(x).sum() + 0.01 * reg, names
    check(fn, (NormBlock(), torch.randn(2, 4)))


def test_module_in_closure_cell():
    lin = nn.Linear(3, 3)

    def fn(x):
        return lin(x).relu()
    check(fn, (torch.randn(2, 3),))


def test_module_call_with_kwargs():
    def fn(mod, x, y):
        return mod(x, y=y, scale=0.5)
    check(fn, (KwargsModule(), torch.randn(2, 4), torch.randn(2, 4)))


def test_functional_call_on_module_weights():
    def fn(mod, x):
        return torch.nn.functional.linear(x, mod.weight * 2, mod.bias)
    check(fn, (nn.Linear(4, 3), torch.randn(2, 4)))
