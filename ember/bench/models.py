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

Suites (``SUITES``): ``builtin`` (the models above: nothing but torch, the default of ``ember
bench``); ``timm``, ``hf`` and ``torchvision`` (``zoo_timm.py``, ``zoo_hf.py``,
``zoo_torchvision.py``: real architectures from those libraries, CNNs, vision and language
transformers, decoders, encoder-decoders, speech); and ``gpu``: timm resnet50,
mobilenetv3_large_100 and vit_base_patch16_224, HF BERT-base and GPT-2 (base models, no task
head; ``use_cache=False`` so GPT-2 returns only tensors), meant for a large GPU in bfloat16 at
batch 64/64/32 and 16 x 512 tokens. In train mode the suite is issue 10's training benchmark:
resnet50 (64), vit_base (32), BERT-base (16 x 512) and GPT-2 (8 x 512); mobilenetv3 is
inference only (``ModelSpec.modes``, ``cuda_train_batch_size``). On the CPU the large models
get batch 1 (and 128 tokens).

A user's model is ``module:callable`` (or ``path/to/file.py:callable``): a function returning
``(model, example_inputs)``; it may take ``device`` and ``batch_size`` keywords. Example inputs
are a tuple of positional arguments or a dict of keyword arguments (then the model is wrapped
in ``KeywordCall``, which takes them positionally, so every model is called as
``model(*inputs)``).

``build_model(mode="train")`` returns the model in ``train()`` mode with every dropout
probability set to 0 (so a training step is deterministic and comparable across compilers and
dtypes); the zoo's factories also build their models without stochastic depth.

Each model has a default batch size (per device type) and dtype; ``build_model(batch_size=,
dtype=)`` overrides them. A factory takes ``(device, batch_size)``; ``build_model`` casts the
model's floating-point parameters and buffers and the floating-point inputs to the dtype
(integer inputs, such as token ids, stay integer).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import sys
from typing import Any, Callable

import torch
from torch import nn

from ember.bench import compat

Factory = Callable[[torch.device, int], tuple[nn.Module, tuple]]

SUITES = ("builtin", "timm", "hf", "torchvision", "gpu")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Factory              # build(device, batch_size), the random state already seeded
    requires: str | None = None  # optional package the model needs ("timm", "transformers")
    description: str = ""
    batch_size: int | None = 1   # default batch on the CPU (None: a user's model's own)
    cuda_batch_size: int | None = None   # default batch on CUDA (None: batch_size)
    dtype: torch.dtype | None = torch.float32   # default dtype (None: the model's own)
    suite: str | None = "builtin"   # None: a user's model
    cuda_train_batch_size: int | None = None   # default batch on CUDA in train mode
    modes: tuple[str, ...] = ("infer", "train")   # the modes its suite runs it in

    def default_batch_size(self, device: str | torch.device,
                           mode: str = "infer") -> int | None:
        if torch.device(device).type == "cuda":
            if mode == "train" and self.cuda_train_batch_size is not None:
                return self.cuda_train_batch_size
            if self.cuda_batch_size is not None:
                return self.cuda_batch_size
        return self.batch_size


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, *, requires: str | None = None, description: str = "",
                   batch_size: int = 1, cuda_batch_size: int | None = None,
                   dtype: torch.dtype = torch.float32, suite: str = "builtin",
                   cuda_train_batch_size: int | None = None,
                   modes: tuple[str, ...] = ("infer", "train")):
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")

    def deco(build: Factory) -> Factory:
        MODELS[name] = ModelSpec(name, build, requires, description, batch_size,
                                 cuda_batch_size, dtype, suite, cuda_train_batch_size, modes)
        return build
    return deco


class UnknownModelError(ValueError):
    pass


class ModelUnavailableError(RuntimeError):
    pass


_IMPORTERS = {"timm": compat.import_timm, "transformers": compat.import_transformers,
              "torchvision": compat.import_torchvision}


def is_available(name: str) -> bool:
    spec = MODELS[name]
    return spec.requires is None or _IMPORTERS[spec.requires]() is not None


def missing_package(name: str) -> str | None:
    """The optional package model ``name`` needs and that is not installed, without importing
    anything (None: nothing missing)."""
    spec = MODELS[name]
    if spec.requires is None or importlib.util.find_spec(spec.requires) is not None:
        return None
    return spec.requires


def is_user_model(name: str) -> bool:
    """``module:callable`` or ``file.py:callable``: a user's model factory."""
    return ":" in name


def load_callable(spec: str) -> Callable:
    """The callable named by ``module:attr`` (the current folder is on the path, as for
    ``python -m``) or ``path/to/file.py:attr``; ValueError says what is wrong."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"{spec!r}: expected module:callable or file.py:callable")
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise ValueError(f"{spec!r}: no file {target!r}")
        module_name = "_ember_bench_user_" + os.path.splitext(os.path.basename(target))[0]
        file_spec = importlib.util.spec_from_file_location(module_name, target)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[module_name] = module
        file_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"{spec!r}: cannot import {target!r}: {e}") from None
    value = getattr(module, attr, None)
    if not callable(value):
        raise ValueError(f"{spec!r}: {target!r} has no callable {attr!r}")
    return value


def _user_factory(spec: str) -> Factory:
    def build(device, batch_size):
        make = load_callable(spec)
        params = inspect.signature(make).parameters
        kwargs = {}
        if "device" in params:
            kwargs["device"] = device
        if "batch_size" in params:
            kwargs["batch_size"] = batch_size
        elif batch_size is not None:
            raise ValueError(f"--batch-size: {spec} takes no batch_size parameter")
        result = make(**kwargs)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(f"{spec} must return (model, example_inputs), got "
                            f"{type(result).__name__}")
        model, inputs = result
        return model, inputs if isinstance(inputs, dict) else tuple(inputs)
    return build


def resolve(name: str) -> ModelSpec:
    """The spec of a zoo model or of a user's ``module:callable``."""
    if is_user_model(name):
        return ModelSpec(name, _user_factory(name), batch_size=None, dtype=None, suite=None,
                         description=f"user model {name}")
    check_names([name])
    return MODELS[name]


def known() -> list[str]:
    return list(MODELS)


def available(suite: str | None = None) -> list[str]:
    """Registered models whose optional package is installed, in registration order; only
    those of ``suite`` when given."""
    return [name for name in in_suite(suite) if is_available(name)]


def in_suite(suite: str | None = None, mode: str | None = None) -> list[str]:
    """Registered models of ``suite`` (every model when None), installed or not; with
    ``mode``, only those the suite runs in that mode (``ModelSpec.modes``)."""
    if suite is not None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    return [name for name, spec in MODELS.items() if (suite is None or spec.suite == suite)
            and (mode is None or mode in spec.modes)]


def check_names(names: list[str]) -> None:
    """Raise a clear error for names that are not registered or whose package is missing."""
    unknown = [n for n in names if n not in MODELS and not is_user_model(n)]
    if unknown:
        raise UnknownModelError(f"unknown model(s): {', '.join(unknown)}; known models: "
                                f"{', '.join(MODELS)}")
    for name in names:
        if not is_user_model(name) and not is_available(name):
            raise ModelUnavailableError(
                f"model {name!r} needs the {MODELS[name].requires!r} package; install the "
                f"benchmark extras: pip install torch==2.13.0 -e '.[bench]'")


def build_model(name: str, device: str | torch.device = "cpu", *,
                dtype: torch.dtype | None = None, batch_size: int | None = None,
                mode: str = "infer", amp: torch.dtype | None = None
                ) -> tuple[nn.Module, tuple]:
    """A fresh, seeded model on ``device`` and its example inputs (a tuple).

    ``name``: a zoo model or a user's ``module:callable``. ``dtype`` (default: the model's,
    float32 for the zoo but the gpu suite) casts the floating-point parameters, buffers and
    inputs; ``batch_size`` (default: the model's for this device type) is the inputs' first
    dim. ``mode``: "infer" (``eval()``) or "train" (``train()``, dropout probabilities 0).
    ``amp`` (float16 or bfloat16): mixed precision as users write it: weights and inputs
    float32, the model wrapped in ``Autocast`` (``dtype`` must then be None or float32)."""
    spec = resolve(name)
    if mode not in ("infer", "train"):
        raise ValueError(f"mode must be infer or train, got {mode!r}")
    device = torch.device(device)
    if amp is not None:
        if amp not in (torch.float16, torch.bfloat16) or dtype not in (None, torch.float32):
            raise ValueError(f"amp autocasts float32 weights to float16 or bfloat16, got "
                             f"amp={amp}, dtype={dtype}")
        dtype = torch.float32
    dtype = spec.dtype if dtype is None else dtype
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"models are cast to a floating-point dtype, got {dtype}")
    batch_size = spec.default_batch_size(device, mode) if batch_size is None else batch_size
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        model, inputs = spec.build(device, batch_size)
    if isinstance(inputs, dict):
        model, inputs = KeywordCall(model, list(inputs)), tuple(inputs.values())
    inputs = tuple(_to(t, device, dtype) for t in inputs)
    model = model.to(device=device) if dtype is None else model.to(device=device, dtype=dtype)
    if amp is not None:
        model = Autocast(model, device.type, amp)
    if mode == "train":
        for module in model.modules():
            if isinstance(module, nn.modules.dropout._DropoutNd):
                module.p = 0.0
        return model.train(), inputs
    return model.eval(), inputs


class Autocast(nn.Module):
    """``model`` run under ``torch.autocast(device_type, dtype)`` entered in this forward, so
    inside the compiled frame: automatic mixed precision as training scripts write it
    (float32 weights and gradients, matmuls and convolutions in ``dtype``). The accuracy
    reference calls ``.model`` directly, without autocast."""

    def __init__(self, model: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.model, self.device_type, self.dtype = model, device_type, dtype

    def forward(self, *args):
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.model(*args)


def _to(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if dtype is not None and value.is_floating_point():
        return value.to(device=device, dtype=dtype)
    return value.to(device=device)


class KeywordCall(nn.Module):
    """Calls ``model(**dict(zip(names, args)))``: a model that takes keyword inputs (an
    encoder-decoder's ``input_ids`` and ``decoder_input_ids``) called as ``model(*inputs)``."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)))


def no_dropout(config: Any) -> Any:
    """A HF config with every ``*dropout*``, ``*layerdrop*`` and ``*_pdrop`` probability set to
    0 (GPT-2 names its dropouts ``attn_pdrop``, ``resid_pdrop``, ``embd_pdrop``; eval mode
    ignores them; a training step is then deterministic)."""
    for key, value in list(vars(config).items()):
        if ("dropout" in key or "layerdrop" in key or key.endswith("pdrop")) and \
                isinstance(value, float):
            setattr(config, key, 0.0)
    return config


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

    def __init__(self, dim: int, heads: int, causal: bool = False):
        super().__init__()
        self.heads = heads
        self.causal = causal
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
        if self.causal:
            future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(batch, seq, dim)
        return self.out(y)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int = 256, heads: int = 4, mlp_ratio: int = 4, causal: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal)
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


class TinyGPT(nn.Module):
    """A decoder language model: token and position embeddings, causal pre-LN blocks, a final
    layer norm and an LM head tied to the token embedding."""

    def __init__(self, vocab: int = 2048, dim: int = 128, layers: int = 2, heads: int = 4,
                 max_len: int = 256):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, causal=True)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(dim)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tokens.weight.t()


@register_model("tiny_gpt", description="decoder LM, 2 causal blocks, hidden 128, vocab 2048; "
                                        "batch 4 x 128 token ids", batch_size=4)
def _tiny_gpt(device, batch_size):
    return TinyGPT(), (torch.randint(0, 2048, (batch_size, 128), device=device),)


# ---------------------------------------- small timm and HF models (the timm and hf suites)

def timm_factory(timm_name: str, image_size: int = 224) -> Factory:
    """build(device, batch_size) of timm's ``timm_name`` (random weights) on square images."""
    def build(device, batch_size):
        timm = compat.import_timm()
        return (timm.create_model(timm_name, pretrained=False),
                (torch.randn(batch_size, 3, image_size, image_size, device=device),))
    return build


# resnet18 is fully convolutional: 128x128 inputs cost a third of 224x224 and exercise the same
# graph. ViT's patch embedding fixes its input at 224x224.
register_model("resnet18", requires="timm", suite="timm", cuda_batch_size=32,
               description="timm resnet18; batch 1 (CPU) or 32 (CUDA) x 3x128x128")(
    timm_factory("resnet18", 128))
register_model("vit_tiny", requires="timm", suite="timm", cuda_batch_size=32,
               description="timm vit_tiny_patch16_224; batch 1 (CPU) or 32 (CUDA) x 3x224x224")(
    timm_factory("vit_tiny_patch16_224"))


@register_model("bert", requires="transformers", suite="hf", batch_size=4, cuda_batch_size=32,
                description="HF BertModel, 2 layers, hidden 128; batch 4 (CPU) or 32 (CUDA) x "
                            "seq 64 token ids")
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


def _timm_gpu_model(name: str, timm_name: str, cuda_batch_size: int,
                    modes: tuple[str, ...] = ("infer", "train")) -> None:
    only = "" if "train" in modes else "; inference only"
    register_model(name, requires="timm", suite="gpu", batch_size=1,
                   cuda_batch_size=cuda_batch_size, dtype=torch.bfloat16, modes=modes,
                   description=f"timm {timm_name}; batch {cuda_batch_size} (CUDA) or 1 (CPU) "
                               f"x 3x224x224, bfloat16{only}")(timm_factory(timm_name))


# The training benchmark (issue 10, AMP training on the H200) is resnet50 at batch 64,
# vit_base at 32, BERT-base at 16 x 512 and GPT-2 at 8 x 512: ``--mode train --suite gpu``
# selects those four at those sizes; mobilenetv3_large_100 is in the inference suite only.
_timm_gpu_model("resnet50", "resnet50", 64)
_timm_gpu_model("mobilenetv3_large_100", "mobilenetv3_large_100", 64, modes=("infer",))
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
                cuda_batch_size=16, cuda_train_batch_size=8, dtype=torch.bfloat16,
                description="HF GPT2Model, GPT-2 small config (12 layers, hidden 768), no LM "
                            "head; batch 16 x 512 token ids (CUDA; 8 x 512 in train mode) or "
                            "1 x 128 (CPU), bfloat16")
def _gpt2(device, batch_size):
    transformers = compat.import_transformers()
    config = transformers.GPT2Config(use_cache=False)   # defaults: the 124M-parameter gpt2
    model = transformers.GPT2Model(config)
    return model, (torch.randint(0, config.vocab_size, (batch_size, _seq_len(device)),
                                 device=device),)


# The timm, hf and torchvision suites register themselves on import.
from ember.bench import zoo_hf, zoo_timm, zoo_torchvision  # noqa: E402,F401
