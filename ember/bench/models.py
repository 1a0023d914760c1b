"""The benchmark's model zoo: registry name -> factory building ``(model, example_inputs)``.

Three built-in models need nothing but torch and cover the main shapes of work: ``mlp``
(matmuls and pointwise), ``convnet`` (convolution, batch norm, pooling) and
``transformer_block`` (layer norm, hand-written attention with softmax, matmuls). Models from
timm and transformers join when those packages are installed (``available()``), built from
configs with random weights: nothing is downloaded.

Every factory seeds torch's generator inside ``fork_rng`` so weights and inputs are the same on
every run without disturbing the caller's random state, and returns the model in ``eval()``
mode (dropout off, batch norm on running statistics) so outputs are deterministic. Input sizes
of the ``builtin`` suite are small on purpose: the benchmark and the model tests run on a
2-core CPU.

Suites: ``builtin`` (the models above, the default of ``ember bench``) and ``gpu``: timm
resnet50, mobilenetv3_large_100 and vit_base_patch16_224, HF BERT-base and GPT-2 (base models,
no task head; ``use_cache=False`` so GPT-2 returns only tensors), meant for a large GPU in
bfloat16 at batch 64/64/32 and 16 x 512 tokens. On the CPU the same models get batch 1 (and
128 tokens), since they exist there to check the code path, not to be timed.

Each model has a default batch size (per device type) and dtype; ``build_model(batch_size=,
dtype=)`` overrides them. A factory takes ``(device, batch_size)``; ``build_model`` casts the
model's floating-point parameters and buffers and the floating-point inputs to the dtype
(integer inputs, such as token ids, stay integer).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
from torch import nn

from ember.bench import compat

Factory = Callable[[torch.device, int], tuple[nn.Module, tuple]]

SUITES = ("builtin", "gpu")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Factory              # build(device, batch_size), the random state already seeded
    requires: str | None = None  # optional package the model needs ("timm", "transformers")
    description: str = ""
    batch_size: int = 1          # default batch on the CPU
    cuda_batch_size: int | None = None   # default batch on CUDA (None: batch_size)
    dtype: torch.dtype = torch.float32   # default dtype
    suite: str = "builtin"

    def default_batch_size(self, device: str | torch.device) -> int:
        if torch.device(device).type == "cuda" and self.cuda_batch_size is not None:
            return self.cuda_batch_size
        return self.batch_size


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, *, requires: str | None = None, description: str = "",
                   batch_size: int = 1, cuda_batch_size: int | None = None,
                   dtype: torch.dtype = torch.float32, suite: str = "builtin"):
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")

    def deco(build: Factory) -> Factory:
        MODELS[name] = ModelSpec(name, build, requires, description, batch_size,
                                 cuda_batch_size, dtype, suite)
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


def available(suite: str | None = None) -> list[str]:
    """Registered models whose optional package is installed, in registration order; only
    those of ``suite`` when given."""
    return [name for name in in_suite(suite) if is_available(name)]


def in_suite(suite: str | None = None) -> list[str]:
    """Registered models of ``suite`` (every model when None), installed or not."""
    if suite is not None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    return [name for name, spec in MODELS.items() if suite is None or spec.suite == suite]


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


def build_model(name: str, device: str | torch.device = "cpu", *,
                dtype: torch.dtype | None = None,
                batch_size: int | None = None) -> tuple[nn.Module, tuple]:
    """A fresh, seeded, eval-mode model on ``device`` and its example inputs (a tuple).

    ``dtype`` (default: the model's, float32 for the builtin suite) casts the floating-point
    parameters, buffers and inputs; ``batch_size`` (default: the model's for this device
    type) is the inputs' first dim."""
    check_names([name])
    spec = MODELS[name]
    device = torch.device(device)
    dtype = spec.dtype if dtype is None else dtype
    if not dtype.is_floating_point:
        raise ValueError(f"models are cast to a floating-point dtype, got {dtype}")
    batch_size = spec.default_batch_size(device) if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        model, inputs = spec.build(device, batch_size)
    inputs = tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in inputs)
    return model.to(device=device, dtype=dtype).eval(), inputs


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


@register_model("mlp", description="4 x (Linear 512 + GELU), batch 64", batch_size=64)
def _mlp(device, batch_size):
    return MLP(), (torch.randn(batch_size, 512, device=device),)


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


@register_model("convnet", description="3 x (conv-bn-relu), pool, linear; batch 16 x 3x64x64",
                batch_size=16)
def _convnet(device, batch_size):
    model = ConvNet()
    # Non-trivial running statistics, so eval-mode batch norm is not the identity.
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(batch_size, 3, 64, 64, device=device),)


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


@register_model("transformer_block", description="pre-LN block, 4 heads; batch 8 x seq 128 x 256",
                batch_size=8)
def _transformer_block(device, batch_size):
    return TransformerBlock(), (torch.randn(batch_size, 128, 256, device=device),)


# ------------------------------------------------------------- optional: timm, transformers

# resnet18 is fully convolutional: 128x128 inputs cost a third of 224x224 and exercise the same
# graph. ViT's patch embedding fixes its input at 224x224.
@register_model("resnet18", requires="timm", description="timm resnet18; batch 1 x 3x128x128")
def _resnet18(device, batch_size):
    timm = compat.import_timm()
    return (timm.create_model("resnet18", pretrained=False),
            (torch.randn(batch_size, 3, 128, 128, device=device),))


@register_model("vit_tiny", requires="timm",
                description="timm vit_tiny_patch16_224; batch 1 x 3x224x224")
def _vit_tiny(device, batch_size):
    timm = compat.import_timm()
    return (timm.create_model("vit_tiny_patch16_224", pretrained=False),
            (torch.randn(batch_size, 3, 224, 224, device=device),))


@register_model("bert", requires="transformers",
                description="HF BertModel, 2 layers, hidden 128; batch 4 x seq 64 token ids",
                batch_size=4)
def _bert(device, batch_size):
    transformers = compat.import_transformers()
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=256,
                                     vocab_size=1000)
    model = transformers.BertModel(config)
    return model, (torch.randint(0, config.vocab_size, (batch_size, 64), device=device),)


# ------------------------------------------------- the gpu suite: large models, bfloat16, CUDA

def _seq_len(device: torch.device) -> int:
    """Tokens per sequence of the gpu suite's language models: 512 on CUDA, 128 on the CPU."""
    return 512 if device.type == "cuda" else 128


def _timm_gpu_model(name: str, timm_name: str, cuda_batch_size: int):
    @register_model(name, requires="timm", suite="gpu", batch_size=1,
                    cuda_batch_size=cuda_batch_size, dtype=torch.bfloat16,
                    description=f"timm {timm_name}; batch {cuda_batch_size} (CUDA) or 1 (CPU) "
                                f"x 3x224x224, bfloat16")
    def build(device, batch_size):
        timm = compat.import_timm()
        return (timm.create_model(timm_name, pretrained=False),
                (torch.randn(batch_size, 3, 224, 224, device=device),))
    return build


_timm_gpu_model("resnet50", "resnet50", 64)
_timm_gpu_model("mobilenetv3_large_100", "mobilenetv3_large_100", 64)
_timm_gpu_model("vit_base", "vit_base_patch16_224", 32)


@register_model("bert_base", requires="transformers", suite="gpu", batch_size=1,
                cuda_batch_size=16, dtype=torch.bfloat16,
                description="HF BertModel, BERT-base config (12 layers, hidden 768); batch 16 "
                            "x 512 token ids (CUDA) or 1 x 128 (CPU), bfloat16")
def _bert_base(device, batch_size):
    transformers = compat.import_transformers()
    config = transformers.BertConfig()   # the defaults are bert-base-uncased's sizes
    model = transformers.BertModel(config)
    return model, (torch.randint(0, config.vocab_size, (batch_size, _seq_len(device)),
                                 device=device),)


@register_model("gpt2", requires="transformers", suite="gpu", batch_size=1,
                cuda_batch_size=16, dtype=torch.bfloat16,
                description="HF GPT2Model, GPT-2 small config (12 layers, hidden 768), no LM "
                            "head; batch 16 x 512 token ids (CUDA) or 1 x 128 (CPU), bfloat16")
def _gpt2(device, batch_size):
    transformers = compat.import_transformers()
    config = transformers.GPT2Config(use_cache=False)   # defaults: the 124M-parameter gpt2
    model = transformers.GPT2Model(config)
    return model, (torch.randint(0, config.vocab_size, (batch_size, _seq_len(device)),
                                 device=device),)
