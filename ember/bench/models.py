"""The benchmark's model zoo: registry name -> factory building ``(model, example_inputs)``.

Three built-in models need nothing but torch and cover the main shapes of work: ``mlp``
(matmuls and pointwise), ``convnet`` (convolution, batch norm, pooling) and
``transformer_block`` (layer norm, hand-written attention with softmax, matmuls). Models from
timm and transformers join when those packages are installed (``available()``), built from
configs with random weights: nothing is downloaded.

Every factory seeds torch's generator inside ``fork_rng`` so weights and inputs are the same on
every run without disturbing the caller's random state, and returns the model in ``eval()``
mode (dropout off, batch norm on running statistics) so outputs are deterministic. Input sizes
are small on purpose: the benchmark and the model tests run on a 2-core CPU.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
from torch import nn

from ember.bench import compat

Factory = Callable[[torch.device], tuple[nn.Module, tuple]]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Factory              # called with the random state already seeded
    requires: str | None = None  # optional package the model needs ("timm", "transformers")
    description: str = ""


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, *, requires: str | None = None, description: str = ""):
    def deco(build: Factory) -> Factory:
        MODELS[name] = ModelSpec(name, build, requires, description)
        return build
    return deco


class UnknownModelError(ValueError):
    pass


class ModelUnavailableError(RuntimeError):
    pass


_IMPORTERS = {"timm": compat.import_timm, "transformers": compat.import_transformers}


def is_available(name: str) -> bool:
    spec = MODELS[name]
    return spec.requires is None or _IMPORTERS[spec.requires]() is not None


def known() -> list[str]:
    return list(MODELS)


def available() -> list[str]:
    """Registered models whose optional package is installed, in registration order."""
    return [name for name in MODELS if is_available(name)]


def check_names(names: list[str]) -> None:
    """Raise a clear error for names that are not registered or whose package is missing."""
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise UnknownModelError(f"unknown model(s): {', '.join(unknown)}; known models: "
                                f"{', '.join(MODELS)}")
    for name in names:
        if not is_available(name):
            raise ModelUnavailableError(
                f"model {name!r} needs the {MODELS[name].requires!r} package; install the "
                f"benchmark extras: pip install torch==2.13.0 -e '.[bench]'")


def build_model(name: str, device: str | torch.device = "cpu") -> tuple[nn.Module, tuple]:
    """A fresh, seeded, eval-mode model on ``device`` and its example inputs (a tuple)."""
    check_names([name])
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        model, inputs = MODELS[name].build(device)
    return model.to(device).eval(), tuple(inputs)


# --------------------------------------------------------------------------- built-in models

class MLP(nn.Module):
    def __init__(self, width: int = 512, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.gelu(layer(x))
        return self.head(x)


@register_model("mlp", description="4 x (Linear 512 + GELU), batch 64")
def _mlp(device):
    return MLP(), (torch.randn(64, 512, device=device),)


class ConvNet(nn.Module):
    # The later convolutions stride 2: at full resolution the 3rd layer alone costs ~10 GFLOP,
    # far too slow for a 2-core benchmark.
    def __init__(self, channels=(3, 16, 32, 64), strides=(1, 2, 2), classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                          nn.BatchNorm2d(c_out), nn.ReLU())
            for c_in, c_out, stride in zip(channels, channels[1:], strides)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels[-1], classes)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.fc(torch.flatten(x, 1))


@register_model("convnet", description="3 x (conv-bn-relu), pool, linear; batch 16 x 3x64x64")
def _convnet(device):
    model = ConvNet()
    # Non-trivial running statistics, so eval-mode batch norm is not the identity.
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(16, 3, 64, 64, device=device),)


class SelfAttention(nn.Module):
    """Multi-head self-attention written out (no fused SDPA), so its ops are visible."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        head_dim = dim // self.heads

        def split_heads(t):
            return t.view(batch, seq, self.heads, head_dim).transpose(1, 2)

        q, k, v = split_heads(self.q(x)), split_heads(self.k(x)), split_heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(batch, seq, dim)
        return self.out(y)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int = 256, heads: int = 4, mlp_ratio: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


@register_model("transformer_block", description="pre-LN block, 4 heads; batch 8 x seq 128 x 256")
def _transformer_block(device):
    return TransformerBlock(), (torch.randn(8, 128, 256, device=device),)


# ------------------------------------------------------------- optional: timm, transformers

# resnet18 is fully convolutional: 128x128 inputs cost a third of 224x224 and exercise the same
# graph. ViT's patch embedding fixes its input at 224x224.
@register_model("resnet18", requires="timm", description="timm resnet18; batch 1 x 3x128x128")
def _resnet18(device):
    timm = compat.import_timm()
    return (timm.create_model("resnet18", pretrained=False),
            (torch.randn(1, 3, 128, 128, device=device),))


@register_model("vit_tiny", requires="timm",
                description="timm vit_tiny_patch16_224; batch 1 x 3x224x224")
def _vit_tiny(device):
    timm = compat.import_timm()
    return (timm.create_model("vit_tiny_patch16_224", pretrained=False),
            (torch.randn(1, 3, 224, 224, device=device),))


@register_model("bert", requires="transformers",
                description="HF BertModel, 2 layers, hidden 128; batch 4 x seq 64 token ids")
def _bert(device):
    transformers = compat.import_transformers()
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=256,
                                     vocab_size=1000)
    model = transformers.BertModel(config)
    return model, (torch.randint(0, config.vocab_size, (4, 64), device=device),)
